"""Hostile links and planted text on the dashboard (issue 54): a query value no filter could hold
is refused in one line before any work; the Cite page refuses machines and techniques these
results lack, as the technique pages do; every string from a results tree is text in the Cite
page's export footer (a planted GPU test id drew LaTeX and a link there); and a request whose
Host header names another site (DNS rebinding) gets nothing but a refusal."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("streamlit", reason="the dashboard extra is not installed (pip install -e '.[dashboard]')")
import browser_bits
from dashboard_bits import app_on, frames

ROOT = Path(__file__).resolve().parents[2]
sys_path = ROOT / "dashboard"


@pytest.mark.parametrize("page", ["/contiguous", "views/cite.py", "views/overview.py"])
def test_a_value_no_filter_holds_is_refused_in_one_line_before_any_work(page, monkeypatch):
    began = time.monotonic()
    at = app_on(ROOT / "results", page, monkeypatch, machine="a" * 100_000)
    assert time.monotonic() - began < 20 and not at.exception
    assert [e.value for e in at.error] == [
        "This link gives machine a value 100,000 characters long ('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...'), "
        "longer than any name a filter takes (2,000): nothing is shown. Open the page from the menu, or fix the link."]
    assert not frames(at) and not at.title and not at.get("plotly_chart") and not at.get("vega_lite_chart")


def test_too_many_values_are_refused_too(monkeypatch):
    at = app_on(ROOT / "results", "views/cite.py", monkeypatch, machine=[f"m{i}" for i in range(500)])
    assert len(at.error) == 1 and "names 500 values of machine" in at.error[0].value and not frames(at)


@pytest.mark.parametrize("query, said", [({"machine": "h100-typo"}, "machines 'h100-typo'"),
                                         ({"machine": ["h100-sxm-80gb", "h999-fake"]}, "machines 'h999-fake'"),
                                         ({"technique": "amp", "machine": "h100-sxm-80gb"}, None),
                                         ({"technique": "nonsense"}, "techniques 'nonsense'")])
def test_cite_refuses_what_the_results_lack_like_the_technique_pages(query, said, monkeypatch):
    at = app_on(ROOT / "results", "views/cite.py", monkeypatch, table="paired", **query)
    assert not at.exception
    if said is None:  # all known: shown
        assert not at.error and set(frames(at)[0]["machine"]) == {"h100-sxm-80gb"}
        return
    assert len(at.error) == 1 and f"This link names {said}, which these results do not have" in at.error[0].value
    assert not frames(at) and not at.get("download_button")  # no other selection's numbers, nothing to cite
    assert at.button(key=f"_drop_{next(iter(k for k in query if k != 'table'))}")  # a way out that says what it does


def test_dropping_an_unknown_value_shows_the_rest(monkeypatch):
    at = app_on(ROOT / "results", "views/cite.py", monkeypatch, table="paired", machine=["h100-sxm-80gb", "h999-fake"])
    at.button(key="_drop_machine").click().run()
    assert not at.error and set(frames(at)[0]["machine"]) == {"h100-sxm-80gb"}
    assert at.query_params["machine"] in ("h100-sxm-80gb", ["h100-sxm-80gb"])  # one value reads as a string


HOSTILE_IDS = ["tests/test_x.py::test_$x^2+\\frac{1}{2}$", "tests/t.py::https://evil.example/steal?q=1",
               "tests/t.py::www.evil.example", "tests/t.py::~~struck~~ **bold** <b>b</b>"]


def test_the_export_footer_draws_a_planted_verdict_as_text(tmp_path, monkeypatch):
    results = tmp_path / "results"
    shutil.copytree(ROOT / "results", results)
    path = results / "h200-141gb" / "gpu-tests" / "d93fd5c1.json"
    verdict = json.loads(path.read_text())
    verdict.update(failed=len(HOSTILE_IDS), failures=HOSTILE_IDS, exit_status=1)
    path.write_text(json.dumps(verdict))
    at = app_on(results, "views/cite.py", monkeypatch, table="paired", machine="h200-141gb", commits="all")
    assert not at.exception
    footer = "\n".join(t.value for t in at.text)
    for planted in HOSTILE_IDS:
        assert planted in footer  # as written, character for character
    drawn = "\n".join(m.value for m in at.markdown)  # nothing of them reaches Markdown
    assert not any(s in drawn for s in ("x^2", "evil.example", "struck", "<b>")), drawn
    assert "Reproduce: " in footer


def test_only_the_served_names_and_addresses_are_answered():
    sys.path.insert(0, str(sys_path))
    try:
        from _host import host_allowed, host_name  # noqa: PLC0415 - from the dashboard's directory, put on the path
    finally:
        sys.path.remove(str(sys_path))
    assert host_name("[::1]:8501") == "::1" and host_name("LocalHost.:8501") == "localhost"
    names = {"localhost", "dash.example.org"}
    for ok in ("127.0.0.1:8501", "localhost:8501", "[::1]:8501", "10.0.0.7", "dash.example.org", None, ""):
        assert host_allowed(ok, names), ok
    for bad in ("evil.example:8501", "127.0.0.1.evil.example", "localhost.evil.example:8501", "dash.example.org.evil",
                "a" * 5000):
        assert not host_allowed(bad, names), bad


def test_a_rebound_host_name_gets_a_refusal_in_a_real_browser(tmp_path):
    """A page of evil.test, its name pointed at 127.0.0.1 (chromium's resolver rules stand for the
    attacker's DNS): the request reaches the dashboard with Host: evil.test."""
    from test_dashboard import _serving  # noqa: PLC0415 - the same server the other browser tests use

    chromium, sync_playwright = browser_bits.browser()
    with _serving(ROOT / "results", tmp_path) as url, sync_playwright() as p:
        port = url.rsplit(":", 1)[1]
        browser = p.chromium.launch(executable_path=chromium, args=[
            *browser_bits.ARGS, "--host-resolver-rules=MAP evil.test 127.0.0.1"])
        try:
            page = browser.new_page()
            page.goto(f"http://evil.test:{port}/cite?machine=h200-141gb", timeout=60_000)
            page.wait_for_selector("[data-testid=stAlert]", timeout=60_000)
            body = page.inner_text("body")
            assert "does not answer to the address 'evil.test:" in body and "h200" not in body
            page.goto(f"{url}/cite?machine=h200-141gb", timeout=60_000)
            page.wait_for_selector("text=Cite and export", timeout=60_000)
            assert "does not answer" not in page.inner_text("body")
        finally:
            browser.close()
