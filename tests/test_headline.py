"""speedbench.headline: the overview's first table says the same as the detailed tables."""

from __future__ import annotations

from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")

from speedbench import headline, report  # noqa: E402
from speedbench.paired import ratio_estimate  # noqa: E402
from speedbench.results import load_results  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
H100 = "h100-sxm-80gb (NVIDIA H100 80GB HBM3)"
CPU = "cpu-2core (CPU only)"


@pytest.fixture(scope="module")
def measured() -> pd.DataFrame:
    return load_results(RESULTS).measured


def cell(frame: pd.DataFrame, technique: str, machine: str) -> str:
    return frame.loc[frame["technique"] == report.TECHNIQUES[technique].title, machine].iloc[0]


def test_one_row_per_technique_one_column_per_machine(measured):
    frame = headline.grid(measured).frame
    assert list(frame["technique"]) == [report.TECHNIQUES[h.technique].title for h in headline.HEADLINES]
    assert set(report.TECHNIQUES) == {h.technique for h in headline.HEADLINES}
    assert list(frame.columns) == ["technique", CPU, H100, "comparison"]


def test_a_paired_cell_is_the_paired_tables_estimate(measured):
    last = report.latest(measured)
    p = report.paired(last[(last["technique"] == "amp") & (last["suite"] == "TrainingStep")])
    for machine, label in (("h100-sxm-80gb", H100), ("cpu-2core", CPU)):
        r = p[(p["machine"] == machine) & (p["workload"] == "resnet50") & (p["variant"] == "bf16_channels_last")].iloc[0]
        expected = f"{r['ratio']:.3g}x [{r['ratio_low']:.3g}, {r['ratio_high']:.3g}] N={r['n']}"
        assert cell(headline.grid(measured).frame, "amp", label) == expected + _mark(last, machine, "amp")


def _mark(last, machine: str, technique: str) -> str:
    """The dagger a cell gets where the machine's rows are from an earlier benchmark version."""
    rows = last[(last["machine"] == machine) & (last["technique"] == technique)]
    return f" {headline.EARLIER}" if rows["earlier_version"].fillna(False).astype(bool).any() else ""


def test_memory_beside_a_speed_not_yet_measured(measured):
    last = report.latest(measured)
    no_step = last[~((last["technique"] == "checkpoint") & (last["suite"] == "TrainingStep"))]
    text = cell(headline.grid(no_step).frame, "checkpoint", H100)
    assert text.startswith("speed not measured yet (speedlib run --chunk headline-checkpoint)")
    rows = last[(last["machine"] == "h100-sxm-80gb") & (last["suite"] == "PeakMemory")
                & (last["metric"] == "peak_memory") & (last["workload"] == "densenet_bc")
                & (last["batch"] == "256")].set_index("variant")["value"]
    assert f"batch=256: peak memory {rows['speedlib'] / rows['none']:.3g}x" in text


def test_cells_without_a_number_say_why(measured):
    frame = headline.grid(measured).frame
    assert cell(frame, "transfer", CPU) == "needs a GPU"  # CuPy and pinned tables need CUDA
    gpu_only = measured[(measured["machine"] == "h100-sxm-80gb") & (measured["technique"] != "transfer")]
    assert cell(headline.grid(gpu_only).frame, "transfer", H100) == \
        "not measured yet: speedlib run --chunk headline-transfer"


def test_an_unpaired_cell_shows_both_values(measured):
    text = cell(headline.grid(measured).frame, "parallel", H100)
    last = report.latest(measured)
    rows = last[(last["machine"] == "h100-sxm-80gb") & (last["benchmark"] == "bench_parallel.Step.track_step")]
    step = rows.set_index("variant")["value"]
    assert text == (f"world=1: {step['dataparallel'] / step['ddp']:.3g}x "
                    f"({step['ddp'] * 1e3:.3g} vs {step['dataparallel'] * 1e3:.3g} ms; N=1 each, not paired)"
                    + _mark(last, "h100-sxm-80gb", "parallel"))


def test_wide_intervals_and_earlier_benchmark_versions_are_said_beside_the_grid(measured):
    wild = [1.0, 3.0, 0.5, 2.0, 1.5, 0.8, 2.5, 1.1]
    rows = (measured["technique"] == "amp") & (measured["kind"] == "paired speedup") & (measured["machine"] == "cpu-2core")
    disturbed = measured.copy()
    disturbed.loc[rows, "samples"] = pd.Series([wild] * int(rows.sum()), index=disturbed.index[rows])
    notes = [n for n in headline.grid(disturbed).notes if n.startswith("Mixed precision on cpu")]
    est = ratio_estimate(wild)
    assert notes == [f"Mixed precision on cpu-2core (workload=resnet50, variant=bf16_channels_last): its 99 % "
                     f"interval [{est.low:.3g}, {est.high:.3g}] spans {est.high / est.low:.2f}x (high / low), more "
                     "than 1.10x: only 8 rounds, the middle half of 8 per-round ratios spans 0.95x-2.12x (124 % apart)"]
    # a machine whose results predate a benchmark change keeps them, marked in its cell
    flagged = measured.assign(earlier_version=measured["machine"] == "h100-sxm-80gb")
    g = headline.grid(flagged)
    assert cell(g.frame, "amp", H100).endswith(f" {headline.EARLIER}")
    assert not cell(g.frame, "amp", CPU).endswith(headline.EARLIER)
    assert any(n.startswith(f"{headline.EARLIER}: measured with an earlier version") for n in g.notes)
    assert "benchmark code an earlier version" in report.to_markdown(g)


def test_a_comparison_about_several_gpus_measured_on_one_says_so(measured):
    """The H100's DDP-vs-DataParallel cell is world=1: the same single replica both ways, so
    0.94x is overhead, and the grid says what would measure the comparison itself."""
    note = "DistributedDataParallel vs DataParallel on h100-sxm-80gb: one device only"
    notes = headline.grid(measured).notes
    assert any(n.startswith(note) and "speedlib run --chunk headline-parallel on a machine with 2 or more GPUs" in n
               for n in notes)
    # two ranks measured: no such note
    two = measured.copy()
    on = (two["machine"] == "h100-sxm-80gb") & (two["benchmark"] == "bench_parallel.Step.track_step")
    two.loc[on, "world"] = "2"
    assert not any(n.startswith(note) for n in headline.grid(two).notes)
