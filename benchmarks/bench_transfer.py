"""Host<->GPU transfer: rows gathered from a host table onto the GPU and written back.

Variants are speedlib.transfer backends:
  pageable  CPU index_select, then a synchronous copy from pageable memory
  pinned    rows packed on the CPU into pinned staging buffers, then non_blocking copies
            (the PyTorch path every other variant is compared with); from commit 1408e44 in
            2 MiB chunks on worker threads, each chunk's copy overlapping the next packing
  cupy      CuPy kernels index pinned host memory from the GPU (SpeedTorch's approach)
  uva       registered (page-locked) host memory indexed from the GPU, zero-copy: torch's
            index_select before commit 1408e44, a whole-row Triton kernel from it
  device    the table in GPU memory: the upper bound
EmbeddingStep adds `sparse_adam`: nn.Embedding(sparse=True) + torch.optim.SparseAdam with
the table on the device, PyTorch's built-in answer; its step copies the host indices there.
On CPUs only 'pageable' and 'sparse_adam' run, and no row leaves the host: there 'pageable'
is the baseline instead of 'pinned'.

The batch is workloads.embedding(): 131072 x 128 float32 rows (64 MiB) from a 10M-row table
(5.1 GB) on GPU machines, a 1M-row table on CPUs. Indices arrive on the host (pinned on GPU
machines), as from a DataLoader with pin_memory=True; moving them is part of the cost.
`indices`: random rows, or the same rows sorted (sequential access, same duplicates).

Metrics (benchmarks.common: one process measures a class, its track_* methods report):
  Transfer.track_seconds(op, indices, variant)
                              one gather of the batch (op 'gather') or writing it back
                              ('scatter'), one sample per round, the backends taking turns
  Transfer.track_speedup      pinned / variant per round (pageable / variant on CPUs)
  Transfer.track_bandwidth    the batch's bytes over each round's time, GB/s
  FractionOfFloor.track_gather_fraction_of_floor / track_scatter_fraction_of_floor
                              random-row gather (scatter) bandwidth, the batch's bytes over
                              the median of 20 calls, over the machine's bulk pinned copy
                              bandwidth in the same direction, measured in the same process
                              (measure.host_copy_bandwidth); GPUs only. The headline
  FractionOfFloor.track_gather_bandwidth / track_scatter_bandwidth
                              that bandwidth itself, GB/s: the numerator of the %
  FractionOfFloor.track_h2d_floor / track_d2h_floor
                              the floor it was divided by (the bulk pinned copy, host->device
                              for gather, device->host for scatter), GB/s, timed in that same
                              process: the figures a reader checks against the bus. They are
                              read with the % (speedbench.tables.floor_table), not compared
                              across variants
  CopyBandwidth.track_copy_bandwidth
                              that floor itself, pinned and pageable, each direction; GPUs only
  Footprint.track_host_footprint / DeviceFootprint.track_device_footprint
                              memory a table of the batch's size holds after a gather
                              and a scatter (SpeedTorch's memory table). Host: resident
                              bytes, locked or not: 'uva' locks exactly the table's
                              bytes, 'pinned' only its staging buffers
  EmbeddingStep.track_seconds / track_speedup
                              an Adam training step of a host-resident embedding, per backend
                              and sparse_adam, taking turns; pinned (CPUs: pageable) / variant
  Packing.track_seconds / track_speedup / track_bandwidth (op, variant)
                              the CPU half of a 'pinned' gather (write-back) alone, any machine:
                              torch's one index_select (index_copy_) against speedlib's staging
                              workers packing 2 MiB chunks, nothing copied (variants 'index_select',
                              the baseline, and 'staged'); GB/s of the batch
Nothing here imports torch at the top or touches CUDA at import time; a variant this machine
cannot run is a skip (NaN).
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable

from benchmarks import common

VARIANTS = ["pageable", "pinned", "cupy", "uva", "device"]
ORDERS = ["random", "sorted"]
OPS = ["gather", "scatter"]
# 'pinned' is the PyTorch path the backends are compared with; a CPU has no pinned path
# (nothing is copied to a device), so there the one backend it runs is the baseline, which
# leaves EmbeddingStep's sparse_adam a comparison on CPUs too.
BASELINE = common.pick(cpu="pageable", gpu="pinned")
_SIZE = common.pick(cpu="small", gpu="full")
# workloads.embedding()'s batch, 131072 float32 rows of 128: the bytes a gather or scatter
# moves. Known without torch so that a track_* process can turn seconds into GB/s; the
# measuring process checks it against the workload (_spec).
BATCH_BYTES = 131072 * 128 * 4


def _spec():
    """The embedding batch at this machine's size (tests shrink it)."""
    from speedbench import workloads  # noqa: PLC0415 - torch, in the measuring process only

    return workloads.embedding(_SIZE)


def _device():
    from speedbench import measure  # noqa: PLC0415

    dev = measure.device()
    common.check_profile(dev)
    return dev


def _runs_here(variant: str, dev) -> None:
    """Raise NotImplementedError (a skip) for what this machine or commit cannot run."""
    transfer = common.technique("transfer")
    if variant in ("pageable", "sparse_adam"):
        return
    if dev.type != "cuda":
        raise NotImplementedError(f"the {variant!r} backend moves rows to a GPU; this machine has none")
    if variant not in transfer.BACKENDS:
        raise NotImplementedError(f"this commit has no backend {variant!r}")
    if variant == "cupy":
        try:
            import cupy  # noqa: F401, PLC0415
        except ImportError as e:
            raise NotImplementedError("CuPy is not installed") from e


def _host_indices(spec, dev) -> dict:
    """The batch's indices per order, on the host: pinned on GPU machines, as a DataLoader
    with pin_memory=True delivers them."""
    indices = {order: spec.indices(order) for order in ORDERS}
    return {order: idx.pin_memory() for order, idx in indices.items()} if dev.type == "cuda" else indices


class _Table:
    """A full-size table of one backend, with the batch's rows gathered onto the device."""

    def __init__(self, variant: str, spec, dev, indices: dict):
        from speedbench import measure  # noqa: PLC0415

        HostTable = common.technique("transfer").HostTable
        self.device, self.indices = dev, indices
        self.table = HostTable(spec.rows, spec.dim, backend=variant, device=dev)
        # Gathering them warms gather (staging buffers, allocator pools, CUDA kernels), and a
        # scatter of them writes back what the table holds: it never changes.
        self.values = {order: self.gather(order) for order in ORDERS}
        for order in ORDERS:
            self.scatter(order)
        measure.synchronize(dev)

    def gather(self, order: str):
        return self.table.gather(self.indices[order])

    def scatter(self, order: str) -> None:
        self.table.scatter_(self.indices[order], self.values[order])

    def op(self, op: str) -> Callable[[str], object]:
        return self.gather if op == "gather" else self.scatter


# Transfer's tables, one per backend: built once for all of its configurations (on GPU
# machines five 5 GB tables, seconds each) and dropped when its measure_all ends.
# (common.cached would not do: common frees its cache after every configuration.)
# At most one entry: (device, {variant: _Table}).
_tables: list = []


def _all_tables() -> tuple:
    """(device, {variant: _Table}) for every backend this machine runs."""
    if not _tables:
        dev, spec = _device(), _spec()
        if spec.batch * spec.dim * 4 != BATCH_BYTES:
            raise RuntimeError(f"workloads.embedding() moves {spec.batch * spec.dim * 4} bytes a batch; "
                               f"BATCH_BYTES says {BATCH_BYTES}")
        indices, tables = _host_indices(spec, dev), {}
        for variant in VARIANTS:
            try:
                _runs_here(variant, dev)
            except NotImplementedError:
                continue  # left out of the comparison: common reports it as a skip
            tables[variant] = _Table(variant, spec, dev, indices)
        _tables.append((dev, tables))
    return _tables[0]


class Transfer(common.Paired):
    """Gather, or scatter, of the batch in one index order: the backends taking turns."""

    params = (OPS, ORDERS, VARIANTS)
    param_names = ["op", "indices", "variant"]
    baseline = BASELINE
    # On GPUs the 'device' gather is tens of microseconds: a few calls per sample keep the
    # synchronisation around each sample from dominating it. Everything else is milliseconds.
    number = common.pick(cpu=1, gpu=4)
    timeout = 1800  # setup_cache: every configuration, and on GPUs five 5 GB tables

    def setup_cache(self):
        return self.measure_all()

    def measure_all(self) -> dict:
        try:
            return super().measure_all()
        finally:
            _tables.clear()

    def steps(self, op: str, indices: str):
        dev, tables = _all_tables()
        return dev, {v: functools.partial(t.op(op), indices) for v, t in tables.items()}

    def track_bandwidth(self, cache, op: str, indices: str, variant: str):
        times = self.result(cache, op, indices, variant)
        if times is common.SKIP:
            return common.SKIP
        return {"samples": [BATCH_BYTES / s / 1e9 for s in times[variant]], "number": 1}

    track_bandwidth.unit = "GB/s"


def _median_bandwidth(fn: Callable[[], object], dev, samples: int = 20) -> float:
    """The batch's bytes over the median of `samples` timed calls after three untimed ones,
    bytes/s."""
    from speedbench import measure  # noqa: PLC0415

    for _ in range(3):
        fn()
    times = []
    for _ in range(samples):
        measure.synchronize(dev)
        start = time.perf_counter()
        fn()
        measure.synchronize(dev)
        times.append(time.perf_counter() - start)
    return BATCH_BYTES / statistics.median(times)


class FractionOfFloor(common.Timed):
    """Random-row gather (scatter) over bulk pinned host->device (device->host) bandwidth."""

    params = (VARIANTS,)
    param_names = ["variant"]
    timeout = 1800  # setup_cache: a 5 GB table per backend

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, variant: str) -> dict:
        common.gpu_only("bandwidth as a fraction of the host<->device floor")
        from speedbench import measure  # noqa: PLC0415

        dev, spec = _device(), _spec()
        _runs_here(variant, dev)
        table = _Table(variant, spec, dev, _host_indices(spec, dev))
        out = {}
        for op, direction in (("gather", "h2d"), ("scatter", "d2h")):
            floor = measure.host_copy_bandwidth(dev, direction, pinned=True)
            achieved = _median_bandwidth(functools.partial(table.op(op), "random"), dev)
            out[op] = 100.0 * achieved / floor
            # Both terms of the %, GB/s: the % alone could not be checked against the bus,
            # and a GB/s made of it with a floor timed in another process would not be this one.
            out[f"{op}_bandwidth"] = achieved / 1e9
            out[f"{direction}_floor"] = floor / 1e9
        return out

    def track_gather_fraction_of_floor(self, cache, variant: str) -> float:
        measured = self.result(cache, variant)
        return measured if measured is common.SKIP else measured["gather"]

    track_gather_fraction_of_floor.unit = "% of pinned host->device bandwidth"

    def track_scatter_fraction_of_floor(self, cache, variant: str) -> float:
        measured = self.result(cache, variant)
        return measured if measured is common.SKIP else measured["scatter"]

    track_scatter_fraction_of_floor.unit = "% of pinned device->host bandwidth"

    def _figure(self, cache, variant: str, key: str) -> float:
        measured = self.result(cache, variant)
        return measured if measured is common.SKIP else measured[key]

    def track_gather_bandwidth(self, cache, variant: str) -> float:
        """The random-row gather's bandwidth that track_gather_fraction_of_floor divides."""
        return self._figure(cache, variant, "gather_bandwidth")

    track_gather_bandwidth.unit = "GB/s"

    def track_scatter_bandwidth(self, cache, variant: str) -> float:
        """The random-row write-back's bandwidth that track_scatter_fraction_of_floor divides."""
        return self._figure(cache, variant, "scatter_bandwidth")

    track_scatter_bandwidth.unit = "GB/s"

    def track_h2d_floor(self, cache, variant: str) -> float:
        """The pinned host->device copy the gather was divided by, timed in the same process."""
        return self._figure(cache, variant, "h2d_floor")

    track_h2d_floor.unit = "GB/s"

    def track_d2h_floor(self, cache, variant: str) -> float:
        """The pinned device->host copy the write-back was divided by, timed in the same process."""
        return self._figure(cache, variant, "d2h_floor")

    track_d2h_floor.unit = "GB/s"


class CopyBandwidth(common.Timed):
    """The floor: one bulk 256 MiB copy between host and GPU, best of five."""

    params = (["h2d", "d2h"], ["pinned", "pageable"])
    param_names = ["direction", "variant"]

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, direction: str, variant: str) -> float:
        common.gpu_only("host<->device copies")
        from speedbench import measure  # noqa: PLC0415

        return measure.host_copy_bandwidth(_device(), direction, pinned=variant == "pinned") / 1e9

    def track_copy_bandwidth(self, cache, direction: str, variant: str) -> float:
        return self.result(cache, direction, variant)

    track_copy_bandwidth.unit = "GB/s"


def _footprint(variant: str, read: Callable[[], int]) -> int:
    """What `read()` grows by while a batch-sized table is built and used once."""
    import torch  # noqa: PLC0415

    from speedbench import measure  # noqa: PLC0415

    dev, spec = _device(), _spec()
    _runs_here(variant, dev)
    HostTable = common.technique("transfer").HostTable
    HostTable(1, spec.dim, backend=variant, device=dev).gather([0])  # contexts and libraries, not the table
    before = read()
    table = HostTable(spec.rows, spec.dim, backend=variant, device=dev)
    idx = spec.indices()
    table.scatter_(idx, table.gather(idx))  # staging buffers count; the batch's rows do not
    measure.synchronize(dev)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        if "cupy" in sys.modules:  # CuPy's indexing temporaries are not the table's
            sys.modules["cupy"].get_default_memory_pool().free_all_blocks()
    used = read() - before
    del table
    if "cupy" in sys.modules:
        # A freed CuPy table's pinned memory stays in CuPy's pool: hand it back before the
        # next backend's table is built in this process.
        sys.modules["cupy"].get_default_pinned_memory_pool().free_all_blocks()
    return used


class Footprint(common.Measured):
    """Host memory a table holds (resident bytes, pinned pages included)."""

    params = (VARIANTS,)
    param_names = ["variant"]
    timeout = 1800

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, variant: str) -> int:
        from speedbench import measure  # noqa: PLC0415

        return _footprint(variant, measure.host_memory)

    def track_host_footprint(self, cache, variant: str) -> int:
        return self.result(cache, variant)

    track_host_footprint.unit = "bytes"


class DeviceFootprint(common.Measured):
    """GPU memory a table holds, from the driver (CuPy's and torch's allocations alike)."""

    params = (VARIANTS,)
    param_names = ["variant"]
    timeout = 1800

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, variant: str) -> int:
        common.gpu_only("device memory")
        from speedbench import measure  # noqa: PLC0415

        return _footprint(variant, lambda: measure.device_memory_in_use(measure.device()))

    def track_device_footprint(self, cache, variant: str) -> int:
        return self.result(cache, variant)

    track_device_footprint.unit = "bytes"


class _EmbeddingTrainer:
    def __init__(self, variant: str):
        import torch  # noqa: PLC0415

        from speedbench import measure  # noqa: PLC0415

        spec, dev = _spec(), measure.device()
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
            HostEmbedding = common.technique("transfer").HostEmbedding
            emb = HostEmbedding(spec.rows, spec.dim, functools.partial(torch.optim.Adam, lr=1e-3),
                                backend=variant, device=dev)

            def step() -> None:
                (emb(self.idx) * self.target).sum().backward()
                emb.step()
        self.idx = spec.indices().pin_memory() if dev.type == "cuda" else spec.indices()
        self.target = torch.randn(spec.batch, spec.dim, generator=torch.Generator().manual_seed(1)).to(dev)
        self.step, self.device = step, dev
        for _ in range(2):  # optimizer state tables, allocator pools
            step()
        measure.synchronize(dev)


class EmbeddingStep(common.Paired):
    """Forward, backward and Adam step of a 131072-index batch on a host-resident table,
    every backend and sparse_adam taking turns."""

    params = ([*VARIANTS, "sparse_adam"],)
    param_names = ["variant"]
    baseline = BASELINE
    timeout = 1800  # setup_cache: on GPUs six embeddings of 5 GB, each with two Adam state tables

    def setup_cache(self):
        return self.measure_all()

    def steps(self):
        dev, trainers = _device(), {}
        for variant in self.params[-1]:
            try:
                _runs_here(variant, dev)
            except NotImplementedError:
                continue  # not on this machine: common reports it as a skip
            trainers[variant] = _EmbeddingTrainer(variant)
        return dev, {v: t.step for v, t in trainers.items()}


PACKERS = ["index_select", "staged"]


def _packing_lane(copies: bool, out=None):
    """A copy engine for speedlib's staging ring that stays on the host: `copies=False` copies
    nothing (Packing times the packing alone); `copies=True` copies at once on the CPU (the
    check that staged packing is index_select's, row for row). `out`: the output every gather
    gets, as index_select's is allocated once (else a new one each time)."""
    import torch  # noqa: PLC0415

    class Done:
        def synchronize(self) -> None:
            pass

    class Lane:
        def pinned(self, rows: int, dim: int, dtype):
            return torch.zeros(rows, dim, dtype=dtype)  # host memory: no copy ever reads it

        def output(self, rows: int, dim: int, dtype):
            return out if out is not None else torch.empty(rows, dim, dtype=dtype)

        def start(self) -> None:
            pass

        def copy(self, src, dst):
            if copies:
                dst.copy_(src)
            return Done()

        def finish(self, last) -> None:
            pass

    return Lane()


class Packing(common.Paired):
    """The CPU half of a 'pinned' gather (write-back) alone, on any machine: the batch's rows
    packed from the host table into host memory (written back from it), torch's one
    index_select (index_copy_) on all intra-op threads against speedlib's worker threads
    packing 2 MiB chunks into its staging ring (speedlib/_transfer_staging.py), nothing copied
    behind them. On a GPU machine its GB/s beside CopyBandwidth's pinned copy says whether
    packing can keep the bus busy: a staged gather can be no faster than the slower of the two."""

    params = (OPS, PACKERS)
    param_names = ["op", "variant"]
    baseline = "index_select"

    def setup_cache(self):
        return self.measure_all()

    def steps(self, op: str):
        import importlib  # noqa: PLC0415

        import torch  # noqa: PLC0415

        try:
            staging = importlib.import_module("speedlib._transfer_staging")
        except ImportError as e:
            raise NotImplementedError(f"this commit has no staged packing: {e}") from e
        dev, spec = _device(), _spec()
        # Each row holds its own number (exact in float32 below 2**24 rows), so the check below
        # sees a wrong row; and every page is written: a fresh zero page would read as cached.
        host = torch.arange(spec.rows, dtype=torch.float32)[:, None].expand(spec.rows, spec.dim).contiguous()
        gen = torch.Generator().manual_seed(0)
        # gather: the batch's random rows, repeats included; write-back: as many distinct rows
        # (repeats there carry the same bytes and cost the same), so both move BATCH_BYTES
        idx = spec.indices() if op == "gather" else torch.randperm(spec.rows, generator=gen)[:spec.batch]
        rows = torch.rand(spec.batch, spec.dim, generator=gen)
        staged = staging.Staged(_packing_lane(copies=False, out=rows), host)
        check = staging.Staged(_packing_lane(copies=True), host)
        if op == "gather":
            if not torch.equal(check.gather(idx), host.index_select(0, idx)):
                raise RuntimeError("staged packing gathered other rows than index_select")
            return dev, {"index_select": lambda: torch.index_select(host, 0, idx, out=rows),
                         "staged": lambda: staged.gather(idx)}
        expected = host.clone().index_copy_(0, idx, rows)
        check.scatter(idx, rows)
        if not torch.equal(host, expected):
            raise RuntimeError("staged write-back wrote other rows than index_copy_")
        return dev, {"index_select": lambda: host.index_copy_(0, idx, rows),
                     "staged": lambda: staged.scatter(idx, rows)}

    def track_bandwidth(self, cache, op: str, variant: str):
        times = self.result(cache, op, variant)
        if times is common.SKIP:
            return common.SKIP
        return {"samples": [BATCH_BYTES / s / 1e9 for s in times[variant]], "number": 1}

    track_bandwidth.unit = "GB/s"
