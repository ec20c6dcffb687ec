"""DistributedDataParallel (gloo, 2 processes) against one process on the same global batch,
no_sync accumulation, the DDP options, flat-buffer parameters, and failing ranks."""

from __future__ import annotations

import math
import os
import time

import pytest
import torch

from speedlib import parallel
from speedlib.parallel import RunConfig, RunFailed, RunResult, RunTimedOut

HAS_CUDA = torch.cuda.is_available()
# Small but real: the 100-layer MLP of the contiguous benchmark at a global batch of 16.
BASE = {"workload": "mlp", "batch": 16, "steps": 3, "warmup": 1}


def _run(**kw) -> RunResult:
    return parallel.run(RunConfig(**{**BASE, **kw}), timeout=180)


@pytest.fixture(scope="module")
def single() -> RunResult:
    return _run(mode="single")


def _assert_same_parameters(a: RunResult, b: RunResult) -> None:
    # The all-reduce sums the two shards' gradients in another order than one process does.
    assert a.state_dict.keys() == b.state_dict.keys()
    for k in a.state_dict:
        torch.testing.assert_close(b.state_dict[k], a.state_dict[k], rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


def _moved(result: RunResult) -> bool:
    """Training did something: the weights differ from their initial values."""
    from speedbench import workloads  # noqa: PLC0415

    start = workloads.get(result.config.workload).model(seed=result.config.seed).state_dict()
    return any(not torch.equal(start[k], v) for k, v in result.state_dict.items())


def test_ddp_on_two_processes_equals_one_process(single):
    ddp = _run(mode="ddp", world_size=2, count_allreduces=True)
    assert _moved(single)
    _assert_same_parameters(single, ddp)
    assert len(ddp.step_times) == 2 and all(len(t) == 3 and min(t) > 0 for t in ddp.step_times)
    assert ddp.allreduces[0] == ddp.allreduces[1] > 0 and ddp.allreduces[0] % 3 == 0, "the same buckets every step"


def test_torchrun_launcher_gives_the_same_run(single):
    _assert_same_parameters(single, parallel.run(RunConfig(**BASE, mode="ddp", world_size=2), launcher="torchrun",
                                                 timeout=180))


def test_no_sync_accumulation_same_result_fewer_all_reduces(single):
    synced = _run(mode="ddp", world_size=2, micro_batches=4, no_sync=False, count_allreduces=True)
    skipped = _run(mode="ddp", world_size=2, micro_batches=4, no_sync=True, count_allreduces=True)
    _assert_same_parameters(single, skipped)
    _assert_same_parameters(single, synced)
    assert synced.allreduces[0] == 4 * skipped.allreduces[0], "one all-reduce per micro-batch without no_sync"


def test_ddp_options_and_flat_buffers_keep_the_result(single):
    for options in ({"gradient_as_bucket_view": True, "static_graph": True}, {"find_unused_parameters": True},
                    {"contiguous": True}):
        _assert_same_parameters(single, _run(mode="ddp", world_size=2, **options))


def test_flat_buffers_refuse_gradient_bucket_views():
    """DDP's bucket views would take the gradients out of the flat buffer: a loud error."""
    with pytest.raises(RunFailed, match="gradient_as_bucket_view=False"):
        _run(mode="ddp", world_size=2, contiguous=True, gradient_as_bucket_view=True)


def _gone(pids: list[int]) -> bool:
    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    return not any(alive(p) for p in pids)


@pytest.mark.parametrize("fault,error,message", [("raise", RunFailed, "rank 1 raised"),
                                                 ("kill", RunFailed, "rank 1 died.*SIGKILL")])
def test_a_failing_rank_ends_the_run(fault, error, message):
    start = time.monotonic()
    with pytest.raises(error, match=message) as info:
        parallel.run(RunConfig(**BASE, mode="ddp", world_size=2, fault=fault), timeout=120)
    assert time.monotonic() - start < 60, "the peer waiting in all-reduce must be stopped, not waited for"
    assert info.value.pids and _gone(info.value.pids)
    if fault == "raise":
        assert "fault injected on rank 1 at step 1" in str(info.value)


def test_a_hung_rank_times_out_and_leaves_no_process():
    with pytest.raises(RunTimedOut, match="did not finish within 25 s") as info:
        parallel.run(RunConfig(**BASE, mode="ddp", world_size=2, fault="hang"), timeout=25)
    assert isinstance(info.value, TimeoutError) and _gone(info.value.pids)


def test_a_hung_torchrun_is_killed_with_its_workers(tmp_path):
    with pytest.raises(RunTimedOut, match="torchrun did not finish") as info:
        parallel.run(RunConfig(**BASE, mode="ddp", world_size=2, fault="hang"), launcher="torchrun", timeout=25)
    assert _gone(info.value.pids)
    marker = '"fault": "hang"'
    leftovers = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    leftovers.append(pid)
        except OSError:
            continue
    assert not leftovers, f"worker processes survived: {leftovers}"


def test_step_time_is_the_slowest_ranks_median():
    result = RunResult(RunConfig(mode="ddp", world_size=2, batch=8), [[1.0, 3.0, 2.0], [2.0, 1.0, 5.0]], None, [], {})
    assert result.step_seconds == 3.0  # steps end at max(1, 2), max(3, 1), max(2, 5)
    assert result.samples_per_second == 8 / 3.0


@pytest.mark.parametrize("kwargs,message", [
    ({"mode": "pipeline"}, "unknown mode"),
    ({"mode": "single", "world_size": 2}, "world_size"),
    ({"mode": "dataparallel"}, "CUDA devices"),
    ({"mode": "ddp", "world_size": 3, "batch": 16}, "split evenly"),
    ({"mode": "ddp", "world_size": 2, "micro_batches": 3, "batch": 16}, "split evenly"),
    ({"mode": "ddp", "fault": "segfault"}, "unknown fault"),
    ({"device": "tpu"}, "device"),
    ({"checkpoint": "everything"}, "unknown checkpoint variant"),
])
def test_bad_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**kwargs)


@pytest.mark.parametrize("kwargs,message", [
    ({"micro_batches": 0}, "micro_batches must be >= 1, got 0"),
    ({"batch": 0}, "batch must be >= 1, got 0"),
    ({"mode": "ddp", "world_size": 2, "fault": "raise", "fault_rank": 7}, r"fault_rank must be one of the 2 ranks \(0 to 1\), got 7"),
    ({"mode": "ddp", "world_size": 2, "fault": "kill", "fault_rank": -1}, "fault_rank must be one of the 2 ranks"),
    ({"mode": "ddp", "world_size": 2, "fault": "hang", "fault_step": 4}, r"fault_step must be one of the 4 steps \(0 to 3"),
    ({"mode": "single", "fault": "raise", "fault_rank": 0}, "faults are injected into DDP ranks only"),
    ({"workload": "bogus"}, r"unknown workload 'bogus'; choose one of \["),
    ({"lr": float("nan")}, "lr must be a positive finite number, got nan"),
    ({"lr": 0.0}, "lr must be a positive finite number, got 0.0"),
    ({"lr": "0.1"}, "lr must be a positive finite number, got '0.1'"),
])
def test_configs_that_would_fail_later_or_never_fire_are_refused(kwargs, message):
    """micro_batches=0 divided by zero; a fault aimed at a rank or step that does not exist ran
    the whole job without ever firing, so a test of the failure handling passed vacuously."""
    with pytest.raises(ValueError, match=message):
        RunConfig(**{**BASE, **kwargs})


@pytest.mark.parametrize("field,value", [("world_size", "2"), ("batch", 16.0), ("steps", None),
                                         ("micro_batches", True), ("fault_rank", "1"), ("seed", 0.5)])
def test_config_fields_of_the_wrong_type_are_a_clear_type_error(field, value):
    with pytest.raises(TypeError, match=f"{field} must be an int, got {value!r}"):
        RunConfig(**{**BASE, "mode": "ddp", field: value})


def test_default_configs_stay_valid():
    """fault_rank defaults to 1 while world_size defaults to 1: only a fault that is set is checked."""
    assert RunConfig().fault_rank == 1
    assert RunConfig(mode="single").world_size == 1
    assert RunConfig(**BASE, mode="ddp", world_size=2, fault="raise").fault_rank == 1


def test_bad_launches_are_refused():
    with pytest.raises(ValueError, match="launcher"):
        parallel.run(RunConfig(mode="single"), launcher="slurm")
    with pytest.raises(ValueError, match="DDP ranks only"):
        parallel.run(RunConfig(mode="single", fault="raise"))
    if not HAS_CUDA:
        with pytest.raises(ValueError, match="needs 1 CUDA devices; this machine has 0"):
            parallel.run(RunConfig(mode="ddp", device="cuda"))


def test_the_torchrun_entry_point_needs_torchrun(monkeypatch, capsys):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit):
        parallel.main(["--config", "{}", "--out", "x"])
    assert "start this module with torchrun" in capsys.readouterr().err


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU; DDP's equivalence is tested on CPU with gloo above")
def test_dataparallel_and_nccl_ddp_on_one_gpu_equal_one_process():
    base = {**BASE, "device": "cuda"}
    single_gpu = parallel.run(RunConfig(**base, mode="single"))
    for mode in ("dataparallel", "ddp"):
        _assert_same_parameters(single_gpu, parallel.run(RunConfig(**base, mode=mode, world_size=1), timeout=180))


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of the benchmark")
def test_benchmark_measures_its_grid_in_one_process_and_skips_what_this_machine_cannot_run(monkeypatch):
    """One process measures a class (asv's setup_cache) and its track_* processes report from
    that cache: what this machine cannot run is NaN (asv: skipped), decided before a launch."""
    from benchmarks import bench_parallel as bench  # noqa: PLC0415

    monkeypatch.setitem(bench._SETUP, "steps", 2)
    monkeypatch.setitem(bench._SETUP, "warmup", 0)
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    monkeypatch.setattr(bench.Step, "params", ([1, 2], bench.MODES))
    launched, launch = [], parallel.run
    monkeypatch.setattr(parallel, "run", lambda config, **kw: launched.append(config) or launch(config, **kw))
    step = bench.Step()
    cache = step.measure_all()
    assert [(c.mode, c.world_size) for c in launched] == [("single", 1), ("ddp", 1)]
    assert launched[0].batch == bench._SETUP["per_rank"] and launched[0].device == "cpu"
    assert cache[(1, "dataparallel")] == ("skip", "DataParallel splits batches over CUDA devices; on a CPU it only calls the module")
    assert cache[(2, "single")] == ("skip", "one process is world size 1")
    assert cache[(2, "ddp")] == ("skip", "world size 2 needs 2 cores; this machine has 1")
    for track in (step.track_step, step.track_samples_per_second, step.track_scaling_efficiency):
        assert math.isnan(track(cache, 2, "ddp")) and math.isnan(track(cache, 1, "dataparallel"))
    seconds = step.track_step(cache, 1, "single")
    assert seconds > 0 and step.track_samples_per_second(cache, 1, "single") == pytest.approx(bench._SETUP["per_rank"] / seconds)
    assert math.isnan(step.track_scaling_efficiency(cache, 1, "ddp"))  # 100 % by definition
    # As if 2 ranks had run: DDP's samples/s over twice one process's.
    cache[(2, "ddp")] = ("ok", {"step": 1.0, "samples_per_second": 96.0})
    one = step.track_samples_per_second(cache, 1, "single")
    assert step.track_scaling_efficiency(cache, 2, "ddp") == pytest.approx(100 * 96.0 / (2 * one))

    no_sync = bench.NoSync()
    cache = no_sync.measure_all()  # both variants need 2 ranks: nothing launched
    assert len(launched) == 2 and math.isnan(no_sync.track_step(cache, "on")) and math.isnan(no_sync.track_allreduces(cache, "off"))
