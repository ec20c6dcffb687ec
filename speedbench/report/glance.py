"""The at-a-glance chart: one row per question, one column per machine, one figure per cell
(headline.glance). The dashboard (Vega-Lite: `spec`), the static site (plotly: `figure`) and
the docs' image (`svg`) draw the same cells from the same lines (`lines`, `tip`), so every copy
shows the numbers of `speedlib report --table headline`.

Each row is one comparison (the same scope, baseline and measure in every cell). A cell: the
ratio in bold, its interval below, the marks (‡ contended, † earlier benchmark version, § GPU
tests failed), and in italics the baseline on that machine, the case where the class measured
several, and "not paired" for a separately timed figure; hovering gives the scope and the
baseline in words. Colour: how much better (blue) or worse (red) than the baseline for the
question the row asks (faster; for peak memory, less memory), diverging at "the same", on a
log scale; a cell without an answer is grey and says why, a figure that does not answer the
row's question (DDP on one GPU) included. Plotly is imported inside: no Streamlit, no torch.
"""

from __future__ import annotations

import html
import json
import math
import textwrap

import pandas as pd

from speedbench import report
from speedbench.report.headline import MEASURED, order_machines

__all__ = ["figure", "spec", "tip", "TIP_TITLES", "SELECTION", "SELECTED", "svg", "lines", "figure_text", "colour",
           "ink", "GAIN_CAP", "LEGEND", "CLICK", "IMAGE_COMMAND", "MIN_WIDTH", "COLOUR_WORDS"]

# Colour saturates at 4x either way: the flat-buffer step's 47.8x must not wash every 1.3x out.
GAIN_CAP = 4.0
# red where the technique does worse, white at the same, blue where better (readable by red-green colour-blind readers)
_SCALE = [[0.0, "#b2182b"], [0.25, "#ef8a62"], [0.5, "#f7f7f7"], [0.75, "#67a9cf"], [1.0, "#2166ac"]]
_NO_NUMBER = "#d9d9d9"
# The colour bar's ticks, as gains: what each step means for the row's own question.
_TICKS = [(1 / 4, "≥4x worse"), (1 / 2, "2x worse"), (1, "same"), (2, "2x better"), (4, "≥4x better")]

COLOUR_WORDS = ("Colour: better (blue) or worse (red) than the row's baseline for the row's question: faster, or for "
                "peak memory less memory; grey: no answer on that machine, the cell says why.")
_MARKS = (f"{report.CONTENDED} contended, {report.EARLIER} earlier benchmark version, {report.GPU_TESTS_FAILED} GPU "
          "tests failed.")
# Above the chart, short enough that the chart still ends on a 1440 x 900 first screen.
LEGEND = ("One row, one comparison (same scope, baseline, measure). A cell: x faster than the row's baseline "
          "(peak memory: variant / baseline), 99 % interval, baseline in italics; paired unless marked. Blue better "
          f"(faster, or less memory), red worse, grey no answer (the cell says why). {_MARKS}")
CLICK = "A click on a cell opens its figure on its technique's page (machine, baseline, commit)."
IMAGE_COMMAND = "speedlib publish --chart docs/glance.svg"
# LEGEND without the hover (an image has none); the baselines in words are in the results page's grid.
IMAGE_LEGEND = ("One row, one comparison: every cell of a row has the same scope, baseline and measure. Each cell: x "
                "faster than the baseline (peak memory: variant / baseline, lower is better), [low, high] its 99 % "
                "interval, in italics the baseline on that machine; paired (the variants taking turns) wherever "
                f"measured so, else marked not paired. {COLOUR_WORDS} {_MARKS} Each baseline in words: "
                "docs/results.md, At a glance.")


def _marks(r) -> str:
    marks = [report.CONTENDED if r.contended is True else "", report.EARLIER if r.earlier_version is True else "",
             report.GPU_TESTS_FAILED if r.gpu_tests_failed is True else ""]
    return " ".join(m for m in marks if m)


def figure_text(r) -> str:
    """A cell's number as the chart writes it, with its marks: "5.65x [5.39, 6.61] †"; "" for a
    cell that does not answer its row (no figure, or one that is not the row's comparison)."""
    if r.status != MEASURED:
        return ""
    low, high = (None, None) if pd.isna(r.low) else (r.low, r.high)
    return f"{report.fmt_ratio(r.ratio, low, high)} {_marks(r)}".strip()


def _said(r) -> str:
    """The italic line: the baseline on this machine and the case where a class has several."""
    return f"vs {r.baseline_name}" + (f", {r.case}" if isinstance(r.case, str) and r.case else "")


def _line(text: str, width: int = 26) -> str:
    """`text` on one line of a cell: a cell holds three, the whole text is in the hover and the grid."""
    return text if len(text) <= width else text[:width - 1].rstrip() + "…"


def lines(r) -> list[list[tuple[str, str]]]:
    """A cell's text, line by line, each line (text, style) pieces, style "b" (bold), "i"
    (italic) or "": the dashboard's chart and the docs' image write the same lines. A cell
    without an answer says why: its first words plainly, the rest in italics (three lines in
    all, the whole reason in the hover and the grid)."""
    if r.status != MEASURED:
        head, _, rest = str(r.status).partition(": ")
        more = textwrap.wrap(rest, 26)
        if len(more) > 2:  # a cell holds three lines: the rest is in the hover and the grid
            more = [more[0], _line(more[1] + " " + more[2])]
        return [[(head, "")], *([[(w, "i")] for w in more])]
    ratio, marks = report.fmt_ratio(r.ratio, None, None), _marks(r)
    said = [[(_line(_said(r)), "i")]]
    if pd.isna(r.low):  # no interval (an exact count, or one value each): the marks where it would be
        # a line in one style: the chart draws each style as its own mark, so a bold line bolded its marks
        first = [[(ratio, "b")]]
        if r.measure == "speed" and r.paired is not True:  # separately timed: said under it, in place of brackets
            said.append([(f"not paired {marks}".rstrip(), "i")])
        elif marks:
            first.append([(marks, "")])
    else:
        first = [[(ratio, "b")], [(f"[{r.low:.3g}, {r.high:.3g}] {marks}".rstrip(), "")]]
    return first + said


def _cell(r) -> str:
    tags = {"b": ("<b>", "</b>"), "i": ("<i>", "</i>"), "": ("", "")}
    return "<br>".join("".join(f"{tags[style][0]}{html.escape(text)}{tags[style][1]}" for text, style in line)
                       for line in lines(r))


# The hover's lines in the order shown, each cell having some (a figure, or the reason it has none).
TIP_TITLES = ("comparison", "machine", "no answer", "measured", "scope", "figure", "baseline", "case", "age")


def tip(r, age: str = "") -> list[tuple[str, str]]:
    """What hovering cell `r` says, (title, text) in order: the comparison, the machine, then
    the figure with its scope and baseline in words, or why the cell has none; `age`: how far
    behind the checkout's HEAD its commit is. Both charts' hovers are written from it."""
    said = [("comparison", str(r.label)), ("machine", f"{r.machine} ({r.gpu})")]
    case = str(r.case) if isinstance(r.case, str) and r.case else ""
    if r.status != MEASURED:
        said.append(("no answer", str(r.status)))
        if pd.notna(r.ratio):  # measured, but not this row's comparison: said as such
            said.append(("measured", f"{report.fmt_ratio(r.ratio, None, None)} vs {r.baseline_name}"
                                     f"{' ' + case if case else ''}, not a result for this row"))
        return said
    what = "memory, variant / baseline (exact count)" if r.measure == "peak memory" else "x faster than the baseline"
    n = "" if pd.isna(r.N) else f" N={r.N}" + ("" if r.paired else " each, not paired")
    words = f" ({r.baseline_words})" if isinstance(r.baseline_words, str) and r.baseline_words else ""
    said += [("scope", f"{r.scope} ({r.suite})"), ("figure", f"{figure_text(r)}{n} ({what})"),
             ("baseline", f"vs {r.baseline_name}{words}")]
    return said + ([("case", case)] if case else []) + ([("age", age)] if age else [])


# The hover's lines that read without their title (the figure, "vs ..."; the reason and the age are wrapped).
_BARE = {"figure", "baseline"}


def _hover(r, age: str = "") -> str:
    (_, label), (_, machine), *rest = tip(r, age)
    said = [_wrap_hover(text) if title in ("no answer", "age") else html.escape(text if title in _BARE
                                                                               else f"{title}: {text}")
            for title, text in rest]
    return "<br>".join([f"<b>{html.escape(label)}</b>", html.escape(machine), *said])


def _wrap_hover(text: str) -> str:
    return "<br>".join(textwrap.wrap(html.escape(text), 70)) or html.escape(text)


def _gain(r) -> float:
    """The colour's value: log of how much better than the baseline, capped at GAIN_CAP either
    way; NaN where the cell does not answer its row."""
    if r.status != MEASURED or pd.isna(r.gain) or r.gain <= 0 or not math.isfinite(r.gain):
        return math.nan
    return max(-1.0, min(1.0, math.log(r.gain) / math.log(GAIN_CAP)))


def _wrap(text: str, width: int = 30) -> str:
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


def _layout(rows: pd.DataFrame) -> tuple[list[str], list[str], dict, dict[str, str], dict[str, str]]:
    """Questions down (in the records' order), machines across (GPU machines first, as
    `order_machines` gives them), each cell's row by (question, machine), each question's
    label and each machine's GPU."""
    questions = list(dict.fromkeys(rows["question"]))
    machines = order_machines(rows)
    labels = dict(zip(rows["question"], rows["label"], strict=False))
    gpus = dict(zip(rows["machine"], rows["gpu"].astype(str), strict=False))
    return questions, machines, {(r.question, r.machine): r for r in rows.itertuples()}, labels, gpus


def figure(rows: pd.DataFrame, height: int | None = None, ages: dict | None = None, links: dict | None = None):
    """The chart of `headline.glance(df)`'s rows. Each cell's customdata: [technique, machine,
    question, link], link from `links` ((question, machine) -> URL, "" where none); `ages`:
    (question, machine) -> how far behind the checkout's HEAD the cell's commit is
    (speedbench.report.age), in its hover."""
    import plotly.graph_objects as go  # noqa: PLC0415 - a viewer's import, kept out of `import speedbench`

    ages, links = ages or {}, links or {}
    questions, machines, at, labels, gpus = _layout(rows)
    y = [_wrap(labels[q]) for q in questions]
    x = [f"{html.escape(m)}<br>{html.escape(gpus[m])}" for m in machines]
    z = [[_gain(at[q, m]) if (q, m) in at else math.nan for m in machines] for q in questions]
    grey = [[0.0 if math.isnan(v) else math.nan for v in row] for row in z]
    fig = go.Figure()
    # grey under every cell that has no answer (the coloured heatmap leaves NaN cells empty)
    fig.add_trace(go.Heatmap(z=grey, x=x, y=y, colorscale=[[0, _NO_NUMBER], [1, _NO_NUMBER]], showscale=False,
                             hoverinfo="skip", xgap=3, ygap=3))
    fig.add_trace(go.Heatmap(
        z=z, x=x, y=y, zmin=-1, zmax=1, colorscale=_SCALE, xgap=3, ygap=3, hoverinfo="skip",
        colorbar=dict(title=dict(text="vs baseline", side="right"), thickness=12, len=0.8,
                      tickvals=[math.log(g) / math.log(GAIN_CAP) for g, _ in _TICKS],
                      ticktext=[t for _, t in _TICKS])))
    # one point per cell on top: its text, its hover, and what a click opens (heatmaps cannot be selected)
    cells = [(q, m, at[q, m]) for q in questions for m in machines if (q, m) in at]
    fig.add_trace(go.Scatter(
        x=[x[machines.index(m)] for _, m, _ in cells], y=[y[questions.index(q)] for q, _, _ in cells],
        mode="markers+text", text=[_cell(r) for _, _, r in cells],
        textfont=dict(size=11, color=[ink(colour(_gain(r))) for _, _, r in cells]),
        marker=dict(symbol="square", size=56, color="rgba(0,0,0,0)"),
        hovertext=[_hover(r, ages.get((q, m), "")) for q, m, r in cells], hoverinfo="text",
        customdata=[[r.technique, m, q, links.get((q, m), "")] for q, m, r in cells], showlegend=False))
    fig.update_layout(
        height=height or 60 + 46 * len(questions), margin=dict(l=10, r=10, t=4, b=4),
        # ranges fixed to the cells: autorange pads for the invisible markers and squeezed every row
        xaxis=dict(side="top", fixedrange=True, type="category", range=[-0.5, len(machines) - 0.5], automargin=True),
        yaxis=dict(fixedrange=True, type="category", tickfont=dict(size=12), range=[len(questions) - 0.5, -0.5]),
        plot_bgcolor="white", dragmode=False, clickmode="event+select", hoverlabel=dict(align="left"))
    return fig


# The Vega-Lite chart's cells: a row's height and its text's (px), and what a click names.
_ROW_H, _TEXT_LINE = 42, 12
SELECTION = "cell"
SELECTED = ("technique", "machine_id", "question_id")


def spec(rows: pd.DataFrame, ages: dict | None = None) -> dict:
    """The chart of `figure` as a Vega-Lite spec (the dashboard draws it: Streamlit's Vega-Lite
    code loads in a fraction of the time plotly.js takes, issue 51): the same cells, lines,
    colours and hover, a click selecting the cell's technique, machine and question
    (`SELECTION`, its fields `SELECTED`). `ages`: as for `figure`."""
    ages = ages or {}
    questions, machines, at, labels, gpus = _layout(rows)
    written = {k: lines(r) for k, r in at.items()}
    depth = max([len(said) for said in written.values()] or [1])
    # the GPU's name on one line: a third line ran into the cells
    heads = {m: f"{m}\n{_line(gpus[m], 24)}" for m in machines}
    names = {q: "\n".join(textwrap.wrap(labels[q], 34, break_long_words=False)) for q in questions}
    cells = []
    for q in questions:
        for m in machines:
            r = at.get((q, m))
            said = written.get((q, m), [])
            blank = [[("", "-")]] * ((depth - len(said)) // 2)  # a shorter text centred in its cell
            said = blank + said + [[("", "-")]] * (depth - len(said) - len(blank))
            gain = math.nan if r is None else _gain(r)
            cell = {"row": names[q], "column": heads[m], "gain": None if math.isnan(gain) else gain,
                    "ink": ink(colour(gain))}
            # a mark per style, lines aligned by zero-width spaces (Vega trims blank lines, and empty tspans move none)
            for style, field in (("b", "bold"), ("", "plain"), ("i", "italic")):
                cell[field] = "\n".join(("".join(t for t, _ in line) if line[0][1] == style else "\u200b")
                                        for line in said)
            if r is not None:
                cell.update(dict(tip(r, ages.get((q, m), ""))), technique=r.technique, machine_id=m, question_id=q)
            cells.append(cell)
    # `|| datum._`: undefined, which the tooltip leaves out; Streamlit's one table gives other cells' lines as null
    hover = "isValid(datum.technique) ? {" + ", ".join(
        f"{json.dumps('title' if t == 'comparison' else t)}: datum[{json.dumps(t)}] || datum._" for t in TIP_TITLES) \
        + "} : null"  # a blank cell (no row for that machine): no hover
    # from the top, the block centred by hand: centred, a mark whose last lines were blank sat half a line low
    text = {"type": "text", "fontSize": 11, "lineHeight": _TEXT_LINE, "lineBreak": "\n", "baseline": "top",
            "dy": -depth * _TEXT_LINE / 2}
    scale = {"domain": [-1, -0.5, 0, 0.5, 1], "range": [c for _, c in _SCALE], "interpolate": "rgb"}
    ticks = [math.log(g) / math.log(GAIN_CAP) for g, _ in _TICKS]
    # under a chart of few rows: beside a technique page's two rows, the gradient was cut short
    legend = ({"orient": "right", "gradientLength": 160} if len(questions) * _ROW_H >= 200
              else {"orient": "bottom", "direction": "horizontal", "gradientLength": 440, "labelOverlap": False})
    # each label at its own tick, a hair above it so that a float's last bit cannot move it to the next
    words = " : ".join(f"datum.value <= {t + 1e-9:.12g} ? {json.dumps(w, ensure_ascii=False)}"
                       for t, (_, w) in zip(ticks, _TICKS, strict=True))
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "data": {"values": cells}, "width": "container", "height": {"step": _ROW_H},
        "resolve": {"scale": {"color": "independent"}},  # the cells' scale and the text's own colours, apart
        "config": {"view": {"stroke": None}, "axis": {"domain": False, "ticks": False, "labelFontSize": 12,
                                                       "labelColor": "#111"}},
        "encoding": {
            "x": {"field": "column", "type": "nominal", "sort": [heads[m] for m in machines], "title": None,
                  "axis": {"orient": "top", "labelAngle": 0, "labelExpr": "split(datum.label, '\\n')",
                           "labelLimit": 150, "labelOverlap": False}},
            "y": {"field": "row", "type": "nominal", "sort": None, "title": None,
                  "axis": {"labelExpr": "split(datum.label, '\\n')", "labelLimit": 240, "labelPadding": 6}}},
        "layer": [
            # grey where a cell has no answer (an invalid value is kept, not dropped, and meets the condition)
            {"mark": {"type": "rect", "invalid": None, "stroke": "white", "strokeWidth": 3},
             "encoding": {"color": {"field": "gain", "type": "quantitative", "scale": scale,
                                    "condition": {"test": "!isValid(datum.gain)", "value": _NO_NUMBER},
                                    "legend": {"title": "vs baseline", "values": ticks, "labelExpr": f"{words} : ''",
                                               **legend}}}},
            *({"mark": {**text, **style}, "encoding": {"text": {"field": field},
                                                        "color": {"field": "ink", "type": "nominal", "scale": None}}}
              for field, style in (("bold", {"fontWeight": "bold"}), ("plain", {}),
                                   ("italic", {"fontStyle": "italic"}))),
            # on top, unseen: what a click selects and what a hover says (text marks would catch the pointer)
            {"name": "hits", "mark": {"type": "rect", "opacity": 0, "cursor": "pointer", "tooltip": {"expr": hover}},
             "params": [{"name": SELECTION, "select": {"type": "point", "fields": list(SELECTED)}}]},
        ],
    }


# The image's geometry (px): the question column, a machine's column, a text line, the margin.
_NAMES_W, _CELL_W, _LINE, _PAD = 230, 180, 16, 12
_FONT = "font-family=\"-apple-system, 'Segoe UI', Helvetica, Arial, sans-serif\""
_STYLES = {"b": ' font-weight="bold"', "i": ' font-style="italic"', "": ""}


def _svg_text(x: float, y: float, pieces: list[tuple[str, str]], size: int = 13, anchor: str = "middle",
              fill: str = "#111") -> str:
    spans = "".join(f"<tspan{_STYLES[style]}>{html.escape(text)}</tspan>" for text, style in pieces)
    return f'<text x="{x:g}" y="{y:g}" font-size="{size}" text-anchor="{anchor}" fill="{fill}">{spans}</text>'


def svg(rows: pd.DataFrame) -> str:
    """The chart of `figure` as a standalone SVG image (the docs' results page and the README
    show it: `IMAGE_COMMAND` writes it from results/): the same cells, numbers, marks and
    colours, without hover or clicks. Written by hand, not by plotly's image export (kaleido
    needs a browser), so the same results give the same bytes anywhere."""
    questions, machines, at, labels, gpus = _layout(rows)
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
        cells = [[(w, "b")] for w in textwrap.wrap(m, 22)] + [[(w, "")] for w in textwrap.wrap(gpus[m], 24)]
        out += [_svg_text(cx, y + _LINE * (k + 1), row, size=12) for k, row in enumerate(cells)]
    y += _LINE * head + 8
    for q in questions:
        cells = {m: lines(at[q, m]) for m in machines if (q, m) in at}
        names = textwrap.wrap(labels[q], 28)
        height = max(3, len(names), *(len(c) for c in cells.values())) * _LINE + 12
        top = y + (height - _LINE * len(names)) / 2 - 3
        out += [_svg_text(_PAD, top + _LINE * (k + 1), [(w, "b")], anchor="start") for k, w in enumerate(names)]
        for i, m in enumerate(machines):
            x0 = _PAD + _NAMES_W + _CELL_W * i
            fill = colour(_gain(at[q, m])) if (q, m) in at else _NO_NUMBER
            out.append(f'<rect x="{x0 + 1.5:g}" y="{y + 1.5:g}" width="{_CELL_W - 3}" height="{height - 3}" '
                       f'fill="{fill}"/>')
            text = cells.get(m, [])
            first = y + (height - _LINE * len(text)) / 2 - 3
            out += [_svg_text(x0 + _CELL_W / 2, first + _LINE * (k + 1), row, fill=ink(fill))
                    for k, row in enumerate(text)]
        y += height
    y += 14
    x = _PAD
    out.append(_svg_text(x, y + 12, [("Colour: against the row's baseline", "")], size=12, anchor="start"))
    x += 220
    for gain, name in [*((math.log(g) / math.log(GAIN_CAP), t) for g, t in _TICKS), (math.nan, "no answer")]:
        out.append(f'<rect x="{x:g}" y="{y:g}" width="16" height="16" fill="{colour(gain)}" stroke="#999"/>')
        out.append(_svg_text(x + 21, y + 12, [(name, "")], size=12, anchor="start"))
        x += 100
    y += 16 + _LINE + 4
    out.append(_svg_text(_PAD, y, [(f"Drawn from the committed results/ by `{IMAGE_COMMAND}`.", "")], size=12,
                         anchor="start", fill="#555"))
    height = y + _PAD
    body = "\n".join(out)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:g}" '
            f'viewBox="0 0 {width} {height:g}" {_FONT}>\n<title>speedlib at a glance, from results/ '
            f'({html.escape(IMAGE_COMMAND)})</title>\n<rect width="100%" height="100%" fill="#fff"/>\n{body}\n</svg>\n')
