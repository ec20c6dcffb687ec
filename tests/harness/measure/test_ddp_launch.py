"""The harness's DDP launcher (speedbench.measure.ddp_launch): configs it refuses, failing and hung
ranks that end a run with no process left behind, the step time it reports, and the
torchrun entry point. Its runs' equivalence with one process is tests/test_parallel.py's."""

from __future__ import annotations

import os
import time

import pytest
import torch

from speedbench.measure import ddp_launch
from speedbench.measure.ddp_launch import RunConfig, RunFailed, RunResult, RunTimedOut

HAS_CUDA = torch.cuda.is_available()
BASE = {"workload": "mlp", "batch": 16, "steps": 3, "warmup": 1}  # as tests/test_parallel.py's runs


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
        ddp_launch.run(RunConfig(**BASE, mode="ddp", world_size=2, fault=fault), timeout=120)
    assert time.monotonic() - start < 60, "the peer waiting in all-reduce must be stopped, not waited for"
    assert info.value.pids and _gone(info.value.pids)
    if fault == "raise":
        assert "fault injected on rank 1 at step 1" in str(info.value)


def test_a_hung_rank_times_out_and_leaves_no_process():
    with pytest.raises(RunTimedOut, match="did not finish within 25 s") as info:
        ddp_launch.run(RunConfig(**BASE, mode="ddp", world_size=2, fault="hang"), timeout=25)
    assert isinstance(info.value, TimeoutError) and _gone(info.value.pids)


def test_a_hung_torchrun_is_killed_with_its_workers(tmp_path):
    with pytest.raises(RunTimedOut, match="torchrun did not finish") as info:
        ddp_launch.run(RunConfig(**BASE, mode="ddp", world_size=2, fault="hang"), launcher="torchrun", timeout=25)
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
    ({"mode": "ddp", "world_size": 2, "fault": "raise", "fault_rank": 7},
     r"fault_rank must be one of the 2 ranks \(0 to 1\), got 7"),
    ({"mode": "ddp", "world_size": 2, "fault": "kill", "fault_rank": -1}, "fault_rank must be one of the 2 ranks"),
    ({"mode": "ddp", "world_size": 2, "fault": "hang", "fault_step": 4},
     r"fault_step must be one of the 4 steps \(0 to 3"),
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
        ddp_launch.run(RunConfig(mode="single"), launcher="slurm")
    with pytest.raises(ValueError, match="DDP ranks only"):
        ddp_launch.run(RunConfig(mode="single", fault="raise"))
    if not HAS_CUDA:
        with pytest.raises(ValueError, match="needs 1 CUDA devices; this machine has 0"):
            ddp_launch.run(RunConfig(mode="ddp", device="cuda"))


def test_the_torchrun_entry_point_needs_torchrun(monkeypatch, capsys):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit):
        ddp_launch.main(["--config", "{}", "--out", "x"])
    assert "start this module with torchrun" in capsys.readouterr().err
