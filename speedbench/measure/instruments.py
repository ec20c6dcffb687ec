"""The measuring instruments: the device to measure on, the synchronising timer, memory, sync and
allocator counters, and the bandwidth floors (the package, speedbench.measure, names them)."""

from __future__ import annotations

import gc
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterable

import torch

from speedbench.measure import host_settings  # $SPEEDLIB_DEVICE's rule, which the CLI checks without torch


def device(prefer: str | None = None) -> torch.device:
    """The device to measure on: `prefer` if given (or $SPEEDLIB_DEVICE), else CUDA when present."""
    name = prefer or host_settings.benchmark_device()
    if name:
        dev = torch.device(name)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {name!r} was asked for, but torch sees no CUDA device")
        return dev
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def synchronize(dev: torch.device | str | None = None) -> None:
    """Wait for queued work on `dev` (all CUDA devices when None); a no-op on CPU."""
    if dev is not None and torch.device(dev).type != "cuda":
        return
    # is_initialized() rather than is_available(): a CPU-only process must not pay for
    # (or trigger) CUDA initialisation just to read a clock.
    if torch.cuda.is_initialized():
        torch.cuda.synchronize(dev)


def timer() -> float:
    """asv timer: seconds from `time.perf_counter`, read after the GPU has caught up."""
    synchronize()
    return time.perf_counter()


def peak_memory(fn: Callable[[], object], dev: torch.device | str, above_start: bool = False) -> int:
    """Peak bytes allocated on the CUDA device `dev` while `fn()` runs.

    The counter is reset first, so earlier allocations of the process do not count.
    above_start: subtract what was allocated when `fn` started (parameters, optimizer
    state, ...), leaving the memory `fn` itself needed at its peak.
    Raises NotImplementedError on other devices: asv records that as a skip.
    """
    dev = torch.device(dev)
    if dev.type != "cuda":
        raise NotImplementedError(f"peak device memory is only tracked on CUDA, not {dev.type}")
    synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    start = torch.cuda.memory_allocated(dev) if above_start else 0
    fn()
    synchronize(dev)
    return int(torch.cuda.max_memory_allocated(dev)) - start


def saved_tensor_bytes(fn: Callable[[], object], exclude: Iterable[torch.Tensor] = (),
                       alive_after: bool = False) -> int:
    """Bytes of distinct storage that autograd saves for backward while `fn()` runs.

    Each storage counts once however many saved tensors view it. Storages of `exclude`
    (typically the model's parameters, which backward keeps anyway) are left out, so the
    result is the activation memory a checkpointing scheme can save.
    alive_after: count only the saved storages still alive once `fn` has returned (and the
    garbage collector has run): the memory that something outside `fn` keeps holding, such
    as an autograd graph that was never freed by a backward pass.
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, tuple[int, weakref.ref]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        # Saving `t` itself would make an output saved by its own grad_fn (ReLU's, say) a
        # reference cycle through C++ that no garbage collector frees; a detached alias of
        # the same storage has no grad_fn, so the graph is the only thing holding it.
        saved = t.detach()
        storage = saved.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in skip and (ptr not in seen or seen[ptr][1]() is None):
            seen[ptr] = storage.nbytes(), weakref.ref(saved)
        return saved

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    if not alive_after:
        return sum(n for n, _ in seen.values())
    gc.collect()
    return sum(n for n, ref in seen.values() if ref() is not None)


# The text of torch's sync debug mode warning (c10/cuda/CUDAFunctions.cpp).
SYNC_WARNING = "called a synchronizing CUDA operation"


def count_syncs(fn: Callable[[], object]) -> int:
    """How many times `fn()` makes the host wait for a CUDA device, per torch's sync debug
    mode (`.item()`, `.cpu()`, `nonzero`, boolean indexing, `print` of a CUDA tensor, ...).

    The mode sees the synchronisations that go through torch's stream sync and blocking
    copies; `torch.cuda.synchronize()` itself is not counted. Raises NotImplementedError
    without CUDA: a CPU never waits for itself.
    """
    if not torch.cuda.is_available():
        raise NotImplementedError("synchronisations are counted on CUDA devices only")
    saved = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # torch warns at the same place every step
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(saved)
    return sum(SYNC_WARNING in str(w.message) for w in caught)


def allocator_segments(dev: torch.device | str) -> int:
    """How many memory segments the caching allocator has requested from the driver
    (cudaMalloc calls) so far on the CUDA device `dev`; a rise means it found no cached block."""
    dev = torch.device(dev)
    if dev.type != "cuda":
        raise NotImplementedError(f"allocator segments are counted on CUDA only, not {dev.type}")
    return int(torch.cuda.memory_stats(dev).get("segment.all.allocated", 0))


def release_cached_memory(dev: torch.device | str) -> None:
    """Free what Python still references and hand the allocator's cached blocks back, so an
    out-of-memory error leaves room for what runs next. A no-op beyond gc on CPU."""
    gc.collect()
    if torch.device(dev).type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def best_seconds(fn: Callable[[], object], dev: torch.device, repeats: int) -> float:
    """The fastest of `repeats` calls of `fn`, each timed between two synchronisations."""
    best = float("inf")
    for _ in range(repeats):
        synchronize(dev)
        start = time.perf_counter()
        fn()
        synchronize(dev)
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth(dev: torch.device | str, nbytes: int = 1 << 28, repeats: int = 5) -> float:
    """Measured streaming bandwidth of `dev` in bytes/s, from an in-place `a += b`.

    Three accesses per element (read a, read b, write a), the same in-place pattern as an
    optimizer step. A plain copy would under-count on CPUs: writing a line it has not read
    costs an extra read (write-allocate), so a copy's "2 x bytes" hides a third access.
    The best of `repeats` is kept: the floor a kernel can approach, not a typical run.
    """
    dev = torch.device(dev)
    a = torch.zeros(nbytes // 4, dtype=torch.float32, device=dev)
    b = torch.ones_like(a)
    a.add_(b)  # first touch and any lazy allocation stay outside the timing
    return 3 * a.numel() * a.element_size() / best_seconds(lambda: a.add_(b), dev, repeats)


def host_copy_bandwidth(dev: torch.device | str, direction: str = "h2d", pinned: bool = True,
                        nbytes: int = 1 << 28, repeats: int = 5) -> float:
    """Bulk copy bandwidth between host memory and the CUDA device `dev`, in bytes/s.

    direction: "h2d" (host to device) or "d2h". pinned: page-locked host memory, which the
    GPU's copy engines read directly; pageable memory goes through the driver's own staging.
    One large copy, best of `repeats`: the floor that indexed transfers are measured against.
    Raises NotImplementedError off CUDA (asv records a skip).
    """
    dev = torch.device(dev)
    if dev.type != "cuda":
        raise NotImplementedError(f"host<->device copies need a CUDA device, not {dev.type}")
    if direction not in ("h2d", "d2h"):
        raise ValueError(f"direction must be 'h2d' or 'd2h', got {direction!r}")
    host = torch.ones(nbytes, dtype=torch.uint8, pin_memory=pinned)  # every page touched before timing
    gpu = torch.ones(nbytes, dtype=torch.uint8, device=dev)
    src, dst = (host, gpu) if direction == "h2d" else (gpu, host)
    dst.copy_(src, non_blocking=pinned)
    return nbytes / best_seconds(lambda: dst.copy_(src, non_blocking=pinned), dev, repeats)


def host_memory() -> int:
    """Resident host memory of this process in bytes (Linux; pinned pages are resident too)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            resident_pages = int(f.read().split()[1])
    except OSError as e:
        raise NotImplementedError("resident memory is read from /proc/self/statm (Linux only)") from e
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def device_memory_in_use(dev: torch.device | str) -> int:
    """Bytes in use on the CUDA device `dev` by anyone (torch, CuPy, contexts), from the driver."""
    dev = torch.device(dev)
    if dev.type != "cuda":
        raise NotImplementedError(f"device memory is only read on CUDA, not {dev.type}")
    free, total = torch.cuda.mem_get_info(dev)
    return int(total - free)
