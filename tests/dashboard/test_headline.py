"""speedbench.report.headline: one row, one question (issue 51). Every cell of a row is the
same comparison (scope, baseline for that kind of machine, measure), paired wherever measured
so, and a cell without that comparison says why, never showing another comparison's number.

Figures are derived from the results (committed or built here), never written into a test:
issue 50 rewrites the committed results' benchmark versions, so a dagger may come and go.
"""

from __future__ import annotations

import html
import importlib
import io
import json
import math
import re
import sys
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")

from speedbench import report  # noqa: E402 - after the skip: the report needs pandas
from speedbench.report import glance, headline  # noqa: E402 - after the skip: the report needs pandas
from speedbench.results.load import load_results  # noqa: E402 - after the skip: the loader needs pandas
from speedbench.stats.paired import paired_ratio  # noqa: E402 - after the skip, with the report's
from speedbench.techniques import TECHNIQUES  # noqa: E402 - after the skip, with the report's

RESULTS = Path(__file__).resolve().parents[2] / "results"
QUESTION = {q.key: q for q in headline.QUESTIONS}


@pytest.fixture(scope="module")
def measured() -> pd.DataFrame:
    return load_results(RESULTS).measured


@pytest.fixture(scope="module")
def grid(measured) -> report.Table:
    return headline.grid(measured)


def column(frame: pd.DataFrame, machine: str) -> str:
    return next(c for c in frame.columns if c.startswith(machine + " ("))


def cell(frame: pd.DataFrame, key: str, machine: str) -> str:
    """The grid's text for question `key` on `machine`."""
    return frame.loc[frame["question"] == QUESTION[key].label, column(frame, machine)].iloc[0]


def answer(data: pd.DataFrame, key: str, machine: str):
    return data[(data["question"] == key) & (data["machine"] == machine)].iloc[0]


def test_one_row_per_question_one_column_per_machine(grid, measured):
    assert list(grid.frame["question"]) == [q.label for q in headline.QUESTIONS]
    machines = headline.order_machines(measured)  # GPU machines first, as on the chart
    assert [headline.machine_kind(measured.loc[measured["machine"] == m, "gpu"].iloc[0]) for m in machines[:2]] == \
        ["gpu", "gpu"]
    assert list(grid.frame.columns) == ["technique", "question", *(column(grid.frame, m) for m in machines),
                                        "comparison"]
    # a technique asking two things has two rows: the four
    keys = {q.key for q in headline.QUESTIONS}
    assert {"checkpoint-time", "checkpoint-memory", "contiguous-step", "contiguous-iteration", "amp-default",
            "amp-fp32"} <= keys
    assert len(grid.data) == len(headline.QUESTIONS) * len(machines)


def test_every_cell_of_a_row_is_the_same_comparison(grid, measured):
    """The same class (or its unpaired stand-in), variant, measure and scope in every cell, and
    the baseline the row names on that kind of machine; each figure's result is of that class."""
    suite_of = dict(zip(measured["result_id"], measured["suite"], strict=False))
    for key, rows in grid.data.groupby("question", sort=False):
        q = QUESTION[key]
        h = q.comparison
        classes = {h.memory_suite} if q.measure == "peak memory" else {h.suite, *([h.fallback.suite] if h.fallback
                                                                                  else [])}
        assert set(rows["measure"]) == {q.measure}, key
        shown = rows[rows["ratio"].notna()]
        for r in shown.itertuples():
            assert r.suite in classes and suite_of[r.result_id] == r.suite, (key, r.machine)
            assert r.variant == h.variant and r.baseline == q.baseline_on(headline.machine_kind(r.gpu)), key
        assert shown.drop_duplicates(["suite", "scope"])["suite"].is_unique, key  # one scope per class


def test_a_cell_without_its_comparison_says_why_and_shows_no_other_number(grid):
    """The H100's flat-buffer cell once showed "Adam step alone" beside the H200's "whole step":
    now the whole-iteration row's H100 cell says why it has none, with no figure, grey."""
    for r in grid.data[grid.data["ratio"].isna()].itertuples():
        text = cell(grid.frame, r.question, r.machine)
        assert text == r.status and "x [" not in text and " N=" not in text
        assert r.status.startswith(("needs ", "not measured yet: speedlib run --chunk ", "not measured: ")), text
        assert math.isnan(glance._gain(r))
    # a GPU machine whose run did not time the row's baseline says which run, and which baseline
    for r in grid.data[grid.data["status"].str.startswith("not measured: ")].itertuples():
        assert f"at {r.status.split(' at ')[1][:8]}" in r.status and "did not time" in r.status


def test_mixed_precision_has_a_row_for_pytorchs_default_and_one_for_strict_fp32(grid, measured):
    """The H100 showed 3.18x against strict fp32 beside the H200's 1.62x against TF32
    convolutions. Each row now compares with one baseline: PyTorch's default on each machine
    (strict fp32 on a CPU), and strict fp32 everywhere; a machine that never timed `default`
    says so instead of lending the other row's figure."""
    last = report.citable(measured)
    amp = last[(last["technique"] == "amp") & (last["suite"] == "TrainingStep") & (last["workload"] == "resnet50")]
    paired = report.paired(amp)
    for machine, rows in amp.groupby("machine"):
        kind = headline.machine_kind(rows["gpu"].iloc[0])
        fp32 = paired[(paired["machine"] == machine) & (paired["variant"] == "bf16_channels_last")
                      & (paired["baseline"] == "fp32")].iloc[0]
        assert cell(grid.frame, "amp-fp32", machine).startswith(
            f"{report.fmt_ratio(fp32['ratio'], fp32['ratio_low'], fp32['ratio_high'])} N={fp32['n']} vs strict fp32")
        default = cell(grid.frame, "amp-default", machine)
        seconds = rows[rows["benchmark"].str.endswith(".track_seconds")].set_index("variant")["samples"]
        if kind == "cpu":
            assert default == cell(grid.frame, "amp-fp32", machine)  # strict fp32 is PyTorch's default there
        elif "default" in seconds:
            e = paired_ratio(seconds["default"], seconds["bf16_channels_last"])
            assert default.startswith(f"{e.ratio:.3g}x [{e.low:.3g}, {e.high:.3g}] N={e.n} vs TF32 convolutions")
        else:
            earlier = bool(report.earlier_version(rows).any())
            assert default.startswith("not measured: " + ("earlier benchmark version" if earlier else "its run"))
            assert default.endswith("did not time TF32 convolutions"), default


def test_the_flat_buffer_has_a_row_for_the_optimizer_step_and_one_for_the_whole_iteration(grid, measured):
    last = report.citable(measured)
    for key, suite in (("contiguous-step", "AdamStep"), ("contiguous-iteration", "Iteration")):
        p = report.paired(last[(last["technique"] == "contiguous") & (last["suite"] == suite)])
        for machine in sorted(measured["machine"].unique()):
            a = answer(grid.data, key, machine)
            mine = p[(p["machine"] == machine) & (p["workload"] == "resnet50") & (p["variant"] == "speedlib")
                     & (p["baseline"] == a["baseline"])]
            if mine.empty:
                assert pd.isna(a["ratio"]) and a["status"] != headline.MEASURED, (key, machine)
            else:
                assert a["ratio"] == pytest.approx(mine["ratio"].iloc[0]) and a["suite"] == suite, (key, machine)


def test_peak_memory_has_its_own_row_coloured_less_is_better(grid, measured):
    """Checkpointing's GPU cells were peak-memory ratios (0.388x) beside the CPUs' speed ratios,
    on one colour scale, and 0.388x was blue where the colour bar put below 1x in red. Memory
    has its own row: variant / baseline at the largest batch, its colour the gain (less memory
    is better), the colour bar and the legend in those words."""
    last = report.citable(measured)
    peak = last[(last["suite"] == "PeakMemory") & (last["technique"] == "checkpoint")
                & (last["metric"] == "peak_memory") & (last["workload"] == "densenet_bc")]
    assert not peak.empty
    for machine, rows in peak.groupby("machine"):
        largest = max(rows["batch"].unique(), key=int)
        value = rows[rows["batch"] == largest].set_index("variant")["value"]
        a = answer(grid.data, "checkpoint-memory", machine)
        assert (a["case"], a["measure"]) == (f"batch={largest}", "peak memory")
        assert a["ratio"] == pytest.approx(value["speedlib"] / value["none"])
        assert a["gain"] == pytest.approx(value["none"] / value["speedlib"])
        assert (glance._gain(a) > 0) == (a["ratio"] < 1)  # less memory: the better side of the scale
        assert f"peak memory {a['ratio']:.3g}x vs none" in cell(grid.frame, "checkpoint-memory", machine)
    for r in grid.data[(grid.data["question"] == "checkpoint-memory") & (grid.data["gpu"] == "CPU only")].itertuples():
        assert r.status == "needs a GPU"  # peak GPU memory: never the CPU's speed ratio in its place
    fig = glance.figure(grid.data).to_dict()
    bar = next(t for t in fig["data"] if t["type"] == "heatmap" and t.get("colorbar"))
    assert bar["colorbar"]["ticktext"] == ["≥4x worse", "2x worse", "same", "2x better", "≥4x better"]
    assert "Blue better (faster, or less memory), red worse" in glance.LEGEND
    assert "better (blue) or worse (red) than the row's baseline" in glance.IMAGE_LEGEND


def test_a_gpu_rows_cpu_cell_says_why_the_cpus_own_figure_is_not_its_answer(grid, measured):
    """The AMD CPU's transfer page shows auto vs torch_pageable 1.75x (a gather with no device to copy
    to) beside a grid cell that said only "needs a GPU": the cell now says that figure is another comparison."""
    cpu_gather = measured[(measured["machine"] == "cpu-2core-amd-epyc") & (measured["suite"] == "Transfer")
                          & (measured["op"] == "gather")]
    assert not cpu_gather.empty  # the case this guards
    a = answer(grid.data, "transfer-gather", "cpu-2core-amd-epyc")
    assert pd.isna(a["ratio"]) and a["status"].startswith("needs a GPU: this CPU's figure (on the technique page)")
    assert answer(grid.data, "checkpoint-memory", "cpu-2core-amd-epyc")["status"] == "needs a GPU"  # none ran


def test_the_dashboards_vega_lite_chart_is_the_sites_plotly_chart_cell_for_cell(grid):
    """The dashboard draws the at-a-glance chart with Vega-Lite (plotly.js cost a new tab 1.5 s),
    the static site with plotly: the same cells, text, colours, hover, and what a click names."""
    rows = grid.data
    ages = {(r.question, r.machine): f"{i} commits behind HEAD" for i, r in enumerate(rows.itertuples())}
    spec = glance.spec(rows, ages)
    fig = glance.figure(rows, ages=ages).to_dict()
    (points,) = [t for t in fig["data"] if t["type"] == "scatter"]
    plotly = {(c[2], c[1]): (text, hover) for c, text, hover in
              zip(points["customdata"], points["text"], points["hovertext"], strict=True)}
    cells = spec["data"]["values"]
    answered = {(c["question_id"], c["machine_id"]): c for c in cells if "technique" in c}
    assert set(answered) == set(plotly) and len(cells) == rows["question"].nunique() * rows["machine"].nunique()
    at = {(r.question, r.machine): r for r in rows.itertuples()}
    depth = max(len(glance.lines(r)) for r in at.values())
    for key, c in answered.items():
        r, (text, hover) = at[key], plotly[key]
        lines = [line.split("\n") for line in (c["bold"], c["plain"], c["italic"])]
        assert {len(line) for line in lines} == {depth}  # the three marks' lines stay aligned
        shown = [[p for p in pieces if p != "\u200b"] for pieces in zip(*lines, strict=True)]
        assert all(len(p) <= 1 for p in shown)  # each line in one mark only
        assert all(len({style for _, style in line}) == 1 for line in glance.lines(r))  # so in one style
        words = [p[0] for p in shown if p]
        assert words == ["".join(t for t, _ in line) for line in glance.lines(r)]
        assert " ".join(words) == re.sub(r"</?[bi]>", "", text).replace("<br>", " ").replace("&gt;", ">") \
            .replace("&#x27;", "'").replace("&amp;", "&")
        assert (c["gain"] is None) == math.isnan(glance._gain(r)) and c["ink"] == glance.ink(glance.colour(
            math.nan if c["gain"] is None else c["gain"]))
        titles = [t for t, _ in glance.tip(r, ages[key])]
        assert titles == [t for t in glance.TIP_TITLES if t in titles]  # the order the Vega-Lite hover lists them in
        for _, text in glance.tip(r, ages[key]):  # both hovers say every line, plotly's wrapped
            assert html.escape(text) in hover.replace("<br>", " ")
        assert hover.startswith(f"<b>{html.escape(r.label)}</b>")
        assert (ages[key] in hover) == (r.status == headline.MEASURED) == ("age" in c)  # a figure's age only
    blank = [c for c in cells if "technique" not in c]
    assert all(set(c) == {"row", "column", "gain", "ink", "bold", "plain", "italic"} for c in blank)
    assert json.dumps(spec, allow_nan=False)  # Streamlit sends it as JSON: a NaN would stop the chart
    # the colour: plotly's scale (glance.colour) stop for stop, linear in RGB between them
    (cell_layer, *texts, hits) = spec["layer"]
    colour = cell_layer["encoding"]["color"]
    assert colour["scale"] == {"domain": [-1, -0.5, 0, 0.5, 1], "range": [c for _, c in glance._SCALE],
                               "interpolate": "rgb"}
    assert [glance.colour(g) for g in colour["scale"]["domain"]] == colour["scale"]["range"]
    legend = colour["legend"]["labelExpr"]
    assert [legend.index(w) for w in ("≥4x worse", "2x worse", "same", "2x better", "≥4x better")] == sorted(
        legend.index(w) for w in ("≥4x worse", "2x worse", "same", "2x better", "≥4x better"))
    assert colour["condition"]["value"] == glance.colour(math.nan)  # grey: no answer
    assert [(t["encoding"]["text"]["field"], t["mark"].get("fontWeight"), t["mark"].get("fontStyle")) for t in texts] \
        == [("bold", "bold", None), ("plain", None, None), ("italic", None, "italic")]
    assert hits["params"][0]["name"] == glance.SELECTION
    # the hover: the comparison as its heading, every line in TIP_TITLES' order, none on a blank cell
    hover = hits["mark"]["tooltip"]["expr"]
    assert hover.startswith("isValid(datum.technique) ? {") and hover.endswith("} : null")
    assert re.findall(r'"([^"]+)": datum\["([^"]+)"\]', hover) == [
        ("title" if t == "comparison" else t, t) for t in glance.TIP_TITLES]
    assert hits["params"][0]["select"]["fields"] == list(glance.SELECTED)


def test_ddp_on_one_gpu_is_not_coloured_as_a_result(grid, measured):
    """0.941x and 0.927x were coloured like results though both ran one GPU: the wrapper's
    overhead, not DDP against DataParallel. Grey, said so; two ranks are a result."""
    one = grid.data[(grid.data["question"] == "parallel") & grid.data["ratio"].notna()]
    assert not one.empty
    for r in one.itertuples():
        assert r.status == "one GPU: wrapper overhead only (needs >= 2 GPUs)"
        assert math.isnan(glance._gain(r)) and glance.figure_text(r) == ""
        assert cell(grid.frame, "parallel", r.machine).startswith(r.status + ": world=1: ")
        assert [[("one GPU", "")], [("wrapper overhead only", "i")], [("(needs >= 2 GPUs)", "i")]] == glance.lines(r)
    for r in grid.data[(grid.data["question"] == "parallel") & (grid.data["gpu"] == "CPU only")].itertuples():
        assert r.status == "needs 2 or more GPUs"  # not "needs a GPU" beside "11 results on its page"
    two = measured.copy()
    on = two["benchmark"] == "bench_parallel.Step.track_step"
    two.loc[on, "world"] = "2"
    two.loc[on, "params"] = two.loc[on, "params"].str.replace("world=1", "world=2")
    again = headline.grid(two).data
    assert (again[(again["question"] == "parallel") & again["ratio"].notna()]["status"] == headline.MEASURED).all()


def test_the_transfer_rows_lead_with_the_paired_gather_and_say_why_the_unpaired_one_differs(grid, measured):
    """The H200 cell led with FractionOfFloor's 1.18x (one value per variant, timed one after
    another) while the paired Transfer class on the same machine and commit gave 1.71x over
    30 rounds. The paired figure is the cell's; where both exist, a note gives both and why."""
    last = report.citable(measured)
    mine = last[(last["technique"] == "transfer") & (last["suite"] == "Transfer") & (last["op"] == "gather")
                & (last["indices"] == "random")]
    p = report.paired(mine)
    checked = 0
    for key in ("transfer-gather", "transfer-gather-pinned"):
        for machine, rows in p[p["variant"] == "auto"].groupby("machine"):
            if headline.machine_kind(rows["gpu"].iloc[0]) != "gpu":
                continue
            a = answer(grid.data, key, machine)
            r = rows[rows["baseline"] == a["baseline"]].iloc[0]
            assert a["paired"] and a["suite"] == "Transfer" and a["ratio"] == pytest.approx(r["ratio"])
            floor = report.speedups(last[(last["machine"] == machine) & (last["metric"] == "gather_fraction_of_floor")
                                         & (last["commit"] == a["commit"])], baseline=a["baseline"])
            floor = floor[floor["variant"] == "auto"]
            notes = [n for n in grid.notes if n.startswith(f"{QUESTION[key].label} on {machine} at {a['commit'][:8]}")]
            if floor.empty:
                assert not notes
                continue
            (note,) = notes
            assert f"{report.fmt_ratio(a['ratio'], a['low'], a['high'])} N={a['N']}, the variants taking turns" in note
            assert f"reads {report.fmt_ratio(floor['ratio'].iloc[0], None, None)}" in note
            assert "FractionOfFloor times each variant alone" in note
            checked += 1
    assert checked >= 1  # the committed H200 run measured both


UNIT = "% of pinned host->device bandwidth"


def _floor_run(machine: str, values: dict[str, float]) -> pd.DataFrame:
    """FractionOfFloor's gather % per variant, one value each, as the loader gives them."""
    frame = pd.DataFrame([{"machine": machine, "gpu": "Some GPU 80GB", "technique": "transfer",
                           "suite": "FractionOfFloor", "benchmark": "bench_transfer.FractionOfFloor."
                           "track_gather_fraction_of_floor", "metric": "gather_fraction_of_floor",
                           "kind": "fraction of floor", "unit": UNIT, "variant": v, "params": f"variant={v}",
                           "workload": None, "value": x, "ci99_low": None, "ci99_high": None, "q25": None, "q75": None,
                           "n": 1, "result_id": f"{machine}-{v}"} for v, x in values.items()])
    return frame.assign(commit="c" * 40, commit_date=pd.Timestamp(0, tz="UTC"), earlier_version=False)


def test_a_separately_timed_figure_only_where_no_paired_one_exists_marked_so():
    frame = _floor_run("box-gpu", {"torch_pageable": 11.0, "torch_pinned": 42.4, "pinned": 40.0, "auto": 38.8})
    g = headline.grid(frame)
    a = answer(g.data, "transfer-gather-pinned", "box-gpu")
    assert (a["paired"], a["suite"], a["ratio"]) == (False, "FractionOfFloor", pytest.approx(38.8 / 42.4))
    assert cell(g.frame, "transfer-gather-pinned", "box-gpu") == (
        f"{38.8 / 42.4:.3g}x vs PyTorch pinned (SpeedTorch's baseline) (38.8 vs 42.4 {UNIT}; N=1 each, not paired: "
        "FractionOfFloor)")
    shown = glance.lines(next(g.data[g.data["question"] == "transfer-gather-pinned"].itertuples()))
    assert " ".join(text for line in shown for text, style in line if style == "i") == "vs PyTorch pinned not paired"
    # before the plain-PyTorch baselines existed (speedlib's own pinned was the baseline): no ratio
    old = headline.grid(_floor_run("box-gpu", {"pageable": 6.5, "pinned": 11.3, "cupy": 32.6, "uva": 33.3}))
    assert cell(old.frame, "transfer-gather-pinned", "box-gpu") == \
        "not measured: its run at cccccccc did not time auto or PyTorch pinned"


# --- baselines per kind of machine: PyTorch's default (issue 29, item 5; issue 51) ----------------------
# Small frames as the loader gives them, on machines named here: the committed results' names
# may change, what a cell compares with must not depend on them.

def _adam_run(machine: str, gpu: str, seconds: dict[str, list[float]], technique: str = "contiguous",
              suite: str = "AdamStep", baseline: str = "forloop", earlier: bool = False) -> pd.DataFrame:
    """One paired comparison on ResNet-50: every variant's seconds per round and each variant's
    per-round speedup over the class's baseline (benchmarks/common.py)."""
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
    return pd.DataFrame(rows).assign(commit="c" * 40, commit_date=pd.Timestamp(0, tz="UTC"), earlier_version=earlier)


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


def test_the_flat_buffer_row_compares_with_pytorchs_default_adam_on_each_kind_of_machine():
    """torch.optim.Adam picks foreach when every parameter is on CUDA and the per-tensor loop
    on CPUs: one row, one question ("vs PyTorch's default Adam"), the variant following the
    machine; fused and the source's loop are in the paired table, not in this row."""
    gpu = _seconds(forloop=10e-3, foreach=1.6e-3, fused=0.48e-3, speedlib=0.29e-3)
    cpu = _seconds(forloop=48e-3, foreach=66e-3, fused=16e-3, speedlib=15e-3)
    g = headline.grid(pd.concat([_adam_run("box-gpu", "Some GPU 80GB", gpu), _adam_run("box-cpu", "CPU only", cpu)]))
    assert cell(g.frame, "contiguous-step", "box-gpu") == \
        f"{_vs(gpu, 'foreach')} N=10 vs foreach (PyTorch's default on CUDA)"
    assert cell(g.frame, "contiguous-step", "box-cpu") == (
        f"{_vs(cpu, 'forloop')} N=10 vs per-tensor loop (PyTorch's default on CPUs, contiguous_params' baseline)")
    # the figure behind foreach is the two variants' seconds of the same rounds
    foreach = g.sources[(g.sources["machine"] == "box-gpu") & (g.sources["baseline"] == "foreach")].iloc[0]
    assert (foreach["result_id"], foreach["result_id_base"], foreach["n"]) == (
        "box-gpu-seconds-speedlib", "box-gpu-seconds-foreach", 10)
    paired = report.paired_table(pd.concat([_adam_run("box-gpu", "Some GPU 80GB", gpu)])).frame
    assert {"fused", "forloop", "foreach"} <= set(paired["baseline"])  # every other baseline: still one table away


def test_a_run_without_the_rows_baseline_says_so_and_an_earlier_version_is_named():
    """An older run without foreach shows no other baseline's figure in the foreach row; a run
    of an earlier benchmark version says that is why. A machine whose run did not record its
    GPU cannot say which Adam is the default there: the source's baseline stands in, named."""
    old = {v: s for v, s in _seconds(forloop=10e-3, foreach=1.6e-3, speedlib=0.29e-3).items() if v != "foreach"}
    unknown = _seconds(forloop=10e-3, foreach=1.6e-3, fused=0.48e-3, speedlib=0.29e-3)
    g = headline.grid(pd.concat([_adam_run("old-gpu", "Some GPU 80GB", old, earlier=True),
                                 _adam_run("new-gpu", "Some GPU 80GB", old), _adam_run("who", "unknown", unknown)]))
    assert cell(g.frame, "contiguous-step", "old-gpu") == \
        "not measured: earlier benchmark version at cccccccc, which did not time foreach"
    assert cell(g.frame, "contiguous-step", "new-gpu") == "not measured: its run at cccccccc did not time foreach"
    assert cell(g.frame, "contiguous-step", "who") == \
        f"{_vs(unknown, 'forloop')} N=10 vs per-tensor loop (contiguous_params' baseline)"
    assert cell(g.frame, "contiguous-iteration", "new-gpu") == "not measured yet: speedlib run --chunk contiguous-amp"


def test_the_mixed_precision_default_row_compares_with_tf32_convolutions_on_a_gpu():
    gpu = {v: [t * d for d in DRIFT] for v, t in (("fp32", 0.20), ("default", 0.16), ("bf16_channels_last", 0.06))}
    g = headline.grid(_adam_run("box-gpu", "Some GPU 80GB", gpu, "amp", "TrainingStep", "fp32"))
    assert cell(g.frame, "amp-default", "box-gpu") == (
        f"{_vs(gpu, 'default', 'bf16_channels_last')} N=10 vs TF32 convolutions (PyTorch's default "
        "on CUDA)")
    assert cell(g.frame, "amp-fp32", "box-gpu") == (
        f"{_vs(gpu, 'fp32', 'bf16_channels_last')} N=10 vs strict fp32 (the Tuning Guide's baseline)")


def test_the_grid_says_which_baseline_every_row_uses_and_the_claims_keep_the_sources(grid):
    said = {q.label: [n[len(q.label) + 2:] for n in grid.notes if n.startswith(q.label + ": against")]
            for q in headline.QUESTIONS}
    assert all(len(n) == 1 for n in said.values()), said  # each row's baseline said once
    said = {label: n[0] for label, n in said.items()}
    assert said[QUESTION["contiguous-step"].label] == \
        "against PyTorch's default on each machine: foreach on GPUs; per-tensor loop on CPUs"
    assert "strict fp32 (the Tuning Guide's baseline)" in said[QUESTION["amp-fp32"].label]
    # the claims table still compares with the sources' baselines, SpeedTorch's "PyTorch pinned" plain PyTorch
    assert {(c.technique, c.baseline) for c in report.CLAIMS if c.technique in ("contiguous", "transfer")} == {
        ("contiguous", "forloop"), ("transfer", "torch_pinned")}


EVERY_HEADLINE = [x for h in headline.HEADLINES for x in (h, h.whole, h.fallback) if x is not None]


@pytest.mark.parametrize("h", EVERY_HEADLINE, ids=lambda h: f"{h.technique}.{h.suite}")
def test_every_baseline_a_row_names_is_a_plain_variant_its_class_measures(h):
    sys.path.insert(0, str(RESULTS.parent))
    cls = getattr(importlib.import_module(f"benchmarks.bench_{h.technique}"), h.suite)
    params = cls.params if isinstance(cls.params[0], (list, tuple)) else [cls.params]
    variants = dict(zip(cls.param_names, params, strict=True))
    baselines = {h.baseline, *(v for _, v in h.default), *h.beside}
    assert baselines | {h.variant} <= set(variants["variant"])
    assert baselines <= set(report.TECHNIQUES[h.technique].plain)  # plain PyTorch, never a speedlib path
    for column, value in h.where:  # the fixed parameters are the class's own
        assert value in variants[column], (column, value)


def test_wide_intervals_and_earlier_benchmark_versions_are_said_beside_the_grid(measured):
    intel = "cpu-2core-intel-xeon"
    wild = [1.0, 3.0, 0.5, 2.0, 1.5, 0.8, 2.5, 1.1]
    rows = (measured["technique"] == "amp") & (measured["kind"] == "paired speedup") & (measured["machine"] == intel)
    disturbed = measured.copy()
    disturbed.loc[rows, "samples"] = pd.Series([wild] * int(rows.sum()), index=disturbed.index[rows])
    notes = [n for n in headline.grid(disturbed).notes if n.startswith(f"{QUESTION['amp-fp32'].label} on {intel}")]
    assert len(notes) == 1 and "only 8 rounds, the middle half of 8 per-round ratios spans 0.95x-2.12x" in notes[0]
    # a machine whose results predate a benchmark change keeps them, marked in its cells
    flagged = measured.assign(earlier_version=measured["machine"] == "h100-sxm-80gb")
    g = headline.grid(flagged)
    marked = g.data[g.data["ratio"].notna()]
    assert (marked["earlier_version"] == (marked["machine"] == "h100-sxm-80gb")).all()
    for r in marked.itertuples():
        assert cell(g.frame, r.question, r.machine).endswith(headline.EARLIER) == r.earlier_version
    assert any(n.startswith(f"{headline.EARLIER}: measured with an earlier version") for n in g.notes)


def test_a_comparison_about_several_gpus_measured_on_one_says_what_would_measure_it(grid, measured):
    note = "DistributedDataParallel vs DataParallel on {}: one device only"
    one = grid.data[(grid.data["question"] == "parallel") & grid.data["ratio"].notna()]
    for machine in one["machine"]:
        assert any(n.startswith(note.format(machine)) and "on a machine with 2 or more GPUs" in n
                   for n in grid.notes)


def test_the_csv_export_is_tidy_numbers_with_the_same_figures_as_the_grid(grid):
    """`speedlib report --table headline --format csv`: one row per question and machine,
    ratio/low/high numeric, N an integer, the marks booleans; every figure of the grid's text
    is one row of it, formatted as the grid formats it, and a cell without one says why in the
    same words."""
    data = pd.read_csv(io.StringIO(report.to_csv(grid)))
    assert not data.duplicated(["question", "machine"]).any() and len(data) == len(grid.data)
    for c in ("ratio", "low", "high", "gain"):
        assert pd.api.types.is_float_dtype(data[c]), c
    for c in ("paired", "contended", "earlier_version", "gpu_tests_failed"):
        assert pd.api.types.is_bool_dtype(data[c]), c
    for r in data.itertuples():
        text = cell(grid.frame, r.question, r.machine)
        if pd.isna(r.ratio):
            assert text == r.status
        else:
            low, high = (None, None) if pd.isna(r.low) else (r.low, r.high)
            assert report.fmt_ratio(r.ratio, low, high) in text and (pd.isna(r.N) or f"N={int(r.N)}" in text or
                                                                    r.measure == "peak memory"), (r.question, text)


def test_every_paired_figure_of_the_overview_is_in_the_paired_table_and_its_export(grid, measured):
    """Issue 44: one comparison, one number: every paired figure the grid shows is a row of the
    paired table and of its CSV, with the same numbers."""
    shown = grid.data[(grid.data["status"] == headline.MEASURED) & grid.data["paired"]]
    table = report.paired_table(report.latest(measured))
    csv = pd.read_csv(io.StringIO(report.to_csv(table)))
    assert len(shown) >= 10
    for r in shown.itertuples():
        for data in (table.data, csv):
            rows = data[(data["machine"] == r.machine) & (data["technique"] == r.technique)
                        & (data["baseline"] == r.baseline) & (data["result_id"] == r.result_id)]
            assert len(rows) == 1, (r.question, r.machine, r.baseline, len(rows))
            assert rows["ratio"].iloc[0] == pytest.approx(r.ratio) and rows["low"].iloc[0] == pytest.approx(r.low)


def test_the_chart_puts_gpu_machines_first_and_a_click_knows_its_cell(grid):
    rows = grid.data
    machines = glance.order_machines(rows)
    kinds = [headline.machine_kind(rows.loc[rows["machine"] == m, "gpu"].iloc[0]) != "gpu" for m in machines]
    assert kinds == sorted(kinds)
    fig = glance.figure(rows, links={("amp-fp32", machines[0]): "amp.html#x"}).to_dict()
    (points,) = [t for t in fig["data"] if t["type"] == "scatter"]
    assert len(points["customdata"]) == len(rows)
    assert ["amp", machines[0], "amp-fp32", "amp.html#x"] in [list(c) for c in points["customdata"]]
    assert {TECHNIQUES[c[0]] is not None for c in points["customdata"]} == {True}
