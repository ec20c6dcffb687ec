"""`speedlib publish --output DIR`: a static site of the committed results that opens from
file:// with the network cut, every page without a console error, its numbers the report's.

The browser part needs Debian's `chromium` and `playwright`; with SPEEDLIB_REQUIRE_BROWSER set
(CI) a missing browser fails the test instead of skipping it, as in tests/dashboard/test_dashboard.py.
"""

from __future__ import annotations

import contextlib
import html.parser
import io
import re
from pathlib import Path

import browser_bits
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("plotly")

from speedbench import report  # noqa: E402 - after the skips: the report needs pandas
from speedbench.cli.parser import main  # noqa: E402 - after the skips, with the report it runs
from speedbench.report import headline, site  # noqa: E402 - after the skips: the site needs pandas and plotly
from speedbench.results.load import load_results  # noqa: E402 - after the skips: the loader needs pandas

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*site.PAGES, *(f"{name}.html" for name in report.TECHNIQUES)]


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    assert main(["publish", "--results", str(ROOT / "results"), "--output", str(out),
                 "--citation", str(ROOT / "CITATION.cff")]) == 0
    return out


class _TableText(html.parser.HTMLParser):
    """Every table of a page as rows of cell texts."""

    def __init__(self):
        super().__init__()
        self.tables, self._cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self.tables and self.tables[-1]:
            self.tables[-1][-1].append(self._cell.strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def _tables(text: str) -> list[list[list[str]]]:
    parser = _TableText()
    parser.feed(text)
    return [t for t in parser.tables if t]


def _report(*args: str) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(io.StringIO()):
        assert main(["report", "--results", str(ROOT / "results"), *args]) == 0
    return buffer.getvalue()


def test_every_page_has_a_stable_name_and_loads_nothing_from_the_network(published):
    for name in [*PAGES, site.PLOTLY_JS, "headline.csv", "headline.provenance.txt"]:
        assert (published / name).is_file(), name
    for name in PAGES:
        text = (published / name).read_text(encoding="utf-8")
        assert re.findall(r'<script src="([^"]+)"', text) == [site.PLOTLY_JS], name  # plotly.js written once
        assert not re.search(r'(src|href)="(https?:)?//', text), name  # every link relative
        reproduce = "Reproduce: " in text and "git checkout " in text
        assert reproduce or (name == "history.html" and "No timed" in text), name
    # the cite page's CSV is the report's, byte for byte
    assert (published / "headline.csv").read_text(encoding="utf-8") == _report("--table", "headline", "--format", "csv")


def test_the_site_has_the_dashboards_pages_and_tables(published):
    """Issue 51: the static site lacked the Machine comparison, every technique page's memory,
    floor and separately timed tables and charts; N read "30.0" and headers "baseline_name";
    its notes count differed from the dashboard's."""
    machines = (published / "machines.html").read_text(encoding="utf-8")
    assert "<h2>Machines</h2>" in machines and "Speedups on each machine" in machines
    checkpoint = (published / "checkpoint.html").read_text(encoding="utf-8")
    assert "<h3>Memory</h3>" in checkpoint and "Separately timed" in checkpoint and "Paired speedups" in checkpoint
    assert "<h3>Bandwidth and floor</h3>" in (published / "transfer.html").read_text(encoding="utf-8")
    counts = 0
    for name in PAGES:
        text = (published / name).read_text(encoding="utf-8")
        assert "baseline_name" not in text and "baseline_words" not in text, name
        for table in _tables(text):  # a count is an integer: "30", never "30.0"
            if "N" in table[0]:
                column = [row[table[0].index("N")] for row in table[1:]]
                assert all(n.isdigit() for n in column if n), (name, column)
                counts += sum(n.isdigit() for n in column)
    assert counts >= 50
    grid = headline.grid(load_results(ROOT / "results").measured)
    index = (published / "index.html").read_text(encoding="utf-8")
    assert f"<summary>Notes ({len(grid.notes)})</summary>" in index  # the dashboard's count: len(grid.notes)


def test_publish_refuses_a_missing_results_directory(tmp_path, capsys):
    assert main(["publish", "--results", str(tmp_path / "nowhere"), "--output", str(tmp_path / "site")]) == 2
    assert "no results directory" in capsys.readouterr().err and not (tmp_path / "site").exists()


def _cell_figures(text: str) -> str:
    """A chart cell's figure as the grid writes it: "<b>5.65x</b><br>[5.39, 6.61] †<br>..." -> "5.65x [5.39, 6.61]"."""
    bold = re.search(r"<b>([^<]+)</b>", text)
    interval = re.search(r"\[[^\]]+\]", text)
    return (bold.group(1).split()[0] + (f" {interval.group(0)}" if interval else "")) if bold else ""


def test_every_page_opens_offline_without_a_console_error_and_shows_the_reports_numbers(published):
    chromium, sync_playwright = browser_bits.browser()
    errors, blocked = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=browser_bits.ARGS)
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 900})
            context.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file://")
                          else (blocked.append(r.request.url), r.abort()))
            page = context.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            drawn = {}
            for name in PAGES:
                page.goto((published / name).as_uri())
                page.wait_for_load_state("load")
                drawn[name] = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].length")
            page.goto((published / "index.html").as_uri())
            cells = page.evaluate("() => { const g = document.getElementById('glance');"
                                  " const t = g.data.find(t => t.type === 'scatter');"
                                  " return t.text.map((x, i) => [x, ...t.customdata[i], t.hovertext[i]]); }")
            # a click on a cell lands on the figure clicked: its row on its technique's page
            box = page.locator("#glance .scatterlayer .point").first.bounding_box()
            x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
            page.mouse.move(x, y)  # plotly clicks what it hovers
            page.mouse.click(x, y)
            page.wait_for_url(lambda u: not u.endswith("/index.html"), timeout=15_000)
            opened = page.url
            landed = page.evaluate("() => { const r = document.querySelector(':target');"
                                   " return r ? r.innerText : null; }")
            # a phone's width: nothing scrolls sideways but the chart, which says so
            narrow = browser.new_context(viewport={"width": 390, "height": 900}).new_page()
            sideways = {}
            for name in PAGES:
                narrow.goto((published / name).as_uri())
                narrow.wait_for_load_state("load")
                sideways[name] = narrow.evaluate("() => document.documentElement.scrollWidth > innerWidth + 1")
            said_narrow = narrow.evaluate("() => [...document.querySelectorAll('.narrow')].filter("
                                          "e => getComputedStyle(e).display !== 'none').length")
            page.goto((published / "amp.html").as_uri())
            amp_speedups = page.evaluate(
                "() => { const t = [...document.querySelectorAll('table')].find(t => t.innerText.includes('speedup'));"
                " const head = [...t.rows[0].cells].map(c => c.innerText.trim()); const k = head.indexOf('speedup');"
                " return [...t.rows].slice(1).map(r => r.cells[k].innerText.trim()); }")
        finally:
            browser.close()
    assert errors == [] and blocked == [], (errors, blocked)
    assert all(drawn[n] >= 1 for n in PAGES if n != "cite.html"), drawn
    (_, _, machine, _, link, _) = cells[0]
    assert opened == (published / link.split("#")[0]).as_uri() + "#" + link.split("#")[1]
    assert landed is not None and machine in landed  # the row of that cell, its machine and figure
    figure = _cell_figures(cells[0][0])
    assert (figure.split()[0] in landed) if figure else True
    assert not any(sideways.values()), sideways
    assert said_narrow == 1
    # the hover says how far behind HEAD a figure is, as on the dashboard (where git has the commit)
    assert any("commits behind HEAD" in c[-1] for c in cells if _cell_figures(c[0]))
    # The chart's numbers are the report's: each cell's ratio and interval stand in the same
    # question's and machine's cell of `speedlib report --table headline`.
    grid = _report("--table", "headline")
    lines = [line for line in grid.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    rows = {r[1]: r for r in ([c.strip() for c in line.strip("|").split(" | ")] for line in lines[1:])}
    labels = {q.key: q.label for q in headline.QUESTIONS}
    checked = 0
    for text, _, machine, question, _, _ in cells:
        figure = _cell_figures(text)
        if not figure:
            continue
        column = next(i for i, h in enumerate(header) if h.startswith(machine + " "))
        said = rows[report.md_escape(labels[question])][column]  # Markdown: "\\[" for "["
        assert report.md_escape(figure) in said, (question, machine, figure, said)
        checked += len(re.findall(r"\d+\.?\d*", figure))
    # and the technique page's paired speedups are `speedlib report --table paired`'s
    paired = _report("--table", "paired", "--machine", "h200-141gb") + _report("--table", "paired")
    for speedup in amp_speedups:
        assert report.md_escape(speedup) in paired, speedup
        checked += len(re.findall(r"\d+\.?\d*", speedup))
    assert checked >= 20, checked
