"""The batch-size curve (speedbench.measure.batch_curve): it times each batch size until memory runs
out, takes any library's allocation failure for the end of the curve with its text, and
raises every other error, so a bug never reads as a full GPU; and the BatchSize benchmark
that uses it (benchmarks/bench_tuning.py)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from benchmarks import bench_tuning as bench
from speedbench.measure import batch_curve

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.gpu(reason="needs a CUDA GPU; the CPU tests above cover the logic")


# --- the curve --------------------------------------------------------------------------

def test_batch_size_curve_measures_until_memory_runs_out():
    tried, seen = [], []

    def make_step(batch):
        tried.append(batch)
        if batch >= 8:
            raise torch.OutOfMemoryError("CUDA out of memory (stand-in)")
        x = torch.randn(batch, 32)
        return lambda: torch.mm(x, x.T)

    curve = batch_curve.batch_size_curve(make_step, [1, 2, 4, 8, 16], "cpu", repeats=2, progress=seen.append)
    assert tried == [1, 2, 4, 8] and seen == curve
    assert [p.status for p in curve] == ["ok", "ok", "ok", "oom"]
    assert all(p.seconds > 0 and p.samples_per_second == p.batch / p.seconds for p in curve[:3])
    assert math.isnan(curve[-1].seconds) and math.isnan(curve[-1].samples_per_second)
    assert curve[-1].reason == "OutOfMemoryError: CUDA out of memory (stand-in)" and curve[0].reason == ""


# What libraries raise when their own allocation fails near the memory limit: the messages
# of PyTorch's checks around cuDNN, cuBLAS, cuFFT, NCCL and the CUDA runtime.
ALLOCATION_FAILURES = [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
                           "of which 1.06 GiB is free. Including non-PyTorch memory, "
                           "this process has 78.12 GiB in use."),
    RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. "
                 "This error may appear if you passed in a non-contiguous input."),
    RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"),
    RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"),
    RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"),  # cuDNN 9's name
    RuntimeError("Unable to find a valid cuDNN algorithm to run convolution"),
    RuntimeError("GET was unable to find an engine to execute this computation"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError("CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`"),
    RuntimeError("cuFFT error: CUFFT_ALLOC_FAILED"),
    torch.distributed.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL version "
                                       "2.21.5\nncclUnhandledCudaError: Call to CUDA function failed.\n"
                                       "Last error:\nCuda failure 'out of memory'"),
    RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
    MemoryError(),
]
UNRELATED_ERRORS = [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 4x8)"),
    RuntimeError("cuDNN error: CUDNN_STATUS_BAD_PARAM"),
    RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED_SHAPE"),  # a cuDNN 9 sub-code: the shape, not memory
    RuntimeError("CUDA error: an illegal memory access was encountered"),
    RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k)`"),
    ValueError("out of memory"),  # not an error torch or a library raises for a failed allocation
]


def _failing_at(batch_limit: int, error: BaseException):
    def make_step(batch):
        x = torch.randn(batch, 8)

        def step():
            if batch >= batch_limit:
                raise error
            return x @ x.T

        return step

    return make_step


@pytest.mark.parametrize("error", ALLOCATION_FAILURES, ids=lambda e: str(e)[:40] or type(e).__name__)
def test_any_allocation_failure_ends_the_curve_with_its_text(error):
    curve = batch_curve.batch_size_curve(_failing_at(4, error), [1, 2, 4, 8], "cpu", repeats=1)
    assert [p.status for p in curve] == ["ok", "ok", "oom"]
    first_line = str(error).splitlines()[0] if str(error) else ""
    assert curve[-1].reason.startswith(f"{type(error).__name__}: {first_line[:40]}")
    assert len(curve[-1].reason) <= 160


@pytest.mark.parametrize("error", UNRELATED_ERRORS, ids=lambda e: str(e)[:40])
def test_other_errors_are_not_mistaken_for_running_out_of_memory(error):
    with pytest.raises(type(error)) as raised:
        batch_curve.batch_size_curve(_failing_at(2, error), [1, 2, 4], "cpu", repeats=1)
    assert raised.value is error


def test_a_real_host_allocation_failure_ends_the_curve():
    """torch's CPU allocator refuses 4 EiB with a RuntimeError of its own words."""
    def make_step(batch):
        x = torch.empty(1 << 62 if batch == 4 else batch, dtype=torch.uint8)
        return lambda: x.add_(1)

    curve = batch_curve.batch_size_curve(make_step, [1, 2, 4, 8], "cpu", repeats=1)
    assert [p.status for p in curve] == ["ok", "ok", "oom"] and "can't allocate memory" in curve[-1].reason


def test_batch_size_curve_rejects_bad_sizes():
    for bad in ([], [2, 1], [1, 1], [0, 2]):
        with pytest.raises(ValueError, match="batch_sizes"):
            batch_curve.batch_size_curve(lambda b: (lambda: None), bad, "cpu")


@needs_cuda
def test_a_real_gpu_out_of_memory_ends_the_curve():
    total = torch.cuda.get_device_properties(0).total_memory

    def make_step(batch):
        x = torch.empty(batch * total // 4, dtype=torch.uint8, device="cuda")
        return lambda: x.add_(1)

    curve = batch_curve.batch_size_curve(make_step, [1, 2, 8], "cuda", repeats=1)
    assert [p.status for p in curve] == ["ok", "ok", "oom"] and "out of memory" in curve[-1].reason
    assert torch.cuda.memory_allocated() < total // 4, "the failed batch's memory was released"


# --- the benchmark -----------------------------------------------------------------------

@pytest.mark.parametrize("error,status,text", [
    (ALLOCATION_FAILURES[1], "skip", "batch 8 does not fit.*CUDNN_STATUS_NOT_SUPPORTED"),
    (UNRELATED_ERRORS[0], "fail", "shapes cannot be multiplied"),
], ids=["cudnn", "unrelated"])
def test_batch_size_benchmark_skips_only_a_batch_that_does_not_fit(monkeypatch, error, status, text):
    """An allocation failure ends the curve: that batch and the larger ones are skips (the
    first with the reason); anything else is that batch's failure: a bug must not look
    like a full GPU."""
    class Trainer:
        def __init__(self, knob, variant, batch=None):
            raise error

    monkeypatch.setattr(bench, "_Trainer", Trainer)
    monkeypatch.setattr(bench.BatchSize, "params", ([8, 16],))
    curve = bench.BatchSize()
    cache = curve.measure_all()
    assert cache[(8,)][0] == status and re.search(text, cache[(8,)][1])
    if status == "skip":
        assert math.isnan(curve.track_throughput(cache, 8))
        assert cache[(16,)][0] == "skip" and cache[(16,)][1].startswith("batch 16 is past batch 8, which did not fit")
    else:
        with pytest.raises(RuntimeError, match=text):  # asv records the set as failed
            curve.track_throughput(cache, 8)
        assert cache[(16,)][0] == "fail"
