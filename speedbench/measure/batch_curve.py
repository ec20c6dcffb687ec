"""Throughput against batch size, measured until memory runs out (the `batch_size` knob).

batch_size_curve times a training step at increasing batch sizes; the first allocation
failure, whoever raised it (torch, cuDNN, cuBLAS, cuFFT, NCCL, the CUDA runtime, the host
allocator), ends the curve with a point that says why, and any other error raises, so a
bug never reads as a full GPU. It measures, so it lives in the harness (speedlib.tuning
holds the knobs a training script calls); benchmarks/bench_tuning.py's BatchSize uses it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from speedbench.measure import instruments

__all__ = ["CurvePoint", "batch_size_curve"]


# Allocation failures that reach Python as a RuntimeError other than torch.OutOfMemoryError:
# libraries that allocate outside PyTorch's allocator, or that report a failed workspace
# allocation as "no algorithm", say so in their own words (CUDA runtime, NCCL, cuDNN,
# cuBLAS, cuFFT, cuSPARSE, cuSOLVER; torch's CPU allocator: "can't allocate memory").
# Near the memory limit cuDNN also returns plain NOT_SUPPORTED or INTERNAL_ERROR; the
# sub-codes cuDNN 9 appends to those (..._NOT_SUPPORTED_SHAPE, ..._INTERNAL_ERROR_BAD_LAUNCH_PARAM)
# name other problems, so `\b` leaves them to raise.
_ALLOCATION_FAILURE = re.compile(
    r"out of memory|can't allocate memory|ALLOC(ATION)?_FAILED|CUDNN_STATUS_(NOT_SUPPORTED|INTERNAL_ERROR)\b"
    r"|CUBLAS_STATUS_NOT_INITIALIZED|unable to find (a valid cuDNN algorithm|an engine)", re.IGNORECASE)


def _allocation_failure(error: Exception) -> str | None:
    """The error's short text if it says memory ran out, else None (an error to raise)."""
    if not isinstance(error, (torch.OutOfMemoryError, MemoryError)) and not _ALLOCATION_FAILURE.search(str(error)):
        return None
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 160 else text[:157] + "..."


@dataclass(frozen=True)
class CurvePoint:
    batch: int
    seconds: float  # per step; NaN when out of memory
    status: str  # "ok" or "oom" (any allocation failure)
    reason: str = ""  # for "oom": the error's type and first line, at most 160 characters

    @property
    def samples_per_second(self) -> float:
        return self.batch / self.seconds if self.status == "ok" else math.nan


def batch_size_curve(make_step: Callable[[int], Callable[[], object]], batch_sizes: Sequence[int],
                     device: torch.device | str, repeats: int = 3,
                     progress: Callable[[CurvePoint], None] | None = None) -> list[CurvePoint]:
    """Step time for each batch size in increasing order, until memory runs out.

    make_step(batch) builds whatever one batch size needs and returns a step function; it
    runs once to warm up, then the best of `repeats` is kept. The first allocation failure
    (while building or stepping) ends the curve with an "oom" point carrying the error's
    short text instead of a crash; larger sizes are not tried. That is torch.OutOfMemoryError
    and the RuntimeErrors cuDNN, cuBLAS, cuFFT, NCCL and the CUDA runtime raise when an
    allocation of their own fails (CUDNN_STATUS_ALLOC_FAILED, CUBLAS_STATUS_NOT_INITIALIZED,
    ...), and host allocation failures; any other error raises. Memory is released before
    returning.
    """
    if not batch_sizes or any(b < 1 for b in batch_sizes) or list(batch_sizes) != sorted(set(batch_sizes)):
        raise ValueError(f"batch_sizes must be distinct positive integers in increasing order, got {batch_sizes}")
    dev = torch.device(device)
    curve: list[CurvePoint] = []
    for batch in batch_sizes:
        step = None
        try:
            step = make_step(batch)
            step()
            point = CurvePoint(batch, instruments.best_seconds(step, dev, repeats), "ok")
        except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
            reason = _allocation_failure(e)
            if reason is None:
                raise
            point = CurvePoint(batch, math.nan, "oom", reason)
        del step  # the step's closure holds the batch's tensors
        curve.append(point)
        if progress is not None:
            progress(point)
        if point.status == "oom":
            instruments.release_cached_memory(dev)
            break
    return curve
