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

__all__ = ["figure", "svg", "lines", "label", "figure_text", "elsewhere", "colour", "GAIN_CAP", "LEGEND", "CLICK",
           "IMAGE_COMMAND"]

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


def lines(r, elsewhere: int = 0) -> list[list[tuple[str, str]]]:
    """A cell's text, line by line, each line (text, style) pieces, style "b" (bold), "i"
    (italic) or "": the dashboard's chart and the docs' image write the same lines. A cell
    without a number says why, which figure, and how many other results of the technique
    the machine has (`elsewhere`: the DDP-vs-single and CPU embedding results are on its page)."""
    if r.status != "measured":  # three lines at most: a row of the chart holds four
        why = "needs a GPU" if r.status == "needs a GPU" else "not measured yet"
        return [[(why, "")], [(label(r), "i")], *([[(f"{elsewhere} results on its page", "")]] if elsewhere else [])]
    ratio, marks = report.fmt_ratio(r.ratio, None, None), _marks(r)
    if pd.isna(r.low):  # no interval (an exact count, or one value each): the marks beside the ratio
        first = [[(ratio, "b"), *([(f" {marks}", "")] if marks else [])]]
    else:
        first = [[(ratio, "b")], [(f"[{r.low:.3g}, {r.high:.3g}] {marks}".rstrip(), "")]]
    return first + [[(w, "i")] for w in textwrap.wrap(label(r), 24)]


def _cell(r, elsewhere: int = 0) -> str:
    tags = {"b": ("<b>", "</b>"), "i": ("<i>", "</i>"), "": ("", "")}
    return "<br>".join("".join(f"{tags[style][0]}{html.escape(text)}{tags[style][1]}" for text, style in line)
                       for line in lines(r, elsewhere))


def elsewhere(df: pd.DataFrame) -> dict[tuple[str, str], int]:
    """How many results each technique has on each machine at its latest commit: a cell
    without a headline number says how many other results its page shows."""
    if df.empty:
        return {}
    return {k: int(n) for k, n in report.latest(df).groupby(["technique", "machine"]).size().items()}


def _hover(r, elsewhere: int = 0, age: str = "") -> str:
    e = html.escape
    head = f"<b>{e(r.title)}</b> on {e(r.machine)} ({e(str(r.gpu))})"
    if r.status != "measured":
        more = f"<br>{elsewhere} results of this technique on this machine: its page" if elsewhere else ""
        return f"{head}<br>{e(str(r.scope))}: {e(r.status)}{more}"
    what = "memory, variant / baseline (exact count)" if r.measure == "peak memory" else "x faster than the baseline"
    n = "" if pd.isna(r.n) else f" N={r.n:g}" + ("" if r.paired else " each, not paired")
    case = f"<br>case: {e(str(r.case))}" if isinstance(r.case, str) and r.case else ""
    words = f" ({e(str(r.baseline_words))})" if isinstance(r.baseline_words, str) and r.baseline_words else ""
    return (f"{head}<br>scope: {e(str(r.scope))}<br>{e(figure_text(r))}{n} ({what})<br>"
            f"vs {e(str(r.baseline_name))}{words}{case}" + (f"<br>{e(age)}" if age else ""))


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


def colour(gain: float) -> str:
    """The cell colour of `gain` (`_gain`: -1 to 1) on the chart's scale, interpolated as plotly
    does (linearly in RGB between its stops); grey where the cell has no number."""
    if math.isnan(gain):
        return _NO_NUMBER
    at = (gain + 1) / 2
    for (lo, a), (hi, b) in zip(_SCALE, _SCALE[1:], strict=False):  # consecutive stops
        if at <= hi:
            f = (at - lo) / (hi - lo)
            rgb = [round(int(a[i:i + 2], 16) * (1 - f) + int(b[i:i + 2], 16) * f) for i in (1, 3, 5)]
            return "#" + "".join(f"{c:02x}" for c in rgb)
    return _SCALE[-1][1]


def ink(fill: str) -> str:
    """Text colour on `fill`: white on the dark ends of the scale, near-black elsewhere."""
    r, g, b = (int(fill[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "#fff" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.45 else "#111"


def _layout(picks: pd.DataFrame) -> tuple[list[str], list[str], dict]:
    """Techniques down (in the records' order), machines across (as given: GPU machines first),
    and each cell's row by (technique, machine)."""
    techniques = list(dict.fromkeys(picks["technique"]))
    machines = list(dict.fromkeys(picks["machine"]))
    return techniques, machines, {(r.technique, r.machine): r for r in picks.itertuples()}


def figure(picks: pd.DataFrame, height: int | None = None, others: dict | None = None, ages: dict | None = None):
    """The chart of `headline.glance(df)`'s rows; customdata[0] is each cell's technique.
    `others`: `elsewhere(df)`, said in cells without a number; `ages`: (technique, machine) ->
    how far behind the checkout's HEAD the cell's commit is (speedbench.report.age), in its hover."""
    import plotly.graph_objects as go  # noqa: PLC0415 - a viewer's import, kept out of `import speedbench`

    others, ages = others or {}, ages or {}
    techniques, machines, at = _layout(picks)
    titles = dict(zip(picks["technique"], picks["title"], strict=True))
    gpus = dict(zip(picks["machine"], picks["gpu"].astype(str), strict=True))
    y = [_wrap(titles[t]) for t in techniques]
    x = [f"{html.escape(m)}<br>{html.escape(gpus[m])}" for m in machines]
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
        mode="markers+text", text=[_cell(r, others.get((t, m), 0)) for t, m, r in cells],
        textfont=dict(size=13, color=[ink(colour(_gain(r))) for _, _, r in cells]),
        marker=dict(symbol="square", size=56, color="rgba(0,0,0,0)"),
        hovertext=[_hover(r, others.get((t, m), 0), ages.get((t, m), "")) for t, m, r in cells], hoverinfo="text",
        customdata=[[t, m] for t, m, _ in cells], showlegend=False))
    fig.update_layout(
        height=height or 90 + 68 * len(techniques), margin=dict(l=10, r=10, t=50, b=4),
        xaxis=dict(side="top", fixedrange=True, type="category"),
        yaxis=dict(autorange="reversed", fixedrange=True, type="category"),
        plot_bgcolor="white", dragmode=False, clickmode="event+select", hoverlabel=dict(align="left"))
    return fig


# The image's geometry (px): the technique column, a machine's column, a text line, the margin.
_NAMES_W, _CELL_W, _LINE, _PAD = 210, 170, 16, 12
_FONT = "font-family=\"-apple-system, 'Segoe UI', Helvetica, Arial, sans-serif\""
IMAGE_COMMAND = "speedlib publish --chart docs/glance.svg"
_STYLES = {"b": ' font-weight="bold"', "i": ' font-style="italic"', "": ""}
# LEGEND without the hover (an image has none); the baselines in words are in the results page's grid.
IMAGE_LEGEND = ("Each cell: x faster than the baseline (PyTorch's default on that machine where measured), the whole "
                "training step where measured, else the figure named in italics; peak memory is variant / baseline. "
                f"[low, high]: 99 % interval. {report.CONTENDED} contended, {report.EARLIER} earlier benchmark "
                f"version, {report.GPU_TESTS_FAILED} GPU tests failed. Each baseline in words: docs/results.md, At a "
                "glance.")


def _svg_text(x: float, y: float, pieces: list[tuple[str, str]], size: int = 13, anchor: str = "middle",
              fill: str = "#111") -> str:
    spans = "".join(f"<tspan{_STYLES[style]}>{html.escape(text)}</tspan>" for text, style in pieces)
    return f'<text x="{x:g}" y="{y:g}" font-size="{size}" text-anchor="{anchor}" fill="{fill}">{spans}</text>'


def svg(picks: pd.DataFrame, others: dict | None = None) -> str:
    """The chart of `figure` as a standalone SVG image (the docs' results page and the README
    show it: `IMAGE_COMMAND` writes it from results/): the same cells, numbers, marks and
    colours, without hover or clicks. Written by hand, not by plotly's image export (kaleido
    needs a browser), so the same results give the same bytes anywhere."""
    others = others or {}
    techniques, machines, at = _layout(picks)
    titles = dict(zip(picks["technique"], picks["title"], strict=True))
    gpus = dict(zip(picks["machine"], picks["gpu"].astype(str), strict=True))
    width = 2 * _PAD + _NAMES_W + _CELL_W * len(machines)
    out, y = [], _PAD + 16
    out.append(_svg_text(_PAD, y, [("speedlib at a glance: what each technique gains, per machine", "b")], size=15,
                         anchor="start"))
    for line in textwrap.wrap(IMAGE_LEGEND, (width - 2 * _PAD) // 7):
        y += _LINE
        out.append(_svg_text(_PAD, y, [(line, "")], size=12, anchor="start", fill="#333"))
    y += 10
    head = max(len(textwrap.wrap(m, 22)) + len(textwrap.wrap(gpus[m], 24)) for m in machines) if machines else 0
    for i, m in enumerate(machines):
        cx = _PAD + _NAMES_W + _CELL_W * (i + 0.5)
        rows = [[(w, "b")] for w in textwrap.wrap(m, 22)] + [[(w, "")] for w in textwrap.wrap(gpus[m], 24)]
        out += [_svg_text(cx, y + _LINE * (k + 1), row, size=12) for k, row in enumerate(rows)]
    y += _LINE * head + 8
    for t in techniques:
        cells = {m: lines(at[t, m], others.get((t, m), 0)) for m in machines if (t, m) in at}
        height = max(4, *(len(c) for c in cells.values())) * _LINE + 12
        names = textwrap.wrap(titles[t], 26)
        top = y + (height - _LINE * len(names)) / 2 - 3
        out += [_svg_text(_PAD, top + _LINE * (k + 1), [(w, "b")], anchor="start") for k, w in enumerate(names)]
        for i, m in enumerate(machines):
            x0 = _PAD + _NAMES_W + _CELL_W * i
            fill = colour(_gain(at[t, m])) if (t, m) in at else _NO_NUMBER
            out.append(f'<rect x="{x0 + 1.5:g}" y="{y + 1.5:g}" width="{_CELL_W - 3}" height="{height - 3}" '
                       f'fill="{fill}"/>')
            text = cells.get(m, [])
            first = y + (height - _LINE * len(text)) / 2 - 3
            out += [_svg_text(x0 + _CELL_W / 2, first + _LINE * (k + 1), row, fill=ink(fill))
                    for k, row in enumerate(text)]
        y += height
    y += 14
    x = _PAD
    out.append(_svg_text(x, y + 12, [("Colour: gain (peak memory inverted)", "")], size=12, anchor="start"))
    x += 230
    for gain, name in [(-1, "≤0.25x"), (-0.5, "0.5x"), (0, "1x"), (0.5, "2x"), (1, "≥4x"), (math.nan, "no number")]:
        out.append(f'<rect x="{x:g}" y="{y:g}" width="16" height="16" fill="{colour(gain)}" stroke="#999"/>')
        out.append(_svg_text(x + 21, y + 12, [(name, "")], size=12, anchor="start"))
        x += 92
    y += 16 + _LINE + 4
    out.append(_svg_text(_PAD, y, [(f"Drawn from the committed results/ by `{IMAGE_COMMAND}`.", "")], size=12,
                         anchor="start", fill="#555"))
    height = y + _PAD
    body = "\n".join(out)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:g}" '
            f'viewBox="0 0 {width} {height:g}" {_FONT}>\n<title>speedlib at a glance, from results/ '
            f'({html.escape(IMAGE_COMMAND)})</title>\n<rect width="100%" height="100%" fill="#fff"/>\n{body}\n</svg>\n')
