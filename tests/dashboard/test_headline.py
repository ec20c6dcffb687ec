"""speedbench.report.headline: the overview's first table says the same as the detailed tables."""

from __future__ import annotations

import importlib
import io
import sys
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")

from speedbench import report  # noqa: E402 - after the skip: the report needs pandas
from speedbench.report import headline  # noqa: E402 - after the skip: the report needs pandas
from speedbench.results.load import load_results  # noqa: E402 - after the skip: the loader needs pandas
from speedbench.stats.paired import paired_ratio, ratio_estimate  # noqa: E402 - after the skip, with the report's

RESULTS = Path(__file__).resolve().parents[2] / "results"
H100 = "h100-sxm-80gb (NVIDIA H100 80GB HBM3)"
H200 = "h200-141gb (NVIDIA H200)"  # commit 838236b, the headline chunks but the checkpoint step time
INTEL = "cpu-2core-intel-xeon"  # the headline commit's CPU machine
CPU = f"{INTEL} (CPU only)"
AMD = "cpu-2core-amd-epyc (CPU only)"  # earlier benchmark versions only, marked


@pytest.fixture(scope="module")
def measured() -> pd.DataFrame:
    return load_results(RESULTS).measured


def cell(frame: pd.DataFrame, technique: str, machine: str, part: str = "main") -> str:
    """The cell's figures for the headline's own comparison ("main") or for the whole step
    beside it ("whole"), each without the scope the cell says it in."""
    text = frame.loc[frame["technique"] == report.TECHNIQUES[technique].title, machine].iloc[0]
    h = next(h for h in headline.HEADLINES if h.technique == technique)
    assert text.startswith(_said(h.scope)), text  # every cell opens with what its timed region holds
    main, _, whole = text[len(_said(h.scope)):].partition(". " + _said(h.whole.scope) if h.whole else "\0")
    assert bool(whole) == bool(h.whole), text
    return main if part == "main" else whole


def _said(scope: str) -> str:
    return scope[0].upper() + scope[1:] + ": "


def test_one_row_per_technique_one_column_per_machine(measured):
    frame = headline.grid(measured).frame
    assert list(frame["technique"]) == [report.TECHNIQUES[h.technique].title for h in headline.HEADLINES]
    assert set(report.TECHNIQUES) == {h.technique for h in headline.HEADLINES}
    assert list(frame.columns) == ["technique", AMD, CPU, H100, H200, "comparison"]


def test_a_paired_cell_is_the_paired_tables_estimate(measured):
    """The H100 run predates bench_amp's `default`: strict fp32 leads, named; on the CPU it is
    PyTorch's default too (TF32 does not exist there). The H200 run of d93fd5c1 measured
    `default`: it leads, its ratio the paired estimate of the same rounds' seconds."""
    last = report.latest(measured)
    p = report.paired(last[(last["technique"] == "amp") & (last["suite"] == "TrainingStep")])
    named = {"h100-sxm-80gb": "strict fp32 (the Tuning Guide's baseline)",
             INTEL: "strict fp32 (PyTorch's default on CPUs, the Tuning Guide's baseline)"}
    for machine, label in (("h100-sxm-80gb", H100), ("h200-141gb", H200), (INTEL, CPU)):
        r = p[(p["machine"] == machine) & (p["workload"] == "resnet50")
              & (p["variant"] == "bf16_channels_last")].iloc[0]
        fp32 = f"{r['ratio']:.3g}x [{r['ratio_low']:.3g}, {r['ratio_high']:.3g}]"
        if machine in named:
            expected = f"{fp32} N={r['n']} vs {named[machine]}"
        else:
            seconds = last[(last["machine"] == machine) & (last["suite"] == "TrainingStep")
                           & (last["technique"] == "amp") & last["benchmark"].str.endswith(".track_seconds")
                           & (last["workload"] == "resnet50")].set_index("variant")["samples"]
            e = paired_ratio(seconds["default"], seconds["bf16_channels_last"])
            expected = (f"{e.ratio:.3g}x [{e.low:.3g}, {e.high:.3g}] N={e.n} vs TF32 convolutions + fp32 matmuls "
                        f"(PyTorch's default on CUDA); {fp32} vs strict fp32 (the Tuning Guide's baseline)")
        assert cell(headline.grid(measured).frame, "amp", label) == \
            expected + _mark(last, machine, "amp", "TrainingStep")


def _mark(last, machine: str, technique: str, suite: str | None = None) -> str:
    """The dagger a cell gets where the machine's rows (of `suite`, the class the cell shows)
    are from an earlier benchmark version."""
    rows = last[(last["machine"] == machine) & (last["technique"] == technique)
                & ((last["suite"] == suite) if suite else True)]
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
    rows = (measured["technique"] == "amp") & (measured["kind"] == "paired speedup") & (measured["machine"] == INTEL)
    disturbed = measured.copy()
    disturbed.loc[rows, "samples"] = pd.Series([wild] * int(rows.sum()), index=disturbed.index[rows])
    notes = [n for n in headline.grid(disturbed).notes if n.startswith(f"Mixed precision on {INTEL}")]
    est = ratio_estimate(wild)
    assert notes == [f"Mixed precision on {INTEL} (workload=resnet50, variant=bf16_channels_last): its 99 % "
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


# --- baselines: PyTorch's default first (issue 29, item 5) ---------------------------------------
# Small frames as the loader gives them, on machines named here: the committed results' names
# may change, what a cell leads with must not depend on them.

def _adam_run(machine: str, gpu: str, seconds: dict[str, list[float]], technique: str = "contiguous",
              suite: str = "AdamStep", baseline: str = "forloop") -> pd.DataFrame:
    """One AdamStep comparison (ResNet-50's parameters): every variant's seconds per round and
    each variant's per-round speedup over forloop, the class's baseline (benchmarks/common.py);
    another paired class's on ResNet-50 with `technique`, `suite` and `baseline`."""
    rows = []
    for v, s in seconds.items():
        common = {"machine": machine, "gpu": gpu, "technique": technique, "suite": suite, "workload": "resnet50",
                  "variant": v, "params": f"workload=resnet50, variant={v}", "n": len(s)}
        rows.append({**common, "benchmark": f"bench_{technique}.{suite}.track_seconds", "metric": "seconds",
                     "kind": "time", "unit": "seconds", "samples": s, "value": sorted(s)[len(s) // 2],
                     "result_id": f"{machine}-seconds-{v}"})
        if v != baseline:
            ratios = [b / x for b, x in zip(seconds[baseline], s, strict=True)]
            rows.append({**common, "benchmark": f"bench_{technique}.{suite}.track_speedup", "metric": "speedup",
                         "kind": "paired speedup", "unit": "x", "samples": ratios, "value": sorted(ratios)[len(s) // 2],
                         "result_id": f"{machine}-speedup-{v}"})
    return pd.DataFrame(rows).assign(commit="c" * 40, commit_date=pd.Timestamp(0, tz="UTC"), earlier_version=False)


# Ten rounds whose speed drifts (a round's factor hits every variant alike), with some
# jitter of the baselines' own, so that the interval has a width to print.
DRIFT = [1.0, 1.3, 0.9, 1.6, 1.1, 0.8, 1.4, 1.0, 1.2, 0.95]
JITTER = [1.0, 1.02, 0.99, 1.01, 0.98, 1.0, 1.03, 0.97, 1.01, 1.0]


def _seconds(**per_variant: float) -> dict[str, list[float]]:
    return {v: [t * d * (j if v != "speedlib" else 1.0) for d, j in zip(DRIFT, JITTER, strict=True)]
            for v, t in per_variant.items()}


def _vs(seconds: dict[str, list[float]], baseline: str, variant: str = "speedlib") -> str:
    r = paired_ratio(seconds[baseline], seconds[variant])
    return report.fmt_ratio(r.ratio, r.low, r.high)


def test_the_flat_buffer_cell_leads_with_pytorchs_default_adam_on_each_kind_of_machine():
    """torch.optim.Adam picks foreach when every parameter is on CUDA and the per-tensor loop
    on CPUs: a GPU cell leads with foreach, a CPU cell with the loop, fused beside both, and
    the per-tensor loop (contiguous_params' baseline) stays in the GPU cell after them."""
    gpu = _seconds(forloop=10e-3, foreach=1.6e-3, fused=0.48e-3, speedlib=0.29e-3)
    cpu = _seconds(forloop=48e-3, foreach=66e-3, fused=16e-3, speedlib=15e-3)
    frame = pd.concat([_adam_run("box-gpu", "Some GPU 80GB", gpu), _adam_run("box-cpu", "CPU only", cpu)])
    g = headline.grid(frame)
    assert cell(g.frame, "contiguous", "box-gpu (Some GPU 80GB)") == (
        f"{_vs(gpu, 'foreach')} N=10 vs foreach (PyTorch's default on CUDA); {_vs(gpu, 'fused')} vs fused; "
        f"{_vs(gpu, 'forloop')} vs per-tensor loop (contiguous_params' baseline)")
    assert cell(g.frame, "contiguous", "box-cpu (CPU only)") == (
        f"{_vs(cpu, 'forloop')} N=10 vs per-tensor loop (PyTorch's default on CPUs, contiguous_params' baseline); "
        f"{_vs(cpu, 'fused')} vs fused")  # foreach is neither the default nor the fused one there
    # the rows behind the foreach figure are the two variants' seconds of the same rounds
    foreach = g.sources[(g.sources["machine"] == "box-gpu") & (g.sources["baseline"] == "foreach")].iloc[0]
    assert (foreach["result_id"], foreach["result_id_base"], foreach["n"]) == (
        "box-gpu-seconds-speedlib", "box-gpu-seconds-foreach", 10)


def test_a_flat_buffer_cell_without_the_default_measured_leads_with_the_sources_baseline():
    """An older run without foreach, or a machine whose run did not record its GPU, cannot
    say which Adam is the default there: the loop leads, named, and nothing claims to be it."""
    old = {v: s for v, s in _seconds(forloop=10e-3, foreach=1.6e-3, speedlib=0.29e-3).items() if v != "foreach"}
    unknown = _seconds(forloop=10e-3, foreach=1.6e-3, fused=0.48e-3, speedlib=0.29e-3)
    g = headline.grid(pd.concat([_adam_run("old-gpu", "Some GPU 80GB", old), _adam_run("who", "unknown", unknown)]))
    assert cell(g.frame, "contiguous", "old-gpu (Some GPU 80GB)") == \
        f"{_vs(old, 'forloop')} N=10 vs per-tensor loop (contiguous_params' baseline)"
    assert cell(g.frame, "contiguous", "who (unknown)") == (
        f"{_vs(unknown, 'forloop')} N=10 vs per-tensor loop (contiguous_params' baseline); "
        f"{_vs(unknown, 'fused')} vs fused")


def test_the_mixed_precision_cell_leads_with_pytorchs_default_precision_on_a_gpu():
    """On a GPU PyTorch runs cuDNN convolutions in TF32 and matmuls in float32 (bench_amp's
    `default`): the cell leads with it and keeps strict fp32, the Tuning Guide's baseline, beside."""
    gpu = {v: [t * d for d in DRIFT] for v, t in (("fp32", 0.20), ("default", 0.16), ("bf16_channels_last", 0.06))}
    g = headline.grid(_adam_run("box-gpu", "Some GPU 80GB", gpu, "amp", "TrainingStep", "fp32"))
    assert cell(g.frame, "amp", "box-gpu (Some GPU 80GB)") == (
        f"{_vs(gpu, 'default', 'bf16_channels_last')} N=10 vs TF32 convolutions + fp32 matmuls (PyTorch's default on "
        f"CUDA); {_vs(gpu, 'fp32', 'bf16_channels_last')} vs strict fp32 (the Tuning Guide's baseline)")


UNIT = "% of pinned host->device bandwidth"


def _floor_run(values: dict[str, float]) -> pd.DataFrame:
    """FractionOfFloor's gather % per variant, one value each, as the loader gives them."""
    frame = pd.DataFrame([{"machine": "box-gpu", "gpu": "Some GPU 80GB", "technique": "transfer",
                           "suite": "FractionOfFloor", "benchmark": "bench_transfer.FractionOfFloor."
                           "track_gather_fraction_of_floor", "metric": "gather_fraction_of_floor",
                           "kind": "fraction of floor", "unit": UNIT, "variant": v, "params": f"variant={v}",
                           "workload": None, "value": x, "ci99_low": None, "ci99_high": None, "q25": None, "q75": None,
                           "n": 1, "result_id": v} for v, x in values.items()])
    return frame.assign(commit="c" * 40, commit_date=pd.Timestamp(0, tz="UTC"))


def test_the_transfer_cell_leads_with_the_pageable_copy_and_keeps_speedtorchs_pinned_beside():
    """Both baselines are plain PyTorch (bench_transfer's torch_pageable and torch_pinned);
    speedlib's own pinned backend, once the baseline, is not one."""
    frame = _floor_run({"torch_pageable": 11.0, "torch_pinned": 42.4, "pinned": 40.0, "auto": 38.8})
    assert cell(headline.grid(frame).frame, "transfer", "box-gpu (Some GPU 80GB)") == (
        f"{38.8 / 11.0:.3g}x vs PyTorch pageable (PyTorch's default; 38.8 vs 11 {UNIT}; N=1 each, not paired); "
        f"{38.8 / 42.4:.3g}x vs PyTorch pinned (SpeedTorch's baseline; 38.8 vs 42.4 {UNIT})")


def test_a_transfer_run_from_before_the_plain_baselines_shows_no_ratio_against_speedlibs_pinned():
    """At 838236b and earlier the baseline was speedlib's pinned backend: no ratio is shown
    against it, in the grid or in the tables; the % of the floor stand on their own."""
    old = _floor_run({"pageable": 6.5, "pinned": 11.3, "cupy": 32.6, "uva": 33.3})
    assert cell(headline.grid(old).frame, "transfer", "box-gpu (Some GPU 80GB)") == \
        "not measured yet: speedlib run --chunk headline-transfer"
    assert report.speedups(old).empty
    assert report.speedup_table(old, "fraction of floor").frame.empty


def test_the_grid_says_which_baseline_every_row_uses_and_the_claims_keep_the_sources():
    gpu = _seconds(forloop=10e-3, foreach=1.6e-3, fused=0.48e-3, speedlib=0.29e-3)
    g = headline.grid(_adam_run("box-gpu", "Some GPU 80GB", gpu))
    said = {n.split(": ", 1)[0]: n.split(": ", 1)[1] for n in g.notes}
    for h in headline.HEADLINES:
        assert "PyTorch" in said[report.TECHNIQUES[h.technique].title], h.technique
    assert "foreach where every parameter is on CUDA" in said["Flat-buffer (contiguous) parameters"]
    # PyTorch's default on GPUs (TF32 convolutions, float32 matmuls) leads, strict fp32 beside it
    assert said["Mixed precision"].startswith("leads on GPUs with default, PyTorch's default precision")
    assert "strict fp32 (TF32 off everywhere), the Tuning Guide's baseline" in said["Mixed precision"]
    # the claims table still compares with the sources' baselines, SpeedTorch's "PyTorch pinned" plain PyTorch
    assert {(c.technique, c.baseline) for c in report.CLAIMS if c.technique in ("contiguous", "transfer")} == {
        ("contiguous", "forloop"), ("transfer", "torch_pinned")}


EVERY_HEADLINE = [x for h in headline.HEADLINES for x in (h, h.whole) if x is not None]


@pytest.mark.parametrize("h", EVERY_HEADLINE, ids=lambda h: f"{h.technique}.{h.suite}")
def test_every_baseline_a_cell_names_is_a_plain_variant_its_class_measures(h):
    sys.path.insert(0, str(RESULTS.parent))
    cls = getattr(importlib.import_module(f"benchmarks.bench_{h.technique}"), h.suite)
    params = cls.params if isinstance(cls.params[0], (list, tuple)) else [cls.params]
    variants = dict(zip(cls.param_names, params, strict=True))
    baselines = {h.baseline, *(v for _, v in h.default), *h.beside}
    assert baselines | {h.variant} <= set(variants["variant"])
    assert baselines <= set(report.TECHNIQUES[h.technique].plain)  # plain PyTorch, never a speedlib path


def test_each_cell_says_its_scope_and_a_part_of_a_step_shows_the_whole_step_beside_it(measured):
    """A 35.8x optimizer step stood in one column with a 3.18x training step: each cell opens
    with what it times, and the flat buffer's shows the whole iteration's paired estimate."""
    frame = headline.grid(measured).frame
    scopes = {h.technique: h.scope for h in headline.HEADLINES}
    assert scopes["contiguous"].startswith("Adam step alone") and scopes["transfer"].startswith("row gather only")
    assert {scopes[t] for t in ("amp", "checkpoint", "tuning")} == {"whole training step"}
    last = report.latest(measured)
    p = report.paired(last[(last["technique"] == "contiguous") & (last["suite"] == "Iteration")])
    r = p[(p["machine"] == INTEL) & (p["workload"] == "resnet50") & (p["variant"] == "speedlib")].iloc[0]
    expected = f"{r['ratio']:.3g}x [{r['ratio_low']:.3g}, {r['ratio_high']:.3g}] N={r['n']} vs per-tensor loop"
    assert cell(frame, "contiguous", CPU, "whole").startswith(expected)
    # The H100 ran the optimizer step but not the whole iteration: the cell says which chunk would.
    assert cell(frame, "contiguous", H100, "whole") == "not measured yet: speedlib run --chunk contiguous-amp"
    # the embedding step's auto vs SparseAdam on the host runs on CPUs too: this run predates them
    assert cell(frame, "transfer", CPU, "whole") == "not measured yet: speedlib run --chunk transfer-parallel"


def test_the_whole_step_has_its_own_marks_and_wide_interval_notes(measured):
    """A whole-step figure from an earlier benchmark version carries its own dagger, and its
    wide-interval note names its class (it shares the headline's parameters)."""
    t = headline.grid(measured)
    assert cell(t.frame, "contiguous", AMD, "whole").endswith(headline.EARLIER)
    assert any(n.startswith("Flat-buffer (contiguous) parameters on cpu-2core-amd-epyc (Iteration, workload=resnet50")
               for n in t.notes)
    assert any("times Adam step alone (optimizer.step(), not clip or zero_grad), and its cells add whole training "
               "iteration (Iteration)" in n
               for n in t.notes)


def test_the_csv_export_is_tidy_numbers_with_the_same_figures_as_the_grid(measured):
    """`speedlib report --table headline --format csv`: one row per technique, machine and
    comparison, ratio/low/high/N numeric, scope and baseline words in columns of their own;
    every figure the grid's text shows is one row of it, formatted as the grid formats it."""
    table = headline.grid(measured)
    data = pd.read_csv(io.StringIO(report.to_csv(table)))
    for column in ("ratio", "low", "high", "n"):
        assert pd.api.types.is_float_dtype(data[column]), column
    for column in ("technique", "machine", "part", "scope", "baseline", "baseline_words", "status"):
        assert column in data
    assert not data.duplicated(["technique", "machine", "part", "measure", "case", "baseline"]).any()
    # the H100 flat-buffer step: 5.65x [5.39, 6.61] N=30 vs foreach, PyTorch's default on CUDA
    row = data[(data["technique"] == "contiguous") & (data["machine"] == "h100-sxm-80gb")
               & (data["part"] == "headline") & data["lead"]].iloc[0]
    assert (row["baseline"], row["baseline_words"], row["n"]) == ("foreach", "PyTorch's default on CUDA", 30)
    assert report.fmt_ratio(row["ratio"], row["low"], row["high"]) in cell(table.frame, "contiguous", H100)
    speed = data[(data["status"] == "measured") & (data["measure"] == "speed")]
    for r in speed.itertuples():
        col = next(c for c in table.frame.columns if c.startswith(r.machine + " "))
        text = cell(table.frame, r.technique, col, "whole" if r.part == "whole step" else "main")
        low, high = (None, None) if pd.isna(r.low) else (r.low, r.high)
        assert report.fmt_ratio(r.ratio, low, high) in text, (r.technique, r.machine, text)
    # a cell without a number says why in the same words as the grid
    gone = data[(data["technique"] == "transfer") & (data["machine"] == "h100-sxm-80gb") & (data["part"] == "headline")]
    assert gone["ratio"].isna().all() and gone["status"].iloc[0].startswith("not measured yet: speedlib run")


def test_glance_gives_one_number_per_technique_and_machine_gpus_first(measured):
    picks = headline.glance(measured)
    assert not picks.duplicated(["technique", "machine"]).any()
    assert len(picks) == len(headline.HEADLINES) * measured["machine"].nunique()
    kinds = list(picks["gpu"].map(lambda g: g == "CPU only"))
    assert kinds == sorted(kinds)  # every GPU machine before every CPU one
    # the whole step where it was measured (H200 flat buffer), else the headline's own figure
    h200 = picks[(picks["technique"] == "contiguous") & (picks["machine"] == "h200-141gb")].iloc[0]
    assert (h200["part"], h200["baseline"]) == ("whole step", "foreach")
    h100 = picks[(picks["technique"] == "contiguous") & (picks["machine"] == "h100-sxm-80gb")].iloc[0]
    assert (h100["part"], h100["baseline"]) == ("headline", "foreach")
    tidy = headline.grid(measured).data
    lead = tidy[(tidy["technique"] == "contiguous") & (tidy["machine"] == "h200-141gb") & (tidy["part"] == "whole step")
                & tidy["lead"]].iloc[0]
    assert h200["ratio"] == lead["ratio"]


def test_every_paired_figure_of_the_overview_is_in_the_paired_table_and_its_export(measured):
    """Issue 44: the H100 flat-buffer cell led with "5.65x [5.39, 6.61] vs foreach", a figure no
    other table held (`--table paired` had the forloop baseline only). Every paired ratio the grid
    shows, against PyTorch's default and fused Adam included, is a row of the paired table and of
    its CSV, with the same numbers: one comparison, one number."""
    tidy = headline.grid(measured).data
    shown = tidy[(tidy["status"] == "measured") & tidy["paired"] & (tidy["measure"] == "speed")]
    table = report.paired_table(report.latest(measured))
    csv = pd.read_csv(io.StringIO(report.to_csv(table)))
    assert len(shown) >= 20
    for r in shown.itertuples():
        for data in (table.data, csv):
            rows = data[(data["machine"] == r.machine) & (data["technique"] == r.technique)
                        & (data["baseline"] == r.baseline) & (data["result_id"] == r.result_id)]
            assert len(rows) == 1, (r.technique, r.machine, r.baseline, len(rows))
            assert rows["ratio"].iloc[0] == pytest.approx(r.ratio) and rows["low"].iloc[0] == pytest.approx(r.low)
    h100 = table.frame[(table.frame["machine"] == "h100-sxm-80gb") & (table.frame["variant"] == "speedlib")
                       & (table.frame["baseline"] == "foreach") & (table.frame["comparison"] == "AdamStep resnet50")]
    assert list(h100["speedup"]) == ["5.65x [5.39, 6.61]"]
