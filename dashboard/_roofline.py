"""The transfer page's Roofline tab: where each host-table path leaves the pinned-copy floor, one
axis at a time, and what the 'uva' kernel's hypotheses change (speedbench.report.roofline gives
every number; this module only draws them). Before a GPU has run the chunk it says so, with the
command that measures it."""

from __future__ import annotations

import html

import pandas as pd
import plotly.colors
import plotly.graph_objects as go
import streamlit as st
from _tables import caption, md_text, table
from plotly.subplots import make_subplots

from speedbench.report import roofline
from speedbench.report.charts import esc

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
    colours = _colours(here["variant"])
    axes = [a for a in roofline.AXES if not roofline.along(paths, a).empty]
    for pair in (axes[i:i + 2] for i in range(0, len(axes), 2)):  # side by side; one under the other on a phone
        for column, axis in zip(st.columns(2), pair, strict=False):
            with column:
                st.plotly_chart(_axis_chart(roofline.along(paths, axis), axis, where, colours), key=f"roofline-{axis}")
    hypotheses = here[here["suite"] == "RooflineHypotheses"]
    if not hypotheses.empty:
        st.markdown("**The uva kernel's hypotheses** beside plain uva, measured in the same process: sorted indices, "
                    "the table in 2 MiB pages, whole-line reads, 4 KiB and 64 KiB in flight per program.")
        st.plotly_chart(_hypotheses_chart(hypotheses, where, colours), key="roofline-hypotheses")
    table(roofline.roofline_table(rows[rows["commit"].str[:8] == commit]), hide=hide)


def _hover(g: pd.DataFrame, gbps: str, floor: str, bus: str, useful: str) -> dict:
    """A point's hover: the table's own words for it (GB/s, floor GB/s, bus bytes, row's share)."""
    texts = [[html.escape(f"{a:.1f} GB/s"), html.escape(f"{b:.1f} GB/s"), html.escape(f"{c:.4g} B"),
              html.escape(f"{d:.1f} %")] for a, b, c, d in zip(g[gbps], g[floor], g[bus], g[useful], strict=True)]
    return {"customdata": texts,
            "hovertemplate": "%{x}: %{y:.1f} %<br>%{customdata[0]} of a %{customdata[1]} floor<br>"
                             "bus bytes a row %{customdata[2]} (row's share %{customdata[3]})<extra></extra>"}


def _colours(variants) -> dict[str, str]:
    """One colour per variant in every chart of the tab, in the record's order."""
    palette = plotly.colors.qualitative.Dark24
    return {v: palette[k % len(palette)] for k, v in enumerate(roofline.variant_order(variants))}


def _title(what: str, where: str) -> str:
    """A chart's title: what, and the machine in smaller type under it (a phone cuts one long line)."""
    return f"{html.escape(what)}<br><sup>{html.escape(where)}</sup>"


def _axis_chart(on: pd.DataFrame, axis: str, where: str, colours: dict[str, str]) -> go.Figure:
    """One axis: gather (top) and write-back (bottom), a line per path."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[html.escape(d[1]) for d in DIRECTIONS])
    for variant in roofline.variant_order(on["variant"]):
        g = on[on["variant"] == variant]
        x = esc(g["x"]) if axis == "order" else list(g["x"])
        for r, (column, _, gbps, floor, bus, useful) in enumerate(DIRECTIONS, start=1):
            fig.add_trace(go.Scatter(x=x, y=g[column], mode="lines+markers", name=html.escape(str(variant)),
                                     legendgroup=str(variant), showlegend=r == 1, line={"color": colours[variant]},
                                     **_hover(g, gbps, floor, bus, useful)), row=r, col=1)
    for r in (1, 2):
        fig.add_hline(y=GOAL, line_dash="dot", line_color="gray", row=r, col=1)
        fig.update_yaxes(title_text="% of floor", rangemode="tozero", row=r, col=1)
    if axis != "order":  # rows, bytes and GB over decades
        fig.update_xaxes(type="log", tickvals=sorted(set(on["x"])), ticktext=[_tick(axis, v) for v in
                                                                                sorted(set(on["x"]))])
    fig.update_xaxes(title_text=html.escape(roofline.AXES[axis]), row=2, col=1)
    fig.update_layout(title=_title(roofline.AXES[axis].split(" (")[0], where), height=540,
                      margin={"t": 90}, legend={"orientation": "h", "y": -0.25})
    return fig


def _tick(axis: str, value: float) -> str:
    if axis == "row":
        return f"{value / 1024:g} KiB" if value >= 1024 else f"{value:g} B"
    if axis == "batch":
        return f"{value / 2**20:g}M" if value >= 2**20 else f"{value / 1024:g}k" if value >= 1024 else f"{value:g}"
    return f"{value:g}"


def _hypotheses_chart(h: pd.DataFrame, where: str, colours: dict[str, str]) -> go.Figure:
    """Each hypothesis at each of its points: grouped bars, gather (top) and write-back (bottom)."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=[html.escape(d[1]) for d in DIRECTIONS])
    points = sorted(dict.fromkeys(h["point"]), key=roofline.point_order)
    label = {p: ("default" if p.startswith("default") else p) for p in points}
    for variant in roofline.variant_order(h["variant"]):
        g = h[h["variant"] == variant].set_index("point").reindex(points).dropna(subset=["gather", "scatter"],
                                                                                 how="all").reset_index()
        for r, (column, _, gbps, floor, bus, useful) in enumerate(DIRECTIONS, start=1):
            fig.add_trace(go.Bar(x=esc(g["point"].map(label)), y=g[column], name=html.escape(str(variant)),
                                 legendgroup=str(variant), showlegend=r == 1, marker_color=colours[variant],
                                 **_hover(g, gbps, floor, bus, useful)), row=r, col=1)
    for r in (1, 2):
        fig.add_hline(y=GOAL, line_dash="dot", line_color="gray", row=r, col=1)
        fig.update_yaxes(title_text="% of floor", rangemode="tozero", row=r, col=1)
    fig.update_layout(title=_title("the uva kernel's hypotheses", where), barmode="group", height=580,
                      margin={"t": 90}, legend={"orientation": "h", "y": -0.15})
    return fig
