"""The transfer page's Roofline tab (dashboard/_roofline.py): drawn from the roofline's results
where they exist (a chart per axis, the hypotheses, the table `speedlib report --table roofline`
prints), kept out of the page's other tabs, and "not measured yet" with the command before a GPU
has run the chunk. Results: the committed tree (no roofline yet) and synthetic ones."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("streamlit", reason="the dashboard extra is not installed (pip install -e '.[dashboard]')")
from dashboard_bits import app_on, frames

from speedbench.report import roofline
from speedbench.results import synthetic
from speedbench.results.load import load_results

ROOT = Path(__file__).resolve().parents[2]
PAGE = "/transfer"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """The synthetic suite on three machines at two commits, and the roofline on the H200 at the second."""
    root = tmp_path_factory.mktemp("results")
    synthetic.write_results(root, commits=2, machines=3)
    synthetic.write_roofline(root, "synthetic-h200", commit=1)
    return root


def _infos(at) -> list[str]:
    return [str(e.value) for e in at.info]


def _values(array) -> list:
    """A plotly JSON array: a list, or a typed array ({"dtype", "bdata"}) for numbers."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def _charts(at) -> list[dict]:
    return [json.loads(e.proto.spec) for e in at.get("plotly_chart")]


def test_the_roofline_tab_draws_each_axis_the_hypotheses_and_the_reports_table(tree, monkeypatch):
    at = app_on(tree, PAGE, monkeypatch, machine="synthetic-h200", tab="Roofline")
    assert not at.exception, at.exception
    assert [t.label for t in at.tabs][-1] == "Roofline"
    titles = [c["layout"].get("title", {}).get("text", "").split("<br>")[0] for c in _charts(at)]
    # the page's own at-a-glance chart first, then the tab's
    assert titles[-5:] == ["row width", "batch", "table size", "index order", "the uva kernel&#x27;s hypotheses"]
    row_chart = _charts(at)[-5]
    paths = [t["name"] for t in row_chart["data"] if t.get("showlegend", True)]
    assert paths == ["torch_pinned", "uva", "auto"]
    measured = load_results(tree).measured
    expected = roofline.roofline_table(measured[measured["machine"] == "synthetic-h200"])
    uva = next(t for t in row_chart["data"] if t["name"] == "uva")
    on_row = roofline.along(roofline.figures(measured).query("suite == 'Roofline' and variant == 'uva'"), "row")
    assert _values(uva["x"]) == [64, 256, 512, 4096] and _values(uva["y"]) == pytest.approx(list(on_row["gather"]))
    shown = frames(at)[-1]
    assert list(shown["gather"]) == list(expected.frame["gather"])  # the numbers `speedlib report` prints
    assert list(shown["bus bytes a row"]) == list(expected.frame["bus bytes a row"])
    assert not any("not measured yet" in i for i in _infos(at))


def test_the_other_tabs_leave_the_roofline_to_its_own(tree, monkeypatch):
    at = app_on(tree, PAGE, monkeypatch, machine="synthetic-h200", tab="Bandwidth and floor")
    assert not at.exception, at.exception
    # the machine measured nothing but the roofline: the floor tab has no rows, not 48 of the roofline's
    assert "No bandwidth or floor results here." in _infos(at)


def test_a_machine_measured_only_by_the_roofline_opens_on_its_tab(tree, monkeypatch):
    at = app_on(tree, PAGE, monkeypatch, machine="synthetic-h200")
    assert not at.exception, at.exception
    assert at.query_params["tab"] == "Roofline"


def test_before_a_gpu_ran_the_chunk_the_tab_says_so_with_the_command(monkeypatch):
    at = app_on(ROOT / "results", PAGE, monkeypatch, machine="h200-141gb", tab="Roofline")
    assert not at.exception, at.exception
    said = [i for i in _infos(at) if "host-gather roofline" in i]
    assert said == ["The host-gather roofline: not measured yet on this machine. `speedlib run --chunk "
                    "transfer-roofline --chunk transfer-hypotheses` measures it on a GPU machine (the chunks build "
                    "tables up to 40 GB; on a CPU every point is a skip)."]
    assert said[0] == roofline.not_measured(load_results(ROOT / "results").measured, "h200-141gb")


def test_a_roofline_of_another_commit_is_named_not_shown_as_this_ones(tmp_path, monkeypatch):
    """The committed H200 results with a (synthetic) roofline at an older commit: the page opens on
    the newest commit, d93fd5c1, whose run measured no roofline, and says which commit has one."""
    root = tmp_path / "results"
    shutil.copytree(ROOT / "results", root)
    synthetic.write_roofline(root, "h200-141gb", commit=0)
    older = synthetic._sha("commit 0")[:8]
    at = app_on(root, PAGE, monkeypatch, machine="h200-141gb", commit="d93fd5c1", tab="Roofline")
    assert not at.exception, at.exception
    assert f"The host-gather roofline was not measured at commit d93fd5c1 here; it was at {older}: pick one " \
           "above." in _infos(at)
    at = app_on(root, PAGE, monkeypatch, machine="h200-141gb", commit=older, tab="Roofline")
    assert not at.exception, at.exception
    assert len(frames(at)[-1]) == 48  # picked: the roofline's table
