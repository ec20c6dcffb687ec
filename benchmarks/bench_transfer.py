"""Host<->GPU transfer: rows gathered from a host table onto the GPU and written back.

Variants are speedlib.transfer backends:
  pageable  CPU index_select, then a synchronous copy from pageable memory
  pinned    CPU index_select into a pinned staging buffer, then a non_blocking copy
            (the PyTorch path every other variant is compared with)
  cupy      CuPy kernels index pinned host memory from the GPU (SpeedTorch's approach)
  uva       torch's own kernels index registered (page-locked) host memory from the GPU (zero-copy)
  device    the table in GPU memory: the upper bound
EmbeddingStep adds `sparse_adam`: nn.Embedding(sparse=True) + torch.optim.SparseAdam with
the table on the device, PyTorch's built-in answer; its step copies the host indices there.

The batch is workloads.embedding(): 131072 x 128 float32 rows (64 MiB) from a 10M-row table
(5.1 GB) on GPU machines, a 1M-row table on CPUs. Indices arrive on the host (pinned on GPU
machines), as from a DataLoader with pin_memory=True; moving them is part of the cost.
`indices`: random rows, or the same rows sorted (sequential access, same duplicates).

Metrics:
  time_gather / time_scatter          one gather of the batch / writing it back
  track_gather_bandwidth / _scatter_  the batch's bytes over the median of 20 calls, GB/s
  track_*_fraction_of_floor           that bandwidth over the machine's bulk pinned copy
                                      bandwidth in the same direction, measured in the same
                                      process (measure.host_copy_bandwidth); GPUs only
  track_copy_bandwidth                that floor itself, pinned and pageable, each direction
  track_host_footprint / DeviceFootprint.track_device_footprint
                                      memory a table of the batch's size holds after a gather
                                      and a scatter (SpeedTorch's memory table). Host: resident
                                      bytes, locked or not: 'uva' locks exactly the table's
                                      bytes, 'pinned' only its staging buffers
  EmbeddingStep.time_step             an Adam training step of a CPU-hosted embedding
Nothing here touches CUDA at import time; a variant this machine cannot run is a skip.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch

from speedbench import measure, workloads

VARIANTS = ["pageable", "pinned", "cupy", "uva", "device"]
ORDERS = ["random", "sorted"]
_ON_GPU = measure.device().type == "cuda"
_SIZE = "full" if _ON_GPU else "small"
# One process per parameter combination, each building a 5 GB table on GPU machines: one
# round, and the samples taken inside it.
_TIMING = {"rounds": 1, "repeat": (5, 20, 20.0), "timeout": 900}


def _check(variant: str) -> None:
    """Skip (NotImplementedError in setup) what this machine or commit cannot run."""
    try:
        from speedlib import transfer  # noqa: PLC0415
    except ImportError as e:  # a commit before the technique existed
        raise NotImplementedError(f"speedlib has no transfer module here: {e}") from e
    if variant in ("pageable", "sparse_adam"):
        return
    if not _ON_GPU:
        raise NotImplementedError(f"the {variant!r} backend moves rows to a GPU; this machine has none")
    if variant == "cupy":
        try:
            import cupy  # noqa: F401, PLC0415
        except ImportError as e:
            raise NotImplementedError("CuPy is not installed") from e
    if variant not in transfer.BACKENDS:
        raise NotImplementedError(f"this commit has no backend {variant!r}")


class _Bench:
    """A full-size table of one backend, the batch's indices, and its rows on the device."""

    def __init__(self, variant: str):
        from speedlib.transfer import HostTable  # noqa: PLC0415

        self.spec = workloads.embedding(_SIZE)
        self.device = measure.device()
        self.table = HostTable(self.spec.rows, self.spec.dim, backend=variant, device=self.device)
        self.indices = {}
        self.values = {}
        for order in ORDERS:
            idx = self.spec.indices(order)
            self.indices[order] = idx.pin_memory() if _ON_GPU else idx
            self.values[order] = self.table.gather(self.indices[order])
        self.nbytes = self.spec.batch * self.spec.dim * 4
        for order in ORDERS:  # warm: staging buffers, allocator pools, CUDA kernels
            self.gather(order)
            self.scatter(order)
        measure.synchronize(self.device)

    def gather(self, order: str) -> torch.Tensor:
        return self.table.gather(self.indices[order])

    def scatter(self, order: str) -> None:
        # The rows gathered from these indices, written back: the table never changes.
        self.table.scatter_(self.indices[order], self.values[order])

    def bandwidth(self, op: str, samples: int = 20) -> float:
        """The batch's bytes over the median of `samples` timed calls after three untimed ones
        (as asv warms up a time benchmark), bytes/s."""
        fn = self.gather if op == "gather" else self.scatter
        for _ in range(3):
            fn("random")
        times = []
        for _ in range(samples):
            measure.synchronize(self.device)
            start = time.perf_counter()
            fn("random")
            measure.synchronize(self.device)
            times.append(time.perf_counter() - start)
        return self.nbytes / statistics.median(times)


_cache: dict[str, _Bench] = {}


def _bench(variant: str) -> _Bench:
    _check(variant)
    if variant not in _cache:
        _cache.clear()  # one 5 GB table at a time
        _cache[variant] = _Bench(variant)
    return _cache[variant]


class Transfer:
    """Gather and scatter of the batch, per backend and index order."""

    params = (VARIANTS, ORDERS)
    param_names = ["variant", "indices"]
    timer = staticmethod(measure.timer)
    rounds, repeat, timeout = _TIMING["rounds"], _TIMING["repeat"], _TIMING["timeout"]

    def setup(self, variant: str, indices: str) -> None:
        self.bench = _bench(variant)

    def time_gather(self, variant: str, indices: str) -> None:
        self.bench.gather(indices)

    def time_scatter(self, variant: str, indices: str) -> None:
        self.bench.scatter(indices)


class Bandwidth:
    """Random-row gather and scatter as GB/s."""

    params = (VARIANTS,)
    param_names = ["variant"]
    rounds, timeout = 1, _TIMING["timeout"]

    def setup(self, variant: str) -> None:
        self.bench = _bench(variant)

    def track_gather_bandwidth(self, variant: str) -> float:
        return self.bench.bandwidth("gather") / 1e9

    track_gather_bandwidth.unit = "GB/s"

    def track_scatter_bandwidth(self, variant: str) -> float:
        return self.bench.bandwidth("scatter") / 1e9

    track_scatter_bandwidth.unit = "GB/s"


class FractionOfFloor:
    """Random-row gather (scatter) over bulk pinned host->device (device->host) bandwidth."""

    params = (VARIANTS,)
    param_names = ["variant"]
    rounds, timeout = 1, _TIMING["timeout"]

    def setup(self, variant: str) -> None:
        if not _ON_GPU:
            raise NotImplementedError("host<->device floors need a GPU")
        self.bench = _bench(variant)

    def track_gather_fraction_of_floor(self, variant: str) -> float:
        floor = measure.host_copy_bandwidth(self.bench.device, "h2d", pinned=True)
        return 100.0 * self.bench.bandwidth("gather") / floor

    track_gather_fraction_of_floor.unit = "% of pinned host->device bandwidth"

    def track_scatter_fraction_of_floor(self, variant: str) -> float:
        floor = measure.host_copy_bandwidth(self.bench.device, "d2h", pinned=True)
        return 100.0 * self.bench.bandwidth("scatter") / floor

    track_scatter_fraction_of_floor.unit = "% of pinned device->host bandwidth"


class CopyBandwidth:
    """The floor: one bulk 256 MiB copy between host and GPU, best of five."""

    params = (["h2d", "d2h"], ["pinned", "pageable"])
    param_names = ["direction", "variant"]
    rounds = 1

    def setup(self, direction: str, variant: str) -> None:
        if not _ON_GPU:
            raise NotImplementedError("host<->device copies need a GPU")

    def track_copy_bandwidth(self, direction: str, variant: str) -> float:
        return measure.host_copy_bandwidth(measure.device(), direction, pinned=variant == "pinned") / 1e9

    track_copy_bandwidth.unit = "GB/s"


def _footprint(variant: str, read: Callable[[], int]) -> int:
    """What `read()` grows by while a batch-sized table is built and used once."""
    from speedlib.transfer import HostTable  # noqa: PLC0415

    spec, dev = workloads.embedding(_SIZE), measure.device()
    HostTable(1, spec.dim, backend=variant, device=dev).gather([0])  # contexts and libraries, not the table
    before = read()
    table = HostTable(spec.rows, spec.dim, backend=variant, device=dev)
    idx = spec.indices()
    table.scatter_(idx, table.gather(idx))  # staging buffers count; the batch's rows do not
    measure.synchronize(dev)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        if "cupy" in sys.modules:
            sys.modules["cupy"].get_default_memory_pool().free_all_blocks()
    used = read() - before
    del table
    return used


class Footprint:
    """Host memory a table holds (resident bytes, pinned pages included)."""

    params = (VARIANTS,)
    param_names = ["variant"]
    rounds, timeout = 1, _TIMING["timeout"]

    def setup(self, variant: str) -> None:
        _check(variant)

    def track_host_footprint(self, variant: str) -> int:
        return _footprint(variant, measure.host_memory)

    track_host_footprint.unit = "bytes"


class DeviceFootprint:
    """GPU memory a table holds, from the driver (CuPy's and torch's allocations alike)."""

    params = (VARIANTS,)
    param_names = ["variant"]
    rounds, timeout = 1, _TIMING["timeout"]

    def setup(self, variant: str) -> None:
        if not _ON_GPU:
            raise NotImplementedError("device memory needs a GPU")
        _check(variant)

    def track_device_footprint(self, variant: str) -> int:
        return _footprint(variant, lambda: measure.device_memory_in_use(measure.device()))

    track_device_footprint.unit = "bytes"


class _EmbeddingTrainer:
    def __init__(self, variant: str):
        spec, dev = workloads.embedding(_SIZE), measure.device()
        torch.manual_seed(0)
        if variant == "sparse_adam":
            emb = torch.nn.Embedding(spec.rows, spec.dim, sparse=True, device=dev)
            opt = torch.optim.SparseAdam(emb.parameters(), lr=1e-3)

            def step() -> None:
                opt.zero_grad()
                # The table is on the device, so its lookup needs the indices there: they are
                # copied each step, as the host-table variants move theirs inside the step.
                (emb(self.idx.to(dev, non_blocking=True)) * self.target).sum().backward()
                opt.step()
        else:
            import functools  # noqa: PLC0415

            from speedlib.transfer import HostEmbedding  # noqa: PLC0415

            emb = HostEmbedding(spec.rows, spec.dim, functools.partial(torch.optim.Adam, lr=1e-3),
                                backend=variant, device=dev)

            def step() -> None:
                (emb(self.idx) * self.target).sum().backward()
                emb.step()
        self.idx = spec.indices().pin_memory() if _ON_GPU else spec.indices()
        self.target = torch.randn(spec.batch, spec.dim, generator=torch.Generator().manual_seed(1)).to(dev)
        self.step, self.device = step, dev
        for _ in range(2):  # optimizer state tables, allocator pools
            step()
        measure.synchronize(dev)


_trainers: dict[str, _EmbeddingTrainer] = {}


class EmbeddingStep:
    """Forward, backward and Adam step of a 131072-index batch on a host-resident table."""

    params = ([*VARIANTS, "sparse_adam"],)
    param_names = ["variant"]
    timer = staticmethod(measure.timer)
    rounds, repeat, timeout = _TIMING["rounds"], _TIMING["repeat"], _TIMING["timeout"]

    def setup(self, variant: str) -> None:
        _check(variant)
        if variant not in _trainers:
            _trainers.clear()
            _trainers[variant] = _EmbeddingTrainer(variant)
        self.trainer = _trainers[variant]

    def time_step(self, variant: str) -> None:
        self.trainer.step()
