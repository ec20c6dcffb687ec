"""The at-a-glance chart: technique x machine, one number per cell (headline.glance), coloured
by value. The dashboard's Overview, the static site (speedlib publish) and the docs' image all
draw this one figure, so every copy shows the numbers of `speedlib report --table headline`.

Each cell: the ratio in bold, its interval below, the marks (‡ contended, † earlier benchmark
version, § GPU tests failed), and which figure it is (whole step, a part of the step, peak
memory) in italics; hovering gives the scope and the baseline in words. Colour: log of what
the technique gains (peak memory inverted, so less memory reads as a gain), diverging at 1x;
a cell without a number is grey and says why. Plotly is imported inside: no Streamlit, no torch.
"""

from __future__ import annotations

import html
import math
import textwrap

import pandas as pd

from speedbench import report

__all__ = ["figure", "label", "figure_text", "GAIN_CAP", "LEGEND", "CLICK"]

# Colour saturates at 4x either way: the flat-buffer step's 47.8x must not wash every 1.3x out.
GAIN_CAP = 4.0
# red where the technique loses, white at 1x, blue where it gains (readable by red-green colour-blind readers)
_SCALE = [[0.0, "#b2182b"], [0.25, "#ef8a62"], [0.5, "#f7f7f7"], [0.75, "#67a9cf"], [1.0, "#2166ac"]]
_NO_NUMBER = "#d9d9d9"


LEGEND = (f"Each cell: x faster than the baseline (PyTorch's default on that machine where measured; hover for the "
          f"scope and the baseline in words), the whole training step where measured, else the figure named in "
          f"italics; peak memory is variant / baseline. [low, high]: 99 % interval. {report.CONTENDED} contended, "
          f"{report.EARLIER} earlier benchmark version, {report.GPU_TESTS_FAILED} GPU tests failed.")
CLICK = "A click on a cell opens its technique's page."


def label(r) -> str:
    """Which figure a cell shows, in a few words: "whole step", "Adam step alone", "peak memory"."""
    if r.measure == "peak memory":
        return "peak memory"
    if r.part == "whole step" or str(r.scope).startswith("whole"):
        return "whole step" + ("" if r.paired else ", not paired")
    return str(r.scope).split(" (")[0] + ("" if r.paired else ", not paired")


def _marks(r) -> str:
    marks = [report.CONTENDED if r.contended is True else "", report.EARLIER if r.earlier_version is True else "",
             report.GPU_TESTS_FAILED if r.gpu_tests_failed is True else ""]
    return " ".join(m for m in marks if m)


def figure_text(r) -> str:
    """A cell's number as the grid writes it, with its marks: "5.65x [5.39, 6.61] †"."""
    if r.status != "measured":
        return ""
    low, high = (None, None) if pd.isna(r.low) else (r.low, r.high)
    return f"{report.fmt_ratio(r.ratio, low, high)} {_marks(r)}".strip()


def _cell(r) -> str:
    if r.status != "measured":
        return "needs a GPU" if r.status == "needs a GPU" else "not measured yet"
    ratio = report.fmt_ratio(r.ratio, None, None)
    marks = _marks(r)
    if pd.isna(r.low):  # no interval (an exact count, or one value each): the marks beside the ratio
        return f"<b>{ratio}</b> {marks}".rstrip() + f"<br><i>{html.escape(label(r))}</i>"
    return f"<b>{ratio}</b><br>[{r.low:.3g}, {r.high:.3g}] {marks}".rstrip() + f"<br><i>{html.escape(label(r))}</i>"


def _hover(r) -> str:
    e = html.escape
    head = f"<b>{e(r.title)}</b> on {e(r.machine)} ({e(str(r.gpu))})"
    if r.status != "measured":
        return f"{head}<br>{e(r.status)}"
    what = "memory, variant / baseline (exact count)" if r.measure == "peak memory" else "x faster than the baseline"
    n = "" if pd.isna(r.n) else f" N={r.n:g}" + ("" if r.paired else " each, not paired")
    case = f"<br>case: {e(str(r.case))}" if isinstance(r.case, str) and r.case else ""
    words = f" ({e(str(r.baseline_words))})" if isinstance(r.baseline_words, str) and r.baseline_words else ""
    return (f"{head}<br>scope: {e(str(r.scope))}<br>{e(figure_text(r))}{n} ({what})<br>"
            f"vs {e(str(r.baseline_name))}{words}{case}")


def _gain(r) -> float:
    """The colour's value: log2 of what the technique gains, capped; NaN where no number."""
    if r.status != "measured" or pd.isna(r.ratio) or r.ratio <= 0 or not math.isfinite(r.ratio):
        return math.nan
    gain = 1 / r.ratio if r.measure == "peak memory" else r.ratio
    return max(-1.0, min(1.0, math.log(gain) / math.log(GAIN_CAP)))


def _wrap(text: str, width: int = 22) -> str:
    return "<br>".join(textwrap.wrap(html.escape(text), width, break_long_words=False)) or html.escape(text)


# The narrowest the chart is drawn: a cell needs about 150 px for "[0.994, 1.03] †"; a phone scrolls it sideways.
MIN_WIDTH = 220 + 150 * 4


def figure(picks: pd.DataFrame, height: int | None = None):
    """The chart of `headline.glance(df)`'s rows: techniques down (in the records' order),
    machines across (as given: GPU machines first); customdata[0] is each cell's technique."""
    import plotly.graph_objects as go  # noqa: PLC0415 - a viewer's import, kept out of `import speedbench`

    techniques = list(dict.fromkeys(picks["technique"]))
    machines = list(dict.fromkeys(picks["machine"]))
    titles = dict(zip(picks["technique"], picks["title"], strict=True))
    gpus = dict(zip(picks["machine"], picks["gpu"].astype(str), strict=True))
    y = [_wrap(titles[t]) for t in techniques]
    x = [f"{html.escape(m)}<br>{html.escape(gpus[m])}" for m in machines]
    at = {(r.technique, r.machine): r for r in picks.itertuples()}
    z = [[_gain(at[t, m]) if (t, m) in at else math.nan for m in machines] for t in techniques]
    grey = [[0.0 if math.isnan(v) else math.nan for v in row] for row in z]
    fig = go.Figure()
    # grey under every cell that has no number (the coloured heatmap leaves NaN cells empty)
    fig.add_trace(go.Heatmap(z=grey, x=x, y=y, colorscale=[[0, _NO_NUMBER], [1, _NO_NUMBER]], showscale=False,
                             hoverinfo="skip", xgap=3, ygap=3))
    ticks = [1 / 4, 1 / 2, 1, 2, 4]
    fig.add_trace(go.Heatmap(
        z=z, x=x, y=y, zmin=-1, zmax=1, colorscale=_SCALE, xgap=3, ygap=3, hoverinfo="skip",
        colorbar=dict(title=dict(text="gain", side="right"), thickness=12, len=0.8,
                      tickvals=[math.log(t) / math.log(GAIN_CAP) for t in ticks],
                      ticktext=[f"{t:g}x" for t in ticks[:-1]] + [f"≥{ticks[-1]:g}x"])))
    # one point per cell on top: its text, its hover, and what a click opens (heatmaps cannot be selected)
    cells = [(t, m, at[t, m]) for t in techniques for m in machines if (t, m) in at]
    fig.add_trace(go.Scatter(
        x=[x[machines.index(m)] for _, m, _ in cells], y=[y[techniques.index(t)] for t, _, _ in cells],
        mode="markers+text", text=[_cell(r) for _, _, r in cells], textfont=dict(size=13, color="#111"),
        marker=dict(symbol="square", size=56, color="rgba(0,0,0,0)"),
        hovertext=[_hover(r) for _, _, r in cells], hoverinfo="text",
        customdata=[[t, m] for t, m, _ in cells], showlegend=False))
    fig.update_layout(
        height=height or 90 + 68 * len(techniques), margin=dict(l=10, r=10, t=50, b=4),
        xaxis=dict(side="top", fixedrange=True, type="category"),
        yaxis=dict(autorange="reversed", fixedrange=True, type="category"),
        plot_bgcolor="white", dragmode=False, clickmode="event+select", hoverlabel=dict(align="left"))
    return fig
