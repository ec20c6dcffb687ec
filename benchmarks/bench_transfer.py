"""Host<->GPU transfer: rows gathered from a host table onto the GPU and written back.

Baselines, plain PyTorch written here with torch alone (never a speedlib code path, which
changes with our commits; a ratio against those would move with them):
  torch_pageable  PyTorch's default: a table in pageable host memory, `table[idx].to(dev)`;
                  write-back `table[idx] = values.cpu()`
  torch_pinned    PyTorch's pinned path (SpeedTorch's "PyTorch pinned"): a pinned table,
                  index_select into a pinned buffer, then `.to(dev, non_blocking=True)`;
                  write-back: the values copied into the pinned buffer, then index_copy_.
                  The baseline every variant's speedup is taken against on GPUs
speedlib.transfer backends (HostTable):
  pageable  CPU index_select, then a synchronous copy from pageable memory
  pinned    CPU index_select into pinned staging, then one non_blocking copy; 2 MiB chunks on
            worker threads from 1408e44 up to 838236b
  cupy      CuPy kernels index pinned host memory from the GPU (SpeedTorch's approach)
  uva       registered (page-locked) host memory indexed from the GPU, zero-copy: torch's
            index_select before commit 1408e44, a whole-row Triton kernel from it
  auto      HostTable's default: the paths above measured at first use, the fastest kept
            (speedlib/_transfer_auto.py); what it chose in FractionOfFloor, and every
            path's time, is printed by its track_gather_bandwidth (`speedlib run --show-stderr`)
  device    the table in GPU memory: the upper bound
EmbeddingStep's baseline is plain PyTorch's host-resident embedding, `sparse_adam_host`:
nn.Embedding(sparse=True) in host memory + torch.optim.SparseAdam stepping on the CPU, the
looked-up rows copied to the device and their gradient back; beside it `sparse_adam`, the
same with the table on the device (GPUs only). On CPUs no row leaves the host: there
torch_pageable, pageable and auto run (auto is pageable there), torch_pageable the baseline.

The batch is workloads.embedding(): 131072 x 128 float32 rows (64 MiB) from a 10M-row table
(5.1 GB) on GPU machines, a 1M-row table on CPUs. Indices arrive on the host (pinned on GPU
machines), as from a DataLoader with pin_memory=True; moving them is part of the cost.
`indices`: random rows, or the same rows sorted (sequential access, same duplicates).

Metrics (benchmarks.common: one process measures a class, its track_* methods report):
  Transfer.track_seconds(op, indices, variant)
                              one gather of the batch (op 'gather') or writing it back
                              ('scatter'), one sample per round, the backends taking turns
  Transfer.track_speedup      torch_pinned / variant per round (torch_pageable / variant on CPUs)
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
                              read with the % (speedbench.report.floors.floor_table), not compared
                              across variants
  CopyBandwidth.track_copy_bandwidth
                              that floor itself, pinned and pageable, each direction; GPUs only
  Footprint.track_host_footprint / DeviceFootprint.track_device_footprint
                              memory a table of the batch's size holds after a gather
                              and a scatter (SpeedTorch's memory table). Host: resident
                              bytes, locked or not: 'uva' and 'auto' lock exactly the
                              table's bytes, 'pinned' only its staging buffers, torch_pinned
                              the table rounded up to a power of two (torch's pinned allocator)
  EmbeddingStep.track_seconds / track_speedup
                              an Adam training step of a host-resident embedding, per backend
                              (SparseAdam for the plain-PyTorch ones), taking turns;
                              sparse_adam_host / variant
Nothing here imports torch at the top or touches CUDA at import time; a variant this machine
cannot run is a skip (NaN).
"""

from __future__ import annotations

import functools
import inspect
import statistics
import sys
import time
from collections.abc import Callable
from math import gcd

from benchmarks import common

TORCH = ["torch_pageable", "torch_pinned"]  # plain PyTorch, written below
# Every variant written with torch alone (tests/test_baselines.py traces their steps for speedlib code).
PLAIN_PYTORCH = (*TORCH, "sparse_adam_host", "sparse_adam")
BACKENDS = ["pageable", "pinned", "cupy", "uva", "auto", "device"]  # speedlib.transfer's
VARIANTS = [*TORCH, *BACKENDS]
ORDERS = ["random", "sorted"]
OPS = ["gather", "scatter"]
# A CPU has no pinned path (nothing is copied to a device): there PyTorch's default is the
# baseline, which leaves every backend that runs on a CPU a comparison there too.
BASELINE = common.pick(cpu="torch_pageable", gpu="torch_pinned")
_SIZE = common.pick(cpu="small", gpu="full")
# workloads.embedding()'s batch, 131072 float32 rows of 128: the bytes a gather or scatter
# moves. Known without torch so that a track_* process can turn seconds into GB/s; the
# measuring process checks it against the workload (_spec).
BATCH_BYTES = 131072 * 128 * 4


def _spec():
    """The embedding batch at this machine's size (tests shrink it)."""
    from speedbench.measure import workloads  # noqa: PLC0415 - torch, in the measuring process only

    return workloads.embedding(_SIZE)


def _device():
    from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

    dev = measure.device()
    common.check_profile(dev)
    return dev


def _runs_here(variant: str, dev) -> None:
    """Raise NotImplementedError (a skip) for what this machine or commit cannot run."""
    if variant in ("torch_pageable", "sparse_adam_host"):
        return  # plain PyTorch on the host: every machine, every commit
    if variant in ("torch_pinned", "sparse_adam") and dev.type != "cuda":
        raise NotImplementedError(f"{variant!r} is for copies to a GPU; on this machine the device is the host")
    if variant in TORCH or variant == "sparse_adam":
        return
    transfer = common.technique("transfer")
    if variant not in transfer.BACKENDS:
        raise NotImplementedError(f"this commit has no backend {variant!r}")
    if variant in ("pageable", "auto"):
        return
    if dev.type != "cuda":
        raise NotImplementedError(f"the {variant!r} backend moves rows to a GPU; this machine has none")
    if variant == "cupy":
        try:
            import cupy  # noqa: F401, PLC0415 - optional (the cupy extra): its absence is a skip
        except ImportError as e:
            raise NotImplementedError("CuPy is not installed") from e


class _TorchPageable:
    """PyTorch's default, as a user writes it: rows indexed in pageable host memory and copied."""

    def __init__(self, rows: int, dim: int, dev, batch: int):
        import torch  # noqa: PLC0415 - torch: the measuring process only

        self.table, self.device = torch.zeros(rows, dim), dev

    def gather(self, idx):
        return self.table[idx].to(self.device)

    def scatter_(self, idx, values) -> None:
        self.table[idx] = values.cpu()


class _TorchPinned:
    """PyTorch's pinned path, as a user writes it: a pinned table, index_select into a pinned
    buffer and one non_blocking copy, the buffer refilled once its last copy has read it;
    write-back: the values copied into the buffer, then index_copy_ into the table."""

    def __init__(self, rows: int, dim: int, dev, batch: int):
        import torch  # noqa: PLC0415 - torch: the measuring process only

        self.torch, self.device = torch, dev
        self.table = torch.zeros(rows, dim, pin_memory=True)
        self.buffer = torch.empty(batch, dim, pin_memory=True)
        self.copied = None  # the event after the last copy out of the buffer

    def gather(self, idx):
        if self.copied is not None:
            self.copied.synchronize()
        rows = self.buffer[:idx.numel()]
        self.torch.index_select(self.table, 0, idx, out=rows)
        out = rows.to(self.device, non_blocking=True)
        self.copied = self.torch.cuda.Event()
        self.copied.record()
        return out

    def scatter_(self, idx, values) -> None:
        rows = self.buffer[:idx.numel()]
        rows.copy_(values, non_blocking=True)
        self.torch.cuda.current_stream().synchronize()  # the rows are here before the CPU reads them
        self.table.index_copy_(0, idx, rows)


def _storage(variant: str, rows: int, dim: int, dev, batch: int):
    """A zeroed rows x dim table of `variant` with `gather(idx)` and `scatter_(idx, values)`."""
    if variant == "torch_pageable":
        return _TorchPageable(rows, dim, dev, batch)
    if variant == "torch_pinned":
        return _TorchPinned(rows, dim, dev, batch)
    return common.technique("transfer").HostTable(rows, dim, backend=variant, device=dev)


def _host_indices(spec, dev) -> dict:
    """The batch's indices per order, on the host: pinned on GPU machines, as a DataLoader
    with pin_memory=True delivers them."""
    indices = {order: spec.indices(order) for order in ORDERS}
    return {order: idx.pin_memory() for order, idx in indices.items()} if dev.type == "cuda" else indices


class _Table:
    """A full-size table of one backend, with the batch's rows gathered onto the device."""

    def __init__(self, variant: str, spec, dev, indices: dict):
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        self.device, self.indices = dev, indices
        self.table = _storage(variant, spec.rows, spec.dim, dev, spec.batch)
        # Gathering them warms gather (staging buffers, allocator pools, CUDA kernels; 'auto'
        # measures its paths here), and a scatter of them writes back what the table holds.
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


def _what_auto_chose(table) -> str:
    """One line per direction: the path 'auto' keeps and what each of its paths measured."""
    measured = table._impl.measured
    return "\n".join(f"bench_transfer auto {op}: {path} ("
                     + (", ".join(f"{p} {t * 1e3:.3g} ms" for p, t in measured.get(op, {}).items())
                        or "not measured here")
                     + ")" for op, path in table.chosen.items())


# Transfer's tables, one per backend: built once for all of its configurations (on GPU
# machines eight 5 GB tables, seconds each) and dropped when its measure_all ends.
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

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (OPS, ORDERS, VARIANTS)
    param_names = ["op", "indices", "variant"]
    baseline = BASELINE
    # On GPUs the 'device' gather is tens of microseconds: a few calls per sample keep the
    # synchronisation around each sample from dominating it. Everything else is milliseconds.
    number = common.pick(cpu=1, gpu=4)
    timeout = 1800  # setup_cache: every configuration, and on GPUs eight 5 GB tables

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
    from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

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

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (VARIANTS,)
    param_names = ["variant"]
    timeout = 1800  # setup_cache: a 5 GB table per backend

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, variant: str) -> dict:
        common.gpu_only("bandwidth as a fraction of the host<->device floor")
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

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
        if variant == "auto":  # printed by track_gather_bandwidth (_figure)
            out["chose"] = _what_auto_chose(table.table)
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
        if key == "gather_bandwidth" and measured is not common.SKIP and "chose" in measured:
            # asv shows a setup_cache's output only when it fails; a track's with --show-stderr.
            # Here, not in a track's own code: that is what asv versions its results by.
            print(measured["chose"], file=sys.stderr)
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

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (["h2d", "d2h"], ["pinned", "pageable"])
    param_names = ["direction", "variant"]

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, direction: str, variant: str) -> float:
        common.gpu_only("host<->device copies")
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        return measure.host_copy_bandwidth(_device(), direction, pinned=variant == "pinned") / 1e9

    def track_copy_bandwidth(self, cache, direction: str, variant: str) -> float:
        return self.result(cache, direction, variant)

    track_copy_bandwidth.unit = "GB/s"


def _footprint(variant: str, read: Callable[[], int]) -> int:
    """What `read()` grows by while a batch-sized table is built and used once."""
    import torch  # noqa: PLC0415 - torch: the measuring process only

    from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

    dev, spec = _device(), _spec()
    _runs_here(variant, dev)
    # contexts and libraries, not the table
    _storage(variant, 1, spec.dim, dev, 1).gather(torch.zeros(1, dtype=torch.int64))
    before = read()
    table = _storage(variant, spec.rows, spec.dim, dev, spec.batch)
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

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (VARIANTS,)
    param_names = ["variant"]
    timeout = 1800

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, variant: str) -> int:
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        return _footprint(variant, measure.host_memory)

    def track_host_footprint(self, cache, variant: str) -> int:
        return self.result(cache, variant)

    track_host_footprint.unit = "bytes"


class DeviceFootprint(common.Measured):
    """GPU memory a table holds, from the driver (CuPy's and torch's allocations alike)."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (VARIANTS,)
    param_names = ["variant"]
    timeout = 1800

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, variant: str) -> int:
        common.gpu_only("device memory")
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        return _footprint(variant, lambda: measure.device_memory_in_use(measure.device()))

    def track_device_footprint(self, cache, variant: str) -> int:
        return self.result(cache, variant)

    track_device_footprint.unit = "bytes"


class _EmbeddingTrainer:
    def __init__(self, variant: str):
        import torch  # noqa: PLC0415 - torch: the measuring process only

        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        spec, dev = _spec(), measure.device()
        torch.manual_seed(0)
        if variant == "sparse_adam_host":
            emb = torch.nn.Embedding(spec.rows, spec.dim, sparse=True)  # host memory
            opt = torch.optim.SparseAdam(emb.parameters(), lr=1e-3)

            def step() -> None:
                opt.zero_grad()
                # Looked up on the CPU, the rows copied to the device; backward copies their
                # gradient back, and SparseAdam steps on the CPU.
                (emb(self.idx).to(dev) * self.target).sum().backward()
                opt.step()
        elif variant == "sparse_adam":
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
    plain PyTorch's (SparseAdam) and every backend taking turns."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (["sparse_adam_host", *BACKENDS, "sparse_adam"],)
    param_names = ["variant"]
    baseline = "sparse_adam_host"
    # setup_cache: on GPUs eight embeddings of 5 GB, each with two state tables: about 90 GB of host memory
    timeout = 1800

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


# --- the host-gather roofline (issue 52) ------------------------------------------------------

# The suite's point (workloads.embedding at full size: 10M x 128 float32, 131072 random rows) and
# one axis moved at a time around it; a name says its coordinates, so results explain themselves
# (speedbench.report.roofline reads them). Points sharing a table's shape stand together: a
# variant's table is built once for them (`_roofline_table`).
DEFAULT_POINT = "default (row 512 B, batch 131072, table 5.12 GB, order random)"
ROOFLINE_POINTS = [DEFAULT_POINT, "batch 1024", "batch 1048576", "order sorted", "order zipf",
                   "row 64 B", "row 256 B", "row 4096 B", "table 1 GB", "table 40 GB"]
ROOFLINE_VARIANTS = ["torch_pinned", "uva", "auto"]
# Issue 52's hypotheses, each a 'uva' table with one option (speedlib.HostTable), measured beside
# the plain 'uva' at the points where their predictions differ most.
HYPOTHESES = {"uva": {}, "uva_sorted": {"sort_indices": True}, "uva_2m": {"huge_pages": True},
              "uva_lines": {"whole_lines": True}, "uva_4k_in_flight": {"bytes_in_flight": 4096},
              "uva_64k_in_flight": {"bytes_in_flight": 65536}}
HYPOTHESIS_POINTS = [DEFAULT_POINT, "row 64 B", "table 40 GB"]
ZIPF_EXPONENT = 1.05  # the zipf order: row popularity ~ 1 / rank^1.05, hot rows scattered over the table
SECTOR, LINE, INDEX_BYTES = 32, 128, 8  # bytes: a GPU memory access's unit, its cache line, an int64 index


def roofline_point(name: str) -> tuple[int, int, int, str]:
    """(row bytes, batch rows, table bytes, index order) of a point's name."""
    row, batch, table, order = 512, 131072, 5_120_000_000, "random"
    axis, _, value = name.partition(" ")
    if axis == "row":
        row = int(value.removesuffix(" B"))
    elif axis == "batch":
        batch = int(value)
    elif axis == "table":
        table = int(float(value.removesuffix(" GB")) * 1e9)
    elif axis == "order":
        order = value
    elif name != DEFAULT_POINT:
        raise ValueError(f"no roofline point {name!r}")
    return row, batch, table, order


def touched_bytes(row_bytes: int, unit: int) -> float:
    """Bytes of whole `unit`-byte blocks a row touches, averaged over the rows of a table that
    starts on a block: row r starts at r * row_bytes, so its offset in a block cycles through
    the multiples of gcd(row_bytes, unit)."""
    step = gcd(row_bytes, unit)
    offsets = range(0, unit, step)
    return sum(-(-(o + row_bytes) // unit) * unit for o in offsets) / len(offsets)


def bus_bytes(path: str, op: str, row_bytes: int, share: float = 0.0) -> float:
    """Bytes one row costs on the bus in the direction it travels: a model, not a measurement.
    A row the CPU packs crosses as itself inside one bulk copy (paths 'pinned', 'pageable'); a row the GPU
    reads or writes in place moves the 32-byte sectors it touches ('uva'), whole 128-byte lines
    where the kernel reads lines ('lines'), and for a gather its int64 index crosses the same
    way first. 'split': `share` of the rows packed, the rest the kernel's."""
    if path == "split":
        return share * bus_bytes("pinned", op, row_bytes) + (1 - share) * bus_bytes("uva", op, row_bytes)
    if path in ("pinned", "pageable"):
        return float(row_bytes)
    unit = LINE if path == "lines" and op == "gather" else SECTOR
    return touched_bytes(row_bytes, unit) + (INDEX_BYTES if op == "gather" else 0)


def _bus_path(variant: str, table, op: str) -> tuple[str, float]:
    """(bus_bytes's path, share) for a variant's table after it has moved rows in direction `op`."""
    if variant == "torch_pinned":
        return "pinned", 0.0
    if variant == "auto":
        chosen = getattr(table._impl, "chosen", {}).get(op)  # what 'auto' runs (speedlib/_transfer_auto.py)
        return getattr(chosen, "name", "pinned"), getattr(chosen, "share", None) or 0.0
    return ("lines" if HYPOTHESES.get(variant, {}).get("whole_lines") else "uva"), 0.0


def roofline_indices(order: str, rows: int, batch: int, seed: int = 0):
    """`batch` int64 row indices on the host: random rows with repeats; the same sorted; or zipf,
    rows drawn by popularity rank (p ~ 1 / rank^ZIPF_EXPONENT, many repeats), ranks mapped to
    rows by a fixed random permutation so the hot rows lie all over the table."""
    import torch  # noqa: PLC0415 - torch: the measuring process only

    gen = torch.Generator().manual_seed(seed)
    if order in ("random", "sorted"):
        idx = torch.randint(0, rows, (batch,), generator=gen)
        return idx.sort().values if order == "sorted" else idx
    if order != "zipf":
        raise ValueError(f"order must be random, sorted or zipf, got {order!r}")
    weights = torch.arange(1, rows + 1, dtype=torch.float64).pow_(-ZIPF_EXPONENT)
    cdf = weights.cumsum_(0).div_(weights[-1].item())  # cumsum in place: the last entry is the total
    ranks = torch.searchsorted(cdf, torch.rand(batch, generator=gen, dtype=torch.float64)).clamp_(max=rows - 1)
    return torch.randperm(rows, generator=gen)[ranks]


def _host_bytes_needed(variant: str, table_bytes: int) -> int:
    """Host memory a variant's table takes: torch's pinned allocator rounds up to a power of two
    (torch_pinned); 2 MiB pages round up to whole pages."""
    if variant == "torch_pinned":
        return 1 << (table_bytes - 1).bit_length()
    return -(-table_bytes // (2 << 20)) * (2 << 20)


def _room_for(variant: str, table_bytes: int, meminfo: str = "/proc/meminfo") -> None:
    """NotImplementedError (a skip) where the host cannot hold the table: nine tenths of what
    /proc/meminfo says is available (the rest for the batch, the process and the system)."""
    need = _host_bytes_needed(variant, table_bytes)
    try:
        with open(meminfo, encoding="ascii") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return  # not Linux, or a kernel without the line: try, and let the allocation say
    if need > 0.9 * available:
        raise NotImplementedError(f"a {table_bytes / 1e9:g} GB table of {variant} needs {need / 1e9:.1f} GB of host "
                                  f"memory; {available / 1e9:.1f} GB is available here")


def _roofline_storage(variant: str, rows: int, dim: int, dev, batch: int):
    """A zeroed rows x dim float32 table of `variant`: PyTorch's pinned path (the frozen
    baseline above), HostTable's default, or a 'uva' table with a hypothesis's option."""
    if variant == "torch_pinned":
        return _TorchPinned(rows, dim, dev, batch)
    HostTable = common.technique("transfer").HostTable
    if variant == "auto":
        return HostTable(rows, dim, device=dev)
    options = HYPOTHESES[variant]
    missing = [o for o in options if o not in inspect.signature(HostTable).parameters]
    if missing:
        raise NotImplementedError(f"this commit's HostTable has no {', '.join(missing)} option")
    if options.get("huge_pages"):
        _transparent_huge_pages()
    return HostTable(rows, dim, backend="uva", device=dev, **options)


def _transparent_huge_pages() -> None:
    """NotImplementedError (a skip) where the kernel gives no transparent huge pages: the
    2 MiB-page table cannot be built on this host (speedlib would refuse it, saying why)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as f:
            setting = f.read()
    except OSError:
        return
    if "[never]" in setting:
        raise NotImplementedError(f"transparent huge pages are off on this host ({setting.strip()}): "
                                  "no table in 2 MiB pages")


# The table the roofline measures now, kept while the next points share its shape:
# at most one entry, (variant, rows, dim, table). Dropped before the next is built.
_roofline_tables: list = []


def _roofline_table(variant: str, rows: int, dim: int, dev):
    """The variant's rows x dim table, kept for the points after this one that share its shape;
    torch_pinned's buffer sized for the largest batch among them."""
    if _roofline_tables and _roofline_tables[0][:3] == (variant, rows, dim):
        return _roofline_tables[0][3]
    _drop_roofline_table()
    _room_for(variant, rows * dim * 4)
    batch = max(b for r, b, t, _ in map(roofline_point, ROOFLINE_POINTS + HYPOTHESIS_POINTS)
                if (t // r, r // 4) == (rows, dim))
    table = _roofline_storage(variant, rows, dim, dev, batch)
    _roofline_tables.append((variant, rows, dim, table))
    return table


def _drop_roofline_table() -> None:
    """Free the kept table and the pinned memory torch's allocator would cache from it."""
    _roofline_tables.clear()
    if "torch" in sys.modules:
        import gc  # noqa: PLC0415 - with torch: before anything is freed

        torch = sys.modules["torch"]
        gc.collect()
        if torch.cuda.is_initialized() and hasattr(torch._C, "_host_emptyCache"):
            torch.cuda.synchronize()
            torch._C._host_emptyCache()  # torch_pinned's 8 GiB block would stay cached beside the next table


def _median_seconds(fn: Callable[[], object], dev, samples: int = 20) -> float:
    """The median of `samples` timed calls of `fn` after three untimed ones, each between two
    synchronisations, in seconds."""
    from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

    for _ in range(3):
        fn()
    times = []
    for _ in range(samples):
        measure.synchronize(dev)
        start = time.perf_counter()
        fn()
        measure.synchronize(dev)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _roofline_one(variant: str, name: str) -> dict:
    """One variant at one point: gather and write-back of the point's batch, each as % of the
    bulk pinned copy in its direction timed just before in this process, with both GB/s and the
    bytes a row costs on the bus."""
    common.gpu_only("the host-gather roofline (bandwidth as a fraction of the host<->device floor)")
    from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

    dev = _device()
    row_bytes, batch, table_bytes, order = roofline_point(name)
    dim, rows = row_bytes // 4, table_bytes // row_bytes
    table = _roofline_table(variant, rows, dim, dev)
    idx = roofline_indices(order, rows, batch)
    idx = idx.pin_memory() if dev.type == "cuda" else idx  # as a DataLoader with pin_memory=True delivers them
    values = table.gather(idx)  # warms gather ('auto' measures its paths here) and gives the rows to write back
    table.scatter_(idx, values)
    moved = batch * row_bytes
    out = {"distinct": idx.unique().numel() / batch}
    steps = {"gather": lambda: table.gather(idx), "scatter": lambda: table.scatter_(idx, values)}
    for op, direction in (("gather", "h2d"), ("scatter", "d2h")):
        floor = measure.host_copy_bandwidth(dev, direction, pinned=True)
        achieved = moved / _median_seconds(steps[op], dev)
        out[op] = 100.0 * achieved / floor
        out[f"{op}_bandwidth"] = achieved / 1e9
        out[f"{direction}_floor"] = floor / 1e9
        path, share = _bus_path(variant, table, op)
        out[f"{op}_bus_bytes"] = bus_bytes(path, op, row_bytes, share)
    if variant == "auto":
        out["chose"] = _what_auto_chose(table)
    return out


class _RooflineTracks:
    """What both roofline classes report per (variant, point), from `measure_one`'s dict."""

    def _value(self, cache, variant: str, point: str, key: str):
        measured = self.result(cache, variant, point)
        if key == "gather" and measured is not common.SKIP:
            # asv shows a setup_cache's output only when it fails; a track's with --show-stderr.
            print(f"{type(self).__name__} {variant} at {point}: {measured['distinct']:.1%} of the batch's rows "
                  "distinct" + (f"; {measured['chose']}" if "chose" in measured else ""), file=sys.stderr)
        return measured if measured is common.SKIP else measured[key]

    def track_roofline_gather(self, cache, variant: str, point: str) -> float:
        return self._value(cache, variant, point, "gather")

    track_roofline_gather.unit = "% of pinned host->device bandwidth"

    def track_roofline_scatter(self, cache, variant: str, point: str) -> float:
        return self._value(cache, variant, point, "scatter")

    track_roofline_scatter.unit = "% of pinned device->host bandwidth"

    def track_roofline_gather_bandwidth(self, cache, variant: str, point: str) -> float:
        return self._value(cache, variant, point, "gather_bandwidth")

    track_roofline_gather_bandwidth.unit = "GB/s"

    def track_roofline_scatter_bandwidth(self, cache, variant: str, point: str) -> float:
        return self._value(cache, variant, point, "scatter_bandwidth")

    track_roofline_scatter_bandwidth.unit = "GB/s"

    def track_roofline_h2d_floor(self, cache, variant: str, point: str) -> float:
        return self._value(cache, variant, point, "h2d_floor")

    track_roofline_h2d_floor.unit = "GB/s"

    def track_roofline_d2h_floor(self, cache, variant: str, point: str) -> float:
        return self._value(cache, variant, point, "d2h_floor")

    track_roofline_d2h_floor.unit = "GB/s"

    def track_roofline_gather_bus_bytes(self, cache, variant: str, point: str) -> float:
        return self._value(cache, variant, point, "gather_bus_bytes")

    track_roofline_gather_bus_bytes.unit = "bytes on the bus per row"

    def track_roofline_scatter_bus_bytes(self, cache, variant: str, point: str) -> float:
        return self._value(cache, variant, point, "scatter_bus_bytes")

    track_roofline_scatter_bus_bytes.unit = "bytes on the bus per row"


class Roofline(_RooflineTracks, common.Timed):
    """The host-gather roofline: PyTorch's pinned path, speedlib's 'uva' kernel and its default
    'auto', each as % of the pinned copy floor at the suite's point and one axis away from it
    (row width 64 B to 4 KiB, batch 1k to 1M rows, table 1 GB to 40 GB, random, sorted or zipf
    indices); GPUs only."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (ROOFLINE_VARIANTS, ROOFLINE_POINTS)
    param_names = ["variant", "point"]
    timeout = 1800  # setup_cache: every variant's tables, up to 40 GB each

    def setup_cache(self):
        return self.measure_all()

    def measure_all(self) -> dict:
        try:
            return super().measure_all()
        finally:
            _drop_roofline_table()

    def measure_one(self, variant: str, point: str) -> dict:
        return _roofline_one(variant, point)


class RooflineHypotheses(_RooflineTracks, common.Timed):
    """Issue 52's hypotheses at the roofline's points where they differ most: the 'uva' kernel
    with sorted indices, a table in 2 MiB pages, whole-line reads, 4 KiB and 64 KiB in flight
    per program, beside the plain 'uva' measured in the same process; GPUs only."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (list(HYPOTHESES), HYPOTHESIS_POINTS)
    param_names = ["variant", "point"]
    timeout = 1800  # setup_cache: six 40 GB tables among the rest

    def setup_cache(self):
        return self.measure_all()

    def measure_all(self) -> dict:
        try:
            return super().measure_all()
        finally:
            _drop_roofline_table()

    def measure_one(self, variant: str, point: str) -> dict:
        return _roofline_one(variant, point)
