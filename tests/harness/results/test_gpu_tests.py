"""The GPU tests' verdict: read by the loader (bad files reported, never fatal), joined onto
the rows of its machine and commit, and shown beside them: the section mark in the tables,
the headline grid, the CSV's columns, the exports' provenance and the dashboard's pages."""

from __future__ import annotations

import io
import json
import shutil
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pandas as pd
import pytest

from speedbench import report
from speedbench.cli import parser as cli
from speedbench.report import headline
from speedbench.results import synthetic
from speedbench.results.gpu_tests import (
    FAILED,
    INCOMPLETE,
    NONE_RAN,
    NOT_APPLICABLE,
    NOT_RECORDED,
    PASSED,
    check_verdict,
    status,
)
from speedbench.results.load import load_results
from speedbench.results.tree import ResultsTree

ROOT = Path(__file__).resolve().parents[3]
FAILING = ["tests/test_transfer.py::test_x[device]", "tests/test_checkpoint_torch.py::test_y[False]"]


def verdict(commit: str, machine: str, **changes) -> dict:
    v = {"commit": commit, "machine": machine, "started_at": 1_795_000_000_000, "duration_s": 43.3, "passed": 140,
         "failed": 2, "skipped": 3, "errors": 0, "failures": list(FAILING), "command": "python3 -m pytest -m gpu",
         "torch": "2.11.0+cu130", "gpu": "NVIDIA H200", "exit_status": 1, "finished": True}
    return {**v, **changes}


def write(root: Path, v: dict, name: str | None = None) -> Path:
    path = (ResultsTree(root).machine(v["machine"]).verdict(v["commit"]) if name is None
            else root / v["machine"] / "gpu-tests" / name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(v))
    return path


@pytest.fixture
def tree(tmp_path) -> tuple[Path, str]:
    """Synthetic results of two commits on two GPUs and a CPU; the H200's newest commit failed
    its GPU tests, the H100 recorded none."""
    synthetic.write_results(tmp_path, commits=2, machines=3)
    latest = load_results(tmp_path).measured.sort_values("commit_date")["commit"].iloc[-1]
    write(tmp_path, verdict(latest, "synthetic-h200"))
    return tmp_path, latest


def test_each_row_gets_its_machines_verdict_at_its_commit(tree):
    root, latest = tree
    loaded = load_results(root)
    assert not loaded.problems
    df = loaded.measured
    states = df.groupby(["machine", df["commit"] == latest])["gpu_tests"].agg(set).to_dict()
    assert states == {("synthetic-h200", True): {FAILED}, ("synthetic-h200", False): {NOT_RECORDED},
                      ("synthetic-h100", True): {NOT_RECORDED}, ("synthetic-h100", False): {NOT_RECORDED},
                      ("synthetic-cpu", True): {NOT_APPLICABLE}, ("synthetic-cpu", False): {NOT_APPLICABLE}}
    note = df.loc[df["gpu_tests"] == FAILED, "gpu_tests_note"].iloc[0]
    assert note == f"failed: 2 of 145 (140 passed, 2 failed, 3 skipped) in 43 s: {FAILING[0]}; {FAILING[1]}"


@pytest.mark.parametrize("changes, expected", [
    ({}, FAILED),
    ({"failed": 0, "errors": 1, "failures": ["tests/t.py::crashed"], "finished": False, "exit_status": -11}, FAILED),
    ({"failed": 0, "failures": [], "exit_status": 0}, PASSED),
    ({"failed": 0, "failures": [], "finished": False, "exit_status": 143}, INCOMPLETE),  # stopped at the slot's limit
    ({"failed": 0, "failures": [], "exit_status": 2}, INCOMPLETE),  # pytest interrupted
    ({"passed": 0, "failed": 0, "failures": [], "skipped": 136, "exit_status": 0}, NONE_RAN),  # no GPU visible
])
def test_status_follows_pytests_counts_and_exit(changes, expected):
    assert status(check_verdict(verdict("a" * 40, "m", **changes), "m", "a" * 8)) == expected


@pytest.mark.parametrize("content, why", [
    (b"{not json", "not valid JSON"),
    (json.dumps([1]).encode(), "not a JSON object"),
    (json.dumps(verdict("b" * 40, "synthetic-h200")).encode(), "filed under"),
    (json.dumps(verdict("a" * 40, "synthetic-h100")).encode(), "not 'synthetic-h200'"),
    (json.dumps(verdict("a" * 7, "synthetic-h200")).encode(), "not a full commit hash"),
    (json.dumps(verdict("a" * 40, "synthetic-h200", passed=-1)).encode(), "'passed' is not a count"),
    (json.dumps(verdict("a" * 40, "synthetic-h200", failed=True)).encode(), "'failed' is not a count"),
    (json.dumps(verdict("a" * 40, "synthetic-h200", failed=1)).encode(), "names 2 failing tests but counts 1"),
    (json.dumps(verdict("a" * 40, "synthetic-h200", duration_s=float("nan"))).encode(), "'duration_s'"),
    (json.dumps(verdict("a" * 40, "synthetic-h200", finished="yes")).encode(), "'finished'"),
    (json.dumps(verdict("a" * 40, "synthetic-h200", command=None)).encode(), "'command'"),
])
def test_a_malformed_verdict_is_a_problem_not_a_failure_of_the_load(tmp_path, content, why):
    synthetic.write_results(tmp_path, commits=1, machines=3)
    bad = tmp_path / "synthetic-h200" / "gpu-tests" / "aaaaaaaa.json"
    bad.parent.mkdir()
    bad.write_bytes(content)
    loaded = load_results(tmp_path)
    (problem,) = loaded.problems
    assert problem.path == str(bad) and why in problem.reason and "read as not recorded" in problem.reason
    assert not problem.expected  # listed as damage by speedlib report, always
    assert set(loaded.measured.loc[loaded.measured["machine"] == "synthetic-h200", "gpu_tests"]) == {NOT_RECORDED}


def test_tables_mark_a_figure_whose_commit_failed_its_gpu_tests(tree):
    root, latest = tree
    df = load_results(root).measured
    t = report.speedup_table(report.latest(df))
    marked = t.frame["commit"].str.endswith(report.GPU_TESTS_FAILED)
    assert marked.any() and set(t.frame.loc[marked, "machine"]) == {"synthetic-h200"}
    assert report.GPU_TESTS_NOTE in t.notes
    assert f"{report.GPU_TESTS_FAILED} synthetic-h200 {latest[:8]}: GPU tests failed: 2 of 145" in "\n".join(t.notes)
    assert f"GPU tests (speedlib slot) at these commits: not recorded: synthetic-h100 {latest[:8]}" in t.notes
    assert "synthetic-cpu" not in " ".join(n for n in t.notes if "GPU tests" in n)  # CPU: not applicable, unsaid
    md = report.to_markdown(t)
    assert f"| {latest[:8]} {report.GPU_TESTS_FAILED} |" in md and "tests/test_transfer.py::test_x\\[device\\]" in md
    footer = report.csv_provenance(t)
    assert "machine synthetic-h200, " in footer and "GPU tests § failed: 2 of 145" in footer
    assert "GPU tests not recorded" in footer  # the H100's run
    csv = pd.read_csv(io.StringIO(report.to_csv(t)), keep_default_na=False)
    by_machine = csv.groupby("machine")[["gpu_tests", "gpu_tests_failed"]].agg(lambda c: set(map(str, c))).to_dict()
    assert by_machine["gpu_tests"] == {"synthetic-cpu": {NOT_APPLICABLE}, "synthetic-h100": {NOT_RECORDED},
                                       "synthetic-h200": {FAILED}}
    assert by_machine["gpu_tests_failed"] == {"synthetic-cpu": {"False"}, "synthetic-h100": {"False"},
                                              "synthetic-h200": {"True"}}


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> Path:
    """The committed results, the H100's run at bdb0cb6d given a failing verdict (it has none):
    the headline and the paired comparisons as they really are."""
    root = tmp_path_factory.mktemp("committed") / "results"
    shutil.copytree(ROOT / "results", root)
    write(root, verdict(H100_COMMIT, "h100-sxm-80gb"))
    return root


H100_COMMIT = "bdb0cb6dd5f8cec580cb5a8cfcd26521924e8024"


def test_the_headline_grid_marks_the_failed_machines_cells(committed):
    grid = headline.grid(load_results(committed).measured)
    h100 = next(c for c in grid.frame.columns if c.startswith("h100-sxm-80gb"))
    measured = grid.frame[h100].str.contains(r"\dx")
    assert measured.any() and grid.frame.loc[measured, h100].str.contains(report.GPU_TESTS_FAILED).all()
    cpus = [c for c in grid.frame.columns if c.startswith("cpu-")]
    assert cpus and not grid.frame[cpus].apply(lambda c: c.str.contains(report.GPU_TESTS_FAILED)).any().any()
    assert report.GPU_TESTS_NOTE in grid.notes
    assert f"{report.GPU_TESTS_FAILED} h100-sxm-80gb bdb0cb6d: GPU tests failed: 2 of 145" in "\n".join(grid.notes)


def test_speedlib_report_csv_carries_the_columns(committed):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert cli.main(["report", "--results", str(committed), "--table", "paired", "--format", "csv"]) == 0
    csv = pd.read_csv(io.StringIO(out.getvalue()), keep_default_na=False)
    assert set(csv.loc[csv["gpu_tests_failed"], "machine"]) == {"h100-sxm-80gb"}
    rest = csv[~csv["gpu_tests_failed"]]
    assert set(rest.loc[rest["machine"].str.startswith("cpu-"), "gpu_tests"]) == {NOT_APPLICABLE}
    # the H200: 838236b predates the slot ("not recorded", no mark); d93fd5c1's slot passed
    h200 = rest[rest["machine"] == "h200-141gb"]
    assert set(rest.loc[~rest["machine"].str.startswith("cpu-"), "machine"]) == {"h200-141gb"}
    assert set(h200.loc[h200["commit"].str.startswith("d93fd5c1"), "gpu_tests"]) == {"passed"}
    assert set(h200.loc[~h200["commit"].str.startswith("d93fd5c1"), "gpu_tests"]) <= {"not recorded"}
    assert "GPU tests § failed: 2 of 145" in err.getvalue()  # the provenance, on stderr beside a CSV on stdout


def test_the_committed_gpu_run_reads_not_recorded():
    """The H100 run at bdb0cb6d and the H200 run at 838236b predate the slot: their figures say
    so, and carry no mark; the H200's slot at d93fd5c1 passed."""
    df = load_results(ROOT / "results").measured
    old = ((df["machine"] == "h100-sxm-80gb")
           | ((df["machine"] == "h200-141gb") & df["commit"].str.startswith("838236ba")))
    assert old.any() and set(df.loc[old, "gpu_tests"]) == {NOT_RECORDED}
    assert set(df.loc[df["commit"].str.startswith("d93fd5c1"), "gpu_tests"]) == {"passed"}
    t = report.paired_table(report.latest(df))
    assert not t.frame["commit"].str.contains(report.GPU_TESTS_FAILED).any()
    assert ("GPU tests (speedlib slot) at these commits: not recorded: h100-sxm-80gb bdb0cb6d, h200-141gb 838236ba; "
            "passed: h200-141gb d93fd5c1" in t.notes)


def test_the_dashboard_shows_each_commits_verdict_and_marks_the_failed_one(tree, monkeypatch):
    pytest.importorskip("streamlit")
    from dashboard_bits import app_on, frames  # noqa: PLC0415 - it imports streamlit, optional: after importorskip

    root, latest = tree
    at = app_on(root, "views/machines.py", monkeypatch)
    assert not at.exception, at.exception
    machines, per_commit = frames(at)[:2]  # as a reader sees them: static tables' Markdown escapes undone
    latest_verdict = dict(zip(machines["machine"], machines["GPU tests at the latest commit"], strict=True))
    assert latest_verdict["synthetic-h200"].startswith("failed: 2 of 145")
    assert latest_verdict["synthetic-h100"].startswith("not recorded")
    assert latest_verdict["synthetic-cpu"].startswith("not applicable")
    failed = per_commit[per_commit["commit"] == f"{latest[:8]} {report.GPU_TESTS_FAILED}"]
    assert list(failed["machine"]) == ["synthetic-h200"] and FAILING[0] in failed["GPU tests"].iloc[0]
    assert "synthetic-cpu" not in set(per_commit["machine"])


def test_the_dashboard_chart_marks_a_bar_whose_gpu_tests_failed():
    pytest.importorskip("plotly")
    from speedbench.report.charts import ratio_chart  # noqa: PLC0415 - plotly, optional
    s = pd.DataFrame({"case": ["a", "b"], "label": "m", "ratio": [1.5, 2.0], "ratio_low": [1.4, 1.9],
                      "ratio_high": [1.6, 2.1], "gpu_tests": [NOT_RECORDED, FAILED]})
    fig = ratio_chart(s, "case", "label", "t")
    assert list(fig.data[0].text) == ["", report.GPU_TESTS_FAILED]
    assert f"{report.GPU_TESTS_FAILED}: the GPU tests failed" in fig.layout.annotations[0].text


def test_a_slot_rehearsed_on_a_cpu_reads_not_applicable_unless_a_test_failed(tmp_path):
    synthetic.write_results(tmp_path, commits=1, machines=3)
    commit = load_results(tmp_path).measured["commit"].iloc[0]
    write(tmp_path, verdict(commit, "synthetic-cpu", passed=0, failed=0, failures=[], skipped=138, exit_status=0))
    df = load_results(tmp_path).measured
    cpu = df[df["machine"] == "synthetic-cpu"]
    assert set(cpu["gpu_tests"]) == {NOT_APPLICABLE}
    assert set(cpu["gpu_tests_note"]) == {"not applicable (no GPU: the 138 GPU tests skipped)"}
    write(tmp_path, verdict(commit, "synthetic-cpu"))  # a test that runs anywhere failed there: it stands
    df = load_results(tmp_path).measured
    assert set(df.loc[df["machine"] == "synthetic-cpu", "gpu_tests"]) == {FAILED}
