"""Shared test setup: the cache of parsed results goes to a scratch directory, never to the
home of whoever runs the tests (and one test's cache cannot answer another's load)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _scratch_results_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SPEEDLIB_CACHE_DIR", str(tmp_path_factory.mktemp("speedlib-cache")))


@pytest.fixture
def tiny_checkout(tmp_path) -> Path:
    """A committed checkout with the parts a run reads: asv.conf.json, speedlib/, benchmarks/."""
    repo = tmp_path / "repo"
    for name in ("speedlib/__init__.py", "speedbench/__init__.py", "benchmarks/bench_x.py"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("")
    (repo / "asv.conf.json").write_text(json.dumps({"results_dir": "results"}))
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo
