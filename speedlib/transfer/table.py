"""`HostTable`: a rows x dim table kept where its backend says, read and written by row index.

The user-facing class and its input checks; the storage itself is one of the backends in
speedlib/transfer/backends.py. Imported through `speedlib.transfer` (or `speedlib.HostTable`).
"""

from __future__ import annotations

import os
import warnings
import weakref

import torch

from speedlib.transfer.auto import Auto
from speedlib.transfer.backends import BACKEND_CLASSES, BACKENDS, MAPPABLE, sync_device
from speedlib.transfer.kernel import Shape

# Every backend's class; 'auto' lives in its own module, which builds on the others.
_BUILDERS = {**BACKEND_CLASSES, "auto": Auto}
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


def _options(backend: str, sort_indices, huge_pages=False, whole_lines=False, bytes_in_flight=None) -> dict:
    """The backend's own keyword arguments, refused where they would do nothing. huge_pages,
    whole_lines and bytes_in_flight are issue 52's hypotheses (`Uva`): off by default, each
    measured by bench_transfer.RooflineHypotheses before it may become anyone's default."""
    for name, value in (("sort_indices", sort_indices), ("huge_pages", huge_pages), ("whole_lines", whole_lines)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    if bytes_in_flight is not None:
        Shape(in_flight=bytes_in_flight)  # raises for a value the kernel cannot use
    given = {"sort_indices": sort_indices, "huge_pages": huge_pages, "whole_lines": whole_lines,
             "bytes_in_flight": bytes_in_flight}
    given = {k: v for k, v in given.items() if v not in (False, None)}
    if not given:
        return {}
    if backend == "auto" and "sort_indices" in given:
        raise ValueError("sort_indices is measured by the 'auto' backend itself (sorted reads are one of its paths); "
                         "to force sorted reads choose backend='uva'")
    if backend == "auto":
        raise ValueError(f"{', '.join(given)}: the 'uva' backend's experimental options (not measured on a GPU yet, "
                         "so 'auto' has none of them); choose backend='uva' to try them")
    if backend != "uva":
        name = next(iter(given))
        if name == "sort_indices":
            raise ValueError(f"sort_indices orders the 'uva' kernel's reads; backend {backend!r} has no such kernel")
        raise ValueError(f"{name} is an option of the 'uva' backend; backend {backend!r} does not take it")
    return given


def _default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")

class HostTable:
    """A rows x dim table kept where `backend` says, read and written by row index.

    device: where `gather` delivers rows (default: the current CUDA device, else the CPU).
    Every backend but 'pageable' needs a CUDA device. The table starts as zeros.
    `writable` is False for a table mapped read-only from a file (`from_file(mode="r")`).
    backend 'auto' (the default) measures its paths at first use and keeps the fastest
    (`chosen` says which; speedlib/transfer/auto.py). sort_indices ('uva'): read rows in index order, the
    caller's order restored in the same pass. Both change speed only, never a result.
    huge_pages, whole_lines, bytes_in_flight ('uva', experimental, not measured on a GPU yet):
    the table in 2 MiB pages; gathers that read whole aligned 128-byte lines; the bytes each
    kernel program reads before writing (speedlib/transfer/kernel.py `Shape`). Speed only too.
    """

    def __init__(self, rows: int, dim: int, *, dtype: torch.dtype = torch.float32, backend: str = "auto",
                 device: torch.device | str | None = None, sort_indices: bool = False, huge_pages: bool = False,
                 whole_lines: bool = False, bytes_in_flight: int | None = None, _host: torch.Tensor | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
        # before any memory is taken
        self.options = _options(backend, sort_indices, huge_pages, whole_lines, bytes_in_flight)
        for name, n in (("rows", rows), ("dim", dim)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
        if dtype not in _DTYPES:
            raise TypeError(f"a table holds one of {', '.join(map(str, _DTYPES))}, not {dtype}")
        dev = _default_device() if device is None else torch.device(device)
        if backend not in ("pageable", "auto") and dev.type != "cuda":
            raise ValueError(f"backend {backend!r} moves rows to a CUDA device, not {dev}; use 'pageable' on CPUs")
        if dev.type == "cuda" and not torch.cuda.is_available():
            # Here, not at the first gather: a 'pageable' table would otherwise be built and
            # fail later with torch's own message about the CUDA build.
            hint = ": use device='cpu' for a table on this machine" if backend in ("pageable", "auto") else ""
            raise RuntimeError(f"backend {backend!r} needs CUDA, and torch sees no CUDA device" + hint)
        if dev.type == "cuda" and dev.index is None:
            # 'cuda' and 'cuda:0' are the same device but compare unequal: name the index, so
            # that indices and values made on the current device pass the device check.
            dev = torch.device("cuda", torch.cuda.current_device())
        self.backend, self.device, self.dtype = backend, dev, dtype
        self.shape = (rows, dim)
        self.writable, self.file, self._mmap = True, None, None
        self._trainer: weakref.ref | None = None  # the HostEmbedding training this table, if any
        try:
            self._impl = _BUILDERS[backend](rows, dim, dtype, dev, *(() if _host is None else (_host,)), **self.options)
        except (RuntimeError, MemoryError) as e:  # torch's allocator names neither the table nor a way out
            if _host is not None or "alloc" not in str(e).lower():
                raise
            size = rows * dim * torch.empty((), dtype=dtype).element_size()
            raise MemoryError(f"a {rows} x {dim} {dtype} table needs {size / 2**30:.3g} GiB, which the '{backend}' "
                              "backend could not allocate here: fewer rows, a smaller dtype, or a file-backed "
                              "table (HostTable.from_file) for one larger than memory") from None

    @classmethod
    def from_tensor(cls, weight: torch.Tensor, *, backend: str = "auto",
                    device: torch.device | str | None = None, **options) -> HostTable:
        """A table holding a copy of the 2-D `weight`."""
        if weight.dim() != 2:
            raise ValueError(f"a table is 2-D (rows x dim), got shape {tuple(weight.shape)}")
        table = cls(weight.shape[0], weight.shape[1], dtype=weight.dtype, backend=backend, device=device, **options)
        table.copy_(weight)
        return table

    @classmethod
    def from_file(cls, file, *, mode: str = "r+", backend: str = "auto",
                  device: torch.device | str | None = None) -> HostTable:
        """A table that *is* a 2-D `.npy` file, memory-mapped rather than read into RAM.

        file: a path, or a `numpy.memmap` already open (`numpy.load(path, mmap_mode="r+")`;
        `mode` is then the array's own). mode "r+": training writes go to the file; "r": a
        read-only table (lookups only; writes raise). Only 'auto', 'pageable' and 'pinned' can
        map a file: they index it on the CPU ('auto' then has the pinned path alone), so the
        kernel pages in just the rows a batch needs.
        Written rows reach the file through the page cache (other processes mapping it see
        them at once); the OS writes them to disk in its own time, and at the latest when the
        mapping closes: call `flush()` to force that (before copying the file, say). Create a
        new file with `numpy.lib.format.open_memmap(path, mode="w+", dtype=..., shape=(rows, dim))`.
        """
        import numpy as np  # noqa: PLC0415 - only file-backed tables need it

        if backend in BACKENDS and backend not in MAPPABLE:
            raise ValueError(f"backend {backend!r} keeps the table in memory of its own; only "
                             f"{', '.join(map(repr, MAPPABLE[:-1]))} or {MAPPABLE[-1]!r} can map a file")
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
            sync_device(self.device)
            self._mmap.flush()

    def _check_writable(self) -> None:
        if not self.writable:
            raise ValueError(f"this table maps {self.file!r} read-only: open it with mode 'r+' to write to it")

    def __repr__(self) -> str:
        file = "" if self.file is None else f", file={self.file!r}{'' if self.writable else ' (read-only)'}"
        return (f"HostTable(rows={self.shape[0]}, dim={self.shape[1]}, dtype={self.dtype}, backend={self.backend!r}, "
                f"device={self.device}{''.join(f', {k}={v!r}' for k, v in self.options.items())}{file})")

    def __reduce__(self):
        # Pickling would copy gigabytes (and CUDA views cannot travel at all): DataLoader
        # workers with the spawn start method should get indices, or rows from `cpu()`.
        raise TypeError("a HostTable cannot be pickled: send indices to worker processes and gather in the "
                        "main process, or read rows in workers from table.cpu()")

    @property
    def chosen(self) -> dict[str, str]:
        """The path each direction ("gather", "scatter") uses, once it has been used: the
        backend itself, or for 'auto' the path it measured fastest (or found measured)."""
        if self.backend != "auto":
            return {"gather": self.backend, "scatter": self.backend}
        return {op: str(path) for op, path in self._impl.chosen.items()}

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
        sync_device(self.device)
        return self._impl.host if self._impl.host is not None else self._impl.table

    def copy_(self, src: torch.Tensor, start: int = 0) -> HostTable:
        """Write the 2-D `src` into rows start .. start + len(src)."""
        if not isinstance(src, torch.Tensor):
            raise TypeError(f"src must be a tensor, got {type(src).__name__}")
        if not isinstance(start, int) or isinstance(start, bool):
            raise TypeError(f"start must be an integer row index, got {start!r}")
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
                raise TypeError(f"indices must be a tensor or a list of ints, "
                                f"got {type(indices).__name__}: {e}") from None
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
            raise ValueError(f"indices are on {idx.device}; "
                             f"a table on {self.device} takes CPU or {self.device} indices")
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
            raise ValueError(f"values are on {values.device}; "
                             f"a table on {self.device} takes CPU or {self.device} values")
        self._check_writable()
        flat = values.reshape(-1, self.shape[1])
        rows, flat = last_write_wins(idx.reshape(-1).to(flat.device), flat)
        self._impl.write(rows, flat)
        return self

    def _write_unique(self, rows: torch.Tensor, values: torch.Tensor) -> None:
        """scatter_ for rows known to be distinct and in range (HostEmbedding's own writes)."""
        self._check_writable()
        self._impl.write(rows, values)

