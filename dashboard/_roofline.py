"""The transfer page's Roofline tab: where each host-table path leaves the pinned-copy floor, one
axis at a time, and what the 'uva' kernel's hypotheses change (speedbench.report.roofline gives
every number; this module only draws them). Before a GPU has run the chunk it says so, with the
command that measures it."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st
from _tables import caption, md_text, table

from speedbench.report import roofline
from speedbench.report.vega import COLUMNS, FIT, LEGEND, SCHEMA, heading

# Gather above write-back in every chart: each has its own floor (host->device, device->host).
DIRECTIONS = (("gather", "gather: % of the h2d pinned copy", "gather_gbps", "h2d_floor", "gather_bus", "useful_gather"),
              ("scatter", "write-back: % of the d2h pinned copy", "scatter_gbps", "d2h_floor", "scatter_bus",
               "useful_scatter"))
GOAL = 80.0  # % of the floor: the target both directions are held to (docs/techniques/transfer.md)


def roofline_tab(rows: pd.DataFrame, machine: str, commit: str, where: str, hide: tuple[str, ...]) -> None:
    """`rows`: the roofline's rows on the page's `machine`, every commit; `commit`: the one picked
    (short hash); `where`: the machine in a chart's words; `hide`: the columns stated above."""
    fig = roofline.figures(rows)
    said = roofline.not_measured(rows, machine)
    if said is not None:
        st.info(said)
        caption("Each point moves one axis from the suite's (10M x 128 float32 table, 131072 random rows): row "
                "width 64 B to 4 KiB, batch 1k to 1M rows, table 1 GB to 40 GB, random, sorted or zipf indices; "
                "PyTorch's pinned path, speedlib's uva kernel and auto, and the kernel's hypotheses beside uva. "
                "docs/techniques/transfer.md says what each result will tell.")
        return
    here = fig[fig["commit"].str[:8] == commit]
    if here.empty:
        others = ", ".join(sorted(set(fig["commit"].str[:8])))
        st.info(f"The host-gather roofline was not measured at commit {md_text(commit)} here; it was at "
                f"{md_text(others)}: pick one above.")
        return
    st.markdown("**Where each path leaves the floor**: gather and write-back as % of the pinned copy in the same "
                "direction, timed in the same process; one axis at a time around the suite's point (on every "
                f"axis). Dotted: {GOAL:.0f} %, the target. Hover a point for its GB/s, the floor's, and the bytes "
                "a row costs on the bus.")
    paths = here[here["suite"] == "Roofline"]
    colours = {"domain": roofline.variant_order(here["variant"]), "scheme": "tableau10"}  # one colour a path, tab-wide
    axes = [a for a in roofline.AXES if not roofline.along(paths, a).empty]
    for pair in (axes[i:i + 2] for i in range(0, len(axes), 2)):  # side by side; one under the other on a phone
        for column, axis in zip(st.columns(2), pair, strict=False):
            with column:
                for direction in DIRECTIONS:
                    st.vega_lite_chart(None, _axis_spec(roofline.along(paths, axis), axis, where, colours, direction),
                                       width="stretch", key=f"roofline-{axis}-{direction[0]}")
    hypotheses = here[here["suite"] == "RooflineHypotheses"]
    if not hypotheses.empty:
        st.markdown("**The uva kernel's hypotheses** beside plain uva, measured in the same process: sorted indices, "
                    "the table in 2 MiB pages, whole-line reads, 4 KiB and 64 KiB in flight per program.")
        for direction in DIRECTIONS:
            st.vega_lite_chart(None, _hypotheses_spec(hypotheses, where, colours, direction), width="stretch",
                               key=f"roofline-hypotheses-{direction[0]}")
    table(roofline.roofline_table(rows[rows["commit"].str[:8] == commit]), hide=hide)


def _points(g: pd.DataFrame, x, direction: tuple) -> list[dict]:
    """A chart's points, each with its hover in the table's own words (GB/s, the floor's, the bus
    bytes a row costs and the row's share of them)."""
    column, _, gbps, floor, bus, useful = direction
    return [{"x": x_, "variant": str(v), "value": float(y), "gbps": f"{a:.1f} GB/s", "floor": f"{b:.1f} GB/s",
             "bus": f"{c:.4g} B", "share": f"{d:.1f} %"}
            for x_, v, y, a, b, c, d in zip(x, g["variant"], g[column], g[gbps], g[floor], g[bus], g[useful],
                                            strict=True) if pd.notna(y)]


_TIP = [{"field": "variant", "title": "path"}, {"field": "value", "format": ".1f", "title": "% of floor"},
        {"field": "gbps", "title": "achieved"}, {"field": "floor", "title": "floor"},
        {"field": "bus", "title": "bus bytes a row"}, {"field": "share", "title": "row's share"}]


def _spec(title: str, where: str, direction: tuple, points: list[dict], x: dict, mark: list[dict],
          colours: dict) -> dict:
    """A chart of one direction: `mark`'s layers over `points`, the goal dotted across, a colour per path."""
    y = {"field": "value", "type": "quantitative", "title": "% of floor", "scale": {"zero": True}}
    goal = {"mark": {"type": "rule", "strokeDash": [2, 3], "color": "gray"}, "encoding": {"y": {"datum": GOAL}}}
    drawn = {p["variant"] for p in points}  # the legend names this chart's paths, coloured as in the others
    colour = {"field": "variant", "type": "nominal", "sort": colours["domain"], "scale": colours,
              "legend": {"values": [v for v in colours["domain"] if v in drawn], **COLUMNS}}
    tip = [{"field": "x", "title": x["title"] or "point"}, *_TIP]
    return {"$schema": SCHEMA, "data": {"values": points}, "width": "container", "height": 240, "autosize": FIT,
            # what, the direction and the machine on lines of their own: a phone cuts one long line
            "title": heading(title, (direction[1], where)), "config": {"legend": {**LEGEND, "orient": "bottom"}},
            # x in each layer, not shared: the goal's line crosses the whole chart
            "layer": [{**m, "encoding": {"x": x, "y": y, "color": colour, "tooltip": tip, **m["encoding"]}}
                      for m in mark] + [goal]}


def _axis_spec(on: pd.DataFrame, axis: str, where: str, colours: dict, direction: tuple) -> dict:
    """One axis in one direction: a line per path."""
    title = roofline.AXES[axis]
    if axis == "order":
        x = {"field": "x", "type": "nominal", "sort": list(roofline.ORDERS), "title": title, "axis": {"labelAngle": 0}}
        xs = [str(v) for v in on["x"]]
    else:  # rows, bytes and GB over decades, each tick the value measured
        ticks = sorted(set(on["x"]))
        said = {_key(v): _tick(axis, v) for v in ticks}
        x = {"field": "x", "type": "quantitative", "title": title, "scale": {"type": "log"},
             "axis": {"values": ticks, "labelExpr": f"{json.dumps(said)}[toString(datum.value)] || datum.label"}}
        xs = [float(v) for v in on["x"]]
    lines = [{"mark": {"type": "line", "point": True}, "encoding": {}}]
    return _spec(title.split(" (")[0], where, direction, _points(on, xs, direction), x, lines, colours)


def _key(value: float) -> str:
    """A number as JavaScript's toString writes it (an integer without its '.0')."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _tick(axis: str, value: float) -> str:
    if axis == "row":
        return f"{value / 1024:g} KiB" if value >= 1024 else f"{value:g} B"
    if axis == "batch":
        return f"{value / 2**20:g}M" if value >= 2**20 else f"{value / 1024:g}k" if value >= 1024 else f"{value:g}"
    return f"{value:g}"


def _hypotheses_spec(h: pd.DataFrame, where: str, colours: dict, direction: tuple) -> dict:
    """Each hypothesis at each of its points, in one direction: grouped bars."""
    points = sorted(dict.fromkeys(h["point"]), key=roofline.point_order)
    label = {p: ("default" if p.startswith("default") else p) for p in points}
    rows = h[h[direction[0]].notna()]
    x = {"field": "x", "type": "nominal", "sort": [label[p] for p in points], "title": None,
         "axis": {"labelAngle": -30, "labelLimit": 200}}
    bars = [{"mark": {"type": "bar"}, "encoding": {"xOffset": {"field": "variant", "sort": colours["domain"]}}}]
    return _spec("the uva kernel's hypotheses", where, direction, _points(rows, [label[p] for p in rows["point"]],
                                                                          direction), x, bars, colours)
