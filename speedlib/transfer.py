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
  uva       the same zero-copy idea without CuPy: ordinary host memory, page-locked in place
            with cudaHostRegister (exactly the table's bytes: torch's pinned allocator rounds
            up to a power of two, 8 GiB for a 5.1 GB table), is described to torch as CUDA
            memory (the CUDA array interface), and torch's own `index_select` and
            `index_copy_` kernels read and write it in place. Unlocked when the table is freed.
  device    the whole table in GPU memory: the upper bound, when it fits.

`gather(indices)` returns a tensor on `device` shaped `indices.shape + (dim,)`, ordered on
the current CUDA stream like any other kernel's output. `scatter_(indices, values)` writes
rows back. **Duplicate indices: the last occurrence wins**, as in Python and NumPy
assignment; `index_copy_` alone leaves the winner unspecified on both CPU and GPU, so every
backend first makes duplicates carry the same row (`last_write_wins`). Bad input fails
before anything is written: out-of-range indices raise `IndexError`, non-integer indices or
values of another dtype `TypeError`, a shape or device mismatch `ValueError`. Indices may be
int32 or int64 everywhere.

`HostTable.from_file(path)` maps a 2-D `.npy` file instead of allocating (the 'pageable' and
'pinned' backends, which index on the CPU): a table larger than RAM, as SpeedTorch users
loaded embeddings with `numpy.load(..., mmap_mode=...)`. Rows are paged in on demand and
writes land in the file through the page cache; `flush()` forces them to disk.

`HostEmbedding` trains such a table with any dense `torch.optim` optimizer; see its docstring.
"""

from __future__ import annotations

import atexit
import inspect
import mmap
import os
import warnings
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
    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device, host: torch.Tensor | None = None):
        self.device = device
        self.host = torch.zeros(rows, dim, dtype=dtype) if host is None else host

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        return self.host.index_select(0, idx.cpu()).to(self.device)

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        self.host.index_copy_(0, idx.cpu(), values.cpu())


class _Pinned(_Pageable):
    """CPU indexing into pinned staging buffers, then an asynchronous copy.

    Two staging buffers take turns, so indexing the next batch on the CPU can overlap the
    copy of the previous one; an event per buffer says when its copy has finished reading it.
    """

    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device, host: torch.Tensor | None = None):
        super().__init__(rows, dim, dtype, device, host)
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


# cudaHostRegisterPortable | cudaHostRegisterMapped: locked for every CUDA context, and mapped
# into the devices' address space so kernels can dereference it (zero-copy).
_HOST_REGISTER_FLAGS = 1 | 2


def _cuda_call(result, what: str) -> None:
    if int(result) != 0:  # cudaSuccess
        raise RuntimeError(f"{what} failed with cudaError {int(result)}")


def _unregister_host(ptr: int, device: torch.device, pid: int) -> None:
    if os.getpid() != pid:  # a forked child's copy: the registration belongs to the parent
        return
    _sync(device)  # GPU kernels queued on the mapped rows finish before the pages are unlocked
    _cuda_call(torch.cuda.cudart().cudaHostUnregister(ptr), "cudaHostUnregister")


def _locked_zeros(rows: int, dim: int, dtype: torch.dtype, device: torch.device, owner: object) -> torch.Tensor:
    """A zeroed rows x dim host tensor, page-locked with cudaHostRegister until `owner` is freed
    (or the interpreter exits, while CUDA is still up: weakref.finalize runs at exit).

    torch's pinned allocator rounds every allocation up to a power of two; registering
    memory of our own locks exactly rows * dim * itemsize bytes. The memory is an anonymous
    shared mapping: page-aligned, so no neighbour's page is locked with it, and not
    copy-on-write, so a fork (DataLoader workers) cannot move a page away from the one the
    GPU holds locked.
    """
    nbytes = rows * dim * dtype.itemsize
    # Zeros already (a fresh mapping), and registering faults every page in: no memset needed.
    host = torch.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED), dtype=dtype).view(rows, dim)
    cudart = torch.cuda.cudart()
    with torch.cuda.device(device):  # CUDA records the current device as the memory's, which torch.as_tensor reads
        _cuda_call(cudart.cudaHostRegister(host.data_ptr(), nbytes, _HOST_REGISTER_FLAGS), "cudaHostRegister")
    weakref.finalize(owner, _unregister_host, host.data_ptr(), device, os.getpid())
    return host


class _Uva:
    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device):
        self.device = device
        self.host = _locked_zeros(rows, dim, dtype, device, owner=self)
        view = torch.as_tensor(_MappedHost(self.host)).view(dtype)
        if view.device != device or view.data_ptr() != self.host.data_ptr():
            raise RuntimeError(f"the registered table was not mapped in place onto {device} (got {view.device}); "
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
# runtime has shut down (SpeedTorch crashed there). Release CuPy tables while CUDA is alive,
# then the blocks CuPy's pools keep cached (a released table's pinned memory lands there).
_CUPY_TABLES: weakref.WeakSet = weakref.WeakSet()
# CuPy once a table has used it. Pools of a CuPy that no table used are left alone: freeing
# them would make CUDA calls at exit in a process that may never have initialised CUDA.
_cupy = None


@atexit.register
def _release_cupy_tables() -> None:
    for table in list(_CUPY_TABLES):
        table.array = table.pinned = table.host = None
    if _cupy is not None:
        _cupy.get_default_pinned_memory_pool().free_all_blocks()
        _cupy.get_default_memory_pool().free_all_blocks()  # temporaries of CuPy's indexing kernels


class _Cupy:
    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device):
        global _cupy  # noqa: PLW0603 - the exit hook frees its pools
        cupy, cupyx = _import_cupy()
        _cupy = cupy
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
# The backends whose table is an ordinary CPU tensor indexed by the CPU, so it can be any
# host memory, a file mapping included; the others need pinned or GPU memory of their own.
_MAPPABLE = ("pageable", "pinned")


class HostTable:
    """A rows x dim table kept where `backend` says, read and written by row index.

    device: where `gather` delivers rows (default: the current CUDA device, else the CPU).
    Every backend but 'pageable' needs a CUDA device. The table starts as zeros.
    `writable` is False for a table mapped read-only from a file (`from_file(mode="r")`).
    """

    def __init__(self, rows: int, dim: int, *, dtype: torch.dtype = torch.float32, backend: str = "pinned",
                 device: torch.device | str | None = None, _host: torch.Tensor | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        for name, n in (("rows", rows), ("dim", dim)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
        if dtype not in _DTYPES:
            raise TypeError(f"a table holds one of {', '.join(map(str, _DTYPES))}, not {dtype}")
        dev = _default_device() if device is None else torch.device(device)
        if backend != "pageable" and dev.type != "cuda":
            raise ValueError(f"backend {backend!r} moves rows to a CUDA device, not {dev}; use 'pageable' on CPUs")
        if dev.type == "cuda" and not torch.cuda.is_available():
            # Here, not at the first gather: a 'pageable' table would otherwise be built and
            # fail later with torch's own message about the CUDA build.
            raise RuntimeError(f"backend {backend!r} needs CUDA, and torch sees no CUDA device"
                               + (": use device='cpu' for a table on this machine" if backend == "pageable" else ""))
        if dev.type == "cuda" and dev.index is None:
            # 'cuda' and 'cuda:0' are the same device but compare unequal: name the index, so
            # that indices and values made on the current device pass the device check.
            dev = torch.device("cuda", torch.cuda.current_device())
        self.backend, self.device, self.dtype = backend, dev, dtype
        self.shape = (rows, dim)
        self.writable, self.file, self._mmap = True, None, None
        self._trainer: weakref.ref | None = None  # the HostEmbedding training this table, if any
        try:
            self._impl = _IMPLS[backend](rows, dim, dtype, dev, *(() if _host is None else (_host,)))
        except (RuntimeError, MemoryError) as e:  # torch's allocator names neither the table nor a way out
            if _host is not None or "alloc" not in str(e).lower():
                raise
            size = rows * dim * torch.empty((), dtype=dtype).element_size()
            raise MemoryError(f"a {rows} x {dim} {dtype} table needs {size / 2**30:.3g} GiB, which the '{backend}' "
                              "backend could not allocate here: fewer rows, a smaller dtype, or a file-backed "
                              "table (HostTable.from_file) for one larger than memory") from None

    @classmethod
    def from_tensor(cls, weight: torch.Tensor, *, backend: str = "pinned",
                    device: torch.device | str | None = None) -> HostTable:
        """A table holding a copy of the 2-D `weight`."""
        if weight.dim() != 2:
            raise ValueError(f"a table is 2-D (rows x dim), got shape {tuple(weight.shape)}")
        table = cls(weight.shape[0], weight.shape[1], dtype=weight.dtype, backend=backend, device=device)
        table.copy_(weight)
        return table

    @classmethod
    def from_file(cls, file, *, mode: str = "r+", backend: str = "pinned",
                  device: torch.device | str | None = None) -> HostTable:
        """A table that *is* a 2-D `.npy` file, memory-mapped rather than read into RAM.

        file: a path, or a `numpy.memmap` already open (`numpy.load(path, mmap_mode="r+")`;
        `mode` is then the array's own). mode "r+": training writes go to the file; "r": a
        read-only table (lookups only; writes raise). Only 'pageable' and 'pinned' can map a
        file: they index it on the CPU, so the kernel pages in just the rows a batch needs.
        Written rows reach the file through the page cache (other processes mapping it see
        them at once); the OS writes them to disk in its own time, and at the latest when the
        mapping closes: call `flush()` to force that (before copying the file, say). Create a
        new file with `numpy.lib.format.open_memmap(path, mode="w+", dtype=..., shape=(rows, dim))`.
        """
        import numpy as np  # noqa: PLC0415 - only file-backed tables need it

        if backend in BACKENDS and backend not in _MAPPABLE:
            raise ValueError(f"backend {backend!r} keeps the table in memory of its own; only "
                             f"{' and '.join(map(repr, _MAPPABLE))} can map a file")
        if isinstance(file, np.memmap):
            array, name = file, getattr(file, "filename", None) or "the memmap"
        elif isinstance(file, (str, os.PathLike)):
            if mode not in ("r", "r+"):
                raise ValueError(f"mode must be 'r+' (train, writing to the file) or 'r' (read-only), got {mode!r}")
            name = os.fspath(file)
            if not os.path.isfile(name):
                raise FileNotFoundError(f"no file {name!r}; create one with numpy.lib.format.open_memmap("
                                        "path, mode='w+', dtype=numpy.float32, shape=(rows, dim))")
            try:
                array = np.load(name, mmap_mode=mode, allow_pickle=False)
            except ValueError as e:
                raise ValueError(f"{name!r} is not a .npy array of numbers: {e}") from e
            if not isinstance(array, np.memmap):
                raise ValueError(f"{name!r} is not a single .npy array (an .npz archive holds several)")
        else:
            raise TypeError(f"file must be a path to a .npy file or a numpy.memmap, got {type(file).__name__}")
        if array.ndim != 2:
            raise ValueError(f"{name}: a table is 2-D (rows x dim), got shape {array.shape}")
        if not array.flags.c_contiguous:  # rows must be contiguous to be read and written as rows
            raise ValueError(f"{name}: the array must be C-contiguous (row-major), not Fortran-ordered or strided")
        if array.dtype not in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)):  # native byte order
            raise TypeError(f"{name}: a table holds native-endian float16, float32 or float64, not {array.dtype}")
        with warnings.catch_warnings():
            # torch warns that writing to a read-only array is undefined: writable=False
            # below makes every write path refuse instead.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            host = torch.from_numpy(array)
        table = cls(*array.shape, dtype=host.dtype, backend=backend, device=device, _host=host)
        table.writable, table.file, table._mmap = bool(array.flags.writeable), name, array
        return table

    def flush(self) -> None:
        """Write the changed pages of a file-backed table to disk now (msync); otherwise nothing."""
        if self._mmap is not None and self.writable:
            _sync(self.device)
            self._mmap.flush()

    def _check_writable(self) -> None:
        if not self.writable:
            raise ValueError(f"this table maps {self.file!r} read-only: open it with mode 'r+' to write to it")

    def __repr__(self) -> str:
        file = "" if self.file is None else f", file={self.file!r}{'' if self.writable else ' (read-only)'}"
        return (f"HostTable(rows={self.shape[0]}, dim={self.shape[1]}, dtype={self.dtype}, backend={self.backend!r}, "
                f"device={self.device}{file})")

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
        self._check_writable()
        self._storage()[start:start + src.shape[0]].copy_(src)
        return self

    def fill_(self, row) -> HostTable:
        """Set every row to `row`: dim values (a tensor, a NumPy array or a list), or one number
        for every value as `Tensor.fill_` takes; converted to the table's dtype."""
        row = self._fill_row(row)
        self._check_writable()
        target = self._storage()
        target.copy_(row.to(target.device).expand(self.shape))
        return self

    def _fill_row(self, row) -> torch.Tensor:
        """`row` as a 1 x dim tensor of the table's dtype, checked before anything is written."""
        if isinstance(row, torch.Tensor):
            values = row.detach()  # filling a table is no step of a graph
        else:
            try:
                values = torch.as_tensor(row)
            except (TypeError, ValueError, RuntimeError):
                values = None
        # Real numbers only: a cast to the table's dtype would drop an imaginary part silently,
        # and True/False are no values of an embedding.
        if values is None or values.dtype == torch.bool or values.is_complex():
            what = type(row).__name__ if values is None else f"{type(row).__name__} of {values.dtype}"
            raise TypeError(f"a row must be a tensor, a list or array of numbers, or a number, got {what}")
        dim = self.shape[1]
        if values.numel() == 1:
            values = values.reshape(1).expand(dim)
        if values.numel() != dim:
            raise ValueError(f"fill_ takes {dim} values (one row) or one number, got {values.numel()} values "
                             f"(shape {tuple(values.shape)}); write several rows with copy_ or scatter_")
        return values.reshape(1, dim).to(self.dtype)

    def _indices(self, indices) -> torch.Tensor:
        if isinstance(indices, torch.Tensor):
            idx = indices
        else:
            try:
                idx = torch.as_tensor(indices)
            except (TypeError, ValueError, RuntimeError) as e:
                raise TypeError(f"indices must be a tensor or a list of ints, got {type(indices).__name__}: {e}") from None
            if idx.numel() == 0:
                # torch reads an empty list as float32, which would be refused below with a
                # message about the dtype: name the actual problem.
                raise ValueError(f"indices is an empty {type(indices).__name__}; to gather or write no rows pass "
                                 "torch.empty(0, dtype=torch.int64)")
        if idx.dtype not in _INDEX_DTYPES:
            hint = ("; floating-point indices are not row numbers: convert whole numbers with .long()"
                    if idx.is_floating_point() else "")
            raise TypeError(f"indices must be int32 or int64, got {idx.dtype}{hint}")
        if idx.device.type != "cpu" and idx.device != self.device:
            raise ValueError(f"indices are on {idx.device}; a table on {self.device} takes CPU or {self.device} indices")
        if idx.numel():
            # One synchronisation, so that a bad index is an IndexError here rather than a
            # device-side assert that would poison the CUDA context.
            lo, hi = torch.stack(torch.aminmax(idx.reshape(-1))).tolist()
            if lo < 0 or hi >= self.shape[0]:
                bad = lo if lo < 0 else hi
                raise IndexError(f"index {bad} is out of range for a table of {self.shape[0]} rows")
        # int64 from here on: index_copy_ (every backend's write, CPU and CUDA) takes no int32,
        # and HostEmbedding's rows come from these indices, so its step() would fail too.
        return idx.to(torch.int64)

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
        self._check_writable()
        flat = values.reshape(-1, self.shape[1])
        rows, flat = last_write_wins(idx.reshape(-1).to(flat.device), flat)
        self._impl.write(rows, flat)
        return self

    def _write_unique(self, rows: torch.Tensor, values: torch.Tensor) -> None:
        """scatter_ for rows known to be distinct and in range (HostEmbedding's own writes)."""
        self._check_writable()
        self._impl.write(rows, values)


def _world_size() -> int:
    """The default process group's size, 1 when torch.distributed is not in use."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _step_hooks(emb_ref: weakref.ref):
    """Optimizer step pre- and post-hooks that make any step of a HostEmbedding's optimizer
    (emb.step(), a direct `emb.optimizer.step()`, `scaler.step(emb.optimizer)`) one step of
    the embedding: the optimizer's parameter is a copy of the touched rows, which must be
    gathered with their state before the update and written back after it. Weak references,
    so the module is not kept alive by its own optimizer's hooks."""
    def before(optimizer, args, kwargs):
        emb = emb_ref()
        if emb is not None and not emb._stepping:  # emb.step() prepares before it steps
            emb._prepare_step()

    def after(optimizer, args, kwargs):
        emb = emb_ref()
        if emb is not None:
            emb._finish_step()
    return before, after


_TIE_MESSAGE = (
    "HostEmbedding's table (emb.weight) was used in a computation that needs its gradient, which it "
    "would not get: only lookups emb(indices) train the table, so a layer tied to emb.weight (or to an "
    "nn.Parameter made from it) would silently stay untied. To tie an output layer, look the whole "
    "table up: F.linear(h, emb(torch.arange(emb.num_embeddings))) trains it as tying does (the whole "
    "table travels to the device each step), or score sampled candidate rows emb(candidate_ids). "
    "To use the values as a constant, take emb.weight.as_subclass(torch.Tensor).clone()")


class _TableWeight(torch.Tensor):
    """`HostEmbedding.weight`: the table's own memory as a tensor, so that in-place
    initialisation (`.data.uniform_`, `.normal_`, `.copy_`, `nn.init.*`) writes the rows.

    It is no leaf of any graph: nn.Embedding's weight would receive a gradient from every
    computation that uses it, this one cannot. So an operation under grad mode that mixes it
    (or a tensor derived from it: results keep this type) with tensors requiring grad raises
    instead of training silently without it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.is_grad_enabled() and _needs_grad(args, kwargs):
            raise RuntimeError(_TIE_MESSAGE)
        return super().__torch_function__(func, types, args, kwargs)


def _needs_grad(args, kwargs) -> bool:
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    with torch._C.DisableTorchFunctionSubclass():  # reading requires_grad is itself a torch function
        return any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves)


class HostEmbedding(nn.Module):
    """An embedding whose table and optimizer state live in a `HostTable`, trained with any
    dense `torch.optim` optimizer.

    optimizer: called with a list of one tensor, returns the optimizer, e.g.
    `functools.partial(torch.optim.Adam, lr=1e-3)`; reach it as `.optimizer` (for LR schedulers).
    Stepping it (`emb.optimizer.step()`, a loop stepping every optimizer, or
    `scaler.step(emb.optimizer)` under AMP's GradScaler, which unscales, checks for infs and
    skips as for any optimizer) is `emb.step()`: step hooks gather the touched rows and their
    state before the update and write them back after it.
    weight: a tensor to copy into the table, or a `HostTable` to train in place (no copy,
    e.g. `HostTable.from_file`; it brings its own backend, device and dtype, so leave those
    unset). Without one, rows start N(0, 1) as in `nn.Embedding`. A table is trained by one
    non-frozen HostEmbedding at a time (a second one raises ValueError); frozen ones may
    share it. For tied weights, look one HostEmbedding up several times per step.

    A training step is any number of lookups, backward, `emb.step()`:
      1. each forward gathers the distinct rows its indices use onto the device as a leaf
         tensor of its own, so lookups of one step need not know about each other;
      2. when backward reaches a leaf, its gradient is added by row into the step's
         gradient (a post-accumulate-grad hook), so a row several lookups share gets the sum
         of their gradients, as `nn.Embedding` would;
      3. step() gathers the same rows of every optimizer state tensor, runs the optimizer's
         own step on them (each touched row updated once), and writes rows and state back.
    Word2vec's `emb(pos)`, `emb(neg)`, one backward, one step() is therefore one step.
    **Update semantics: only rows that received a gradient change, with their own state**, as
    in `torch.optim.SparseAdam`; scalar state (Adam's step count) is shared by all rows, also
    as in SparseAdam. So SGD without momentum or weight decay equals `nn.Embedding` + SGD
    exactly; Adam(eps) is exactly SparseAdam whose eps at step t is eps * sqrt(1 - beta2**t)
    (SparseAdam adds eps before dividing by that bias correction, Adam after), so it is close
    to SparseAdam with the same eps only where gradients are far above eps; momentum and
    weight decay act on touched rows only (lazy updates).
    A row's state starts as what the optimizer's step leaves after a zero gradient: the
    initial state for SGD, Adam, AdamW, RMSprop, Adagrad (its initial_accumulator_value),
    Adadelta and Adamax.

    Lookups that never see a backward (evaluation without `torch.no_grad()`, a loss that is
    dropped) touch nothing: no gradient reaches their rows, so step() leaves those rows and
    their state alone, and their leaves are freed with their outputs. step() with no gradient
    at all changes nothing; in one process it raises if no lookup tracked gradients since
    the last step (a forward under no_grad followed by step() is a bug). `zero_grad()`
    drops the gradients gathered so far without applying them. A gradient that arrives after step()
    (from an output looked up before it) is applied at the next step() to the rows' current
    values, as a dense parameter's would be.

    padding_idx: as in `nn.Embedding` (negative values count from the end): lookups return
    that row, it gets no gradient and is never written, not even by momentum or weight
    decay; random initialisation sets it to zeros. freeze=True: lookups return rows that do
    not require grad, and step() writes nothing (it drops pending gradients); the setter
    `emb.freeze = False` unfreezes. See `from_pretrained`. max_norm, norm_type,
    scale_grad_by_freq: as in `nn.Embedding` (max_norm rewrites looked-up rows in the table);
    sparse=True is the update this class always does, sparse=False is refused. A tensor
    `weight` sets the dtype unless `dtype` is given. `emb.weight`: the table's memory, for
    in-place initialisation and reading; see the property.

    Gradient clipping: `emb.touched_rows()` after the last backward returns the dense tensor
    holding this step's rows, whose `.grad` is their summed gradient, so
    `clip_grad_norm_([*model.parameters(), emb.touched_rows()], max_norm)` then `emb.step()`
    clips as for `nn.Embedding` (rows no lookup touched have zero gradient and add nothing
    to the norm). The same holds for any code that reads or scales gradients before step().

    DistributedDataParallel: the table holds no `nn.Parameter`, so DDP never sees it; this
    module does the part DDP would. With `process_group` (default: the default group when
    torch.distributed is initialised with more than one rank at construction), construction
    makes every rank's table equal to rank 0's (chunks that differ are copied from it, as
    DDP broadcasts parameters), and step() (or touched_rows()) all-gathers every rank's rows
    and gradients, sums them by row, divides by the world size like DDP's averaging, and
    every rank applies the same update to the union of rows: one process on the global
    batch, when the loss is a mean over the local batch. Construction, step() and
    touched_rows() are collectives then: call them on every rank. Gloo communicates CPU tensors, NCCL CUDA tensors. An embedding built before
    init_process_group refuses to step on more than one rank; pass a single-rank group
    (`dist.new_group([rank])`) to train each rank's table on its own.

    Memory-mapped tables: train a `HostTable.from_file` table (or pass a `.npy` path or
    `numpy.memmap` to `from_pretrained`) and its rows are updated in the file. Optimizer
    state tables are ordinary RAM, the size of the table each (Adam: two), and are saved
    through `state_dict()`.

    `state_dict()` holds the table (`weight`) and optimizer state (`optimizer.<name>`) as host
    tensors; hyper-parameters belong to the optimizer factory. Loading replaces the optimizer
    state with the loaded one, an entry absent (a state saved before the first step) with
    its fresh value. An embedding without an optimizer (frozen, for inference) loads the
    weight and ignores `optimizer.*` entries. Device placement is fixed at construction:
    `.to()` on the module does not move the table.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None,
                 *, backend: str | None = None, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 weight: torch.Tensor | HostTable | None = None, padding_idx: int | None = None, freeze: bool = False,
                 process_group=None, max_norm: float | None = None, norm_type: float = 2.0,
                 scale_grad_by_freq: bool = False, sparse: bool | None = None):
        super().__init__()
        self._check_embedding_options(max_norm, sparse)
        if optimizer is None:
            if not freeze:
                raise ValueError("optimizer=None is for frozen embeddings only (freeze=True): training needs an optimizer")
        elif not callable(optimizer):
            raise TypeError("optimizer must be a callable taking a list of tensors, e.g. functools.partial(torch.optim.Adam, lr=1e-3)")
        pad = self._padding_index(padding_idx, num_embeddings)
        if isinstance(weight, HostTable):
            if (backend, device, dtype) != (None, None, None):
                raise ValueError("a HostTable weight brings its own backend, device and dtype: leave those unset")
            if weight.shape != (num_embeddings, embedding_dim):
                raise ValueError(f"weight must have shape {(num_embeddings, embedding_dim)}, got {weight.shape}")
            self.table = weight
        else:
            if weight is not None and tuple(weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(f"weight must have shape {(num_embeddings, embedding_dim)}, got {tuple(weight.shape)}")
            if dtype is None:  # as nn.Embedding.from_pretrained, the table takes the weight's dtype
                dtype = weight.dtype if weight is not None else torch.float32
            self.table = HostTable(num_embeddings, embedding_dim, dtype=dtype,
                                   backend=backend or "pinned", device=device)
            if weight is not None:
                self.table.copy_(weight)
            else:
                self._init_normal()
                if pad is not None:  # as nn.Embedding's reset_parameters does
                    self.table.copy_(torch.zeros(1, embedding_dim, dtype=self.table.dtype), pad)
        self.padding_idx = pad
        if max_norm is not None and not self.table.writable:
            raise ValueError(f"max_norm renormalises looked-up rows in the table, which maps {self.table.file!r} "
                             "read-only: open it with mode 'r+', or leave max_norm unset")
        self.max_norm, self.norm_type, self.scale_grad_by_freq = max_norm, norm_type, bool(scale_grad_by_freq)
        self.sparse = True  # its update is always sparse=True's (only touched rows change)
        # The rows of the current step. A plain tensor, not an nn.Parameter, so that a model
        # optimizer built from model.parameters() does not update them a second time.
        self._rows_weight = torch.empty(0, embedding_dim, dtype=self.table.dtype, device=self.table.device,
                                        requires_grad=True)
        self.optimizer = None if optimizer is None else optimizer([self._rows_weight])
        if optimizer is not None and not isinstance(self.optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer(...) must return a torch.optim.Optimizer, got {type(self.optimizer).__name__}")
        self._stepping = False  # emb.step() is running the optimizer
        if self.optimizer is not None:
            before, after = _step_hooks(weakref.ref(self))
            self.optimizer.register_step_pre_hook(before)
            self.optimizer.register_step_post_hook(after)
        self._freeze = False
        self.freeze = freeze  # the setter checks that the table can be trained
        self._state_tables: dict[str, HostTable] = {}
        self._rows: torch.Tensor | None = None  # the rows holding gradient this step (sorted, distinct)
        self._tracked = False  # a lookup tracked gradients since the last step
        self._generation = 0  # counts table changes: a lookup's rows are stale once the table has changed
        self._rows_generation = 0  # the generation whose values _rows_weight holds
        self._combined = False  # this step's gradients are already summed over the ranks
        # Some optimizers (Adagrad) create their state in the constructor, shaped like the
        # empty rows tensor: give those their tables now, before a step needs them.
        fresh = self.optimizer.state.get(self._rows_weight, {}) if self.optimizer else {}
        for key, value in fresh.items():
            if isinstance(value, torch.Tensor) and value.shape == self._rows_weight.shape:
                self._state_tables[key] = self._new_state_table(key)
        # What load_state_dict restores for entries a state_dict lacks.
        self._fresh_state = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in fresh.items()}
        self._group_given = process_group is not None
        if process_group is None and _world_size() > 1:
            process_group = torch.distributed.group.WORLD
        self._group = None
        if process_group is not None and torch.distributed.get_world_size(process_group) > 1:
            self._group = process_group
            self._copy_rank0_table()

    @classmethod
    def from_pretrained(cls, embeddings, optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None = None,
                        *, freeze: bool = True, padding_idx: int | None = None, backend: str | None = None,
                        device: torch.device | str | None = None, process_group=None, max_norm: float | None = None,
                        norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                        sparse: bool | None = None) -> HostEmbedding:
        """An embedding holding `embeddings`, like `nn.Embedding.from_pretrained` (frozen by default).

        embeddings: a 2-D tensor or NumPy array, copied into a table of `backend` (default
        'pinned') with its dtype; a `HostTable`, used as is; or a `.npy` path or
        `numpy.memmap`, mapped rather than copied (`HostTable.from_file`: 'pageable' or
        'pinned'; a path opens read-only when frozen, read-write otherwise).
        The padding row keeps its pretrained value, as in nn.Embedding.
        """
        import numpy as np  # noqa: PLC0415 - torch needs it for from_numpy anyway

        if isinstance(embeddings, (str, os.PathLike, np.memmap)):
            embeddings = HostTable.from_file(embeddings, mode="r" if freeze else "r+", backend=backend or "pinned",
                                             device=device)
            backend = device = None
        elif isinstance(embeddings, np.ndarray):
            embeddings = torch.from_numpy(embeddings)
        if isinstance(embeddings, HostTable):
            shape, dtype = embeddings.shape, None
        elif isinstance(embeddings, torch.Tensor):
            if embeddings.dim() != 2:
                raise ValueError(f"embeddings must be 2-D (rows x dim), got shape {tuple(embeddings.shape)}")
            shape, dtype = tuple(embeddings.shape), embeddings.dtype
        else:
            raise TypeError("embeddings must be a tensor, a NumPy array, a HostTable, or a .npy path / numpy.memmap, "
                            f"got {type(embeddings).__name__}")
        return cls(*shape, optimizer, backend=backend, device=device, dtype=dtype, weight=embeddings,
                   padding_idx=padding_idx, freeze=freeze, process_group=process_group, max_norm=max_norm,
                   norm_type=norm_type, scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)

    @staticmethod
    def _check_embedding_options(max_norm, sparse) -> None:
        if sparse is not None and not sparse:
            raise ValueError("sparse=False asks for nn.Embedding's dense update, which changes every row each step; "
                             "HostEmbedding updates only the rows a batch touched (sparse=True's semantics, as with "
                             "SparseAdam), since a dense update would move the whole table to the device every "
                             "step: leave sparse unset or pass sparse=True")
        if max_norm is not None and not (isinstance(max_norm, (int, float)) and max_norm > 0):
            raise ValueError(f"max_norm must be positive (rows with a larger norm are scaled down to it), got {max_norm!r}")

    @staticmethod
    def _padding_index(padding_idx, rows: int) -> int | None:
        if padding_idx is None:
            return None
        if not isinstance(padding_idx, int) or isinstance(padding_idx, bool):
            raise TypeError(f"padding_idx must be an int or None, got {padding_idx!r}")
        if not -rows <= padding_idx < rows:
            raise ValueError(f"padding_idx must be within num_embeddings: -{rows} <= padding_idx < {rows}, got {padding_idx}")
        return padding_idx % rows  # negative counts from the end, as in nn.Embedding

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

    @property
    def weight(self) -> torch.Tensor:
        """The table's memory as a (rows, dim) tensor, for in-place initialisation and reading
        (`emb.weight.data.uniform_(-0.1, 0.1)`, `nn.init.normal_(emb.weight)`, `.copy_(w)`).
        Not a parameter: only lookups train the table, and using it where a gradient would be
        needed (tying another layer to it) raises, naming the tie that works."""
        if not self.table.writable:
            # A write through a view of a read-only mapping would crash the process, not raise.
            raise ValueError(f"the table maps {self.table.file!r} read-only, so it has no writable weight: read "
                             "rows with emb.table.gather(indices), or open the file with mode 'r+'")
        # Writes through the view change rows that pending gradients and lookups gathered:
        # step() and backward re-gather them (as nn.Embedding's step sees its weight as it is).
        self._generation += 1
        return self.table._storage().as_subclass(_TableWeight)

    def __setattr__(self, name: str, value) -> None:
        if name == "weight":  # nn.Module would otherwise report "attribute 'weight' already exists"
            raise AttributeError("HostEmbedding.weight cannot be replaced: it is the host table itself. Write new "
                                 "values into it with emb.weight.data.copy_(w), or build the embedding with weight=w "
                                 "(HostEmbedding.from_pretrained(w, ...))")
        super().__setattr__(name, value)

    @property
    def freeze(self) -> bool:
        """True: lookups only (no gradients), step() writes nothing."""
        return self._freeze

    @freeze.setter
    def freeze(self, value: bool) -> None:
        if not value and self.optimizer is None:
            raise ValueError("this embedding was built without an optimizer (optimizer=None), so it can only be frozen")
        if not value and not self.table.writable:
            raise ValueError(f"the table maps {self.table.file!r} read-only and cannot be trained: "
                             "open it with mode 'r+' (numpy.load(path, mmap_mode='r+'))")
        if not value:
            # Two trainers of one table would each write back rows gathered before the
            # other's step(), silently losing its update.
            other = self.table._trainer() if self.table._trainer is not None else None
            if other is not None and other is not self and not other.freeze:
                raise ValueError("this HostTable is already trained by another HostEmbedding, and two would each "
                                 "overwrite the other's updates: look one HostEmbedding up several times per step "
                                 "(emb(a), emb(b), one backward, one emb.step()), or freeze the other first")
            self.table._trainer = weakref.ref(self)
        self._freeze = bool(value)

    def extra_repr(self) -> str:
        extra = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        extra += ", freeze=True" if self.freeze else ""
        extra += "" if self.max_norm is None else f", max_norm={self.max_norm}, norm_type={self.norm_type}"
        extra += ", scale_grad_by_freq=True" if self.scale_grad_by_freq else ""
        return (f"{self.num_embeddings}, {self.embedding_dim}{extra}, backend={self.table.backend!r}, "
                f"device={self.table.device}, optimizer={type(self.optimizer).__name__ if self.optimizer else None}")

    def forward(self, indices) -> torch.Tensor:
        idx = self.table._indices(indices)
        track = not self.freeze and torch.is_grad_enabled()
        if not track and self.max_norm is None:
            return self.table.gather(idx)
        if self.table.backend in _GPU_INDEXED:  # these index on the GPU: find the distinct rows there too
            idx = idx.to(self.table.device, non_blocking=True)
        rows, inverse = torch.unique(idx.reshape(-1), sorted=True, return_inverse=True)
        values = self.table.gather(rows)
        if self.max_norm is not None:
            self._renorm(rows, values)
        inverse = inverse.to(self.table.device, non_blocking=True).reshape(idx.shape)
        if not track:
            return F.embedding(inverse, values)
        self._tracked = True
        leaf = values.requires_grad_()
        # Nothing here keeps the leaf: a lookup that never sees a backward is freed with its
        # output. One that does hands its gradient over in the hook.
        generation = self._generation
        leaf.register_post_accumulate_grad_hook(lambda t: self._accumulate(rows, t, generation))
        # Distinct rows have the frequencies of the indices they stand for, so scaling by
        # the frequency of `inverse` is nn.Embedding's scaling by index frequency.
        return F.embedding(inverse, leaf, scale_grad_by_freq=self.scale_grad_by_freq)

    def _renorm(self, rows: torch.Tensor, values: torch.Tensor) -> None:
        """nn.Embedding's max_norm: looked-up rows whose norm exceeds it are scaled down, in the
        table too (with torch's own renorm kernel, so the values are nn.Embedding's)."""
        before = values.clone()
        torch.embedding_renorm_(values, torch.arange(rows.numel(), device=values.device), self.max_norm, self.norm_type)
        changed = (values != before).any(1)
        if changed.any():  # write back only what changed: a memory-mapped table stays clean otherwise
            self.table._write_unique(rows[changed.to(rows.device)], values[changed])
            self._generation += 1  # rows gathered before (pending gradients, other lookups) are stale

    def _accumulate(self, rows: torch.Tensor, leaf: torch.Tensor, generation: int) -> None:
        """Add a lookup's gradient into the step's rows (union) and gradient (summed by row)."""
        if self._combined:
            raise RuntimeError("a backward reached HostEmbedding after touched_rows() combined this step's "
                               "gradients over the ranks: call touched_rows() after the last backward")
        grad, leaf.grad = leaf.grad, None  # taken over: a second backward adds only its own
        values = leaf.detach()
        if self.padding_idx is not None:  # the padding row never trains: it is not a touched row
            keep = rows != self.padding_idx
            rows, keep = rows[keep], keep.to(grad.device)
            grad, values = grad[keep], values[keep]
        if generation != self._generation:  # step() ran since the lookup: use the current rows
            values = self.table.gather(rows)
        if self._rows is not None and self._rows_weight.grad is None:
            # emb.optimizer.zero_grad() dropped the pending gradient (a step GradScaler skipped):
            # those rows got no gradient since, so they are no touched rows any more.
            self._rows = None
        if self._rows is not None:
            old = self._rows_weight
            n = self._rows.numel()
            rows, where = torch.unique(torch.cat([self._rows, rows]), sorted=True, return_inverse=True)
            where = where.to(grad.device)
            # Positions are distinct within each index_add_, so the sums are deterministic
            # on GPUs too: (0 + old) + new, in lookup order.
            values = values.new_empty(rows.numel(), self.embedding_dim).index_copy_(0, where[:n], old.detach()) \
                .index_copy_(0, where[n:], values)
            grad = torch.zeros_like(values).index_add_(0, where[:n], old.grad).index_add_(0, where[n:], grad)
        if self._rows is not None and self._rows_generation != self._generation:
            self._rows_generation = -1  # the earlier rows' values are stale: step() re-gathers
        else:
            self._rows_generation = self._generation
        self._rows = rows
        weight = values.requires_grad_()
        weight.grad = grad
        self._swap_rows_weight(weight)

    def touched_rows(self) -> torch.Tensor:
        """This step's rows as a dense tensor whose `.grad` is their gradient (None before
        any backward), for gradient clipping: `clip_grad_norm_([*params, emb.touched_rows()])`.

        Call it after the last backward of the step; step() applies the `.grad` as it then
        is. Distributed, this combines the ranks' gradients (a collective: every rank calls it).
        """
        if self.freeze:
            return self._rows_weight
        group = self._process_group()
        if group is not None and not self._combined:
            self._combine(group)
        return self._rows_weight

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients gathered since the last step() without applying them (a parent
        module's zero_grad() does not reach here: it only visits parameters)."""
        self._rows, self._combined = None, False
        self._swap_rows_weight(self._rows_weight.detach().new_empty(0, self.embedding_dim).requires_grad_())

    def step(self) -> None:
        """Update the rows that received gradients since the last step, and their optimizer state.

        The same as `emb.optimizer.step()` (which `scaler.step(emb.optimizer)` calls), except
        that it raises when no lookup tracked gradients since the last step."""
        if self.freeze:
            self.zero_grad()
            return
        # Distributed, a rank without lookups still joins its peers' collective: no error there.
        if self._rows is None and not self._tracked and self._group is None:
            raise RuntimeError("step() needs a forward pass that tracked gradients first (or the optimizer was "
                               "already stepped since: emb.optimizer.step() and scaler.step(emb.optimizer) "
                               "are emb.step() too, so call one of them per step)")
        self._stepping = True
        try:
            self._prepare_step()
            if self._rows is not None and self._rows.numel():
                self.optimizer.step()  # through the optimizer, so LR schedulers see the step
            else:
                self._finish_step()
        finally:
            self._stepping = False

    def _prepare_step(self) -> None:
        """Before the optimizer updates the touched rows: combine the ranks' gradients, re-gather
        rows the table changed under (writes through .weight, max_norm), gather their state."""
        w = self.touched_rows()
        rows = self._rows
        if rows is None or not rows.numel():
            return
        if self._rows_generation != self._generation:
            with torch.no_grad():
                w.copy_(self.table.gather(rows))
            self._rows_generation = self._generation
        state = self.optimizer.state.get(w)
        if state:
            for key, table in self._state_tables.items():
                state[key] = table.gather(rows)

    def _finish_step(self) -> None:
        """After the optimizer step: write rows and state back, start the next step afresh."""
        w, rows = self._rows_weight, self._rows
        self._rows, self._tracked, self._combined = None, False, False
        if rows is not None and rows.numel():
            with torch.no_grad():
                self.table._write_unique(rows, w)
                for key, value in self.optimizer.state[w].items():
                    if isinstance(value, torch.Tensor) and value.shape == w.shape:
                        if key not in self._state_tables:
                            self._state_tables[key] = self._new_state_table(key)
                        self._state_tables[key]._write_unique(rows, value)
                        # The rows are on the host now; free the device copy until next step.
                        self.optimizer.state[w][key] = value.new_empty(0, self.embedding_dim)
            self._generation += 1
        self.zero_grad()

    def _swap_rows_weight(self, new: torch.Tensor) -> None:
        # A fresh leaf whenever the rows change (autograd caches a leaf's shape, so resizing
        # one in place fails); the optimizer's param entry and state move over to it.
        old = self._rows_weight
        if self.optimizer is not None:
            self.optimizer.param_groups[0]["params"][0] = new
            if old in self.optimizer.state:
                self.optimizer.state[new] = self.optimizer.state.pop(old)
        self._rows_weight = new

    # --- several processes ------------------------------------------------------------

    def _process_group(self):
        if self._group is None and not self._group_given and _world_size() > 1:
            raise RuntimeError("torch.distributed was initialised after this HostEmbedding was built, so its ranks "
                               "would train diverging tables: build it after init_process_group (or pass "
                               "process_group=dist.new_group([rank]) to train each rank's table on its own)")
        return self._group

    def _comm_device(self) -> torch.device:
        """Where collectives take tensors: the GPU for NCCL, the CPU for gloo."""
        backend = str(torch.distributed.get_backend(self._group))
        if "nccl" not in backend:
            return torch.device("cpu")
        if self.table.device.type == "cuda":
            return self.table.device
        return torch.device("cpu") if "gloo" in backend else torch.device("cuda", torch.cuda.current_device())

    def _combine(self, group) -> None:
        """Replace this rank's rows and gradient by the union of every rank's, the gradients
        summed by row and divided by the world size (DDP's average)."""
        dist = torch.distributed
        comm, world, dim = self._comm_device(), dist.get_world_size(group), self.embedding_dim
        w = self._rows_weight
        rows = self._rows.to(comm, torch.int64) if self._rows is not None else torch.empty(0, dtype=torch.int64, device=comm)
        grad = w.grad.to(comm) if w.grad is not None else torch.zeros(0, dim, dtype=w.dtype, device=comm)
        # all_gather needs one size on every rank: share the counts, pad to the largest.
        counts = [torch.zeros(1, dtype=torch.int64, device=comm) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([rows.numel()], device=comm), group=group)
        counts = [int(c) for c in counts]
        most = max(counts)
        if most == 0:  # no rank has a gradient: nothing to gather, nothing to update
            self.zero_grad()
            self._combined = True
            return
        rows = torch.cat([rows, rows.new_zeros(most - rows.numel())])
        grad = torch.cat([grad, grad.new_zeros(most - grad.shape[0], dim)])
        all_rows = [torch.empty_like(rows) for _ in range(world)]
        all_grads = [torch.empty_like(grad) for _ in range(world)]
        dist.all_gather(all_rows, rows, group=group)
        dist.all_gather(all_grads, grad, group=group)
        all_rows = [r[:n] for r, n in zip(all_rows, counts)]
        union, where = torch.unique(torch.cat(all_rows), sorted=True, return_inverse=True)
        summed = torch.zeros(union.numel(), dim, dtype=grad.dtype, device=comm)
        start = 0
        for r, g in zip(all_rows, all_grads):  # rank by rank, in the same order on every rank
            summed.index_add_(0, where[start:start + r.numel()], g[:r.numel()])
            start += r.numel()
        summed.div_(world)
        self._combined = True
        self._rows = union.to(self.table.device if self.table.backend in _GPU_INDEXED else "cpu")
        weight = self.table.gather(self._rows).requires_grad_()  # this rank may not have looked these rows up
        weight.grad = summed.to(weight.device)
        self._swap_rows_weight(weight)

    def _copy_rank0_table(self, chunk_bytes: int = 64 << 20) -> None:
        """Make this rank's table equal to rank 0's, as DDP broadcasts parameters; only the
        chunks that differ are written, so ranks mapping one file write nothing."""
        dist = torch.distributed
        comm, (rows, dim) = self._comm_device(), self.table.shape
        chunk = max(1, chunk_bytes // (dim * self.table.dtype.itemsize))
        src = dist.get_global_rank(self._group, 0)
        differs = torch.zeros(1, device=comm)
        for start in range(0, rows, chunk):
            idx = torch.arange(start, min(rows, start + chunk))
            mine = self.table.gather(idx)
            theirs = mine.to(comm, copy=True)
            dist.broadcast(theirs, src=src, group=self._group)
            theirs = theirs.to(mine.device)
            if not torch.equal(theirs, mine):
                if self.table.writable:
                    self.table._write_unique(idx, theirs)
                else:
                    differs.fill_(1)
        dist.all_reduce(differs, op=dist.ReduceOp.MAX, group=self._group)  # every rank raises, or none
        if differs.item():
            raise ValueError("the ranks' read-only tables differ from rank 0's: map the same file on every rank")

    # --- state ------------------------------------------------------------------------

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
        for key, value in (self.optimizer.state.get(self._rows_weight, {}) if self.optimizer else {}).items():
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
        self._generation += 1  # rows gathered before the load are stale
        loaded = {}
        for name, value in mine.items():
            if not name.startswith("optimizer."):
                unexpected_keys.append(prefix + name)
            elif self.optimizer is not None:  # without one (inference), training state is ignored
                loaded[name.removeprefix("optimizer.")] = value
        if self.optimizer is None:
            return
        # The loaded state replaces this embedding's whole state, absent entries by their fresh
        # values: keeping ours (Adam's step count, momentum rows) would make training continue
        # differently from the source.
        self._state_tables, state = {}, {}
        for key, value in {**self._fresh_state, **loaded}.items():
            if isinstance(value, torch.Tensor) and tuple(value.shape) == self.table.shape:
                self._state_tables[key] = HostTable.from_tensor(value, backend=self.table.backend, device=self.table.device)
                value = value.new_empty(0, self.embedding_dim).to(self.table.device)
            elif isinstance(value, torch.Tensor) and tuple(value.shape) == (0, self.embedding_dim):  # fresh per-row state
                self._state_tables[key] = self._new_state_table(key)
            state[key] = value.clone() if isinstance(value, torch.Tensor) else value
        if state:
            self.optimizer.state[self._rows_weight] = state
        else:
            self.optimizer.state.pop(self._rows_weight, None)
