"""Tables that live in host memory: gather rows to the GPU, scatter them back, train them.

`HostTable(rows, dim, backend=...)` keeps a rows x dim table where the backend says and
moves rows between it and `device`:

  pageable  a plain CPU tensor; rows are indexed on the CPU and copied synchronously.
            The only backend that runs without a GPU.
  pinned    a plain CPU tensor, indexed on the CPU (`index_select` runs on all intra-op
            threads) into a pinned staging buffer that is copied with `non_blocking=True`.
            Only the staging buffer needs pinning, so the table itself costs no locked memory.
  cupy      CuPy pinned memory, indexed by CuPy kernels running on the GPU: SpeedTorch's
            approach. Pinned memory is mapped into the GPU's address space (unified
            addressing), so the kernel reads and writes host rows over the bus: no CPU indexing.
  uva       the same zero-copy idea without CuPy: a pinned torch tensor is described to torch
            as CUDA memory (the CUDA array interface), and torch's own `index_select` and
            `index_copy_` kernels read and write it in place.
  device    the whole table in GPU memory: the upper bound, when it fits.

`gather(indices)` returns a tensor on `device` shaped `indices.shape + (dim,)`, ordered on
the current CUDA stream like any other kernel's output. `scatter_(indices, values)` writes
rows back. **Duplicate indices: the last occurrence wins**, as in Python and NumPy
assignment; `index_copy_` alone leaves the winner unspecified on both CPU and GPU, so every
backend first makes duplicates carry the same row (`last_write_wins`). Bad input fails
before anything is written: out-of-range indices raise `IndexError`, non-integer indices or
values of another dtype `TypeError`, a shape or device mismatch `ValueError`.

`HostEmbedding` trains such a table with any dense `torch.optim` optimizer; see its docstring.
"""

from __future__ import annotations

import atexit
import inspect
import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["BACKENDS", "HostTable", "HostEmbedding", "last_write_wins"]

BACKENDS = ("pageable", "pinned", "cupy", "uva", "device")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INDEX_DTYPES = (torch.int32, torch.int64)


def last_write_wins(indices: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows and values to write so that, for a repeated index, its last value is the one kept.

    Returns the indices sorted (writes in row order are kinder to caches and the bus) and,
    for each, the value of that index's last occurrence, so every write to one row carries
    the same data and the write order stops mattering. No host synchronisation: the result
    keeps its duplicates instead of compacting them, which would need to know their count.
    """
    n = indices.numel()
    if n < 2:
        return indices, values
    rows, order = torch.sort(indices, stable=True)
    starts = torch.ones(n, dtype=torch.bool, device=rows.device)
    starts[1:] = rows[1:] != rows[:-1]
    run = torch.cumsum(starts, 0) - 1
    # The sort is stable, so a run's last original position is its largest one.
    last = torch.zeros(n, dtype=order.dtype, device=rows.device)
    last.scatter_reduce_(0, run, order, reduce="amax", include_self=False)
    return rows, values.index_select(0, last[run])


def _default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _sync(device: torch.device) -> None:
    # is_initialized() is False in a forked DataLoader worker, which must not touch CUDA.
    if device.type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.synchronize(device)


class _Pageable:
    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device):
        self.device = device
        self.host = torch.zeros(rows, dim, dtype=dtype)

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        return self.host.index_select(0, idx.cpu()).to(self.device)

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        self.host.index_copy_(0, idx.cpu(), values.cpu())


class _Pinned(_Pageable):
    """CPU indexing into pinned staging buffers, then an asynchronous copy.

    Two staging buffers take turns, so indexing the next batch on the CPU can overlap the
    copy of the previous one; an event per buffer says when its copy has finished reading it.
    """

    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device):
        super().__init__(rows, dim, dtype, device)
        self._stages: list[torch.Tensor | None] = [None, None]
        self._events: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0

    def _stage(self, n: int) -> tuple[int, torch.Tensor]:
        i, self._turn = self._turn, self._turn ^ 1
        if self._events[i] is not None:
            self._events[i].synchronize()  # the last copy out of this buffer is done
            self._events[i] = None
        stage = self._stages[i]
        if stage is None or stage.shape[0] < n:
            stage = self._stages[i] = torch.empty(n, self.host.shape[1], dtype=self.host.dtype, pin_memory=True)
        return i, stage[:n]

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        i, stage = self._stage(idx.numel())
        torch.index_select(self.host, 0, idx.cpu(), out=stage)
        out = stage.to(self.device, non_blocking=True)
        self._events[i] = torch.cuda.Event()
        self._events[i].record()
        return out

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        if values.device.type == "cuda":
            _, stage = self._stage(values.shape[0])
            stage.copy_(values, non_blocking=True)
            torch.cuda.current_stream(values.device).synchronize()  # the rows must be here before the CPU reads them
            values = stage
        self.host.index_copy_(0, idx.cpu(), values)


class _MappedHost:
    """Pinned host memory described as CUDA memory through the CUDA array interface.

    Under unified addressing, pinned host memory is mapped into every GPU's address space at
    the same address, so a CUDA kernel can dereference it. The rows are described as bytes
    and viewed back as the table's dtype, which lets bfloat16 through (it has no typestr).
    """

    def __init__(self, host: torch.Tensor):
        self.host = host  # keeps the memory alive as long as the CUDA view exists
        self.__cuda_array_interface__ = {
            "shape": (host.shape[0], host.shape[1] * host.element_size()),
            "typestr": "|u1",
            "data": (host.data_ptr(), False),
            "strides": None,
            "version": 2,
        }


class _Uva:
    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device):
        self.device = device
        self.host = torch.zeros(rows, dim, dtype=dtype, pin_memory=True)
        view = torch.as_tensor(_MappedHost(self.host)).view(dtype)
        if view.device != device or view.data_ptr() != self.host.data_ptr():
            raise RuntimeError(f"the pinned table was not mapped in place onto {device} (got {view.device}); "
                               "zero-copy access needs unified addressing")
        self.view = view

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.index_select(self.view, 0, idx.to(self.device, non_blocking=True))

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        self.view.index_copy_(0, idx.to(self.device, non_blocking=True), values.to(self.device, non_blocking=True))


def _import_cupy():
    try:
        import cupy  # noqa: PLC0415 - optional and heavy
        import cupyx  # noqa: PLC0415
    except ImportError as e:
        raise ImportError("the 'cupy' backend needs CuPy: pip install 'speedlib[cupy]'") from e
    return cupy, cupyx


# CuPy frees pinned memory in finalizers; at interpreter exit those can run after the CUDA
# runtime has shut down (SpeedTorch crashed there). Release CuPy tables while CUDA is alive.
_CUPY_TABLES: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _release_cupy_tables() -> None:
    for table in list(_CUPY_TABLES):
        table.array = table.pinned = table.host = None


class _Cupy:
    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device):
        cupy, cupyx = _import_cupy()
        import numpy  # noqa: PLC0415

        self.cupy, self.device = cupy, device
        self._numpy = {torch.float16: numpy.float16, torch.float32: numpy.float32, torch.float64: numpy.float64,
                       torch.int32: numpy.int32, torch.int64: numpy.int64}
        if dtype not in self._numpy:
            raise TypeError(f"the 'cupy' backend holds float16, float32 or float64 (NumPy has no {dtype})")
        with cupy.cuda.Device(device.index):
            self.pinned = cupyx.empty_pinned((rows, dim), dtype=self._numpy[dtype])
            self.pinned.fill(0)
            self.array = self._view(self.pinned.ctypes.data, self.pinned.shape, dtype, owner=self.pinned)
        self.host = torch.from_numpy(self.pinned)
        _CUPY_TABLES.add(self)

    def _view(self, ptr: int, shape: tuple[int, ...], dtype: torch.dtype, owner: object):
        """A CuPy array over memory someone else owns: no copy, no CuPy allocation."""
        np_dtype = self._numpy[dtype]
        nbytes = int(torch.Size(shape).numel()) * dtype.itemsize
        mem = self.cupy.cuda.UnownedMemory(ptr, nbytes, owner, self.device.index)
        return self.cupy.ndarray(shape, dtype=np_dtype, memptr=self.cupy.cuda.MemoryPointer(mem, 0))

    def _of(self, t: torch.Tensor):
        t = t.contiguous()
        return self._view(t.data_ptr(), tuple(t.shape), t.dtype, owner=t)

    def _stream(self):
        """torch's current stream as a CuPy stream: CuPy's kernels queue behind torch's work."""
        stream = torch.cuda.current_stream(self.device)
        if hasattr(self.cupy.cuda.Stream, "from_external") and hasattr(stream, "__cuda_stream__"):  # CuPy >= 14
            return self.cupy.cuda.Stream.from_external(stream)
        return self.cupy.cuda.ExternalStream(stream.cuda_stream, self.device.index)

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        idx = idx.to(self.device, non_blocking=True)
        out = torch.empty(idx.numel(), self.host.shape[1], dtype=self.host.dtype, device=self.device)
        with self.cupy.cuda.Device(self.device.index), self._stream():
            self.cupy.take(self.array, self._of(idx), axis=0, out=self._of(out))
        return out

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        idx = idx.to(self.device, non_blocking=True)
        values = values.to(self.device, non_blocking=True)
        with self.cupy.cuda.Device(self.device.index), self._stream():
            self.array[self._of(idx)] = self._of(values)


class _Device:
    host = None

    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device):
        self.device = device
        self.table = torch.zeros(rows, dim, dtype=dtype, device=device)

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.index_select(self.table, 0, idx.to(self.device, non_blocking=True))

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        self.table.index_copy_(0, idx.to(self.device, non_blocking=True), values.to(self.device, non_blocking=True))


_GPU_INDEXED = ("cupy", "uva", "device")
_IMPLS = {"pageable": _Pageable, "pinned": _Pinned, "cupy": _Cupy, "uva": _Uva, "device": _Device}


class HostTable:
    """A rows x dim table kept where `backend` says, read and written by row index.

    device: where `gather` delivers rows (default: the current CUDA device, else the CPU).
    Every backend but 'pageable' needs a CUDA device. The table starts as zeros.
    """

    def __init__(self, rows: int, dim: int, *, dtype: torch.dtype = torch.float32, backend: str = "pinned",
                 device: torch.device | str | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        for name, n in (("rows", rows), ("dim", dim)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
        if dtype not in _DTYPES:
            raise TypeError(f"a table holds one of {', '.join(map(str, _DTYPES))}, not {dtype}")
        dev = _default_device() if device is None else torch.device(device)
        if backend != "pageable":
            if dev.type != "cuda":
                raise ValueError(f"backend {backend!r} moves rows to a CUDA device, not {dev}; use 'pageable' on CPUs")
            if not torch.cuda.is_available():
                raise RuntimeError(f"backend {backend!r} needs CUDA, and torch sees no CUDA device")
            if dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        self.backend, self.device, self.dtype = backend, dev, dtype
        self.shape = (rows, dim)
        self._impl = _IMPLS[backend](rows, dim, dtype, dev)

    @classmethod
    def from_tensor(cls, weight: torch.Tensor, *, backend: str = "pinned",
                    device: torch.device | str | None = None) -> HostTable:
        """A table holding a copy of the 2-D `weight`."""
        if weight.dim() != 2:
            raise ValueError(f"a table is 2-D (rows x dim), got shape {tuple(weight.shape)}")
        table = cls(weight.shape[0], weight.shape[1], dtype=weight.dtype, backend=backend, device=device)
        table.copy_(weight)
        return table

    def __repr__(self) -> str:
        return f"HostTable(rows={self.shape[0]}, dim={self.shape[1]}, dtype={self.dtype}, backend={self.backend!r}, device={self.device})"

    def __reduce__(self):
        # Pickling would copy gigabytes (and CUDA views cannot travel at all): DataLoader
        # workers with the spawn start method should get indices, or rows from `cpu()`.
        raise TypeError("a HostTable cannot be pickled: send indices to worker processes and gather in the "
                        "main process, or read rows in workers from table.cpu()")

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.dtype.itemsize

    def cpu(self) -> torch.Tensor:
        """The table on the host: a view of its memory for host backends (after queued GPU writes
        to it have finished), a copy for 'device'."""
        return self._storage().cpu()

    def _storage(self) -> torch.Tensor:
        """The tensor holding the rows (host memory, or the GPU for 'device'), safe to touch
        from the host once queued GPU work on it has finished."""
        _sync(self.device)
        return self._impl.host if self._impl.host is not None else self._impl.table

    def copy_(self, src: torch.Tensor, start: int = 0) -> HostTable:
        """Write the 2-D `src` into rows start .. start + len(src)."""
        if src.dim() != 2 or src.shape[1] != self.shape[1] or not 0 <= start <= self.shape[0] - src.shape[0]:
            raise ValueError(f"cannot copy a {tuple(src.shape)} tensor into rows {start}.. of a {self.shape} table")
        if src.dtype != self.dtype:
            raise TypeError(f"the table holds {self.dtype}, got {src.dtype}: cast explicitly")
        self._storage()[start:start + src.shape[0]].copy_(src)
        return self

    def fill_(self, row: torch.Tensor) -> HostTable:
        """Set every row to `row` (dim values)."""
        row = row.reshape(1, self.shape[1]).to(self.dtype)
        target = self._storage()
        target.copy_(row.to(target.device).expand(self.shape))
        return self

    def _indices(self, indices) -> torch.Tensor:
        idx = indices if isinstance(indices, torch.Tensor) else torch.as_tensor(indices)
        if idx.dtype not in _INDEX_DTYPES:
            raise TypeError(f"indices must be int32 or int64, got {idx.dtype}")
        if idx.device.type != "cpu" and idx.device != self.device:
            raise ValueError(f"indices are on {idx.device}; a table on {self.device} takes CPU or {self.device} indices")
        if idx.numel():
            # One synchronisation, so that a bad index is an IndexError here rather than a
            # device-side assert that would poison the CUDA context.
            lo, hi = torch.stack(torch.aminmax(idx.reshape(-1))).tolist()
            if lo < 0 or hi >= self.shape[0]:
                bad = lo if lo < 0 else hi
                raise IndexError(f"index {bad} is out of range for a table of {self.shape[0]} rows")
        return idx

    def gather(self, indices) -> torch.Tensor:
        """Rows `indices` (any shape, int32/int64, on the CPU or `device`), on `device`."""
        idx = self._indices(indices)
        return self._impl.gather(idx.reshape(-1)).reshape(*idx.shape, self.shape[1])

    def scatter_(self, indices, values: torch.Tensor) -> HostTable:
        """Write `values` (shape `indices.shape + (dim,)`) to rows `indices`; the last duplicate wins."""
        idx = self._indices(indices)
        if not isinstance(values, torch.Tensor):
            raise TypeError(f"values must be a tensor, got {type(values).__name__}")
        if values.dtype != self.dtype:
            raise TypeError(f"the table holds {self.dtype}, got {values.dtype} values: cast explicitly")
        if tuple(values.shape) != (*idx.shape, self.shape[1]):
            raise ValueError(f"values for indices of shape {tuple(idx.shape)} must have shape "
                             f"{(*idx.shape, self.shape[1])}, got {tuple(values.shape)}")
        if values.device.type != "cpu" and values.device != self.device:
            raise ValueError(f"values are on {values.device}; a table on {self.device} takes CPU or {self.device} values")
        flat = values.reshape(-1, self.shape[1])
        rows, flat = last_write_wins(idx.reshape(-1).to(flat.device), flat)
        self._impl.write(rows, flat)
        return self

    def _write_unique(self, rows: torch.Tensor, values: torch.Tensor) -> None:
        """scatter_ for rows known to be distinct and in range (HostEmbedding's own writes)."""
        self._impl.write(rows, values)


class HostEmbedding(nn.Module):
    """An embedding whose table and optimizer state live in a `HostTable`, trained with any
    dense `torch.optim` optimizer.

    optimizer: called with a list of one tensor, returns the optimizer, e.g.
    `functools.partial(torch.optim.Adam, lr=1e-3)`; reach it as `.optimizer` (for LR schedulers).

    A training step is `out = emb(indices)`, backward, `emb.step()`:
      1. forward gathers the distinct rows the batch uses (sorted) onto the device, as one
         dense tensor the optimizer owns;
      2. autograd sums the gradients of duplicate indices into that tensor's rows;
      3. step() gathers the same rows of every optimizer state tensor, runs the optimizer's
         own step on them, and writes rows and state back to the host.
    **Update semantics: only the rows a batch touched change, with their own state**, as in
    `torch.optim.SparseAdam`; scalar state (Adam's step count) is shared by all rows, also as
    in SparseAdam. So SGD without momentum or weight decay equals `nn.Embedding` + SGD
    exactly; Adam equals SparseAdam up to where eps enters (SparseAdam adds it before the
    bias correction); momentum and weight decay act on touched rows only (lazy updates).
    A row's state starts as what the optimizer's step leaves after a zero gradient: the
    initial state for SGD, Adam, AdamW, RMSprop, Adagrad (its initial_accumulator_value),
    Adadelta and Adamax. One forward per step: accumulate over several batches by
    concatenating their indices.

    `state_dict()` holds the table (`weight`) and optimizer state (`optimizer.<name>`) as host
    tensors; hyper-parameters belong to the optimizer factory. Device placement is fixed at
    construction: `.to()` on the module does not move the table.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
                 *, backend: str = "pinned", device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
                 weight: torch.Tensor | None = None):
        super().__init__()
        if not callable(optimizer):
            raise TypeError("optimizer must be a callable taking a list of tensors, e.g. functools.partial(torch.optim.Adam, lr=1e-3)")
        self.table = HostTable(num_embeddings, embedding_dim, dtype=dtype, backend=backend, device=device)
        if weight is not None:
            if tuple(weight.shape) != self.table.shape:
                raise ValueError(f"weight must have shape {self.table.shape}, got {tuple(weight.shape)}")
            self.table.copy_(weight)
        else:
            self._init_normal()
        # The rows of the current step. A plain tensor, not an nn.Parameter, so that a model
        # optimizer built from model.parameters() does not update them a second time.
        self._rows_weight = torch.empty(0, embedding_dim, dtype=dtype, device=self.table.device, requires_grad=True)
        self.optimizer = optimizer([self._rows_weight])
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer(...) must return a torch.optim.Optimizer, got {type(self.optimizer).__name__}")
        self._state_tables: dict[str, HostTable] = {}
        self._rows: torch.Tensor | None = None
        # Some optimizers (Adagrad) create their state in the constructor, shaped like the
        # empty rows tensor: give those their tables now, before a step needs them.
        for key, value in self.optimizer.state.get(self._rows_weight, {}).items():
            if isinstance(value, torch.Tensor) and value.shape == self._rows_weight.shape:
                self._state_tables[key] = self._new_state_table(key)

    def _init_normal(self, chunk: int = 1 << 20) -> None:
        # N(0, 1) like nn.Embedding, generated a chunk at a time: a 10M-row table needs no
        # second full-size temporary.
        rows, dim = self.table.shape
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            self.table.copy_(torch.randn(n, dim, dtype=self.table.dtype), start)

    @property
    def num_embeddings(self) -> int:
        return self.table.shape[0]

    @property
    def embedding_dim(self) -> int:
        return self.table.shape[1]

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, backend={self.table.backend!r}, "
                f"device={self.table.device}, optimizer={type(self.optimizer).__name__}")

    def forward(self, indices) -> torch.Tensor:
        idx = self.table._indices(indices)
        if not torch.is_grad_enabled():
            return self.table.gather(idx)
        if self._rows is not None:
            raise RuntimeError("HostEmbedding ran forward twice without step(): call step() after each backward "
                               "(to accumulate several batches, concatenate their indices)")
        if self.table.backend in _GPU_INDEXED:  # these index on the GPU: find the distinct rows there too
            idx = idx.to(self.table.device, non_blocking=True)
        rows, inverse = torch.unique(idx.reshape(-1), sorted=True, return_inverse=True)
        self._swap_rows_weight(self.table.gather(rows).requires_grad_())
        self._rows = rows
        inverse = inverse.to(self.table.device, non_blocking=True).reshape(idx.shape)
        return F.embedding(inverse, self._rows_weight)

    def step(self) -> None:
        """Update the rows the last forward touched, and their optimizer state, on the host."""
        if self._rows is None:
            raise RuntimeError("step() needs a forward pass that tracked gradients first")
        rows, w = self._rows, self._rows_weight
        self._rows = None
        if w.grad is not None:
            state = self.optimizer.state.get(w)
            if state:
                for key, table in self._state_tables.items():
                    state[key] = table.gather(rows)
            self.optimizer.step()
            with torch.no_grad():
                self.table._write_unique(rows, w)
                for key, value in self.optimizer.state[w].items():
                    if isinstance(value, torch.Tensor) and value.shape == w.shape:
                        if key not in self._state_tables:
                            self._state_tables[key] = self._new_state_table(key)
                        self._state_tables[key]._write_unique(rows, value)
                        # The rows are on the host now; free the device copy until next step.
                        self.optimizer.state[w][key] = value.new_empty(0, self.embedding_dim)
        self._swap_rows_weight(w.detach().new_empty(0, self.embedding_dim).requires_grad_())

    def _swap_rows_weight(self, new: torch.Tensor) -> None:
        # A fresh leaf per step (autograd caches a leaf's shape, so resizing one in place
        # fails); the optimizer's param entry and state move over to it.
        old = self._rows_weight
        self.optimizer.param_groups[0]["params"][0] = new
        if old in self.optimizer.state:
            self.optimizer.state[new] = self.optimizer.state.pop(old)
        self._rows_weight = new

    def _new_state_table(self, key: str) -> HostTable:
        """A state table whose rows start where the optimizer's state starts (see the class doc)."""
        probe = torch.zeros(1, self.embedding_dim, dtype=self.table.dtype, device=self.table.device, requires_grad=True)
        probe.grad = torch.zeros_like(probe)
        # The same hyper-parameters as constructor arguments (Adagrad reads its initial value
        # there), leaving out what schedulers add to param groups (initial_lr, ...).
        accepted = inspect.signature(type(self.optimizer)).parameters
        group = self.optimizer.param_groups[0]
        opt = type(self.optimizer)([probe], **{k: v for k, v in group.items() if k in accepted and k != "params"})
        opt.step()
        table = HostTable(*self.table.shape, dtype=self.table.dtype, backend=self.table.backend, device=self.table.device)
        initial = opt.state[probe].get(key)
        if isinstance(initial, torch.Tensor) and initial.any():
            table.fill_(initial.detach())
        return table

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        destination[prefix + "weight"] = self.table.cpu()
        for key, value in self.optimizer.state.get(self._rows_weight, {}).items():
            table = self._state_tables.get(key)
            destination[prefix + "optimizer." + key] = table.cpu() if table is not None else value

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        mine = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        if "weight" not in mine:
            missing_keys.append(prefix + "weight")
            return
        try:
            self.table.copy_(mine.pop("weight"))
        except (ValueError, TypeError) as e:
            error_msgs.append(f"{prefix}weight: {e}")
            return
        state = {}
        for name, value in mine.items():
            if not name.startswith("optimizer."):
                unexpected_keys.append(prefix + name)
                continue
            key = name.removeprefix("optimizer.")
            if isinstance(value, torch.Tensor) and tuple(value.shape) == self.table.shape:
                self._state_tables[key] = HostTable.from_tensor(value, backend=self.table.backend, device=self.table.device)
                state[key] = value.new_empty(0, self.embedding_dim).to(self.table.device)
            else:
                state[key] = value.clone() if isinstance(value, torch.Tensor) else value
        if state:
            self.optimizer.state[self._rows_weight] = state
