"""The History page's chart as a Vega-Lite spec: one benchmark's value at each commit, a line per
machine, parameters and environment, its 99 % interval as an error bar, significant changes and
the first commits of sustained steps marked (report.history computes both). Vega-Lite, not
plotly: a new tab loads Streamlit's Vega-Lite code in a fraction of plotly.js's 1.5 s (issue 51).
No Streamlit."""

from __future__ import annotations

import json

import pandas as pd

from speedbench.report.ticks import log_span
from speedbench.report.vega import FIT, SCHEMA, number
from speedbench.results.machines import describe, environment_keys

__all__ = ["spec", "commit_labels", "environments", "MARKS"]

# What report.history found at a commit, and its shape (an SVG path for the x: Vega-Lite's "cross" is a plus).
MARKS = {"no change": "circle",
         "significant change": "M-.35,-.5L0,-.15L.35,-.5L.5,-.35L.15,0L.5,.35L.35,.5L0,.15L-.35,.5L-.5,.35L-.15,0"
                               "L-.5,-.35Z",
         "first commit of a step": "diamond", "significant change and first commit of a step": "square"}


def commit_labels(h: pd.DataFrame) -> dict[str, str]:
    """Each commit's label, "hash date", in commit-date order (a result file without a date is
    labelled "date unknown" and goes last): one category each, so same-day commits are not spread
    over hours and no line is drawn through a gap in time."""
    order = h.drop_duplicates("commit").sort_values("commit_date", kind="stable", na_position="last")
    return {c: f"{c[:8]} " + ("date unknown" if pd.isna(d) else f"{d:%Y-%m-%d}")
            for c, d in zip(order["commit"], order["commit_date"], strict=True)}


def _mark(significant: bool, step: bool) -> str:
    return list(MARKS)[int(significant) + 2 * int(step)]


def environments(h: pd.DataFrame) -> pd.Series:
    """How many environments (CPU, GPU, torch/CUDA build) each machine of `h` was measured in."""
    return _counted(h.assign(_environment=environment_keys(h)))


def _counted(keyed: pd.DataFrame) -> pd.Series:
    return keyed.groupby("machine")["_environment"].nunique()


def spec(h: pd.DataFrame, scale: float, unit: str) -> dict:
    """The chart of `h` (report.history_table(...).sources), values times `scale` in `unit`, on a
    log axis (a 10 % change looks the same at 1 ms as at 1 s) with its ticks written out."""
    labels = commit_labels(h)
    keyed = h.assign(_environment=environment_keys(h))
    several = _counted(keyed) > 1
    points = []
    # a line per environment: one drawn across a new build would read as the code's doing
    for k, ((machine, params, _), g) in enumerate(keyed.groupby(["machine", "params", "_environment"], sort=True)):
        where = f" ({describe(g.iloc[0])})" if several[machine] else ""
        for r in g.itertuples():
            low = r.ci99_low if pd.notna(r.ci99_low) else r.value
            high = r.ci99_high if pd.notna(r.ci99_high) else r.value
            points.append({"commit": labels[r.commit], "line": f"{machine}: {params}{where}", "series": k,
                           "value": number(r.value * scale), "low": number(low * scale),
                           "high": number(high * scale), "mark": _mark(bool(r.significant), bool(r.step))})
    span = log_span([v for p in points for v in (p["value"], p["low"], p["high"]) if v is not None])
    low, high, ticks = span or (0.1, 10.0, [0.1, 1.0, 10.0])
    x = {"field": "commit", "type": "nominal", "sort": list(labels.values()), "title": "commit (oldest left)",
         "axis": {"labelAngle": -30, "labelLimit": 160}}
    y = {"field": "value", "type": "quantitative", "title": f"{unit} (log scale)",
         "scale": {"type": "log", "domain": [low, high], "clamp": True},
         "axis": {"values": ticks, "format": "~g", "grid": True}}
    line = {"field": "line", "type": "nominal", "title": None,
            # under the chart, the machine over its parameters: beside it or on one line, a phone cut them off
            "legend": {"orient": "bottom", "direction": "vertical", "labelLimit": 0, "columns": 1,
                       "labelExpr": "split(replace(datum.label, ': ', ':\\n'), '\\n')"}}
    tooltip = [{"field": "line"}, {"field": "commit"}, {"field": "value", "format": ".4g", "title": unit},
               {"field": "low", "format": ".4g", "title": "99 % interval from"},
               {"field": "high", "format": ".4g", "title": "to"}, {"field": "mark"}]
    on_axis = {"filter": "datum.value > 0"}  # a log axis has no 0: clamped, it sat on the floor as a value
    return {
        "$schema": SCHEMA,
        "data": {"values": points}, "width": "container", "height": 380,
        # Streamlit's default ("fit") took the legend's lines out of the 380 px and left a flat plot
        "autosize": FIT,
        "encoding": {"x": x, "color": line},
        "layer": [
            {"mark": {"type": "rule"}, "transform": [{"filter": "datum.high > 0"}],
             "encoding": {"y": {**y, "field": "low"}, "y2": {"field": "high"}, "detail": {"field": "series"}}},
            {"mark": {"type": "line"}, "transform": [on_axis], "encoding": {"y": y, "detail": {"field": "series"}}},
            {"mark": {"type": "point", "filled": True, "opacity": 1}, "transform": [on_axis],
             "encoding": {"y": y, "tooltip": tooltip,
                          "shape": {"field": "mark", "type": "nominal", "legend": None,
                                    "scale": {"domain": list(MARKS), "range": list(MARKS.values())}},
                          "size": {"condition": {"test": f"datum.mark == {json.dumps(list(MARKS)[0])}", "value": 40},
                                   "value": 150}}},
        ],
    }
