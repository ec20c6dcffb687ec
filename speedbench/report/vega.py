"""The dashboard's ratio, sample and value charts as Vega-Lite specs: ratios as bars from the 1x
line, every sample as boxes and points, values as bars grouped by configuration. Vega-Lite, not
plotly: a page with one plotly chart loads all of plotly.js, 1.5-2 s of a new tab (issue 51). The
bars, marks and notes are speedbench.report.chart_rows', as the static site's plotly charts'
(speedbench.report.charts). Labels are SVG text, never markup. No Streamlit."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pandas as pd

from speedbench.report.chart_rows import ratio_bars, ratio_notes, ratio_span, sample_scale, samples, value_rows
from speedbench.report.ticks import log_span

__all__ = ["ratio_spec", "spread_spec", "bars_spec", "LOOKS", "SCHEMA", "FIT", "LEGEND", "COLUMNS", "heading",
           "number"]

SCHEMA = "https://vega.github.io/schema/vega-lite/v6.json"
# How these charts draw each marked ratio bar, in the words of the notes above the bars: Vega-Lite
# has no hatching, so a pale fill and a dashed outline stand for it.
LOOKS = {"unsure": "hollow bar, a dotted outline in its colour", "lone": "pale bar, dashed outline",
         "busy": "palest bar, dashed outline"}
LEGEND = {"orient": "top", "direction": "horizontal", "title": None, "labelLimit": 0}  # above the chart
# Entries a row: four, two on a phone (eight transfer paths in one row, then four, ran off its screen).
COLUMNS = {"columns": {"expr": "containerSize()[0] < 700 ? 2 : 4"}}
# A chart's width is its container's; the legend and notes take what they need under it.
FIT = {"type": "fit-x", "contains": "padding"}


def number(v) -> float | None:
    return float(v) if pd.notna(v) and math.isfinite(v) else None  # JSON has no NaN


def heading(text: str, notes: tuple[str, ...] = ()) -> dict:
    """A chart's title over its whole width, labels included, in lines a phone's width holds (Vega-Lite
    neither wraps a title nor an axis title: at 390 px both were cut off), `notes` under it."""
    return {"text": textwrap.wrap(text, 48), "anchor": "start", "frame": "bounds", "fontSize": 15,
            "subtitle": [line for note in notes for line in textwrap.wrap(note, 56, subsequent_indent="  ")],
            "subtitleFontSize": 12, "subtitlePadding": 6}


# A ratio chart's labels: up to 320 px, and under half its width (on a phone 320 px left the bars no room).
_LABEL_PX = "clamp(containerSize()[0] * 0.45, 100, 320)"
# On a phone a label goes on two lines at its first " / ", its configuration over its variant: cut at the
# end, labels that differ in their variant alone read alike (Machines at 390 px).
_NARROW = "containerSize()[0] < 700"
_SLASH = "indexof(datum.label, ' / ')"
_TWO_LINES = (f"{_NARROW} && {_SLASH} > 0 ? [substring(datum.label, 0, {_SLASH}), "
              f"substring(datum.label, {_SLASH} + 3)] : datum.label")


def ratio_spec(s: pd.DataFrame, y: str, color: str, title: str, axis: str = "x faster than the baseline",
               exact: bool = False) -> dict:
    """Ratios with their interval as error bars, one horizontal bar per row of `s` labelled by its
    `y` column, one colour per `color` value; the dashed line at 1x is the baseline. `axis` says
    what a ratio is; `exact`: counts (bytes), which need no interval. Each bar grows from the 1x
    line (right: faster, left: slower), not from the edge of the log axis, where a 0.7x bar would
    look as long as a win. Horizontal: labels name a configuration in words, and two dozen under
    a vertical chart overlapped."""
    groups = ratio_bars(s, y, color, exact)
    bars = []
    for name, g in groups:
        for r in g.itertuples():
            ratio, low, high = number(r.ratio), number(r.low), number(r.high)
            bars.append({"label": r.label, "group": name, "ratio": ratio, "low": low, "high": high,
                         "unsure": bool(r.unsure), "lone": bool(r.lone), "busy": bool(r.busy), "marks": r.marks,
                         # the marks beside the bar's far end, or beside the 1x line for a slowdown
                         "marks_at": max(v for v in (ratio, high, 1.0) if v is not None),
                         "figure": "" if ratio is None else f"{ratio:.3g}x", "interval": r.interval, "n": r.n,
                         "said": r.said})
    low, high, ticks = ratio_span(s)
    labels = sorted({b["label"] for b in bars})  # first label on top, as a table reads
    names = [name for name, _ in groups]
    # the domain: every label keeps its row, a ratio over 0 (no bar) too, as in the site's chart
    along = {"field": "label", "type": "nominal", "sort": labels, "scale": {"domain": labels}, "title": None,
             "axis": {"labelLimit": {"expr": _LABEL_PX}, "labelExpr": _TWO_LINES,
                      "labelFontSize": 11}}  # a font set by an expression cost Machines 0.2-0.3 s a new tab
    offset = {"field": "group", "type": "nominal", "sort": names}
    # one colour per group, in fill and outline alike: a hollow bar is outlined in its group's colour
    # Every chart names its machine: a CPU-only chart beside a CPU-and-GPU one read as GPU results. One
    # group (a page's machine) is named under the title: a legend beside the labels ran off a phone.
    ink = {"field": "group", "type": "nominal", "scale": {"domain": names, "scheme": "tableau10"},
           "legend": COLUMNS if len(names) > 1 else None}
    x = {"field": "ratio", "type": "quantitative", "title": [axis, "(log scale)"],  # one line was cut at 390 px
         "scale": {"type": "log", "domain": [low, high], "clamp": True, "nice": False},
         "axis": {"values": ticks, "format": "~g", "labelExpr": "datum.label + 'x'", "grid": True}}
    tooltip = [{"field": "group", "title": "where"}, {"field": "label", "title": "comparison"},
               {"field": "figure", "title": "ratio"}, {"field": "interval", "title": "99 % interval"},
               {"field": "n", "title": "rounds"}, {"field": "said", "title": "note"}]
    has = {"filter": "isValid(datum.ratio) && datum.ratio > 0"}  # a ratio over 0 (report.UNDEFINED) has no length
    return {
        # what each marked bar means, above the bars: read before them
        "$schema": SCHEMA, "title": heading(title, (*(names if len(names) == 1 else ()),
                                                    *ratio_notes(s, exact, LOOKS))),
        "data": {"values": bars}, "width": "container",
        "height": {"step": 24 * max(len(groups), 1)}, "autosize": FIT,  # two lines of a phone's label
        "config": {"legend": LEGEND},
        "layer": [
            {"mark": {"type": "bar", "strokeWidth": 2}, "transform": [has],
             "encoding": {
                 "y": along, "yOffset": offset, "x": x, "x2": {"datum": 1.0},
                 "fill": {"condition": {"test": "datum.unsure", "value": "white"}, **ink},
                 "stroke": ink,
                 "fillOpacity": {"condition": [{"test": "datum.busy", "value": 0.18},
                                               {"test": "datum.lone", "value": 0.4}], "value": 1.0},
                 "strokeDash": {"condition": [{"test": "datum.unsure", "value": [2, 2]},
                                              {"test": "datum.busy || datum.lone", "value": [6, 3]}],
                                "value": [1, 0]},
                 "strokeOpacity": {"condition": {"test": "datum.unsure || datum.busy || datum.lone", "value": 1},
                                   "value": 0},
                 "tooltip": tooltip}},
            {"mark": {"type": "rule", "color": "#333", "strokeWidth": 1.5},
             "transform": [{"filter": "isValid(datum.low) && isValid(datum.high)"}],
             "encoding": {"y": along, "yOffset": offset, "x": {**x, "field": "low"}, "x2": {"field": "high"}}},
            # the mark itself beside a contended bar: a pale bar alone can be hard to see
            {"mark": {"type": "text", "align": "left", "dx": 4, "fontSize": 13},
             "transform": [{"filter": "datum.marks != ''"}],
             "encoding": {"y": along, "yOffset": offset, "x": {**x, "field": "marks_at"},
                          "text": {"field": "marks"}}},
            {"mark": {"type": "rule", "strokeDash": [5, 4], "color": "#444"}, "encoding": {"x": {"datum": 1.0}}},
        ],
    }


def _log_axis(values: list[float]) -> tuple[float, float, list[float]]:
    """A log axis's ends and ticks over `values` (report.ticks.log_span), a decade each side of 1 where none is."""
    return log_span(values) or (0.1, 10.0, [0.1, 1.0, 10.0])


def _box(v: np.ndarray) -> dict:
    """A box's figures: extremes, median and quartiles as plotly's box (its default "linear" quartiles, which
    numpy calls "hazen"), so that the dashboard's boxes are the site's."""
    q1, median, q3 = np.percentile(v, [25, 50, 75], method="hazen")
    return {"low": number(v.min()), "q1": number(q1), "median": number(median), "q3": number(q3),
            "high": number(v.max()), "n": len(v)}


def spread_spec(rows: pd.DataFrame, title: str) -> dict:
    """Every timed sample per variant, one box per configuration and variant with every sample a
    point on it, so the spread is visible, not just a bar. Log scale: workloads differ by orders
    of magnitude. The box: quartiles, median and the extremes (every point is drawn, so no point
    is called an outlier)."""
    _, unit = sample_scale(rows)
    every = samples(rows)
    every = every[every["variant"].notna()]  # as in the site's chart, which draws a box per variant
    values = [{"kind": "box", "config": c, "variant": str(v), **_box(g.to_numpy())}
              for (c, v), g in every.groupby(["config", "variant"], sort=True)["value"]]
    values += [{"kind": "sample", "config": c, "variant": str(v), "value": number(x)}
               for c, v, x in every.itertuples(index=False)]
    low, high, ticks = _log_axis(list(every["value"]))
    configs = list(dict.fromkeys(every["config"]))
    variants = sorted({str(v) for v in every["variant"]})
    x = {"field": "config", "type": "nominal", "sort": configs, "title": None,
         "axis": {"labelAngle": -30, "labelLimit": 220}}
    offset = {"field": "variant", "type": "nominal", "sort": variants}
    ink = {"field": "variant", "type": "nominal", "title": None, "scale": {"domain": variants, "scheme": "tableau10"},
           "legend": COLUMNS}
    y = {"type": "quantitative", "title": f"{unit} (log scale)", "scale": {"type": "log", "domain": [low, high],
                                                                          "clamp": True, "nice": False},
         "axis": {"values": ticks, "format": "~g", "grid": True}}
    box = {"filter": "datum.kind == 'box'"}
    box_tip = [{"field": "variant"}, {"field": "config", "title": "configuration"},
               {"field": "median", "format": ".4g", "title": f"median, {unit}"},
               {"field": "q1", "format": ".4g", "title": "lower quartile"},
               {"field": "q3", "format": ".4g", "title": "upper quartile"},
               {"field": "low", "format": ".4g", "title": "fastest"}, {"field": "high", "format": ".4g",
                                                                       "title": "slowest"},
               {"field": "n", "title": "samples"}]
    return {
        "$schema": SCHEMA, "title": heading(title), "data": {"values": values}, "width": "container", "height": 380,
        "autosize": FIT, "config": {"legend": LEGEND},
        "encoding": {"x": x, "xOffset": offset},
        "layer": [
            {"mark": {"type": "rule"}, "transform": [box],
             "encoding": {"y": {**y, "field": "low"}, "y2": {"field": "high"}, "color": ink}},
            {"mark": {"type": "bar", "fillOpacity": 0.25, "strokeWidth": 1.5, "width": {"band": 0.8}},
             "transform": [box],
             "encoding": {"y": {**y, "field": "q1"}, "y2": {"field": "q3"}, "fill": ink,
                          "stroke": ink, "tooltip": box_tip}},
            {"mark": {"type": "tick", "thickness": 2, "width": {"band": 0.8}}, "transform": [box],
             "encoding": {"y": {**y, "field": "median"}, "color": ink}},
            {"mark": {"type": "circle", "size": 22, "opacity": 0.7},
             "transform": [{"filter": "datum.kind == 'sample'"}],
             "encoding": {"y": {**y, "field": "value"}, "color": ink,
                          "tooltip": [{"field": "variant"}, {"field": "config", "title": "configuration"},
                                      {"field": "value", "format": ".4g", "title": unit}]}},
        ],
    }


def bars_spec(rows: pd.DataFrame, unit: str, where: str = "", hover: tuple[tuple[str, str], ...] = ()) -> dict:
    """One bar per variant, grouped by configuration (metric, workload, batch) so that each variant
    stands beside its own baseline; never two configurations in one bar. Titled with what is
    measured. `hover`: (label, column) pairs whose text each bar's hover shows, as the table beside
    it does. Log axis for bytes (configurations differ by orders of magnitude); linear from zero
    for a % of a floor, each bar's figure written on it (on a log axis 11 % against 38.8 % was
    drawn about 1:10)."""
    rows, scale, unit, metrics = value_rows(rows, unit)
    rows = rows[rows["variant"].notna()]  # as in the site's chart, which draws a bar per variant
    share = "%" in unit
    values = [{"config": str(c), "variant": str(v), "value": number(x * scale),
               "figure": (str(t) if t is not None else f"{x * scale:.1f} %") if share else f"{x * scale:.4g} {unit}",
               **{label: str(r[column]) for label, column in hover}}
              for (_, r), c, v, x, t in zip(rows.iterrows(), rows["_config"], rows["variant"], rows["value"],
                                            rows["achieved_text"] if "achieved_text" in rows else [None] * len(rows),
                                            strict=True)]
    configs = list(dict.fromkeys(rows["_config"].astype(str)))
    variants = sorted({str(v) for v in rows["variant"]})
    if share:
        y = {"field": "value", "type": "quantitative", "title": unit, "scale": {"zero": True}}
        start = {"datum": 0}
    else:
        low, high, ticks = _log_axis([v["value"] for v in values if v["value"] is not None and v["value"] > 0])
        y = {"field": "value", "type": "quantitative", "title": f"{unit} (log scale)",
             "scale": {"type": "log", "domain": [low, high], "clamp": True, "nice": False},
             "axis": {"values": ticks, "format": "~g", "grid": True}}
        start = {"datum": low}  # a log axis has no 0: a bar stands on the axis's floor
    encoding = {"x": {"field": "config", "type": "nominal", "sort": configs, "title": None,
                      "axis": {"labelAngle": -30, "labelLimit": 220}},
                "xOffset": {"field": "variant", "type": "nominal", "sort": variants}}
    layers = [{"mark": {"type": "bar"}, "transform": [{"filter": "isValid(datum.value) && datum.value > 0"}],
               "encoding": {"y": y, "y2": start,
                            "color": {"field": "variant", "type": "nominal", "title": None, "legend": COLUMNS,
                                      "scale": {"domain": variants, "scheme": "tableau10"}},
                            "tooltip": [{"field": "variant"}, {"field": "config", "title": "configuration"},
                                        # the figure once: a floor's hover gives it as "achieved"
                                        *([] if "achieved_text" in dict(hover).values() else
                                          [{"field": "figure", "title": unit}]),
                                        *({"field": label} for label, _ in hover)]}}]
    if share:
        layers.append({"mark": {"type": "text", "baseline": "bottom", "dy": -3, "fontSize": 11},
                       "encoding": {"y": y, "text": {"field": "figure"}}})
    return {"$schema": SCHEMA, "title": heading(metrics + (f", {where}" if where else "")),
            "data": {"values": values}, "width": "container", "height": 380, "autosize": FIT,
            "config": {"legend": LEGEND},
            "encoding": encoding, "layer": layers}
