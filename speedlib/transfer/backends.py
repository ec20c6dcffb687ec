"""The storage backends behind `speedlib.transfer.HostTable` (see that module's docstring
for what each one is and when to choose it).

Each backend holds a rows x dim table and implements `gather(idx)` (rows to its device) and
`write(idx, values)` (rows back); `HostTable` checks indices, dtypes, shapes and devices
before calling them and makes duplicate indices carry one value (`last_write_wins`), so a
backend sees only valid, int64 input. Kept apart from the table so that a reader of the
user-facing classes does not have to page through CUDA registration and CuPy interop.
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import re
import weakref

import torch

from speedlib.transfer import kernel

# "auto", the default, picks among pinned and uva paths by measurement (speedlib/transfer/auto.py).
BACKENDS = ("auto", "pageable", "pinned", "cupy", "uva", "device")


def sync_device(device: torch.device) -> None:
    # is_initialized() is False in a forked DataLoader worker, which must not touch CUDA.
    if device.type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.synchronize(device)


class Pageable:
    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device, host: torch.Tensor | None = None):
        self.device = device
        self.host = torch.zeros(rows, dim, dtype=dtype) if host is None else host

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        return self.host.index_select(0, idx.cpu()).to(self.device)

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        self.host.index_copy_(0, idx.cpu(), values.cpu())


class Pinned(Pageable):
    """CPU indexing into a pinned staging buffer, then one asynchronous copy.

    Two staging buffers take turns, so indexing the next batch on the CPU can overlap the
    copy of the previous one; an event per buffer says when its copy has finished reading it.
    (From 1408e44 to 838236b the rows went in 2 MiB chunks packed by worker threads; on an
    H200 that delivered 6.2 GB/s, less than index_select's own packing rate of 12.9 GB/s, so
    it went.) `host` may be any CPU tensor: a file mapping, or the page-locked table of 'auto'.
    """

    _pin = True  # tests of the paths built on it stage in plain host memory, having no GPU

    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device, host: torch.Tensor | None = None):
        super().__init__(rows, dim, dtype, device, host)
        self._stages: list[torch.Tensor | None] = [None, None]
        self._events: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0

    def stage(self, n: int) -> tuple[int, torch.Tensor]:
        """(i, an n-row pinned buffer no queued copy reads any more); `release(i, event)` once the
        next copy out of (or into) it is queued."""
        i, self._turn = self._turn, self._turn ^ 1
        if self._events[i] is not None:
            self._events[i].synchronize()  # the last copy out of this buffer is done
            self._events[i] = None
        stage = self._stages[i]
        if stage is None or stage.shape[0] < n:
            stage = self._stages[i] = torch.empty(n, self.host.shape[1], dtype=self.host.dtype, pin_memory=self._pin)
        return i, stage[:n]

    def release(self, i: int, event) -> None:
        """Buffer i may be refilled once `event` (after the copy that reads it) has passed."""
        self._events[i] = event

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        i, stage = self.stage(idx.numel())
        torch.index_select(self.host, 0, idx.cpu(), out=stage)
        out = stage.to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))  # the table's GPU, not the current one
        self.release(i, event)
        return out

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        if values.device.type == "cuda":
            _, stage = self.stage(values.shape[0])
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
    sync_device(device)  # GPU kernels queued on the mapped rows finish before the pages are unlocked
    _cuda_call(torch.cuda.cudart().cudaHostUnregister(ptr), "cudaHostUnregister")


def locked_zeros(rows: int, dim: int, dtype: torch.dtype, device: torch.device, owner: object,
                  huge_pages: bool = False) -> torch.Tensor:
    """A zeroed rows x dim host tensor, page-locked with cudaHostRegister until `owner` is freed
    (or the interpreter exits, while CUDA is still up: weakref.finalize runs at exit).

    torch's pinned allocator rounds every allocation up to a power of two; registering
    memory of our own locks exactly rows * dim * itemsize bytes. The memory is an anonymous
    shared mapping: page-aligned, so no neighbour's page is locked with it, and not
    copy-on-write, so a fork (DataLoader workers) cannot move a page away from the one the
    GPU holds locked. huge_pages: the table in 2 MiB pages instead (`_huge_zeros`), locked
    in whole pages.
    """
    nbytes = rows * dim * dtype.itemsize
    if huge_pages:
        memory = _huge_zeros(nbytes)
        host, locked = memory[:nbytes].view(dtype).view(rows, dim), memory.numel()
    else:
        # Zeros already (a fresh mapping), and registering faults every page in: no memset needed.
        host = torch.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_SHARED), dtype=dtype).view(rows, dim)
        locked = nbytes
    cudart = torch.cuda.cudart()
    with torch.cuda.device(device):  # CUDA records the current device as the memory's, which torch.as_tensor reads
        _cuda_call(cudart.cudaHostRegister(host.data_ptr(), locked, _HOST_REGISTER_FLAGS), "cudaHostRegister")
    weakref.finalize(owner, _unregister_host, host.data_ptr(), device, os.getpid())
    return host


HUGE_PAGE = 2 << 20  # bytes: an x86-64 (and arm64 4K-granule) huge page


def _huge_zeros(nbytes: int) -> torch.Tensor:
    """`nbytes` rounded up to whole 2 MiB pages of zeroed host memory, 2 MiB-aligned, every page
    a huge one (issue 52's hypothesis: the GPU reading a table at random pays for address
    translation, and 2 MiB pages need 512 times fewer translations than 4 KiB ones).

    Transparent huge pages of a private anonymous mapping (madvise(MADV_HUGEPAGE)), which the
    kernel gives where /sys/kernel/mm/transparent_hugepage/enabled is "always" or "madvise";
    a shared mapping (the 4 KiB table's) gets them only where shmem_enabled allows, which it
    seldom does. Private pages are copied on write after a fork (pinned ones, on recent Linux,
    at the fork itself), so the range is left out of forked children (MADV_DONTFORK): a
    DataLoader worker must not read this table (it has no such memory); with the 'uva' backend
    the main process gathers anyway. One write per page faults each in as a huge page;
    RuntimeError where the kernel gave any page as 4 KiB ones (the table would not be what it
    says)."""
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE
    mapping = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = torch.frombuffer(mapping, dtype=torch.uint8)  # keeps the mapping alive
    lead = -whole.data_ptr() % HUGE_PAGE  # from the mapping's start to the first 2 MiB boundary
    mapping.madvise(mmap.MADV_HUGEPAGE, lead, size)
    mapping.madvise(mmap.MADV_DONTFORK, lead, size)
    memory = whole[lead:lead + size]
    memory.view(-1, HUGE_PAGE)[:, 0] = 0  # a write fault per page: the kernel backs each with one huge page
    with open("/proc/self/smaps", encoding="utf-8") as f:
        huge = huge_page_bytes(f.read(), memory.data_ptr(), size)
    if huge < size:
        setting = "unknown"
        with contextlib.suppress(OSError), open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="ascii") as f:
            setting = f.read().strip()
        raise RuntimeError(f"the kernel gave {huge / size:.0%} of a {size / 2**30:.3g} GiB table in 2 MiB pages "
                           f"(transparent huge pages: {setting}; they need 'always' or 'madvise', and memory that "
                           "is not too fragmented)")
    return memory


def huge_page_bytes(smaps: str, start: int, nbytes: int) -> int:
    """Bytes of [start, start + nbytes) in huge pages, from the text of /proc/<pid>/smaps: the
    AnonHugePages of the mappings that lie in that range (madvise gave the range mappings of its
    own). A mapping reaching out of the range counts nothing: its huge pages may be elsewhere."""
    huge, end = 0, start + nbytes
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", smaps):
        span = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", block)
        if span is None:
            continue
        lo, hi = int(span[1], 16), int(span[2], 16)
        if start <= lo and hi <= end:
            found = re.search(r"^AnonHugePages:\s+(\d+) kB", block, re.MULTILINE)
            huge += int(found.group(1)) * 1024 if found else 0
    return huge


def _mapped(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The registered `host` as a tensor on `device` at the same address: the GPU's view of it."""
    view = torch.as_tensor(_MappedHost(host)).view(host.dtype)
    if view.device != device or view.data_ptr() != host.data_ptr():
        raise RuntimeError(f"the registered table was not mapped in place onto {device} (got {view.device}); "
                           "zero-copy access needs unified addressing")
    return view


class Uva:
    """Zero-copy: the GPU reads and writes the registered table in place, whole rows at a time
    (speedlib/transfer/kernel.py); sort_indices reads the rows in index order. `locked`: a
    table already registered (by 'auto'), else one is allocated and registered here.
    huge_pages, whole_lines, bytes_in_flight: issue 52's hypotheses, off by default (the
    table in 2 MiB pages; the kernel's `Shape`), measured by bench_transfer.RooflineHypotheses."""

    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device, *, sort_indices: bool = False,
                 huge_pages: bool = False, whole_lines: bool = False, bytes_in_flight: int | None = None,
                 locked: torch.Tensor | None = None):
        self.device, self.sort = device, sort_indices
        self.shape = kernel.Shape(lines=whole_lines, in_flight=bytes_in_flight)
        self.host = locked_zeros(rows, dim, dtype, device, owner=self, huge_pages=huge_pages) \
            if locked is None else locked
        self.view = _mapped(self.host, device)

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        return kernel.gather(self.view, idx.to(self.device, non_blocking=True), sort=self.sort,
                                       shape=self.shape)

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        kernel.scatter(self.view, idx.to(self.device, non_blocking=True),
                                 values.to(self.device, non_blocking=True), sort=self.sort, shape=self.shape)


def _import_cupy():
    try:
        import cupy  # noqa: PLC0415 - optional and heavy
        import cupyx  # noqa: PLC0415 - optional and heavy, as cupy
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


class Cupy:
    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device):
        global _cupy
        cupy, cupyx = _import_cupy()
        _cupy = cupy
        import numpy  # noqa: PLC0415 - speedlib needs torch alone: the module imports without NumPy; CuPy brings it

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


class Device:
    host = None

    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device):
        self.device = device
        self.table = torch.zeros(rows, dim, dtype=dtype, device=device)

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.index_select(self.table, 0, idx.to(self.device, non_blocking=True))

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        self.table.index_copy_(0, idx.to(self.device, non_blocking=True), values.to(self.device, non_blocking=True))


GPU_INDEXED = ("cupy", "uva", "device")
BACKEND_CLASSES = {"pageable": Pageable, "pinned": Pinned, "cupy": Cupy, "uva": Uva, "device": Device}
# The backends whose table is an ordinary CPU tensor indexed by the CPU, so it can be any
# host memory, a file mapping included; the others need pinned or GPU memory of their own.
# ('auto' maps a file too, and then has only the pinned path: speedlib/transfer/auto.py.)
MAPPABLE = ("auto", "pageable", "pinned")
