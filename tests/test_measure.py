"""speedlib.measure: the timer, memory counters, environment record and machine names."""

from __future__ import annotations

import json

import pytest
import torch

from speedlib import measure

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; CPU tests cover the logic")


def test_timer_is_monotonic_seconds():
    a = measure.timer()
    b = measure.timer()
    assert isinstance(a, float) and b >= a


def test_timer_waits_for_the_gpu(monkeypatch):
    """On CPU, check the wiring: timer() synchronises before reading the clock."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: calls.append(dev))
    measure.timer()
    assert calls == [None]


def test_device_selection(monkeypatch):
    monkeypatch.delenv("SPEEDLIB_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert measure.device().type == expected
    assert measure.device("cpu") == torch.device("cpu")
    monkeypatch.setenv("SPEEDLIB_DEVICE", "cpu")
    assert measure.device() == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device"):
            measure.device("cuda")


def test_saved_tensor_bytes_counts_each_storage_once():
    x = torch.randn(1000, requires_grad=True)
    w = torch.randn(1000, requires_grad=True)

    def fn():
        y = x.exp()  # exp saves its output y (4000 bytes), not x
        (y * w).sum()  # mul saves y again (same storage: not counted twice) and w; sum saves nothing
        return y

    assert measure.saved_tensor_bytes(fn) == 4000 + 4000
    assert measure.saved_tensor_bytes(fn, exclude=[w]) == 4000


def test_saved_tensor_bytes_of_a_linear_layer_is_its_input():
    layer = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64)
    got = measure.saved_tensor_bytes(lambda: layer(x).sum(), exclude=layer.parameters())
    assert got == 8 * 64 * 4  # the input is saved for the weight gradient; weights excluded


def test_peak_memory_is_a_skip_off_gpu():
    with pytest.raises(NotImplementedError, match="only tracked on CUDA"):
        measure.peak_memory(lambda: None, "cpu")


@requires_cuda
def test_peak_memory_resets_the_counter():
    big = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    del big
    # above_start: tensors that earlier tests of the process left alive are not this call's.
    peak = measure.peak_memory(lambda: torch.empty(1 << 20, dtype=torch.uint8, device="cuda"), "cuda", above_start=True)
    assert (1 << 20) <= peak < (1 << 28)


def test_memory_bandwidth_is_plausible():
    bw = measure.memory_bandwidth("cpu", nbytes=1 << 22, repeats=2)
    assert 1e8 < bw < 1e13  # between 100 MB/s and 10 TB/s


def test_environment_record_is_json_ready():
    env = measure.environment()
    json.dumps(env)
    for key in ("gpu_model", "gpu_count", "driver", "cuda", "cudnn", "nccl", "torch", "torchvision",
                "cupy", "cpu_model", "cpu_cores", "machine"):
        assert key in env
    assert env["torch"] == torch.__version__
    assert env["cpu_cores"] >= 1


def test_machine_name_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU machine is named after its GPU")
    import os
    assert measure.machine_name() == f"cpu-{os.cpu_count()}core"


@pytest.mark.parametrize("name, mem, slug", [
    ("NVIDIA H100 80GB HBM3", 85 * 10**9, "h100-sxm-80gb"),
    ("NVIDIA H200", 150 * 10**9, "h200-141gb"),
    ("NVIDIA A100-SXM4-40GB", 42 * 10**9, "a100-sxm4-40gb"),
    ("NVIDIA L4", 24 * 2**30, "l4-24gb"),
])
def test_gpu_machine_names(name, mem, slug):
    assert measure._gpu_slug(name, mem) == slug


def test_host_memory_grows_with_touched_memory():
    before = measure.host_memory()
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, every page written
    assert measure.host_memory() - before >= 48 << 20
    del block


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")
def test_host_copy_floors_are_skips_without_a_gpu():
    with pytest.raises(NotImplementedError):
        measure.host_copy_bandwidth("cpu")
    with pytest.raises(NotImplementedError):
        measure.device_memory_in_use("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_host_copy_bandwidth_is_positive_on_gpu():
    for direction in ("h2d", "d2h"):
        assert measure.host_copy_bandwidth("cuda", direction, pinned=True, nbytes=1 << 24) > 0
    with pytest.raises(ValueError, match="direction"):
        measure.host_copy_bandwidth("cuda", "sideways")
