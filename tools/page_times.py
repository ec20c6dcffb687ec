"""How long each dashboard page takes to draw in a real browser, cold and warm, and a screenshot of each.

Starts `speedlib dashboard` on a free localhost port with an empty cache directory (so the
first view parses every result file: cold), opens every page in headless Chromium (Debian's
`chromium`, driven by Playwright) and times each from the request to the page drawn: its
title shown, its script ended and every element on it drawn, charts included. Then it opens
each page again in a fresh tab of the same server (again: a new session on a warm server, as a
second reader opening a link finds it; the tab loads Streamlit's code and its charts' code,
Vega-Lite's, anew), then
reaches each in one tab by its link in the sidebar (moved to: how a reader goes from page to
page, the code already loaded), and times `speedlib report --table headline` cold and warm.
The floor under a page's again figure is timed too: a Streamlit page with one small Vega-Lite chart.
Prints one line per page and the machine's load average before and after: measure on an idle machine,
since other processes on its cores slow every figure (issue 51's targets: each page <= 3 s
warm, the Overview <= 5 s cold, the headline table <= 3 s). The first view's time is also
given from the moment `speedlib dashboard` was started: the dashboard computes the Overview's
tables while Streamlit starts (speedbench.report.first_view), and that wait counts too.

    python3 tools/page_times.py [--results results] [--width 1440] [--shots DIR]

--shots DIR also keeps a full-page screenshot of each page (warm) at --width.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from speedbench.techniques import TECHNIQUES  # noqa: E402 - after the checkout's path

# (URL path, title) of every page, the Overview first: its cold view is the one with a target.
PAGES = [("", "speedlib: which PyTorch speed tricks pay off"), ("history", "History across commits"),
         ("machines", "Machine comparison"), ("cite", "Cite and export"),
         *((name, t.title) for name, t in TECHNIQUES.items())]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
heights: dict[str, int] = {}  # each screenshot's page height, px
since: dict[str, float] = {}  # when each dashboard was started, and when it first answered
_HEADER = 64  # px: Streamlit's top bar, drawn over the top of the main column


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(results: Path, cache: Path):
    """`speedlib dashboard` on `results`, its parsed-results cache in `cache`."""
    port = _free_port()
    with _served([sys.executable, "-m", "speedbench.cli", "dashboard", "--results", str(results), "--port", str(port),
                  "--no-browser"], port, {"SPEEDLIB_CACHE_DIR": str(cache)}) as url:
        yield url


# The reference page: Streamlit's own cost with one Vega-Lite chart, which no page with a chart can go below.
_FLOOR_APP = """import streamlit as st

st.title("One chart")
st.vega_lite_chart(None, {"data": {"values": [{"x": 1, "y": 3}, {"x": 2, "y": 1}, {"x": 3, "y": 2}]},
                          "mark": "bar", "encoding": {"x": {"field": "x", "type": "ordinal"},
                                                      "y": {"field": "y", "type": "quantitative"}}},
                   width="stretch")
"""


def floor_seconds(browser, width: int, times: int = 3) -> float:
    """The median of `times` fresh tabs of a page with a title and one three-bar Vega-Lite chart
    on a warm Streamlit server: what any Streamlit page with a chart takes on this machine (its
    code and Vega-Lite's loaded and run in a new tab), the floor under every page's again figure."""
    with tempfile.TemporaryDirectory() as d:
        app = Path(d) / "one_chart.py"
        app.write_text(_FLOOR_APP, encoding="utf-8")
        port = _free_port()
        with _served([sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(port),
                      "--server.headless", "true", "--server.fileWatcherType", "none"], port, {}) as url:
            timed_visit(browser, url, "One chart", width)  # the server's first run
            return statistics.median(timed_visit(browser, url, "One chart", width) for _ in range(times))


@contextlib.contextmanager
def _served(argv: list[str], port: int, env: dict[str, str]):
    """`argv`, a Streamlit server on `port`, until it answers; its URL. Stopped on leaving."""
    # cwd too: `python -m` puts the working directory first on sys.path, so from inside another
    # checkout that checkout's speedbench would be measured in this one's name
    proc = subprocess.Popen(argv, env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    since[url] = time.perf_counter()  # the command's start: the first view's wait counts from here too
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{' '.join(argv[2:4])} did not start (status {proc.poll()})")
            time.sleep(0.3)
        since[f"{url} answering"] = time.perf_counter()
        yield url
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


# Streamlit marks its root with the script's state ("notRunning" once the page's script has
# ended) and draws a skeleton where an element's code is still loading: a chart is no
# chart at all until Vega-Lite's code has run, and a check for charts without an SVG alone passed
# 1-2 s before any was on screen (under plotly.js, 4.7 MB, which no page draws with now).
_STATE = ("() => ({script: document.querySelector('[data-testid=\"stApp\"]')?.getAttribute('data-test-script-state'),"
          " skeletons: document.querySelectorAll('[data-testid=\"stSkeleton\"]').length,"
          " vega_without_marks: [...document.querySelectorAll('[data-testid=\"stVegaLiteChart\"]')]"
          ".filter(c => !c.querySelector('svg.marks [role=\"graphics-symbol\"], canvas')).length,"
          " ran_since_move: window.__ran ?? null})")
# the same counts, all met (and said when a page is never drawn)
_DRAWN = (f"() => {{ const s = ({_STATE})(); return s.script === 'notRunning' && !s.skeletons"
          " && !s.vega_without_marks && (s.ran_since_move ?? true); }")


def drawn(page, title: str) -> None:
    """The title is shown, the page's script has ended (since a move, if one was made), and
    every element on the page is drawn, charts included."""
    page.get_by_role("heading", name=title).first.wait_for(timeout=180_000)
    try:
        page.wait_for_function(_DRAWN, timeout=180_000)
    except Exception as e:  # Playwright's TimeoutError: say which part never came
        raise RuntimeError(f"{title!r} not drawn after 180 s: {page.evaluate(_STATE)}") from e


# Set before a move: flags the new page's script starting, so the old page's ended state is no
# answer; from the old values too, since a quick run can start and end before the observer looks.
# One observer per tab, set on the first move.
_WATCH = ("() => { window.__ran = false; if (window.__watching) return; window.__watching = true;"
          " const app = document.querySelector('[data-testid=\"stApp\"]');"
          " new MutationObserver(records => { if (records.some(r => r.oldValue === 'running')"
          " || app.getAttribute('data-test-script-state') === 'running') window.__ran = true; })"
          ".observe(app, {attributes: true, attributeOldValue: true,"
          " attributeFilter: ['data-test-script-state']}); }")


def moved_times(browser, url: str, pages: list[tuple[str, str]], width: int, query: str) -> dict[str, float]:
    """Each page reached as a reader moves through the dashboard in one tab: a click on its
    link in the sidebar, which Streamlit serves without loading the page again (its code and
    plotly.js are already in the tab). Starts on a page not timed first, so every page is a move."""
    start = next(path for path, _ in PAGES if path != pages[0][0])
    page = browser.new_page(viewport={"width": width, "height": 900})
    try:
        page.goto(f"{url}/{start}{query}")
        drawn(page, dict(PAGES)[start])
        times = {}
        for path, title in pages:
            page.evaluate(_WATCH)
            t = time.perf_counter()
            # dispatched, not clicked: at 390 px the sidebar is folded away, its links still in the page
            page.locator(f'[data-testid="stSidebarNavLink"][href="{url}/{path}"]').dispatch_event("click")
            drawn(page, title)
            times[path] = time.perf_counter() - t
        return times
    finally:
        page.close()


def screenshot(page, path: Path) -> int:
    """The whole page as a reader scrolls it, stitched from screens: Streamlit scrolls its main
    column, not the document, and a viewport stretched to the column's height leaves its grids
    and charts undrawn. Returns the column's height in px."""
    from PIL import Image  # noqa: PLC0415 - only for screenshots

    main = "document.querySelector('[data-testid=\"stMain\"]')"
    tall = page.evaluate(f"() => {main}.scrollHeight")
    screen = page.viewport_size["height"]
    page.wait_for_timeout(1500)  # a chart fills its SVG after creating it
    parts, top = [], 0
    while True:
        page.evaluate(f"y => {main}.scrollTo(0, y)", top)
        page.wait_for_timeout(400)  # a grid draws what scrolled into view
        at = page.evaluate(f"() => {main}.scrollTop")
        parts.append((at, Image.open(io.BytesIO(page.screenshot()))))
        if at + screen >= tall or at < top:
            break
        top = at + screen - _HEADER
    whole = Image.new("RGB", (parts[0][1].width, max(at + screen, screen)), "white")
    for i, (at, image) in enumerate(parts):  # below the first, each screen without the bar that covers its top
        whole.paste(image if i == 0 else image.crop((0, _HEADER, image.width, image.height)),
                    (0, at if i == 0 else at + _HEADER))
    whole.save(path)
    return tall


def timed_visit(browser, url: str, title: str, width: int, shot: Path | None = None) -> float:
    page = browser.new_page(viewport={"width": width, "height": 900})
    try:
        start = time.perf_counter()
        page.goto(url)
        drawn(page, title)
        seconds = time.perf_counter() - start
        if shot is not None:
            heights[shot.stem] = screenshot(page, shot)
        return seconds
    finally:
        page.close()


def headline_seconds(results: Path, cache: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "speedbench.cli", "report", "--results", str(results), "--table", "headline"],
                   env={**os.environ, "SPEEDLIB_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)},
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=ROOT)
    return time.perf_counter() - start


def _stop(signum, frame):
    raise SystemExit(128 + signum)  # a kill ends the dashboard it started too (serving's finally)


def main() -> int:
    signal.signal(signal.SIGTERM, _stop)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=str(ROOT / "results"))
    parser.add_argument("--width", type=int, default=1440)
    parser.add_argument("--shots", metavar="DIR", help="keep a full-page screenshot of each page here")
    parser.add_argument("--only", metavar="PAGES", help="these pages alone, comma-separated (overview, cite, amp...)")
    parser.add_argument("--query", default="", help="added to every page's URL, e.g. 'machine=h999-fake'")
    args = parser.parse_args()
    pages = [(path, title) for path, title in PAGES
             if not args.only or (path or "overview") in args.only.split(",")]
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 - only this tool needs it

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("page_times: needs Debian's chromium (apt-get install chromium)")
    shots = Path(args.shots) if args.shots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    results = Path(args.results).resolve()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory() as cache:
        report_cold = headline_seconds(results, Path(cache) / "report")
        report_warm = headline_seconds(results, Path(cache) / "report")
        with serving(results, Path(cache) / "dashboard") as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=ARGS)
            try:
                query = f"?{args.query}" if args.query else ""
                cold = {}
                for path, title in pages:
                    cold[path] = timed_visit(browser, f"{url}/{path}{query}", title, args.width)
                    if len(cold) == 1:  # the first view's whole wait: the server's start-up and the view
                        answered = since[f"{url} answering"] - since[url]
                        first = (answered + cold[path], answered)
                warm = {path: timed_visit(browser, f"{url}/{path}{query}", title, args.width,
                                          shots / f"{path or 'overview'}-{args.width}.png" if shots else None)
                        for path, title in pages}
                moved = moved_times(browser, url, pages, args.width, query)
                floor = floor_seconds(browser, args.width)
            finally:
                browser.close()
        # a new server on the same results: what it kept on disk is read back (the everyday restart)
        with serving(results, Path(cache) / "dashboard") as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=ARGS)
            try:
                path, title = pages[0]
                restarted = timed_visit(browser, f"{url}/{path}{query}", title, args.width)
            finally:
                browser.close()
    print(f"{'page':<12} {'first view (s)':>15} {'again (s)':>10} {'moved to (s)':>13}")
    for path, _ in pages:
        print(f"{path or 'overview':<12} {cold[path]:>15.2f} {warm[path]:>10.2f} {moved[path]:>13.2f}")
    print(f"first view drawn {first[0]:.2f} s after `speedlib dashboard` started (it answered after {first[1]:.2f} s, "
          "the browser's own start left out); "
          f"{restarted:.2f} s on a restarted server (its cache kept)")
    print(f"floor: a Streamlit page with one three-bar Vega-Lite chart, again: {floor:.2f} s (median of 3)")
    print(f"speedlib report --table headline: {report_cold:.2f} s cold, {report_warm:.2f} s warm")
    for name, tall in heights.items():
        print(f"{name}: {tall} px tall")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
