"""The transfer page's Roofline tab (dashboard/_roofline.py): drawn from the roofline's results
where they exist (a chart per axis, the hypotheses, the table `speedlib report --table roofline`
prints), kept out of the page's other tabs, and "not measured yet" with the command before a GPU
has run the chunk. Results: the committed tree (no roofline yet) and synthetic ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("streamlit", reason="the dashboard extra is not installed (pip install -e '.[dashboard]')")
from dashboard_bits import app_on, frames, vega_charts

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


def _charts(at) -> list[tuple[dict, object]]:
    """The tab's charts, the page's at-a-glance row left out: each Vega-Lite spec and its points."""
    assert not at.get("plotly_chart")  # plotly.js alone cost a new tab 1.5-2 s
    return [(spec, values) for spec, values in vega_charts(at) if "technique" not in values]


def test_the_roofline_tab_draws_each_axis_the_hypotheses_and_the_reports_table(tree, monkeypatch):
    at = app_on(tree, PAGE, monkeypatch, machine="synthetic-h200", tab="Roofline")
    assert not at.exception, at.exception
    assert [t.label for t in at.tabs][-1] == "Roofline"
    charts = _charts(at)
    # each axis (two side by side), then the hypotheses; gather above write-back in each
    titles = [(" ".join(c["title"]["text"]), c["title"]["subtitle"][0].split(":")[0]) for c, _ in charts]
    assert titles == [(what, direction) for what in ("row width", "batch", "table size", "index order",
                                                     "the uva kernel's hypotheses")
                      for direction in ("gather", "write-back")]
    assert all(c["title"]["subtitle"][1] == "synthetic-h200 (NVIDIA H200 (synthetic))" for c, _ in charts)
    (gather, points), (write_back, back) = charts[:2]
    colour = gather["layer"][0]["encoding"]["color"]  # one colour a path tab-wide, in the record's order
    assert colour["legend"]["values"] == ["torch_pinned", "uva", "auto"] and set(points["variant"]) == {
        "torch_pinned", "uva", "auto"}  # the legend names the chart's own paths
    assert colour["scale"]["domain"] == roofline.variant_order(load_results(tree).measured.query(
        "machine == 'synthetic-h200' and suite.str.startswith('Roofline')")["variant"])  # the hypotheses' too
    assert gather["layer"][0]["encoding"]["color"]["scale"] == write_back["layer"][0]["encoding"]["color"]["scale"]
    measured = load_results(tree).measured
    expected = roofline.roofline_table(measured[measured["machine"] == "synthetic-h200"])
    on_row = roofline.along(roofline.figures(measured).query("suite == 'Roofline' and variant == 'uva'"), "row")
    uva = points[points["variant"] == "uva"]
    assert list(uva["x"]) == [64, 256, 512, 4096] and list(uva["value"]) == pytest.approx(list(on_row["gather"]))
    assert list(back.loc[back["variant"] == "uva", "value"]) == pytest.approx(list(on_row["scatter"]))
    # the hover: the table's GB/s, its floor's and the bus bytes a row costs
    assert list(uva["gbps"]) == [f"{v:.1f} GB/s" for v in on_row["gather_gbps"]]
    assert list(uva["bus"]) == [f"{v:.4g} B" for v in on_row["gather_bus"]]
    x = gather["layer"][0]["encoding"]["x"]
    assert x["scale"]["type"] == "log" and x["axis"]["values"] == [64, 256, 512, 4096]
    assert '"4096": "4 KiB"' in x["axis"]["labelExpr"] and '"64": "64 B"' in x["axis"]["labelExpr"]
    goal = gather["layer"][-1]
    assert goal["encoding"] == {"y": {"datum": 80.0}} and goal["mark"]["strokeDash"]  # the target, dotted across
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
