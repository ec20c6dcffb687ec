"""speedbench.report.comparisons: the overview's index lists every paired comparison once, with the
figures the technique pages show."""

from __future__ import annotations

from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")

from speedbench import report  # noqa: E402 - after the pandas skip above
from speedbench.report import comparisons  # noqa: E402 - after the pandas skip above
from speedbench.results.load import load_results  # noqa: E402 - after the pandas skip above

RESULTS = Path(__file__).resolve().parents[3] / "results"
INTEL = "cpu-2core-intel-xeon (CPU only)"
H100 = "h100-sxm-80gb (NVIDIA H100 80GB HBM3)"


@pytest.fixture(scope="module")
def measured() -> pd.DataFrame:
    return load_results(RESULTS).measured


@pytest.fixture(scope="module")
def every(measured) -> pd.DataFrame:
    return comparisons.every_comparison(measured).frame


def line(every: pd.DataFrame, comparison: str, technique: str) -> pd.Series:
    rows = every[(every["comparison"] == comparison) & (every["page"] == technique)]
    assert len(rows) == 1, comparison
    return rows.iloc[0]


def test_every_paired_class_variant_and_baseline_has_one_line(measured, every):
    last = report.latest(measured[measured["technique"].isin(report.TECHNIQUES)])
    p = report.paired(last)
    expected = {(t, s, k if isinstance(k, str) else "", v, b)
                for t, s, k, v, b in zip(p["technique"], p["suite"], p["knob"], p["variant"], p["baseline"],
                                         strict=True)}
    assert len(every) == len(expected) >= 30
    # the viewer's own timing benchmark is no technique; every line links to a technique's page
    assert set(every["page"]) <= set(report.TECHNIQUES) and "dashboard" not in set(every["page"])
    for t, s, k, v, b in expected:
        line(every, f"{s}" + (f" ({k})" if k else "") + f": {v} vs {b}", t)
    # techniques in the order of the sidebar, so the index reads like the navigation
    order = list(report.TECHNIQUES)
    assert list(every["page"]) == sorted(every["page"], key=order.index)


def test_one_case_is_the_paired_estimate_with_its_interval(measured, every):
    last = report.latest(measured)
    p = report.paired(last[(last["suite"] == "FusedPointwise") & (last["machine"] == "cpu-2core-intel-xeon")])
    r = p[p["variant"] == "compile"].iloc[0]
    expected = f"{r['ratio']:.3g}x [{r['ratio_low']:.3g}, {r['ratio_high']:.3g}] N={r['n']}"
    assert line(every, "FusedPointwise: compile vs off", "tuning")[INTEL] == \
        expected + _mark(p[p["variant"] == "compile"])


def _mark(rows: pd.DataFrame) -> str:
    """The dagger a cell ends with where its rows are of an earlier benchmark version."""
    return f" {report.EARLIER}" if report.earlier_version(rows).any() else ""


def test_a_few_cases_are_named_and_many_give_their_range(measured, every):
    last = report.latest(measured)
    p = report.paired(last[(last["machine"] == "cpu-2core-intel-xeon")
                           & (last["technique"].isin(["contiguous", "checkpoint"]))])
    adam_rows = p[(p["suite"] == "AdamStep") & (p["variant"] == "speedlib") & (p["baseline"] == "forloop")]
    adam = adam_rows.set_index("workload")["ratio"]
    assert line(every, "AdamStep: speedlib vs forloop", "contiguous")[INTEL] == \
        f"mlp: {adam['mlp']:.3g}x; resnet50: {adam['resnet50']:.3g}x" + _mark(adam_rows)
    ckpt_rows = p[(p["suite"] == "TrainingStep") & (p["variant"] == "speedlib")]
    ckpt = ckpt_rows["ratio"]
    assert len(ckpt) > comparisons.MAX_CASES_NAMED
    assert line(every, "TrainingStep: speedlib vs none", "checkpoint")[INTEL] == \
        f"{ckpt.min():.3g}x to {ckpt.max():.3g}x over {len(ckpt)} cases" + _mark(ckpt_rows)


def test_not_measured_is_an_empty_cell_and_marks_are_kept(measured, every):
    iteration = line(every, "Iteration: speedlib vs forloop", "contiguous")
    assert iteration[H100] == ""  # the H100 ran the optimizer step only
    # the committed results decide which cells are of an earlier benchmark version: find one of each
    p = report.paired(report.latest(measured[measured["technique"].isin(report.TECHNIQUES)]))
    named = p["knob"].map(lambda k: isinstance(k, str))
    p = p.assign(earlier=report.earlier_version(p), knob=p["knob"].where(named, ""))
    marks = {}
    for (t, s, k, v, b, m), rows in p.groupby(["technique", "suite", "knob", "variant", "baseline", "machine"]):
        marks.setdefault(bool(rows["earlier"].any()), (t, f"{s}" + (f" ({k})" if k else "") + f": {v} vs {b}", m))
    assert set(marks) == {True, False}, "the committed results hold no earlier-version cell to check"
    for earlier, (t, comparison, m) in marks.items():
        column = next(c for c in every.columns if c.startswith(f"{m} ("))
        assert line(every, comparison, t)[column].endswith(report.EARLIER) == earlier, (comparison, m)


def test_no_paired_result_gives_an_empty_index():
    t = comparisons.every_comparison(pd.DataFrame(columns=["technique", "machine", "kind", "samples"]))
    assert t.frame.empty and list(t.frame.columns) == ["technique", "page", "comparison"]
