"""Shared test setup: the cache of parsed results goes to a scratch directory, never to the
home of whoever runs the tests (and one test's cache cannot answer another's load); and the
`gpu` marker, the one way a test says it needs a GPU.

`@pytest.mark.gpu(reason=..., devices=1)` skips the test, with its reason, on a machine with
fewer CUDA devices, and `python3 -m pytest -m gpu` selects every such test: that is what a
GPU slot runs (`speedlib slot`), and CI, which has no GPU, never sees them pass or fail. So
that no GPU test is left out of that selection, a test that skips for want of a GPU without
the marker (its own skipif, or pytest.skip in its body) fails instead, saying so.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

import pytest

# A skip reason that says the test needs a GPU ("needs a CUDA GPU", "DataParallel needs two
# GPUs", "moves rows to a CUDA device; this machine has none"), not one that merely names one
# ("a GPU machine is named after its GPU": a CPU test that skips on GPU machines).
GPU_NEED = re.compile(r"\bneeds?\b[^;]*\b(?:GPUs?|CUDA)\b|\bCUDA device\b", re.IGNORECASE)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu(reason, devices=1): needs that many CUDA GPUs; skipped with its reason "
                                       "on a machine with fewer. `-m gpu` selects them all (a GPU slot runs them)")


@functools.cache
def _cuda_devices() -> int:
    import torch  # noqa: PLC0415 - only when a GPU test is about to run: the viewer tests need no torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    # A skip mark, not a skip in a hook: the report then names the test's file and line.
    for item in items:
        marks = list(item.iter_markers("gpu"))
        if not marks:
            continue
        need = max(marks, key=lambda m: m.kwargs.get("devices", 1))  # a function's mark and a parameter's: the stricter
        devices = need.kwargs.get("devices", 1)
        if _cuda_devices() < devices:
            reason = need.kwargs.get("reason") or ("needs a CUDA GPU" if devices == 1 else f"needs {devices} CUDA GPUs")
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and item.get_closest_marker("gpu") is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if GPU_NEED.search(reason):
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid} skipped for want of a GPU ({reason.removeprefix('Skipped: ')}) "
                               "without the gpu marker, so `pytest -m gpu` (a GPU slot) would leave it out: mark it "
                               "@pytest.mark.gpu(reason=...) instead of its own skip (tests/conftest.py)")
    return report


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


@pytest.fixture
def interpreted(monkeypatch):
    """The host tables' uva row-copy kernel run by Triton's interpreter, on CPU tensors
    (tests/test_transfer_kernel.py, tests/test_transfer_auto.py)."""
    from speedlib.transfer import kernel  # noqa: PLC0415 - loads torch, which the viewer tests need none of

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when the kernel is decorated, in build()
    return kernel.build()
