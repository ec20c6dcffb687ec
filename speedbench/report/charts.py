"""The static site's plotly charts: every sample as boxes, ratios as bars from the 1x line, values
as bars grouped by configuration, log axes with their ticks written out (the at-a-glance chart:
speedbench.report.glance); every label from a result file HTML-escaped. What each chart draws
comes from speedbench.report.chart_rows, as the dashboard's Vega-Lite charts' does
(speedbench.report.vega): the same bars, marks and notes in both."""

from __future__ import annotations

import html
import math

import pandas as pd
import plotly.colors
import plotly.graph_objects as go

from speedbench.report.chart_rows import ratio_bars, ratio_notes, ratio_span, sample_scale, samples, value_rows
from speedbench.report.ticks import log_span

__all__ = ["esc", "spread_chart", "ratio_chart", "log_axis", "bars"]

# How plotly draws each marked ratio bar, in the words of the note under the chart.
LOOKS = {"unsure": "hollow dotted bar, outlined in its colour", "lone": "hatched bar", "busy": "cross-hatched bar"}


def esc(values) -> list[str]:
    return [html.escape(str(v)) for v in values]


def spread_chart(rows: pd.DataFrame, title: str) -> go.Figure:
    """Every timed sample per variant (box + points), one box per configuration, so the spread is
    visible, not just a bar. Log scale: workloads differ by orders of magnitude."""
    fig = go.Figure()
    _, unit = sample_scale(rows)
    every = samples(rows)
    for variant, g in every.groupby("variant", sort=True):
        fig.add_trace(go.Box(x=esc(g["config"]), y=list(g["value"]), name=html.escape(str(variant)), boxpoints="all",
                             jitter=0.3))
    # Ticks written out (plotly's own log ticks read "1000, 5, 2, 100, 5, 2, 10").
    fig.update_layout(title=html.escape(title), boxmode="group", height=420, margin={"t": 50},
                      yaxis=log_axis(list(every["value"]), unit))
    return fig


# plotly's own first colours, given to the ratio bars' traces in order (a hollow bar needs its trace's colour)
_PALETTE = plotly.colors.qualitative.Plotly


def ratio_chart(s: pd.DataFrame, y: str, color: str, title: str, axis: str = "x faster than the baseline",
                exact: bool = False) -> go.Figure:
    """Ratios with their interval as error bars, one horizontal bar per row of `s` labelled by
    its `y` column, one colour per `color` value; the dashed line at 1x is the baseline.
    `axis` says what a ratio is; `exact`: counts (bytes), which need no interval, so a bar
    without one is not marked as unsure.

    Horizontal: the labels name a configuration in words ("densenet121, batch=16 / reentrant vs
    none"), and two dozen of them under a vertical chart overlapped diagonally. A label repeated
    within a trace would draw two configurations as one stacked bar (a tuning page once showed
    four knobs' 0.43x-1.29x as one 3.9x bar), so the caller's labels must tell every row apart,
    and a repeat is refused."""
    fig = go.Figure()
    groups = ratio_bars(s, y, color, exact)
    for i, (name, g) in enumerate(groups):
        # Each bar grows from the 1x line (right: faster, left: slower), not from the edge of a
        # log axis, where a 0.7x bar would look as long as a win.
        # Hollow, dotted and outlined in its trace's colour: the interval includes 1x, so the bar
        # is not told apart from the baseline (a faded bar read as another machine's lighter colour).
        # Hatched: no interval at all (one value per variant, not paired), so nothing says how
        # sure it is; drawn solid, a single DDP launch looked as certain as 30 paired rounds.
        # Cross-hatched: contended, measured while other work kept the machine busy; shown, never
        # as solid as a clean figure (the tables carry the same mark, ‡, and its counters). A
        # commit whose GPU tests failed there is marked § beside its bar, as in the tables.
        unsure, lone, busy = g["unsure"].tolist(), g["lone"].tolist(), g["busy"].tolist()
        ink = _PALETTE[i % len(_PALETTE)]  # set, not left to plotly: a hollow bar is outlined in it
        fig.add_trace(go.Bar(
            y=esc(g["label"]), x=g["ratio"] - 1.0, base=1.0, orientation="h", name=html.escape(name),
            marker={"color": ["white" if u else ink for u in unsure],
                    "line": {"color": ink, "width": [2 if u else 0 for u in unsure]},
                    "pattern": {"shape": ["x" if b else "/" if x else "." if u else ""
                                          for x, b, u in zip(lone, busy, unsure, strict=True)],
                                "fgcolor": [ink if u else "#444" for u in unsure], "solidity": 0.3}},
            # the mark itself beside a contended bar: a faded, hatched bar alone can be hard to see
            text=list(g["marks"]), textposition="outside", cliponaxis=False,
            customdata=list(zip(g["ratio"], g["interval"], g["n"], g["said"], strict=True)),
            hovertemplate="%{y}: %{customdata[0]:.3g}x %{customdata[1]} %{customdata[2]} %{customdata[3]}"
                          "<extra>%{fullData.name}</extra>",
            error_x={"type": "data", "symmetric": False, "array": (g["high"] - g["ratio"]).fillna(0),
                     "arrayminus": (g["ratio"] - g["low"]).fillna(0)}))
    fig.add_vline(x=1.0, line_dash="dash")
    legend = ratio_notes(s, exact, LOOKS)
    if legend:
        # Below the axis title: above the bars, the legend's row sits (and the title above it).
        fig.add_annotation(text="<br>".join(legend), xref="paper", yref="paper", x=0, y=0, yanchor="top",
                           yshift=-48, showarrow=False, xanchor="left", align="left")
    # Log scale with ticks at 1-2-5 steps written as ratios (plotly's own log ticks read "1, 2,
    # 5, 10, 2, 5, 100"); plotly hides ticks outside its range.
    low, high, ticks = ratio_span(s)
    labels = sorted({html.escape(str(v)) for v in s[y]})
    # A bar slot per label and trace, so that a chart of 24 configurations is as legible as one of 2.
    # showlegend: plotly hides the legend of a single trace, and the trace names the machine:
    # a CPU-only chart beside a CPU-and-GPU one read as GPU results.
    fig.update_layout(title={"text": html.escape(title), "y": 0.99, "yref": "container", "yanchor": "top"},
                      showlegend=True, barmode="group", height=170 + 24 * len(labels) * max(len(groups), 1),
                      margin={"t": 90, "b": 80}, legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0},
                      xaxis={"type": "log", "title": html.escape(f"{axis} (log scale)"), "tickvals": ticks,
                             "ticktext": [f"{t:g}x" for t in ticks], "range": [math.log10(low), math.log10(high)]},
                      # first label on top, as a table reads
                      yaxis={"type": "category", "categoryorder": "array", "categoryarray": labels[::-1],
                             "automargin": True})
    return fig


def log_axis(values, title: str) -> dict:
    """A plotly log y-axis over `values` with its ticks written out (plotly's own log ticks
    read "2 3 4 ... 9 100", where the 7 stands for 70)."""
    span = log_span(values)
    if span is None:
        return {"type": "log", "title": html.escape(title)}
    low, high, ticks = span
    return {"type": "log", "title": html.escape(title), "tickvals": ticks, "ticktext": [f"{t:g}" for t in ticks],
            "range": [math.log10(low), math.log10(high)]}


def bars(rows, unit: str, where: str = "", hover: tuple[tuple[str, str], ...] = ()) -> go.Figure:
    """One bar per variant, grouped by configuration (metric, workload, batch) so that each
    variant stands beside its own baseline; never two configurations in one bar. Titled
    with what is measured (gather and write-back charts looked alike without one). `hover`:
    (label, column) pairs whose text each bar's hover shows, as the table beside it does."""
    fig = go.Figure()
    rows, scale, unit, metrics = value_rows(rows, unit)
    # plotly's default palette has ten colours; checkpointing has five variants, transfer six.
    palette = plotly.colors.qualitative.Dark24
    for i, (variant, g) in enumerate(rows.groupby("variant", sort=True)):
        said = {}
        if hover:  # plotly's own hover would round the value its own way, and knows no GB/s
            said = {"customdata": [[html.escape(str(t)) for t in texts]
                                   for texts in zip(*(g[c] for _, c in hover), strict=True)],
                    "hovertemplate": "<br>".join([f"{html.escape(str(variant))}: %{{x}}",
                                                  *(f"{label}: %{{customdata[{k}]}}" for k, (label, _) in
                                                    enumerate(hover))]) + "<extra></extra>"}
        if "%" in unit:  # each bar's figure on it: on a linear axis beside a 734 % bar, a 6.6 % one is a line
            said = {**said, "textposition": "outside", "text": [html.escape(str(t)) for t in g["achieved_text"]]
                    if "achieved_text" in g else [f"{v:.1f} %" for v in g["value"] * scale]}  # as the table says it
        fig.add_trace(go.Bar(x=[html.escape(str(v)) for v in g["_config"]], y=g["value"] * scale,
                             name=html.escape(str(variant)), marker_color=palette[i % len(palette)], **said))
    # Log y for bytes: configurations differ by orders of magnitude (DenseNet-121 at batch 256
    # against a transformer at 64), and on a linear axis the small ones vanish. Linear for a %
    # (of a floor): a bar's length is then its share, where on a log axis 11 % against 38.8 %
    # was drawn about 1:10.
    title = metrics + (f", {where}" if where else "")
    axis = {"title": html.escape(unit), "rangemode": "tozero"} if "%" in unit else \
        log_axis(list(rows["value"] * scale), f"{unit} (log scale)")
    fig.update_layout(title=html.escape(title), barmode="group", height=420, margin={"t": 50}, showlegend=True,
                      yaxis=axis)
    return fig
