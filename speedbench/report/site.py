"""A static site of the results (`speedlib publish --output DIR`): the dashboard's pages (the
Overview, the Machine comparison, one page per technique, the history and the cite page) as
plain HTML files that outlive any server.

Like asv's published site: every page has one stable file name (index.html, machines.html,
<technique>.html, history.html, cite.html), links between them are relative (they work from
file:// and from any static host), and plotly.js is written once into DIR (plotly's own offline
bundle), so a page fetches nothing from the network. Every figure and table comes from the
functions that give `speedlib report` and the dashboard their numbers (headline.grid,
paired_table, speedup_table, memory_table, floor_table, history_table, the machine tables) and
its charts from speedbench.report.charts, each with its provenance and Reproduce lines. A click
on a cell of the at-a-glance chart lands on that cell's figure: its row in the technique page's
table, under the machine's own section. Every text is HTML-escaped: names come from result files.
Nothing scrolls sideways at 390 px but the at-a-glance chart, which says so there.
This module makes the pages (`pages`, `chart`); `speedlib publish` writes them, under the one
output rule for a named path (speedbench.results.outputs: the site built aside, renamed whole).
"""
from __future__ import annotations

import html
import re

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from speedbench import report, words
from speedbench.report import charts, comparisons, exports, first_view, glance, headline
from speedbench.report.chart_rows import FLOOR_HOVER, config_label

__all__ = ["pages", "chart", "names", "PAGES", "CITE_FILES", "PLOTLY_JS", "anchor"]

PLOTLY_JS = "plotly.min.js"  # written once; every page loads it from beside itself
PAGES = ("index.html", "machines.html", "history.html", "cite.html")  # and <technique>.html for each technique
CITE_FILES = ("headline.csv", "headline.provenance.txt", "headline.md", "headline.tex")  # the cite page's downloads

_STYLE = """body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1180px;padding:0 12px;color:#222}
nav{display:flex;flex-wrap:wrap;gap:4px 14px;padding:10px 0;border-bottom:1px solid #ddd;font-size:14px}
h1{font-size:1.7em}h2,h3{overflow-wrap:anywhere}.figure{overflow-x:auto}.figure>div{min-width:%dpx}.plot{max-width:100%%}
table{border-collapse:collapse;font-size:13px;margin:8px 0;width:100%%}
td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top;overflow-wrap:break-word}
@media (max-width:600px){td,th{overflow-wrap:anywhere;padding:2px 3px;font-size:12px}}
summary>h2{display:inline}
tr:target{background:#fff3b0;outline:2px solid #d4a800}section:target>h3{background:#fff3b0}
.narrow{display:none;font-size:14px;color:#555}@media (max-width:%dpx){.narrow{display:block}}
.prov{font-size:12px;color:#555}.prov code{white-space:pre-wrap;word-break:break-all}details{margin:8px 0}
pre{white-space:pre-wrap;word-break:break-all;background:#f6f6f6;padding:8px;font-size:12px}
.caption{font-size:13px;color:#555}""" % (glance.MIN_WIDTH, glance.MIN_WIDTH)


def _e(text) -> str:
    return html.escape("" if text is None or (isinstance(text, float) and pd.isna(text)) else str(text))


def anchor(*parts) -> str:
    """An HTML id for a cell or section: letters, digits and dashes only (names come from files)."""
    return "-".join(re.sub(r"[^A-Za-z0-9_-]", "_", str(p)) for p in parts)


def _page(title: str, body: str) -> str:
    links = [("index.html", "Overview"), ("machines.html", "Machine comparison"),
             *((f"{n}.html", t.title) for n, t in report.TECHNIQUES.items()),
             ("history.html", "History"), ("cite.html", "Cite")]
    nav = "".join(f'<a href="{href}">{_e(text)}</a>' for href, text in links)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><title>{_e(title)} - speedlib results</title>'
            f'<style>{_STYLE}</style><script src="{PLOTLY_JS}"></script></head><body><nav>{nav}</nav>'
            f"<h1>{_e(title)}</h1>{body}</body></html>\n")


def _cell(v) -> str:
    if v is pd.NA:
        return ""
    if isinstance(v, float) and not pd.isna(v) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))  # a count read back as float (N, commits) is written as the integer it is
    return _e(v)


def _table(frame: pd.DataFrame, ids: list[str] | None = None) -> str:
    """`frame` as an HTML table whose cells wrap (nothing scrolls sideways); `ids`: each row's id."""
    head = "".join(f"<th>{_e(c)}</th>" for c in frame.columns)
    rows = "".join((f'<tr id="{ids[i]}">' if ids else "<tr>") + "".join(f"<td>{_cell(v)}</td>" for v in row)
                   + "</tr>" for i, row in enumerate(frame.itertuples(index=False)))
    return f"<table><tr>{head}</tr>{rows}</table>"


def _notes(table: report.Table) -> list[str]:
    return [line[len("Note: "):] for line in exports._footer_lines(table) if line.startswith("Note: ")]


def _provenance(table: report.Table) -> str:
    """The export's footer under a figure or table: notes folded, provenance and Reproduce lines shown."""
    lines = exports._footer_lines(table)  # the very lines every export carries
    notes = _notes(table)
    rest = [line for line in lines if not line.startswith("Note: ")]
    shown = "".join(f"<div><code>{_e(line)}</code></div>" if line.startswith("Reproduce: ")
                    else f"<div>{_e(line)}</div>" for line in rest)
    runs = sum(line.startswith("Reproduce: ") for line in rest)
    folded = (f"<details><summary>Notes ({len(notes)})</summary>"
              + "".join(f"<p>{_e(n)}</p>" for n in notes) + "</details>") if notes else ""
    # folded under one line that says what is inside: a dozen runs' lines made the page five screens long
    return (f'<div class="prov">{folded}<details><summary>Provenance and Reproduce: {runs} command(s) rerun '
            f"every number above</summary>{shown}</details></div>")


def _shown(table: report.Table, hide: tuple[str, ...] = ()) -> str:
    """A report table as the dashboard shows it: the columns that say something, the numbers
    beside what they compare, then its provenance."""
    frame = table.frame.drop(columns=[c for c in hide if c in table.frame])
    empty = [c for c in frame.columns if frame[c].isna().all() or frame[c].astype(str).str.strip().eq("").all()]
    frame = frame.drop(columns=empty) if len(empty) < len(frame.columns) else frame
    return _table(frame.reset_index(drop=True)) + _provenance(table)


def _figure(fig, div_id: str, clickable: bool = False, wide: bool = False) -> str:
    # a click on a cell opens its figure: customdata[3] is its link (its technique page's row)
    script = ("document.getElementById('{plot_id}').on('plotly_click', function (d) {"
              " var p = d.points.find(function (q) { return q.customdata; });"
              " if (p) { window.location.href = p.customdata[3] || (p.customdata[0] + '.html'); } });") \
        if clickable else None
    fig.update_layout(autosize=True)
    plot = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, post_script=script,
                       config={"displayModeBar": False, "responsive": True}, default_width="100%")
    return f'<div class="figure">{plot}</div>' if wide else f'<div class="plot">{plot}</div>'


def _ages(rows: pd.DataFrame) -> dict:
    """(question, machine) -> how far behind the checkout's HEAD its commit is, as the dashboard's hover says."""
    return {cell: str(b) for cell, b in first_view.cells_behind(rows).items()}


def _glance(rows: pd.DataFrame, div_id: str) -> str:
    links = {(r.question, r.machine): f"{r.technique}.html#{anchor('cell', r.question, r.machine)}"
             for r in rows.itertuples()}
    narrow = (f'<p class="narrow">The chart is wider than this screen: it scrolls sideways (swipe it), '
              f"{rows['machine'].nunique()} machines across.</p>")
    return (narrow + _figure(glance.figure(rows, ages=_ages(rows), links=links), div_id, clickable=True, wide=True)
            + f'<p class="caption">{_e(glance.CLICK)}</p>')


def _overview(df: pd.DataFrame, grid: report.Table) -> str:
    every = comparisons.every_comparison(df)
    claims = report.claims_table(df)
    index = every.frame.assign(technique=[report.TECHNIQUES[p].title if p in report.TECHNIQUES else p
                                          for p in every.frame["page"]]).drop(columns="page")
    return (f'<p class="caption">{_e(glance.LEGEND)}</p>' + _glance(grid.data, "glance")
            + '<p class="prov">Every figure of every cell, each baseline named: <a href="cite.html">cite page</a>, '
              "<code>speedlib report --table headline</code>.</p>" + _provenance(grid)
            + "<h2>Every paired comparison (latest commit per machine)</h2>"
            + f"<details><summary>{len(index)} comparisons, one line each</summary>{_table(index)}</details>"
            + _provenance(every)
            + f"<details><summary>Claims of the sources versus measured ({len(claims.frame)})</summary>"
            + _table(claims.frame) + _provenance(claims) + "</details>")


# The at-a-glance rows of a technique page, their columns in words.
_CELL_COLUMNS = {"machine": "machine", "label": "question", "figure": "figure", "N": "N", "case": "case",
                 "baseline_name": "baseline", "baseline_words": "baseline in words", "scope": "what is timed",
                 "status": "status"}


def _technique(df: pd.DataFrame, grid: report.Table, name: str) -> str:
    rows = grid.data[grid.data["technique"] == name]
    body = (f'<p class="caption">{_e(glance.LEGEND)}</p>' + _glance(rows, f"glance-{name}")) \
        if not rows.empty else ""
    cells = rows.assign(figure=[glance.figure_text(r) or (f"{report.fmt_ratio(r.ratio, None, None)}, not a result "
                                                          "for this row" if pd.notna(r.ratio) else "")
                                for r in rows.itertuples()])
    mine = cells[list(_CELL_COLUMNS)].rename(columns=_CELL_COLUMNS)
    mine = mine.drop(columns=[c for c in mine if mine[c].isna().all() or mine[c].astype(str).eq("").all()])
    title = report.TECHNIQUES[name].title
    labels = tuple(f"{q.label}" for q in headline.QUESTIONS if q.technique == name)
    own = report.Table(title, mine, grid.sources[grid.sources["technique"] == name] if not grid.sources.empty
                       else grid.sources, [n for n in grid.notes if n.startswith((title, *labels))])
    ids = [anchor("cell", r.question, r.machine) for r in rows.itertuples()]
    body += f"<h2>At a glance, every cell</h2>{_table(mine, ids)}{_provenance(own)}"
    last = report.latest(df[df["technique"] == name])
    # each machine's section folded under its name but the first (a GPU's): the page opens on one
    # machine, as the dashboard's does, and the others are a click away
    opening = report.opening_machine(df[df["technique"] == name])
    machines = glance.order_machines(last) if not last.empty else []
    for i, machine in enumerate(sorted(machines, key=lambda m: m != opening)):  # stable: the rest keep their order
        body += _machine_section(last[last["machine"] == machine], name, machine, opened=i == 0)
    return body


def _machine_section(rows: pd.DataFrame, name: str, machine: str, opened: bool = False) -> str:
    """A machine's results of one technique at its latest commit, as the dashboard's page shows
    them: paired speedups, separately timed medians, memory, bandwidth and the floor, with charts."""
    technique = report.TECHNIQUES[name]
    first = rows.iloc[0]
    where = f"{machine} ({first['gpu']})"
    baseline = report.opening_baseline(technique, sorted(rows["variant"].dropna().unique()), first["gpu"])
    key = anchor(name, machine)
    out = [f'<section id="{anchor("machine", machine)}"><details{" open" if opened else ""}><summary>'
           f'<h2>{_e(where)}</h2></summary><p class="caption">commit {_e(first["commit"][:8])}, torch '
           f'{_e(first["torch"])}, CUDA {_e(first["cuda"])}; separately timed ratios against {_e(baseline)}</p>']
    paired = report.paired_table(rows)
    if not paired.frame.empty:
        s = paired.sources
        s = s.assign(case=config_label(s) + " / " + s["variant"].astype(str) + " vs "
                     + s["baseline"].astype(str), where=where)
        out += ["<h3>Paired speedups (the variants took turns in one process)</h3>",
                _shown(paired, hide=("machine", "GPU", "technique")),
                _figure(charts.ratio_chart(s, "case", "where", "paired speedup: x faster than the baseline"),
                        f"paired-{key}")]
    timed = rows[rows["kind"] == "time"]
    if not timed.empty:
        metric = "seconds" if (timed["metric"] == "seconds").any() else sorted(timed["metric"].unique())[0]
        timed = timed[timed["metric"] == metric]
        speedup = report.speedup_table(timed, "time", baseline)
        s = speedup.sources.assign(case=lambda x: config_label(x) + " / " + x["variant"].astype(str),
                                   where=where)
        out += [f"<h3>Separately timed: {_e(words.metric(metric))}, medians against {_e(baseline)}</h3>",
                _shown(speedup, hide=("machine", "GPU", "technique")),
                _figure(charts.spread_chart(timed, f"{words.metric(metric)}: every sample, {where}"), f"spread-{key}")]
        if not s.empty:
            out.append(_figure(charts.ratio_chart(s, "case", "where", f"{words.metric(metric)}: speedup over "
                                                  f"{baseline}"), f"timed-{key}"))
    memory = rows[rows["kind"] == "memory"]
    if not memory.empty:
        out += ["<h3>Memory</h3>", _shown(report.memory_table(memory, baseline), hide=("machine", "GPU", "technique"))]
        out += [_figure(charts.bars(same, "bytes", where), f"memory-{key}-{i}")
                for i, (_, same) in enumerate(memory.groupby("metric", sort=True))]
    floors = rows[rows["kind"] == "fraction of floor"]
    if not floors.empty:
        floor = report.floor_table(rows)
        out += ["<h3>Bandwidth and floor</h3>", _shown(floor, hide=("machine", "GPU", "technique"))]
        shown = report.floor_figures(rows).sort_values("benchmark", kind="stable")
        out += [_figure(charts.bars(same, str(unit), where, hover=tuple(x for x in FLOOR_HOVER
                                                                       if x[0] in floor.frame.columns)),
                        f"floor-{key}-{i}") for i, (unit, same) in enumerate(shown.groupby("unit", sort=False))]
    bandwidth = rows[(rows["kind"] == "bandwidth") & ~rows["metric"].isin(report.FLOOR_ONLY)]
    if not bandwidth.empty:
        out += ["<h3>Bandwidth</h3>", _shown(report.speedup_table(bandwidth, "bandwidth", baseline),
                                               hide=("machine", "GPU", "technique"))]
    return "".join(out) + "</details></section>"


def _machines(df: pd.DataFrame) -> str:
    """The Machine comparison as the dashboard opens it: every machine, then its two newest GPU machines."""
    body = "<h2>Machines</h2>" + _table(report.machines_table(df))
    verdicts = report.gpu_tests_table(df)
    if not verdicts.empty:
        body += (f"<details><summary>GPU tests per commit ({len(verdicts)} commits of GPU machines)</summary>"
                 f"{_table(verdicts)}</details>")
    gpus = [m for m in glance.order_machines(df) if headline.machine_kind(df.loc[df["machine"] == m, "gpu"].iloc[0])
            == "gpu"]
    pair = report.opening_pair(df)
    if pair is None:
        return body + "<p>A comparison needs a second machine.</p>"
    a, b = pair
    body += (f"<p>The dashboard compares any two; here the two newest GPU machines ({len(gpus)} have results): "
             f"{_e(b)} against {_e(a)}.</p>")
    speedups = report.speedup_comparison(df, a, b)
    body += f"<h2>Speedups on each machine</h2><details><summary>{len(speedups.frame)} paired speedups measured on " \
            f"both, each against its own baseline</summary>{_shown(speedups)}</details>"
    if report.same_work(df, a, b):
        values = report.machine_comparison(df, a, b)
        ratios = report.compare_machines(df, a, b)
        timed = ratios[ratios["kind"] == "time"]
        body += f"<h2>{_e(b)} against {_e(a)}, value by value</h2>"
        if not timed.empty:
            variant = timed["variant"].map(lambda v: f" / {v}" if isinstance(v, str) and v else "")
            body += _figure(charts.ratio_chart(timed.assign(case=config_label(timed) + variant + " ("
                                                            + timed["metric"].astype(str) + ")", pair=f"{b} vs {a}"),
                                               "case", "pair", f"times: {b} against {a} (above 1: {b} is faster)"),
                            "machines-times")
        body += (f"<details><summary>{len(values.frame)} values measured on both (times, memory, bandwidth)</summary>"
                 f"{_shown(values)}</details>")
    return body


def _history(df: pd.DataFrame) -> str:
    """Each headline class's timed benchmarks measured at two or more commits on one machine."""
    suites = {(q.technique, s) for q in headline.QUESTIONS for s in (q.comparison.suite,) if s}
    ours = pd.Series([(t, s) in suites for t, s in zip(df["technique"], df["suite"], strict=True)], index=df.index,
                     dtype=bool)
    timed = df[(df["kind"] == "time") & ours]
    commits = timed.groupby(["benchmark", "machine"])["commit"].nunique()
    body = ""
    for i, benchmark in enumerate(sorted(commits[commits >= 2].index.get_level_values(0).unique())):
        table = report.history_table(timed, benchmark)
        h = table.sources
        fig = go.Figure()
        for (machine, params), line in h.groupby(["machine", "params"], sort=True):
            fig.add_trace(go.Scatter(x=line["commit"].str[:8], y=line["value"], mode="lines+markers",
                                     name=_e(f"{machine}: {params}")))
        # the legend below the chart, never over it (a phone's width left it covering the lines)
        fig.update_layout(height=360, margin=dict(t=30), yaxis=dict(type="log", title=_e(h["unit"].iloc[0])),
                          xaxis=dict(type="category", title="commit"), legend=dict(orientation="h", y=-0.3))
        body += (f"<h2>{_e(benchmark)}</h2>" + _figure(fig, f"history-{i}")
                 + f"<details><summary>The table ({len(table.frame)} rows)</summary>{_table(table.frame)}</details>"
                 + _provenance(table))
    return body or "<p>No timed benchmark of a headline comparison is measured at two commits yet.</p>"


def _cite(grid: report.Table, cff_text: str | None) -> tuple[str, dict]:
    files = dict(zip(CITE_FILES, (report.to_csv(grid), report.csv_provenance(grid), report.to_markdown(grid),
                                  report.to_latex(grid)), strict=True))
    links = " ".join(f'<a href="{n}">{n}</a>' for n in files)
    body = (f"<p>The headline as files, the same as <code>speedlib report --table headline --format md|csv|tex"
            f"</code>: {links}. The CSV is tidy data (one row per question and machine).</p>"
            f"<h2>Markdown</h2><details><summary>The headline grid and its footer</summary>"
            f"<pre>{_e(files['headline.md'])}</pre></details>")
    if cff_text:
        try:
            body += f"<h2>BibTeX</h2><pre>{_e(report.bibtex(cff_text))}</pre>"
        except ValueError as e:
            body += f"<p>CITATION.cff gives no BibTeX entry: {_e(e)}</p>"
    return body, files


def chart(df: pd.DataFrame) -> str:
    """The at-a-glance chart of `df` (the loaded results, every commit) as an SVG image."""
    return glance.svg(headline.glance(df))


def names() -> list[str]:
    """Every file the site holds, whatever the results: `speedlib publish --output` replaces a
    directory holding these and nothing else."""
    return [*PAGES, *(f"{n}.html" for n in report.TECHNIQUES), *CITE_FILES, PLOTLY_JS]


def pages(df: pd.DataFrame, cff_text: str | None = None) -> dict[str, str]:
    """The site of `df` (the loaded results, every commit): file name -> its text (`names`)."""
    grid = headline.grid(df)
    cite, files = _cite(grid, cff_text)
    return {"index.html": _page("speedlib: which PyTorch speed tricks pay off", _overview(df, grid)),
            "machines.html": _page("Machine comparison", _machines(df)),
            **{f"{n}.html": _page(t.title, _technique(df, grid, n)) for n, t in report.TECHNIQUES.items()},
            "history.html": _page("History across commits", _history(df)),
            "cite.html": _page("Cite and export", cite), **files, PLOTLY_JS: get_plotlyjs()}
