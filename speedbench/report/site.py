"""A static site of the results (`speedlib publish --output DIR`): the Overview, one page per
technique, the history and the cite page as plain HTML files that outlive any server.

Like asv's published site: every page has one stable file name (index.html, <technique>.html,
history.html, cite.html), links between them are relative (they work from file:// and from any
static host), and plotly.js is written once into DIR (plotly's own offline bundle), so a page
fetches nothing from the network. Every figure and table comes from the functions that give
`speedlib report` its numbers (headline.grid, paired_table, history_table), and each carries its
provenance and Reproduce lines. Every text is HTML-escaped: names come from result files.
This module makes the pages (`pages`, `chart`); `speedlib publish` writes them, under the one
output rule for a named path (speedbench.results.outputs: the site built aside, renamed whole).
"""

from __future__ import annotations

import html

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from speedbench import report
from speedbench.report import comparisons, exports, glance, headline

__all__ = ["pages", "chart", "names", "PAGES", "CITE_FILES", "PLOTLY_JS"]

PLOTLY_JS = "plotly.min.js"  # written once; every page loads it from beside itself
PAGES = ("index.html", "history.html", "cite.html")  # and <technique>.html for each technique
CITE_FILES = ("headline.csv", "headline.provenance.txt", "headline.md", "headline.tex")  # the cite page's downloads

_STYLE = """body{font-family:system-ui,sans-serif;margin:0 auto;max-width:1180px;padding:0 16px;color:#222}
nav{display:flex;flex-wrap:wrap;gap:4px 14px;padding:10px 0;border-bottom:1px solid #ddd;font-size:14px}
.figure{overflow-x:auto}.figure>div{min-width:%dpx}table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}.scroll{overflow-x:auto}
.scroll table{min-width:760px}
.prov{font-size:12px;color:#555}.prov code{white-space:pre-wrap;word-break:break-all}details{margin:8px 0}
pre{white-space:pre-wrap;word-break:break-all;background:#f6f6f6;padding:8px;font-size:12px}""" % glance.MIN_WIDTH


def _e(text) -> str:
    return html.escape("" if text is None or (isinstance(text, float) and pd.isna(text)) else str(text))


def _page(title: str, body: str) -> str:
    links = [("index.html", "Overview"), *((f"{n}.html", t.title) for n, t in report.TECHNIQUES.items()),
             ("history.html", "History"), ("cite.html", "Cite")]
    nav = "".join(f'<a href="{href}">{_e(text)}</a>' for href, text in links)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width, initial-scale=1"><title>{_e(title)} - speedlib results</title>'
            f'<style>{_STYLE}</style><script src="{PLOTLY_JS}"></script></head><body><nav>{nav}</nav>'
            f"<h1>{_e(title)}</h1>{body}</body></html>\n")


def _table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in frame.columns)
    rows = "".join("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in row) + "</tr>"
                   for row in frame.itertuples(index=False))
    return f'<div class="scroll"><table><tr>{head}</tr>{rows}</table></div>'


def _provenance(table: report.Table) -> str:
    """The export's footer under a figure or table: notes folded, provenance and Reproduce lines shown."""
    lines = exports._footer_lines(table)  # the very lines every export carries
    notes = [line for line in lines if line.startswith("Note: ")]
    rest = [line for line in lines if not line.startswith("Note: ")]
    shown = "".join(f"<div><code>{_e(line)}</code></div>" if line.startswith("Reproduce: ")
                    else f"<div>{_e(line)}</div>" for line in rest)
    runs = sum(line.startswith("Reproduce: ") for line in rest)
    folded = (f"<details><summary>Notes ({len(notes)})</summary>"
              + "".join(f"<p>{_e(n[len('Note: '):])}</p>" for n in notes) + "</details>") if notes else ""
    # folded under one line that says what is inside: a dozen runs' lines made the page five screens long
    return (f'<div class="prov">{folded}<details><summary>Provenance and Reproduce: {runs} command(s) rerun '
            f"every number above</summary>{shown}</details></div>")


def _figure(fig, div_id: str, clickable: bool) -> str:
    # a click on a cell opens its technique's page (customdata[0] is its technique: a TECHNIQUES key)
    script = ("document.getElementById('{plot_id}').on('plotly_click', function (d) {"
              " var p = d.points.find(function (q) { return q.customdata; });"
              " if (p) { window.location.href = p.customdata[0] + '.html'; } });") if clickable else None
    return '<div class="figure">' + fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                                                post_script=script, config={"displayModeBar": False}) + "</div>"


def _overview(df: pd.DataFrame, grid: report.Table) -> str:
    picks = headline.pick(grid.data)
    every = comparisons.every_comparison(df)
    claims = report.claims_table(df)
    index = every.frame.assign(technique=[report.TECHNIQUES[p].title if p in report.TECHNIQUES else p
                                          for p in every.frame["page"]]).drop(columns="page")
    return (f"<p>{_e(glance.LEGEND)} {_e(glance.CLICK)}</p>" + _figure(glance.figure(picks), "glance", clickable=True)
            + '<p class="prov">Every figure of every cell, each baseline named: <a href="cite.html">cite page</a>, '
              "<code>speedlib report --table headline</code>.</p>" + _provenance(grid)
            + "<h2>Every paired comparison (latest commit per machine)</h2>"
            + f"<details><summary>{len(index)} comparisons, one line each</summary>{_table(index)}</details>"
            + _provenance(every)
            + f"<details><summary>Claims of the sources versus measured ({len(claims.frame)})</summary>"
            + _table(claims.frame) + _provenance(claims) + "</details>")


def _technique(df: pd.DataFrame, grid: report.Table, name: str) -> str:
    picks = headline.pick(grid.data)
    picks = picks[picks["technique"] == name]
    body = (f"<p>{_e(glance.LEGEND)}</p>" + _figure(glance.figure(picks), f"glance-{name}", clickable=False)) \
        if not picks.empty else ""
    tidy = grid.data[grid.data["technique"] == name]
    mine = tidy.assign(figure=[glance.figure_text(r) for r in tidy.itertuples()])[
        ["machine", "part", "measure", "case", "figure", "n", "baseline_name", "baseline_words", "status"]]
    title = report.TECHNIQUES[name].title
    own = report.Table(title, mine, grid.sources[grid.sources["technique"] == name] if not grid.sources.empty
                       else grid.sources, [n for n in grid.notes if n.startswith(f"{title}")])
    body += f"<h2>Its main comparison, every baseline</h2>{_table(mine)}{_provenance(own)}"
    paired = report.paired_table(report.latest(df[df["technique"] == name]))
    if not paired.frame.empty:
        body += f"<h2>Paired speedups (latest commit per machine)</h2>{_table(paired.frame)}{_provenance(paired)}"
    return body


def _history(df: pd.DataFrame) -> str:
    """Each headline class's timed benchmarks measured at two or more commits on one machine."""
    suites = {(h.technique, s) for h in headline.HEADLINES for s in (h.suite, h.whole.suite if h.whole else None) if s}
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
        fig.update_layout(height=360, margin=dict(t=30), yaxis=dict(type="log", title=_e(h["unit"].iloc[0])),
                          xaxis=dict(type="category", title="commit"), legend=dict(orientation="h", y=-0.3))
        body += (f"<h2>{_e(benchmark)}</h2>" + _figure(fig, f"history-{i}", clickable=False)
                 + f"<details><summary>The table ({len(table.frame)} rows)</summary>{_table(table.frame)}</details>"
                 + _provenance(table))
    return body or "<p>No timed benchmark of a headline comparison is measured at two commits yet.</p>"


def _cite(grid: report.Table, cff_text: str | None) -> str:
    files = dict(zip(CITE_FILES, (report.to_csv(grid), report.csv_provenance(grid), report.to_markdown(grid),
                                  report.to_latex(grid)), strict=True))
    links = " ".join(f'<a href="{n}">{n}</a>' for n in files)
    body = (f"<p>The headline as files, the same as <code>speedlib report --table headline --format md|csv|tex"
            f"</code>: {links}. The CSV is tidy data (one row per technique, machine and comparison).</p>"
            f"<h2>Markdown</h2><pre>{_e(files['headline.md'])}</pre>")
    if cff_text:
        try:
            body += f"<h2>BibTeX</h2><pre>{_e(report.bibtex(cff_text))}</pre>"
        except ValueError as e:
            body += f"<p>CITATION.cff gives no BibTeX entry: {_e(e)}</p>"
    return body, files


def chart(df: pd.DataFrame) -> str:
    """The at-a-glance chart of `df` (the loaded results, every commit) as an SVG image."""
    return glance.svg(headline.glance(df), glance.elsewhere(df))


def names() -> list[str]:
    """Every file the site holds, whatever the results: `speedlib publish --output` replaces a
    directory holding these and nothing else."""
    return [*PAGES, *(f"{n}.html" for n in report.TECHNIQUES), *CITE_FILES, PLOTLY_JS]


def pages(df: pd.DataFrame, cff_text: str | None = None) -> dict[str, str]:
    """The site of `df` (the loaded results, every commit): file name -> its text (`names`)."""
    grid = headline.grid(df)
    last = df  # the overview's index and claims choose their own commits, as on the dashboard
    cite, files = _cite(grid, cff_text)
    return {"index.html": _page("speedlib: which PyTorch speed tricks pay off", _overview(last, grid)),
            **{f"{n}.html": _page(t.title, _technique(df, grid, n)) for n, t in report.TECHNIQUES.items()},
            "history.html": _page("History across commits", _history(df)),
            "cite.html": _page("Cite and export", cite), **files, PLOTLY_JS: get_plotlyjs()}
