"""DistributedDataParallel (gloo, 2 processes) against one process on the same global batch,
no_sync accumulation, the DDP options and flat-buffer parameters; speedlib.parallel.wrap.

The runs go through the harness's launcher (speedbench.measure.ddp_launch), which wraps the model
with speedlib.parallel.wrap and steps it with speedlib.tuning.accumulation_step."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import bench_parallel
from benchmarks import bench_parallel as bench
from speedbench.measure import ddp_launch, workloads
from speedbench.measure.ddp_launch import RunConfig, RunFailed, RunResult
from speedlib import parallel

HAS_CUDA = torch.cuda.is_available()
# Small but real: the 100-layer MLP of the contiguous benchmark at a global batch of 16.
BASE = {"workload": "mlp", "batch": 16, "steps": 3, "warmup": 1}


def _run(recipe=ddp_launch.LIBRARY, **kw) -> RunResult:
    return ddp_launch.run(RunConfig(**{**BASE, **kw}), timeout=180, recipe=recipe)


@pytest.fixture(scope="module")
def single() -> RunResult:
    return _run(mode="single")


def _assert_same_parameters(a: RunResult, b: RunResult) -> None:
    # The all-reduce sums the two shards' gradients in another order than one process does.
    assert a.state_dict.keys() == b.state_dict.keys()
    for k in a.state_dict:
        torch.testing.assert_close(b.state_dict[k], a.state_dict[k], rtol=1e-5, atol=1e-6,
                                   msg=lambda m, k=k: f"{k}: {m}")


def _moved(result: RunResult) -> bool:
    """Training did something: the weights differ from their initial values."""
    start = workloads.get(result.config.workload).model(seed=result.config.seed).state_dict()
    return any(not torch.equal(start[k], v) for k, v in result.state_dict.items())


def test_ddp_on_two_processes_equals_one_process(single):
    ddp = _run(mode="ddp", world_size=2, count_allreduces=True)
    assert _moved(single)
    _assert_same_parameters(single, ddp)
    assert len(ddp.step_times) == 2 and all(len(t) == 3 and min(t) > 0 for t in ddp.step_times)
    assert ddp.allreduces[0] == ddp.allreduces[1] > 0 and ddp.allreduces[0] % 3 == 0, "the same buckets every step"


def test_torchrun_launcher_gives_the_same_run(single):
    _assert_same_parameters(single, ddp_launch.run(RunConfig(**BASE, mode="ddp", world_size=2), launcher="torchrun",
                                                 timeout=180))


def test_no_sync_accumulation_same_result_fewer_all_reduces(single):
    synced = _run(mode="ddp", world_size=2, micro_batches=4, no_sync=False, count_allreduces=True)
    skipped = _run(mode="ddp", world_size=2, micro_batches=4, no_sync=True, count_allreduces=True)
    _assert_same_parameters(single, skipped)
    _assert_same_parameters(single, synced)
    assert synced.allreduces[0] == 4 * skipped.allreduces[0], "one all-reduce per micro-batch without no_sync"


def _assert_bitwise(a: RunResult, b: RunResult) -> None:
    assert a.state_dict.keys() == b.state_dict.keys()
    assert all(torch.equal(a.state_dict[k], b.state_dict[k]) for k in a.state_dict)


def test_the_benchmarks_plain_recipe_trains_as_speedlibs_path_did(single):
    """The benchmark's baselines (one process; DDP all-reducing every micro-batch, NoSync's
    off) moved from speedlib.parallel.wrap + speedlib.tuning.accumulation_step to a recipe
    written with torch alone (issue 40): the same parameters, bitwise, and the same all-reduces."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the spawned ranks import the benchmark too
    recipe = bench_parallel.torch_recipe()
    _assert_bitwise(single, ddp_launch.run(RunConfig(**BASE, mode="single"), recipe=recipe))
    off = {"mode": "ddp", "world_size": 2, "micro_batches": 4, "no_sync": False, "count_allreduces": True}
    plain, before = _run(**off, recipe=recipe), _run(**off)
    _assert_bitwise(before, plain)
    assert plain.allreduces == before.allreduces and plain.allreduces[0] > 0
    with pytest.raises(ValueError, match="no_sync is speedlib's variant"):
        ddp_launch.run(RunConfig(**BASE, mode="single", micro_batches=2), recipe=recipe)
    with pytest.raises(ValueError, match="runs with launcher='mp'"):
        ddp_launch.run(RunConfig(**BASE, mode="ddp", world_size=2), recipe=recipe, launcher="torchrun")


def test_ddp_options_and_flat_buffers_keep_the_result(single):
    for options in ({"gradient_as_bucket_view": True, "static_graph": True}, {"find_unused_parameters": True},
                    {"contiguous": True}):
        _assert_same_parameters(single, _run(mode="ddp", world_size=2, **options))


def test_flat_buffers_refuse_gradient_bucket_views():
    """DDP's bucket views would take the gradients out of the flat buffer: a loud error."""
    with pytest.raises(RunFailed, match="gradient_as_bucket_view=False"):
        _run(mode="ddp", world_size=2, contiguous=True, gradient_as_bucket_view=True)


def test_wrap_gives_each_mode_its_module_and_refuses_options_it_would_ignore():
    model = torch.nn.Linear(4, 2)
    assert parallel.wrap(model, "single") is model
    if HAS_CUDA:
        assert isinstance(parallel.wrap(model.cuda(), "dataparallel", [0]), torch.nn.DataParallel)
    with pytest.raises(ValueError, match="unknown mode 'pipeline'"):
        parallel.wrap(model, "pipeline")
    with pytest.raises(ValueError, match="are DDP options"):
        parallel.wrap(model, "single", static_graph=True)


@pytest.mark.gpu(reason="needs a CUDA GPU; DDP's equivalence is tested on CPU with gloo above")
def test_dataparallel_and_nccl_ddp_on_one_gpu_equal_one_process():
    base = {**BASE, "device": "cuda"}
    single_gpu = ddp_launch.run(RunConfig(**base, mode="single"))
    for mode in ("dataparallel", "ddp"):
        _assert_same_parameters(single_gpu, ddp_launch.run(RunConfig(**base, mode=mode, world_size=1), timeout=180))


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of the benchmark")
def test_benchmark_measures_its_grid_in_one_process_and_skips_what_this_machine_cannot_run(monkeypatch):
    """One process measures a class (asv's setup_cache) and its track_* processes report from
    that cache: what this machine cannot run is NaN (asv: skipped), decided before a launch."""
    monkeypatch.setitem(bench._SETUP, "steps", 2)
    monkeypatch.setitem(bench._SETUP, "warmup", 0)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    monkeypatch.setattr(bench.Step, "params", ([1, 2], bench.MODES))
    launched, launch = [], ddp_launch.run
    monkeypatch.setattr(ddp_launch, "run", lambda config, **kw: launched.append(config) or launch(config, **kw))
    step = bench.Step()
    cache = step.measure_all()
    assert [(c.mode, c.world_size) for c in launched] == [("single", 1), ("ddp", 1)]
    assert launched[0].batch == bench._SETUP["per_rank"] and launched[0].device == "cpu"
    assert cache[(1, "dataparallel")] == ("skip", "DataParallel splits batches over CUDA devices; "
                                                  "on a CPU it only calls the module")
    assert cache[(2, "single")] == ("skip", "one process is world size 1")
    assert cache[(2, "ddp")] == ("skip", "world size 2 needs 2 cores; this machine has 1")
    for track in (step.track_step, step.track_samples_per_second, step.track_scaling_efficiency):
        assert math.isnan(track(cache, 2, "ddp")) and math.isnan(track(cache, 1, "dataparallel"))
    seconds = step.track_step(cache, 1, "single")
    assert seconds > 0
    assert step.track_samples_per_second(cache, 1, "single") == pytest.approx(bench._SETUP["per_rank"] / seconds)
    assert math.isnan(step.track_scaling_efficiency(cache, 1, "ddp"))  # 100 % by definition
    # As if 2 ranks had run: DDP's samples/s over twice one process's.
    cache[(2, "ddp")] = ("ok", {"step": 1.0, "samples_per_second": 96.0})
    one = step.track_samples_per_second(cache, 1, "single")
    assert step.track_scaling_efficiency(cache, 2, "ddp") == pytest.approx(100 * 96.0 / (2 * one))

    no_sync = bench.NoSync()
    cache = no_sync.measure_all()  # both variants need 2 ranks: nothing launched
    assert len(launched) == 2
    assert math.isnan(no_sync.track_step(cache, "on")) and math.isnan(no_sync.track_allreduces(cache, "off"))
