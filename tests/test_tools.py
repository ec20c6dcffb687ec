"""Every script under tools/ runs, at a small size (CI runs this file with the rest)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from browser_bits import browser

ROOT = Path(__file__).resolve().parents[1]


def test_checkpoint_watch_cost_runs_its_three_variants_at_a_small_size():
    """docs/techniques/checkpoint.md cites it; it swaps the watch classes where the checkpoint
    builds them, so a move of those classes breaks this test rather than the tool."""
    out = subprocess.run([sys.executable, "tools/checkpoint_watch_cost.py", "1", "1", "10"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["shipped / no generator watch", "shipped / neither"]
    assert all("batch 1, depth 10, N=1" in line for line in lines)


def test_checkpoint_watch_cost_refuses_bad_arguments_in_one_line():
    out = subprocess.run([sys.executable, "tools/checkpoint_watch_cost.py", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "usage:" in out.stderr


def test_regenerate_docs_writes_the_committed_pages_again(tmp_path):
    """In a copy of the checkout (it writes docs/ in place), the tool rewrites docs/results.md
    and docs/glance.svg from the committed results and finds them as committed."""
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".ruff_cache", "__pycache__", ".whl"))
    pages = ("docs/results.md", "docs/glance.svg")
    (copy / pages[0]).write_text("stale\n", encoding="utf-8")  # one page out of date: the tool must rewrite it
    out = subprocess.run([sys.executable, "tools/regenerate_docs.py"], cwd=copy, capture_output=True, text=True,
                         timeout=300, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["docs/results.md: changed", "docs/glance.svg: unchanged"]
    for page in pages:
        assert (copy / page).read_bytes() == (ROOT / page).read_bytes(), f"{page} differs from the committed one"


def test_page_times_times_one_page_of_a_small_results_tree(tmp_path):
    """One page (cite) of a one-machine, one-commit tree, cold, warm and moved to, with its screenshot:
    the tool starts the dashboard, drives the browser and prints a line per figure."""
    browser()  # Debian's chromium and playwright, or the skip (CI: the failure) that says so
    from speedbench.results.synthetic import write_results  # noqa: PLC0415 - pandas, for this test alone

    write_results(tmp_path / "results", commits=1, machines=1)
    shots = tmp_path / "shots"
    out = subprocess.run([sys.executable, "tools/page_times.py", "--results", str(tmp_path / "results"),
                          "--only", "cite", "--shots", str(shots), "--width", "390"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    cite = next(line.split() for line in lines if line.startswith("cite "))
    assert len(cite) == 4 and all(float(x) > 0 for x in cite[1:]), lines
    assert any(re.fullmatch(r"speedlib report --table headline: [\d.]+ s cold, [\d.]+ s warm", line) for line in lines)
    floor = r"floor: a Streamlit page with one three-bar Vega-Lite chart, again: [\d.]+ s \(median of 3\)"
    assert any(re.fullmatch(floor, line) for line in lines)
    assert re.fullmatch(r"cite-390: \d+ px tall", lines[-2]) and lines[-1].startswith("load average after: ")
    assert [p.name for p in shots.iterdir()] == ["cite-390.png"] and (shots / "cite-390.png").stat().st_size > 0


def test_every_tool_has_a_smoke_test_here():
    """A script added to tools/ without a test here is one nothing runs (as checkpoint_watch_cost.py broke)."""
    text = Path(__file__).read_text(encoding="utf-8")
    untested = [p.name for p in sorted((ROOT / "tools").glob("*.py")) if f'"tools/{p.name}"' not in text]
    assert untested == []
