"""speedbench.report.first_view: what `speedlib dashboard` computes ahead is what the Overview's
first view asks for, so that view computes nothing itself, and shows what it would have computed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import streamlit as st
from dashboard_bits import app_on, frames

from speedbench import cli
from speedbench.cli import dashboard as dashboard_cli
from speedbench.report import age, claims, comparisons, first_view, headline
from speedbench.results import synthetic

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "results"
    synthetic.write_results(root, commits=3, machines=3)
    return root


def _shown(tree: Path, monkeypatch) -> tuple[list, str]:
    st.cache_resource.clear()  # nothing from an earlier test's server in memory: only the disk can answer
    st.cache_data.clear()
    at = app_on(tree, "views/overview.py", monkeypatch)
    assert not at.exception, at.exception
    return [f.to_csv() for f in frames(at)], "\n".join(str(e.value) for e in at.markdown)


def test_the_overview_after_the_warm_up_computes_nothing_and_shows_the_same(tree, monkeypatch):
    computed, computed_text = _shown(tree, monkeypatch)  # the page computes (and keeps) its tables
    monkeypatch.setenv("SPEEDLIB_CACHE_DIR", str(tree.parent / "another-cache"))  # as a fresh machine's
    first_view.warm(tree)
    for module, name in ((headline, "grid"), (comparisons, "every_comparison"), (claims, "claims_table"),
                         (age, "behind")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("the first view computed what was warmed"))
    warmed, warmed_text = _shown(tree, monkeypatch)
    assert warmed == computed and warmed_text == computed_text
    assert computed  # the page shows tables: the comparison above compares something


def test_a_warm_up_of_no_results_or_a_broken_tree_is_harmless(tmp_path):
    first_view.warm(tmp_path)  # nothing measured: nothing to compute, nothing raised
    done = subprocess.run([sys.executable, "-m", "speedbench.report.first_view", str(tmp_path / "absent")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert (done.returncode, done.stderr) == (0, "")


def test_speedlib_dashboard_starts_the_warm_up_beside_streamlit_and_ends_it(tmp_path, monkeypatch, capsys):
    started, ended = [], []

    def popen(cmd, **kw):
        started.append(cmd)
        return SimpleNamespace(wait=lambda: 0, poll=lambda: None, terminate=lambda: ended.append(cmd))

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(dashboard_cli, "_cannot_listen", lambda address, port: None)
    monkeypatch.setattr(dashboard_cli, "_wait_until_listening", lambda *a, **k: True)
    assert cli.main(["dashboard", "--results", str(tmp_path), "--no-browser", "--port", "8599"]) == 0
    warm = [sys.executable, "-m", "speedbench.report.first_view", str(tmp_path.resolve())]
    assert started[0] == warm and "streamlit" in started[1]
    assert warm in ended  # still running when the dashboard stopped: stopped with it
