"""The Streamlit dashboard: every page under AppTest (committed, synthetic, empty and broken
results), and one end-to-end run in a real headless Chromium driven by Playwright.

The browser test needs Debian's `chromium` (never a downloaded browser) and the `playwright`
package; `.ci/run` installs both and sets SPEEDLIB_REQUIRE_BROWSER=1, so in CI a missing
browser fails the test instead of skipping it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("streamlit", reason="the dashboard extra is not installed (pip install -e '.[dashboard]')")
import browser_bits
from dashboard_bits import app_on, cell_text, frames, glance_cells, read
from streamlit.testing.v1 import AppTest

from speedbench import report
from speedbench.report import comparisons, glance, headline
from speedbench.results import synthetic
from speedbench.results.load import load_results

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["views/overview.py", "views/history.py", "views/machines.py", "views/cite.py",
         *[f"/{name}" for name in report.TECHNIQUES]]


@pytest.fixture(scope="module")
def synthetic_tree(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("results")
    synthetic.write_results(tree, commits=3, machines=3)
    return tree


def texts(at: AppTest) -> str:
    parts = [e.value for kind in ("info", "warning", "markdown", "text", "caption", "title", "subheader", "code")
             for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_on_committed_results(page, monkeypatch):
    at = app_on(ROOT / "results", page, monkeypatch)
    assert not at.exception, at.exception
    assert at.title, "every page has a title"
    if page.startswith("/"):  # a technique's address opens its page of the template, not the default page
        assert at.title[0].value == report.TECHNIQUES[page[1:]].title


def test_a_pages_own_tab_is_a_recorded_techniques():
    """The technique pages come from TECHNIQUES through one template (each address opens its
    record's title: the test above); the tabs some pages add are keyed by a technique with a record."""
    sys.path.insert(0, str(ROOT / "dashboard"))
    import _technique  # noqa: PLC0415 - the dashboard's module, on the path above

    assert _technique.OWN_TABS and set(_technique.OWN_TABS) <= set(report.TECHNIQUES)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_on_synthetic_results_with_several_gpus(page, synthetic_tree, monkeypatch):
    at = app_on(synthetic_tree, page, monkeypatch)
    assert not at.exception, at.exception
    assert not at.warning  # nothing was skipped
    if page in ("views/overview.py", "/contiguous", "views/machines.py", "views/cite.py"):
        assert frames(at), "the page shows a table"


@pytest.mark.parametrize("page", PAGES)
def test_empty_results_say_so(page, tmp_path, monkeypatch):
    at = app_on(tmp_path, page, monkeypatch)
    assert not at.exception, at.exception
    assert "No measured results" in texts(at)


def test_bad_files_are_reported_not_raised(synthetic_tree, tmp_path, monkeypatch):
    tree = tmp_path / "results"
    shutil.copytree(synthetic_tree, tree)
    bad = sorted((tree / "synthetic-h100").glob("*-existing-*.json"))[0]
    bad.write_text(bad.read_text()[:300])
    at = app_on(tree, "views/overview.py", monkeypatch)
    assert not at.exception
    assert "1 problem(s)" in at.warning[0].value
    assert bad.name in at.text[0].value and "not valid JSON" in at.text[0].value



@pytest.mark.parametrize("page", PAGES)
def test_odd_results_the_loader_accepts_do_not_break_a_page(page, tmp_path, monkeypatch):
    """A result file without a date, an environment record whose GPU name is not text."""
    synthetic.write_results(tmp_path, commits=2, machines=2)
    for result in tmp_path.glob("*/*-existing-*.json"):
        data = json.loads(result.read_text())
        del data["date"]
        result.write_text(json.dumps(data))
    for record in tmp_path.glob("*/environment/*.jsonl"):
        record.write_text(record.read_text().replace('"gpu_model": "NVIDIA', '"gpu_model": 5, "x": "NVIDIA'))
    at = app_on(tmp_path, page, monkeypatch)
    assert not at.exception, at.exception


def test_links_out_of_the_tree_are_neither_walked_nor_read(synthetic_tree, tmp_path, monkeypatch):
    """A link to / must not send the dashboard through the whole disk, nor a FIFO stop it."""
    tree = tmp_path / "results"
    shutil.copytree(synthetic_tree, tree)
    os.symlink("/", tree / "everything")
    os.mkfifo(tree / "synthetic-h100" / "pipe.json")
    at = app_on(tree, "views/overview.py", monkeypatch)
    assert not at.exception
    shown = at.text[0].value
    assert "everything: a symlink out of the results tree" in shown and "pipe.json: unreadable (a FIFO" in shown

EVIL = "[x](javascript:alert(1))<img src=x onerror=alert(2)>"


@pytest.mark.parametrize("page", PAGES)
def test_nothing_from_a_result_file_reaches_markdown(page, tmp_path, monkeypatch):
    """A machine or GPU name that is Markdown or HTML is shown as text, never rendered."""
    synthetic.write_results(tmp_path, commits=2, machines=1)
    (tmp_path / "synthetic-h100").rename(tmp_path / EVIL)
    for record in (tmp_path / EVIL / "environment").glob("*.jsonl"):
        record.write_text(record.read_text().replace("NVIDIA H100 80GB HBM3 (synthetic)", EVIL))
    at = app_on(tmp_path, page, monkeypatch)
    assert not at.exception
    rendered = [e.value for kind in ("markdown", "info", "warning", "caption", "title", "subheader", "error")
                for e in getattr(at, kind)]
    # escaped, a name may still be shown as text (a note names the machine whose GPU tests it reports):
    # never as a link or a tag
    assert not any(re.search(r"(?<!\\)\]\(javascript:", str(v)) or "<img" in str(v) for v in rendered)


def test_a_name_that_is_html_is_text_in_the_glance_chart_and_its_hover(tmp_path):
    """The at-a-glance chart is Vega-Lite: a machine and GPU named with a tag are drawn as SVG
    text and said as text in the hover, never made an element (no image is requested)."""
    synthetic.write_results(tmp_path / "results", commits=2, machines=1)
    tree = tmp_path / "results"
    (tree / "synthetic-h100").rename(tree / EVIL)
    for record in (tree / EVIL / "environment").glob("*.jsonl"):
        record.write_text(record.read_text().replace("NVIDIA H100 80GB HBM3 (synthetic)", EVIL))
    chromium, sync_playwright = _browser()
    with _serving(tree, tmp_path) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            asked = []
            page.on("request", lambda r: asked.append(r.url))
            page.goto(url)
            cell = page.locator(f"{GLANCE} path").first
            cell.wait_for(timeout=60_000)
            box = cell.bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.locator("#vg-tooltip-element").wait_for(timeout=30_000)
            tooltip = page.locator("#vg-tooltip-element").inner_text()
            labels = page.locator("[data-testid='stVegaLiteChart'] svg.marks").first.inner_html()
            images = page.evaluate("() => document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] img, "
                                   "#vg-tooltip-element img').length")
        finally:
            browser.close()
    assert EVIL in tooltip and images == 0  # said whole, as text
    assert "&lt;img src=x onerror=alert(2)&gt;" in labels and "<img" not in labels  # SVG text, escaped
    assert not [u for u in asked if u.rstrip("/").endswith("/x")]  # no image requested from the name


IMAGE = "![t](x.png)<img src=y>"


def _rendered(at: AppTest) -> list[str]:
    """Every text Streamlit renders as Markdown (titles, captions, alerts, expander labels, and every
    cell and header of a static table)."""
    shown = [str(e.value) for kind in ("markdown", "info", "warning", "caption", "title", "subheader", "error",
                                        "header", "success") for e in getattr(at, kind)]
    cells = [str(v) for t in at.table for v in [*t.value.columns, *t.value.to_numpy().ravel()]]
    return shown + [str(e.label) for e in at.expander] + cells


@pytest.mark.parametrize("page", PAGES)
def test_a_machine_name_is_text_on_every_page_even_where_two_are_compared(page, tmp_path, monkeypatch):
    """Issue 42: the Machine comparison page wrote its machines' names into a subheader, which is
    Markdown: a machine named ![t](...) became an <img>. Every name from a results tree is text,
    on every page, the comparison of that machine with another included."""
    synthetic.write_results(tmp_path, commits=2, machines=2)
    (tmp_path / "synthetic-h200").rename(tmp_path / IMAGE)
    at = app_on(tmp_path, page, monkeypatch, a="synthetic-h100", b=IMAGE, machine=IMAGE)
    assert not at.exception, at.exception
    shown = _rendered(at)
    if page in ("views/machines.py", "/contiguous"):
        assert any("x.png" in v or "x\\.png" in v for v in shown), "the name is on the page (as text)"
    if page == "views/machines.py":  # its machines table is static (too wide for a grid): Markdown cells
        assert any(read(t.value).isin([IMAGE]).any().any() for t in at.table)  # read as written
    # Markdown would draw "![t](x.png)" as an image and "<img" as a tag: escaped, neither
    assert not any("![t](" in v or re.search(r"(?<!\\)<img", v) for v in shown), shown


def test_missing_gpu_run_is_explained(tmp_path, monkeypatch):
    synthetic.write_results(tmp_path, commits=2, machines=3)
    for gpu in ("synthetic-h100", "synthetic-h200"):
        shutil.rmtree(tmp_path / gpu)
    at = app_on(tmp_path, "views/overview.py", monkeypatch)
    assert "No GPU run is committed yet" in texts(at)


def test_the_committed_gpu_run_is_on_the_overview(monkeypatch):
    at = app_on(ROOT / "results", "views/overview.py", monkeypatch)
    assert "No GPU run is committed yet" not in texts(at)
    shown = pd.concat(frames(at))
    assert shown.astype(str).apply(lambda col: col.str.contains("H100")).any().any()


def test_filter_from_the_url(synthetic_tree, monkeypatch):
    at = app_on(synthetic_tree, "/contiguous", monkeypatch, machine="synthetic-h200", workload="mlp")
    shown = frames(at)[0]
    assert any(t.value.startswith("synthetic-h200: NVIDIA H200") for t in at.text) and set(shown["workload"]) == {"mlp"}
    assert "machine" not in shown and "GPU" not in shown  # the line above the tables states them
    at = app_on(synthetic_tree, "views/cite.py", monkeypatch, table="speedup", machine="synthetic-h200")
    assert set(frames(at)[0]["machine"]) == {"synthetic-h200"}


def test_a_filter_value_that_does_not_exist_is_said_escaped_and_nothing_else_shown(synthetic_tree, monkeypatch):
    """Issue 44: a link naming a machine the results lack no longer shows another machine's
    numbers in its place; the value is said, escaped, never rendered."""
    at = app_on(synthetic_tree, "/contiguous", monkeypatch, machine="<script>alert(1)</script>")
    assert not at.exception and not any(t.value.startswith("synthetic-h100: ") for t in at.text)
    assert any("&lt;script&gt;alert(1)&lt;/script&gt;" in e.value for e in at.error)
    # without a choice in the link, the default: a GPU machine (a CPU runs small workloads)
    at = app_on(synthetic_tree, "/contiguous", monkeypatch)
    assert at.query_params["machine"] in ("synthetic-h100", "synthetic-h200")


def test_a_technique_page_opens_on_the_newest_gpu_machine_with_current_results_and_pytorchs_default(monkeypatch):
    """Issue 51: with no machine in the link a page opened on the oldest GPU machine (the H100's
    earlier benchmark version), and its baseline selector on the source's baseline."""
    measured = load_results(ROOT / "results").measured
    rows = measured[measured["technique"] == "contiguous"]
    gpus = rows[rows["gpu"] != "CPU only"]
    current = gpus[~report.earlier_version(gpus)]
    newest = (current if not current.empty else gpus).sort_values("run_date")["machine"].iloc[-1]
    at = app_on(ROOT / "results", "/contiguous", monkeypatch)
    assert not at.exception and at.query_params["machine"] == newest
    assert at.query_params["baseline"] == "foreach"  # torch.optim.Adam's own choice on CUDA
    at = app_on(ROOT / "results", "/contiguous", monkeypatch, machine="cpu-2core-intel-xeon")
    assert at.query_params["baseline"] == "forloop"  # and on a CPU


def test_a_cells_link_opens_the_page_on_its_figure(monkeypatch):
    """Issue 51: a click on a cell opened /amp?until=... with no machine, on the H100. The link
    a cell opens (the dashboard's click, _glance.cell_link) shows that cell's figure in the
    page's first table of its tab: one measured cell of every row, on a GPU machine."""
    sys.path.insert(0, str(ROOT / "dashboard"))
    import _glance  # noqa: PLC0415 - the dashboard's module, on the path above

    grid = headline.grid(load_results(ROOT / "results").measured)
    shown = grid.data[(grid.data["status"] == headline.MEASURED) & (grid.data["gpu"] != "CPU only")]
    checked = 0
    for _, rows in shown.groupby("question", sort=False):
        r = next(rows.itertuples())
        link = _glance.cell_link(r)
        assert {"machine", "commit", "baseline", "suite", "tab"} <= set(link)
        at = app_on(ROOT / "results", f"/{r.technique}", monkeypatch, **link)
        assert not at.exception and not at.error, (r.question, at.exception)
        assert dict(at.query_params)["machine"] == r.machine and dict(at.query_params)["baseline"] == r.baseline
        figure = report.fmt_ratio(r.ratio, r.low, r.high) if r.measure == "speed" else f"{r.ratio:.3g}x"
        tables = [t.astype(str) for t in frames(at)]
        assert any(t.apply(lambda c, f=figure: c.str.contains(f, regex=False)).any().any() for t in tables), \
            (r.question, figure)
        checked += 1
    assert checked >= 6


def test_a_machine_the_results_lack_in_a_multiselect_link_is_said_and_nothing_shown(monkeypatch):
    """Issue 51: cite?machine=h999-fake silently showed all four machines."""
    at = app_on(ROOT / "results", "views/cite.py", monkeypatch, machine="h999-fake")
    assert not at.exception
    assert any("'h999-fake', which these results do not have" in e.value for e in at.error)
    assert not frames(at) and not at.get("download_button")
    assert at.query_params["machine"] in ("h999-fake", ["h999-fake"])  # the link is left as it was
    at = app_on(ROOT / "results", "views/overview.py", monkeypatch, machine="h999-fake")
    assert any("'h999-fake'" in e.value for e in at.error) and not at.get("vega_lite_chart")  # no glance chart


def test_cite_page_offers_three_exports_and_bibtex(synthetic_tree, monkeypatch):
    at = app_on(synthetic_tree, "views/cite.py", monkeypatch, table="memory")
    assert "Memory (peak, saved activations, retained bytes)" in texts(at)
    assert "@software{speedlib2026" in texts(at) and "Reproduce:" in texts(at)
    # The footer is text: a code block showed its escapes (\[ and &gt;), and Markdown drew a planted
    # verdict's $...$ as LaTeX and its addresses as links (issue 54, tests/dashboard/test_links_hostile.py)
    assert any(t.value.startswith("Reproduce:") for t in at.text)
    assert not any("Reproduce:" in m.value for m in at.markdown) and not any("Reproduce:" in c.value for c in at.code)
    assert set(frames(at)[0]["machine"]) <= {"synthetic-h100", "synthetic-h200"}  # memory: GPUs only


def test_cite_page_lists_techniques_only_and_offers_the_headline_grid(monkeypatch):
    """The technique filter holds techniques (report.TECHNIQUES), not the viewer's own timing
    benchmark ("dashboard"); the tables are named for what they are, the headline grid among
    them, each offered in every format, the CSV with its provenance in a zip."""
    measured = load_results(ROOT / "results").measured
    assert "dashboard" in set(measured["technique"])  # the committed results hold it
    at = app_on(ROOT / "results", "views/cite.py", monkeypatch, table="headline")
    assert not at.exception, at.exception
    assert at.multiselect(key="technique").options == [t for t in report.TECHNIQUES
                                                       if t in set(measured["technique"])]
    tables = at.selectbox(key="table")
    assert tables.options[0].startswith("Headline grid") and not any("(the headline)" in o for o in tables.options)
    assert any(o.startswith("Paired speedups") for o in tables.options)
    shown = frames(at)[0]
    assert list(shown["technique"]) == list(headline.grid(measured).frame["technique"])
    buttons = [b.proto.label for b in at.get("download_button")]
    assert buttons == ["Download Markdown", "Download CSV + provenance (zip)", "Download CSV (data only)",
                       "Download LaTeX"]
    # One technique: the grid keeps its rows alone, and its CSV the same rows
    at = app_on(ROOT / "results", "views/cite.py", monkeypatch, table="headline", technique="amp")
    amp = [q.label for q in headline.QUESTIONS if q.technique == "amp"]
    assert list(frames(at)[0]["question"]) == amp and len(amp) == 2
    footer = [t.value for t in at.text]  # drawn as text, one element a line (dashboard/_footer.py)
    assert any(line.startswith("Note: " + amp[0]) for line in footer)  # its notes stay, the other rows' go
    assert not any(line.startswith("Note: " + q.label) for line in footer for q in headline.QUESTIONS
                   if q.technique != "amp")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _serving(results: Path, tmp_path: Path):
    """`speedlib dashboard` serving `results` on a free localhost port."""
    port = free_port()
    log = (tmp_path / "streamlit.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "speedbench.cli", "dashboard", "--results", str(results),
                             "--port", str(port), "--no-browser"], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "HOME": str(tmp_path)}, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "streamlit.log").read_text()
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


@pytest.fixture
def served(synthetic_tree, tmp_path):
    with _serving(synthetic_tree, tmp_path) as url:
        yield url


_browser = browser_bits.browser


def test_browser_end_to_end(served, tmp_path):
    """Open the app, switch pages, filter through the URL, download a CSV and read it back."""
    chromium, sync_playwright = _browser()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page(accept_downloads=True)
            page.goto(served)
            page.locator(f"{GLANCE} path").first.wait_for(timeout=60_000)  # the at-a-glance chart
            page.get_by_role("link", name="History across commits").click()
            page.get_by_role("heading", name="History across commits").wait_for(timeout=30_000)
            assert urllib.parse.urlsplit(page.url).path.rstrip("/").endswith("/history")

            page.goto(f"{served}/contiguous?machine=synthetic-h200&workload=mlp")  # a selectbox and a multiselect
            page.get_by_text("synthetic-h200: NVIDIA H200 (synthetic)").wait_for(timeout=60_000)
            # The browser's address bar now names every filter, the defaults and the pin included.
            page.wait_for_url(lambda url: "tab=" in url and "metric=" in url, timeout=30_000)
            link = urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query)
            assert {"until", "machine", "commit", "workload", "baseline", "tab", "metric"} <= set(link)
            assert link["machine"] == ["synthetic-h200"] and link["workload"] == ["mlp"] and link["tab"] == ["Time"]

            page.goto(f"{served}/cite?table=speedup&machine=synthetic-h200")
            page.get_by_role("heading", name="Speedup (time)").wait_for(timeout=60_000)
            with page.expect_download(timeout=30_000) as download:
                page.get_by_role("button", name="Download CSV (data only)").click()
            path = tmp_path / "export.csv"
            download.value.save_as(path)
        finally:
            browser.close()
    table = pd.read_csv(path)  # plain data: no option needed
    assert len(table) == 4 and set(table["machine"]) == {"synthetic-h200"}  # 2 workloads x 2 non-baseline variants
    assert set(table["variant"]) == {"fused", "speedlib"}
    assert all(pd.api.types.is_float_dtype(table[c]) for c in ("ratio", "low", "high", "value"))  # numbers, not text
    assert (table["low"] <= table["ratio"]).all() and (table["ratio"] <= table["high"]).all()


def test_the_overview_leads_with_the_at_a_glance_chart(monkeypatch):
    """The first thing on the overview is one chart, technique x machine, GPU machines first,
    each cell the number headline.pick chooses from `speedlib report --table headline`'s rows;
    the paired comparisons follow, folded, every line of speedbench.report.comparisons there."""
    at = app_on(ROOT / "results", "views/overview.py", monkeypatch)
    assert not at.exception
    measured = load_results(ROOT / "results").measured
    cells = glance_cells(at).dropna(subset=["technique"])  # a cell with no row at all is blank grey
    picks = headline.glance(measured)
    at_cell = {(r.question, r.machine): r for r in picks.itertuples()}
    assert sorted(zip(cells["question_id"], cells["machine_id"], strict=True)) == sorted(at_cell)
    gpus = glance.order_machines(picks)[:2]
    assert list(cells["machine_id"][:2]) == gpus and all("CPU" not in at_cell[("amp-fp32", m)].gpu
                                                         for m in gpus)  # GPUs first
    for c in cells.itertuples():
        r, text = at_cell[(c.question_id, c.machine_id)], cell_text(c)
        figure = glance.figure_text(r)
        assert (figure.split()[0] in text) if figure else (r.status.partition(": ")[0] in text)
        assert c.comparison == r.label and (c.figure.startswith(figure) if figure else pd.isna(c.figure))  # the hover
    first_cell = at_cell[(cells["question_id"].iloc[0], cells["machine_id"].iloc[0])]
    assert cell_text(cells.iloc[0]).startswith(glance.figure_text(first_cell).split(" †")[0])
    every = comparisons.every_comparison(measured)
    (index,) = [e for e in at.expander if "comparisons of" in e.label]
    shown = " ".join(m.value for m in index.markdown)
    assert all(report.md_escape(c) in shown for c in every.frame["comparison"])


def _land_a_newer_commit(tree: Path, scratch: Path) -> None:
    """Copy in the files of a third, newer commit; the files already there stay as they are."""
    synthetic.write_results(scratch, commits=3, machines=3)
    added = 0
    for path in scratch.rglob("*"):
        target = tree / path.relative_to(scratch)
        if path.is_file() and not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
            added += 1
    assert added


def _view_of(at: AppTest) -> list[pd.DataFrame]:
    return [d.reset_index(drop=True) for d in frames(at)]


@pytest.mark.parametrize("page, query", [("/contiguous", {}), ("views/overview.py", {}),
                                         ("views/cite.py", {"table": "speedup"}), ("views/history.py", {})])
def test_a_copied_link_shows_the_same_numbers_after_new_results_land(page, query, tmp_path, monkeypatch):
    """The URL holds every filter, defaults and the open tab included, and pins the view to
    the results measured so far: a newer commit landing later changes the unpinned view
    (so this test can fail) but not the link."""
    tree = tmp_path / "results"
    synthetic.write_results(tree, commits=2, machines=3)
    first = app_on(tree, page, monkeypatch, **query)
    link = dict(first.query_params)
    assert "until" in link and not first.exception
    assert not first.button or "newer" not in " ".join(b.label for b in first.button)  # pinned to the newest
    if page == "/contiguous":
        assert {"machine", "commit", "workload", "baseline", "tab", "metric"} <= set(link)
    _land_a_newer_commit(tree, tmp_path / "newer")
    later = app_on(tree, page, monkeypatch, **link)
    assert not later.exception
    assert len(_view_of(later)) == len(_view_of(first))
    for a, b in zip(_view_of(first), _view_of(later), strict=True):
        pd.testing.assert_frame_equal(a, b)
    assert "1 newer result" in texts(later) or "newer result(s)" in " ".join(b.label for b in later.button)
    unpinned = app_on(tree, page, monkeypatch, **query)
    assert dict(unpinned.query_params)["until"] > link["until"]
    if page != "views/history.py":  # the history shows every commit either way, the newest one added
        assert any(not a.equals(b) for a, b in zip(_view_of(first), _view_of(unpinned), strict=True))


def test_the_open_tab_comes_from_the_link(synthetic_tree, monkeypatch):
    at = app_on(synthetic_tree, "/contiguous", monkeypatch, machine="synthetic-h100", tab="Memory")
    assert not at.exception and dict(at.query_params)["tab"] == "Memory"
    assert dict(at.query_params)["machine"] == "synthetic-h100"


def test_results_of_changed_benchmarks_are_listed_quietly_not_as_problems(monkeypatch):
    """The committed results hold older benchmark versions: history, not damage."""
    at = app_on(ROOT / "results", "views/overview.py", monkeypatch)
    assert not any("problem" in w.value for w in at.warning)
    # a maintainer's detail, off the top of every page (issue 51): on the Machines page's foot
    assert not any("hold older results" in e.label for e in at.expander)
    at = app_on(ROOT / "results", "views/machines.py", monkeypatch)
    # One line counts them; the list behind it says what happened to each.
    summary = [e for e in at.expander if "hold older results" in e.label]
    assert summary and summary[0] is at.expander[-1]
    assert len(summary) == 1 and "set aside: older benchmark version" in summary[0].label
    listed = summary[0].text[0].value.splitlines()
    assert len(listed) > 1 and all(line.startswith(("set aside: ", "skipped: ", "kept, flagged †: "))
                                   for line in listed)


def _screenshot_dir() -> Path:
    """Where the browser test leaves a screenshot of every page: CI keeps it as an artifact."""
    target = Path(os.environ.get("SPEEDLIB_SCREENSHOTS") or Path(tempfile.gettempdir()) / "speedlib-screenshots")
    target.mkdir(parents=True, exist_ok=True)
    return target


# The glance chart's cells as drawn: Vega-Lite's unseen top layer (hits), one rectangle per cell
# named by its axes' values, and the text of the three text marks inside it, in line order.
GLANCE = "[data-testid='stVegaLiteChart'] .hits_marks"
_CELLS = ("() => { const svg = document.querySelector(\"[data-testid='stVegaLiteChart'] svg.marks\");"
          " const texts = [...svg.querySelectorAll('.mark-text.role-mark text')];"
          " return [...svg.querySelectorAll('.hits_marks path')].map(p => { const box = p.getBoundingClientRect();"
          " const inside = texts.filter(t => { const b = t.getBoundingClientRect(); const x = b.x + b.width / 2,"
          " y = b.y + b.height / 2; return x > box.x && x < box.right && y > box.y && y < box.bottom; });"
          " const lines = inside.map(t => [...t.querySelectorAll('tspan')].map(s => s.textContent));"
          " return [p.getAttribute('aria-label'), lines[0].map((_, k) => lines.map(l => l[k]).join(''))]; }); }")


def _cell_on_screen(aria: str, lines: list[str]) -> tuple[str, str, str]:
    """(question's label, machine, text) of a cell drawn: its axes' values in its label, wrapped
    on the chart; its lines without the zero-width spaces that hold the marks' lines apart."""
    column, row = re.fullmatch(r"column: (.*); row: (.*)", aria, re.S).groups()
    text = " ".join(t for t in (line.replace("\u200b", "") for line in lines) if t)
    return row.replace("\n", " "), column.split("\n")[0], text


CLICKED = "h200-141gb"  # the committed GPU run that measured mixed precision against PyTorch's default
TITLES = {"overview": "speedlib: which PyTorch speed tricks pay off", "history": "History across commits",
          "machines": "Machine comparison", "cite": "Cite and export",
          **{name: t.title for name, t in report.TECHNIQUES.items()}}


def _settled(page, title: str) -> None:
    """The page's title is drawn and Streamlit has finished running the script."""
    page.get_by_role("heading", name=title).first.wait_for(timeout=90_000)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=90_000)


def _height_settled(page) -> int:
    """The main column's height once it has stopped changing for half a second, px."""
    heights = [-1]
    while len(heights) < 3 or heights[-1] != heights[-2]:
        page.wait_for_timeout(250)
        heights.append(page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight"))
        assert len(heights) < 120, heights  # 30 s
    return heights[-1]


# Each row of the comparison index: its tallest cell's height in lines of its text.
_LINES_PER_ROW = """() => {
    const t = [...document.querySelectorAll('[data-testid="stMarkdownContainer"] table')]
        .find(t => t.querySelector('th') && t.querySelector('th').innerText.trim() === 'technique');
    return [...t.querySelectorAll('tr')].map(r => Math.max(...[...r.querySelectorAll('th, td')].map(c => {
        const s = getComputedStyle(c);
        const text = c.clientHeight - parseFloat(s.paddingTop) - parseFloat(s.paddingBottom);
        return Math.round(text / parseFloat(s.lineHeight)); }))); }"""


def _scrolling_sideways(page) -> list:
    """What scrolls sideways on the page: the page itself, a grid whose columns are wider than
    its frame (Streamlit's grid scrolls inside .dvn-scroller), a static table past the right edge."""
    # A grid draws its scroller after the script has finished: measured before, nothing scrolls.
    page.wait_for_function("() => [...document.querySelectorAll('[data-testid=\"stDataFrame\"]')]"
                           ".every(d => { if (!d.getClientRects().length) return true;"
                           "  // in a closed tab or expander\n"
                           "  const s = d.querySelector('.dvn-scroller'); return s && s.scrollWidth > 0; })",
                           timeout=60_000)
    return page.evaluate("""() => {
        const out = [];
        if (document.documentElement.scrollWidth > window.innerWidth + 1) out.push('page');
        for (const s of document.querySelectorAll('.dvn-scroller'))
            if (s.scrollWidth > s.clientWidth + 1) out.push(`grid ${s.scrollWidth} > ${s.clientWidth} px`);
        for (const t of document.querySelectorAll('table'))
            if (t.getBoundingClientRect().right > window.innerWidth + 1)
                out.push(`table to ${t.getBoundingClientRect().right} px`);
        return out; }""")


def test_every_page_in_a_real_browser_fresh_and_by_navigation(tmp_path):
    """On the committed results at 1440 x 900: each page opened by its URL and by the sidebar
    shows its title and no exception, and no table on it scrolls sideways; a screenshot of each
    is kept; the overview's first screen holds its whole chart with the marks explained above
    it, and lists every paired comparison; the tuning page draws one bar per knob, never one
    stacked bar."""
    chromium, sync_playwright = _browser()
    shots = _screenshot_dir()
    with _serving(ROOT / "results", tmp_path) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            # A laptop's screen: the size at which readers found columns cut and the dagger unexplained.
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            too_wide = {}
            for name, title in TITLES.items():
                page.goto(f"{url}/{'' if name == 'overview' else name}")
                _settled(page, title)
                assert page.locator("[data-testid='stException']").count() == 0, name
                page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
                assert (shots / f"{name}.png").stat().st_size > 10_000
                too_wide[name] = _scrolling_sideways(page)
            page.goto(url)
            _settled(page, TITLES["overview"])
            chart = page.locator("[data-testid='stVegaLiteChart']").first
            page.locator(f"{GLANCE} path").first.wait_for(timeout=60_000)
            cells_on_screen = [_cell_on_screen(*c) for c in page.evaluate(_CELLS)]
            # The chart and the marks' meaning: whole on the first screen, the marks said above the chart.
            legend = page.get_by_text(glance.LEGEND).first.bounding_box()
            chart_box = chart.bounding_box()
            folded_height = _height_settled(page)
            page.get_by_text("comparisons of").first.click()  # the index, folded under its count
            page.locator("[data-testid='stMarkdownContainer'] table").first.wait_for(timeout=60_000)
            _height_settled(page)  # the expander slides open: measured mid-way, the index looked short
            index_lines = page.evaluate(_LINES_PER_ROW)
            index_on_screen = page.evaluate(
                "() => [...document.querySelectorAll('[data-testid=\"stMarkdownContainer\"] table')].map(t =>"
                " [...t.querySelectorAll('tr')].map(r => [...r.querySelectorAll('th, td')]"
                ".map(c => c.innerText.trim())))")
            for name, title in TITLES.items():  # by navigation: the sidebar's links
                if name == "overview":
                    continue
                page.get_by_role("link", name=title, exact=True).click()
                _settled(page, title)
                assert page.locator("[data-testid='stException']").count() == 0, name
                # every chart is Vega-Lite: a page with one plotly chart loads all of plotly.js (1.5-2 s a tab)
                assert page.locator("[data-testid='stPlotlyChart']").count() == 0, name
            # A click lands on the figure clicked (issue 51: /amp?until=... opened on the H100): the
            # H200's mixed-precision cell against PyTorch's default opens amp at that machine,
            # commit, baseline and class, whose paired table shows the cell's figure.
            page.goto(url)
            _settled(page, TITLES["overview"])
            page.locator(f"{GLANCE} path").first.wait_for(timeout=60_000)
            amp = next(q.label for q in headline.QUESTIONS if q.key == "amp-default")
            target = next(i for i, (label, machine, _) in enumerate(cells_on_screen)
                          if (label, machine) == (amp, CLICKED))
            point = page.locator(f"{GLANCE} path").nth(target).bounding_box()
            page.mouse.click(point["x"] + point["width"] / 2, point["y"] + point["height"] / 2)
            page.wait_for_url(lambda u: "/amp?" in u and f"machine={CLICKED}" in u, timeout=60_000)
            _settled(page, TITLES["amp"])
            landed = urllib.parse.parse_qs(urllib.parse.urlsplit(page.url).query)
            page.goto(f"{url}/tuning")
            _settled(page, TITLES["tuning"])
            page.locator("[data-testid='stVegaLiteChart'] .mark-rect path").first.wait_for(timeout=60_000)
            # the paired chart's bars as drawn: one per knob, each labelled once down the side
            paired = page.locator("[data-testid='stVegaLiteChart']").filter(has_text="paired speedup").first
            bars_drawn = paired.locator(".mark-rect path").count()
            knob_labels = [x for x in paired.locator(".role-axis-label text").all_text_contents() if "knob=" in x]
        finally:
            browser.close()
    # The chart as drawn is the one `speedlib report --table headline`'s rows give, cell for cell.

    measured = load_results(ROOT / "results").measured
    picks = headline.glance(measured)
    at_cell = {(r.question, r.machine): r for r in picks.itertuples()}
    by_label = {(r.label, r.machine): r for r in picks.itertuples()}
    assert len(cells_on_screen) == picks["question"].nunique() * picks["machine"].nunique()  # blank ones too
    assert {(label, machine) for label, machine, _ in cells_on_screen} >= set(by_label)
    for label, machine, text in cells_on_screen:
        if (label, machine) not in by_label:
            assert not text  # no row for that machine: blank grey
            continue
        r = by_label[label, machine]
        figure = glance.figure_text(r)
        assert (figure.split()[0] in text) if figure else (r.status.partition(": ")[0] in text)
    clicked = at_cell[("amp-default", CLICKED)]
    assert {k: v[0] for k, v in landed.items() if k in ("machine", "commit", "baseline", "suite", "tab")} == {
        "machine": CLICKED, "commit": clicked.commit[:8], "baseline": clicked.baseline, "suite": clicked.suite,
        "tab": "Time"}  # what that page shows there: test_a_cells_link_opens_the_page_on_its_figure
    assert {n: w for n, w in too_wide.items() if w} == {}, "a table scrolls sideways at 1440 px"
    assert legend is not None and legend["y"] < chart_box["y"] and chart_box["y"] + chart_box["height"] <= 900
    # The page as it opens, its tables folded, is under two screens; opened, the index grows by its
    # rows alone, none wrapped past four lines (48 rows make it some six screens: hence the fold).
    assert folded_height <= 2 * 900, folded_height
    # Every paired comparison, one line each, as speedbench.report.comparisons computes it.
    every = comparisons.every_comparison(measured).frame
    assert len(index_lines) == len(every) + 1 and 1 <= min(index_lines) <= max(index_lines) <= 4, index_lines
    index = [t for t in index_on_screen if t and t[0][:2] == ["technique", "comparison"]]
    assert len(index) == 1 and [r[1] for r in index[0][1:]] == list(every["comparison"])
    assert len(every) >= 30 and {"FusedPointwise: compile vs off", "Iteration: speedlib vs forloop",
                                 "OptimizerStep: speedlib vs forloop", "Transfer: auto vs torch_pinned"} \
        <= set(every["comparison"])
    assert len(knob_labels) == len(set(knob_labels)) == bars_drawn >= 4, (knob_labels, bars_drawn)  # none stacked
    knobs = {x.split("knob=")[1].split()[0].split(",")[0] for x in knob_labels}
    assert {"channels_last", "conv_bias", "zero_grad", "accumulation"} <= knobs


def test_a_fresh_view_is_pinned_to_the_newest_result_not_just_before_it(monkeypatch):
    """Result times carry milliseconds and the link whole seconds: the pin rounds up."""
    at = app_on(ROOT / "results", "views/overview.py", monkeypatch)
    assert not any("newer" in b.label for b in at.button)
    measured = load_results(ROOT / "results").measured
    assert (measured["run_date"] != measured["run_date"].dt.floor("s")).any()  # the case this guards
    assert f"{len(measured)} measured values" in texts(at)


def test_a_deep_link_is_the_first_request_of_a_fresh_server(tmp_path):
    """A cited link opened on a just-started dashboard gets the app's navigation (titles in
    the sidebar), not Streamlit's file-name pages: with a pages/ directory it did."""
    chromium, sync_playwright = _browser()
    with _serving(ROOT / "results", tmp_path) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/amp?machine=h100-sxm-80gb")
            _settled(page, TITLES["amp"])
            sidebar = page.locator("[data-testid='stSidebarNav']").inner_text()
            # Every click on a tab opens it (a default that followed the URL dropped every second one).
            for name in ("Memory", "Time", "Not measured", "Bandwidth and floor", "Time"):
                page.get_by_role("tab", name=name).click()
                page.wait_for_function(
                    "n => [...document.querySelectorAll('[role=tab]')].some("
                    "t => t.innerText.trim() === n && t.getAttribute('aria-selected') === 'true')", arg=name,
                    timeout=30_000)
                page.wait_for_url(lambda u, n=name: "tab=" + urllib.parse.quote_plus(n) in u, timeout=30_000)
        finally:
            browser.close()
    assert "Mixed precision" in sidebar and "Performance Tuning Guide knobs" in sidebar
    assert "app" not in sidebar.split()


# Each ratio chart's axis labels as drawn: a label's lines (tspans) in order.
_RATIO_LABELS = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')]
    .filter(c => c.innerText.includes('x faster than the baseline'))
    .map(c => [...c.querySelectorAll('.role-axis-label text')]
        .map(t => t.querySelectorAll('tspan').length
             ? [...t.querySelectorAll('tspan')].map(s => s.textContent) : [t.textContent])
        .filter(lines => !/^[0-9.]+x$/.test(lines.join(''))))"""


def test_a_ratio_charts_labels_tell_its_bars_apart_on_a_phone(tmp_path):
    """At 390 px the Machines chart's labels were cut at the end, so "TrainingStep: knob=accumula…"
    named two bars (off and on): on a phone a label is its configuration over its variant; wider, one line."""
    chromium, sync_playwright = _browser()
    drawn = {}
    with _serving(ROOT / "results", tmp_path) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            for width in (390, 1440):
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.goto(f"{url}/machines")
                _settled(page, TITLES["machines"])
                page.locator("[data-testid='stVegaLiteChart'] .role-axis-label text").first.wait_for(timeout=60_000)
                drawn[width] = page.evaluate(_RATIO_LABELS)
                page.close()
        finally:
            browser.close()
    for width, charts in drawn.items():
        assert charts and all(charts), width
        for labels in charts:
            assert len({tuple(lines) for lines in labels}) == len(labels), (width, labels)  # none alike
    phone = [lines for labels in drawn[390] for lines in labels]
    assert all(len(lines) == 2 and "…" not in lines[1] for lines in phone if len(lines) > 1)
    assert any(len(lines) == 2 for lines in phone)
    assert all(len(lines) == 1 for labels in drawn[1440] for lines in labels)


@pytest.mark.parametrize("page", ["views/machines.py", "views/overview.py"])
def test_no_static_table_shows_the_loaders_row_numbers(page, monkeypatch):
    """The Machine comparison's value-by-value table showed a raw pandas index with gaps
    (0-6, then 12...): a Styler's hidden index is not hidden by st.table; hide_index is."""
    at = app_on(ROOT / "results", page, monkeypatch, a="cpu-2core-amd-epyc", b="cpu-2core-intel-xeon")
    assert not at.exception and at.table
    assert all(t.proto.hide_index for t in at.table)


@pytest.mark.parametrize("query", [{"machine": "h100-typo"}, {"machine": "h100-sxm-80gb", "commit": "deadbeef"}])
def test_a_link_naming_what_the_results_lack_says_so_and_shows_no_other_numbers(query, monkeypatch):
    """?machine=h100-typo silently showed another machine's numbers and rewrote the link."""
    at = app_on(ROOT / "results", "/contiguous", monkeypatch, **query)
    assert not at.exception
    (wanted,) = [v for v in query.values() if v in ("h100-typo", "deadbeef")]
    assert any(f"'{wanted}', which these results do not have" in e.value for e in at.error)
    assert not frames(at)  # no table of anything else
    assert wanted in dict(at.query_params).values()  # the link is left as it was
