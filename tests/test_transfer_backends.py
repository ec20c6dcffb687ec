"""The storage backends behind HostTable (speedlib/transfer/backends.py) on their own: the uva
backend's page-locking (CUDA's runtime stood in on a CPU), the cupy backend's dtypes and its
release at exit (CuPy stood in), and an interpreter that exits cleanly with every backend's
tables alive. The uva row-copy kernel and 'auto' have files of their own
(tests/test_transfer_kernel.py, tests/test_transfer_auto.py).
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import subprocess
import sys
import textwrap
import types
import weakref

import numpy as np
import pytest
import torch
from transfer_bits import GPU_BACKENDS, _cupy_ok, _reference, needs_cuda, thp_setting

from speedlib.transfer import HostTable, backends
from speedlib.transfer.backends import _MappedHost


@pytest.mark.skipif(not _cupy_ok(), reason="CuPy is not installed")
@needs_cuda
def test_cupy_backend_refuses_bfloat16():
    with pytest.raises(TypeError, match="NumPy has no torch.bfloat16"):
        HostTable(10, 4, dtype=torch.bfloat16, backend="cupy")


def test_mapped_host_describes_the_table_bytes_in_place():
    host = torch.zeros(6, 5, dtype=torch.bfloat16)
    cai = _MappedHost(host).__cuda_array_interface__
    assert cai["data"] == (host.data_ptr(), False)
    assert cai["shape"] == (6, 10) and cai["typestr"] == "|u1" and cai["strides"] is None


class _FakeCudart:
    """torch.cuda.cudart() stood in: records each call and the device current during it."""

    def __init__(self, calls: list, current: list, result: int = 0):
        self.calls, self.current, self.result = calls, current, result

    def cudaHostRegister(self, ptr, nbytes, flags):
        self.calls.append(("register", ptr, nbytes, flags, self.current[-1]))
        return self.result

    def cudaHostUnregister(self, ptr):
        self.calls.append(("unregister", ptr))
        return 0


class _Owner:
    """What a registration's lifetime is tied to (a _Uva table)."""


def test_uva_memory_is_locked_exactly_and_unlocked_when_its_owner_is_freed(monkeypatch):
    """The uva table's memory, on CPU with CUDA's runtime stood in: one registration of exactly
    rows * dim * itemsize bytes (torch's pinned allocator would lock the next power of two),
    mapped and portable, under the table's device (CUDA records it as the memory's, and
    torch.as_tensor reads it back); page-aligned and shared, so no neighbour's page is locked
    and a fork copies no page; unregistered when the owner is freed, the memory still valid."""
    calls, current = [], [None]

    class Device:  # torch.cuda.device stood in
        def __init__(self, dev):
            self.dev = torch.device(dev)

        def __enter__(self):
            current.append(self.dev)

        def __exit__(self, *exc):
            current.pop()

    monkeypatch.setattr(torch.cuda, "cudart", lambda: _FakeCudart(calls, current))
    monkeypatch.setattr(torch.cuda, "device", Device)
    owner, dev = _Owner(), torch.device("cuda", 1)
    rows, dim = 1000, 3  # 6000 bytes of bfloat16: neither a power of two nor whole pages
    host = backends.locked_zeros(rows, dim, torch.bfloat16, dev, owner)
    assert host.shape == (rows, dim) and host.dtype == torch.bfloat16 and not host.any()
    assert calls == [("register", host.data_ptr(), rows * dim * 2, 1 | 2, dev)]  # Portable | Mapped
    assert host.data_ptr() % mmap.PAGESIZE == 0 and host.untyped_storage().nbytes() == rows * dim * 2
    if os.path.exists("/proc/self/maps"):
        with open("/proc/self/maps", encoding="utf-8") as maps:
            perms = [line.split()[1] for line in maps if int(line.split("-")[0], 16) == host.data_ptr()]
        assert perms == ["rw-s"]  # shared: not copy-on-write in forked DataLoader workers
    del owner
    gc.collect()
    assert calls[1:] == [("unregister", host.data_ptr())]
    host[0] = 1.0  # views of table.cpu() outlive the lock: plain memory, still mapped
    assert host[0].float().sum() == dim
    # A failed registration raises, and leaves nothing to unregister later.
    monkeypatch.setattr(torch.cuda, "cudart", lambda: _FakeCudart(calls, current, result=2))
    owner = _Owner()
    with pytest.raises(RuntimeError, match="cudaHostRegister failed with cudaError 2"):
        backends.locked_zeros(rows, dim, torch.float32, dev, owner)
    del owner
    gc.collect()
    assert [c[0] for c in calls] == ["register", "unregister", "register"]


_SMAPS = """\
7f0000000000-7f0000200000 rw-p 00000000 00:00 0
Size:               2048 kB
AnonHugePages:      2048 kB
VmFlags: rd wr mr mw me ac
7f0000200000-7f0000600000 rw-p 00000000 00:00 0
Size:               4096 kB
AnonHugePages:      4096 kB
VmFlags: rd wr mr mw me dc ac hg
7f0000600000-7f0000a00000 rw-p 00000000 00:00 0
Size:               4096 kB
AnonHugePages:      2048 kB
VmFlags: rd wr mr mw me dc ac hg
7f0000a00000-7f0000c00000 rw-p 00000000 00:00 0
Size:               2048 kB
AnonHugePages:      2048 kB
VmFlags: rd wr mr mw me ac
"""


def test_huge_page_bytes_count_only_mappings_inside_the_range():
    start = 0x7F0000200000
    assert backends.huge_page_bytes(_SMAPS, start, 8 << 20) == 6 << 20  # 4 MiB + 2 of the next 4 MiB
    assert backends.huge_page_bytes(_SMAPS, start, 4 << 20) == 4 << 20
    # a range that cuts a mapping counts none of it: its huge pages may lie outside the range
    assert backends.huge_page_bytes(_SMAPS, start, 6 << 20) == 4 << 20
    assert backends.huge_page_bytes(_SMAPS, start - (2 << 20), 12 << 20) == 10 << 20
    assert backends.huge_page_bytes("", start, 4 << 20) == 0


def test_a_huge_page_table_is_aligned_whole_pages_locked_and_left_out_of_forks(monkeypatch):
    """The 'uva' table in 2 MiB pages, CUDA's runtime stood in: the rows start on a 2 MiB boundary,
    whole pages are registered (the rows' bytes rounded up to 2 MiB), every one of them a huge
    page (smaps says so), the range marked hugepage and don't-copy-on-fork; unregistered when
    the owner is freed. Where the kernel gives no transparent huge pages the table is refused
    with the setting named, never built in 4 KiB pages under the name of 2 MiB ones."""
    calls, current = [], [None]
    monkeypatch.setattr(torch.cuda, "cudart", lambda: _FakeCudart(calls, current))
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    owner, dev = _Owner(), torch.device("cuda", 0)
    rows, dim = 5000, 100  # 2,000,000 bytes of float32: less than one huge page
    if thp_setting() not in ("always", "madvise"):
        with pytest.raises(RuntimeError, match=r"2 MiB pages \(transparent huge pages: .*'always' or 'madvise'"):
            backends.locked_zeros(rows, dim, torch.float32, dev, owner, huge_pages=True)
        assert calls == []
        return
    host = backends.locked_zeros(rows, dim, torch.float32, dev, owner, huge_pages=True)
    assert host.shape == (rows, dim) and not host.any() and host.data_ptr() % backends.HUGE_PAGE == 0
    assert calls == [("register", host.data_ptr(), backends.HUGE_PAGE, 1 | 2, None)]
    with open("/proc/self/smaps", encoding="utf-8") as f:
        smaps = f.read()
    assert backends.huge_page_bytes(smaps, host.data_ptr(), backends.HUGE_PAGE) == backends.HUGE_PAGE
    block = smaps[smaps.index(f"{host.data_ptr():x}-"):]
    flags = next(line for line in block.splitlines() if line.startswith("VmFlags")).split()
    assert "hg" in flags and "dc" in flags  # MADV_HUGEPAGE, MADV_DONTFORK
    host[-1] = 1.0  # the rows are ordinary memory, writable to the last byte
    del owner
    gc.collect()
    assert calls[1:] == [("unregister", host.data_ptr())]


@pytest.mark.parametrize("backend", ["pinned", "cupy", "device", "pageable"])
@pytest.mark.parametrize("option", [{"huge_pages": True}, {"whole_lines": True}, {"bytes_in_flight": 4096}])
def test_the_uva_hypotheses_are_refused_by_every_other_backend(backend, option):
    name = next(iter(option))
    with pytest.raises(ValueError, match=f"{name} is an option of the 'uva' backend; backend '{backend}'"):
        HostTable(4, 2, backend=backend, device="cpu", **option)


def test_auto_has_none_of_the_uva_hypotheses_until_a_gpu_has_measured_them():
    with pytest.raises(ValueError, match=r"huge_pages, bytes_in_flight: the 'uva' backend's experimental options "
                                         r"\(not measured on a GPU yet"):
        HostTable(4, 2, device="cpu", huge_pages=True, bytes_in_flight=8192)


def test_the_uva_hypotheses_are_checked_before_any_memory_is_taken():
    with pytest.raises(TypeError, match="huge_pages must be True or False"):
        HostTable(4, 2, backend="uva", huge_pages="yes")
    with pytest.raises(TypeError, match="whole_lines must be True or False"):
        HostTable(4, 2, backend="uva", whole_lines=None)
    with pytest.raises(ValueError, match="bytes in flight must be a power of two of at least 1024, got 3000"):
        HostTable(4, 2, backend="uva", bytes_in_flight=3000)
    from speedlib.transfer import table  # noqa: PLC0415 - the options on their own

    assert table._options("uva", False, True, True, 65536) == {"huge_pages": True, "whole_lines": True,
                                                                "bytes_in_flight": 65536}
    assert table._options("uva", False) == {} and table._options("pinned", False) == {}


@needs_cuda
def test_uva_table_locks_its_own_bytes_and_equals_pageable():
    """On a GPU: gather and scatter equal 'pageable'; the table is exactly rows * dim * itemsize
    bytes, none of them from torch's pinned allocator, locked while the table lives."""
    rows, dim = 150_001, 5  # 3,000,020 bytes: torch's pinned allocator would lock 4 MiB
    ref = _reference(rows, dim)
    allocs = torch.cuda.host_memory_stats()["num_host_alloc"]
    uva = HostTable.from_tensor(ref, backend="uva")
    plain = HostTable.from_tensor(ref, backend="pageable", device=uva.device)
    gen = torch.Generator().manual_seed(6)
    idx = torch.randint(0, rows, (5000,), generator=gen)
    values = torch.randn(5000, dim, generator=gen)
    uva.scatter_(idx.to(uva.device), values.to(uva.device))
    plain.scatter_(idx.to(uva.device), values.to(uva.device))
    assert torch.equal(uva.gather(idx).cpu(), plain.gather(idx).cpu())
    host = uva.cpu()  # the table's memory itself, no copy
    assert torch.equal(host, plain.cpu())
    assert host.untyped_storage().nbytes() == rows * dim * 4 and host.is_pinned()
    assert torch.cuda.host_memory_stats()["num_host_alloc"] == allocs
    del uva
    gc.collect()
    assert not host.is_pinned()  # unregistered with the table; the rows stay readable
    assert torch.equal(host, plain.cpu())


# --- interpreter exit ------------------------------------------------------------------------

_EXIT_SCRIPT = textwrap.dedent("""
    import torch
    from speedlib.transfer import HostEmbedding, HostTable
    import functools
    tables = [HostTable.from_tensor(torch.ones(100, 8), backend=b) for b in {backends!r}]
    for t in tables:
        t.scatter_(torch.tensor([1, 1]), torch.zeros(2, 8, device=t.device))
        assert t.gather(torch.tensor([1])).sum().item() == 0
    emb = HostEmbedding(100, 8, functools.partial(torch.optim.Adam, lr=0.1), backend={backends[0]!r})
    emb(torch.tensor([3, 4])).sum().backward()
    emb.step()
    print("done")
""")


def _exit_cleanly(backends: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT.format(backends=backends)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr


def test_interpreter_exits_cleanly_with_a_pageable_table():
    _exit_cleanly(["pageable"])


@needs_cuda
def test_interpreter_exits_cleanly_with_every_gpu_backend():
    _exit_cleanly([b for b in GPU_BACKENDS if b != "cupy" or _cupy_ok()])


def test_exit_releases_cupy_tables_then_the_blocks_cupys_pools_cache(monkeypatch):
    """The cupy backend and its atexit hook, with CuPy stood in (NumPy memory for pinned):
    tables drop their memory first (a block in use cannot be freed), then the pinned and
    device pools of the CuPy the tables used free their cached blocks while CUDA is alive.
    A CuPy that no table used is left alone: its pools could make CUDA calls at exit."""
    events = []

    class Pool:
        def __init__(self, name):
            self.name = name

        def free_all_blocks(self):
            events.append((self.name, table.pinned is None))

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(Device=lambda index: contextlib.nullcontext(),
                                      UnownedMemory=lambda ptr, nbytes, owner, device: owner,
                                      MemoryPointer=lambda mem, offset: mem)
    cupy.ndarray = lambda shape, dtype=None, memptr=None: ("a CuPy view of", memptr)
    cupy.get_default_pinned_memory_pool = lambda: Pool("pinned pool")
    cupy.get_default_memory_pool = lambda: Pool("device pool")
    cupyx = types.ModuleType("cupyx")
    cupyx.empty_pinned = lambda shape, dtype: np.empty(shape, dtype)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupyx", cupyx)
    monkeypatch.setattr(backends, "_cupy", None)
    monkeypatch.setattr(backends, "_CUPY_TABLES", weakref.WeakSet())
    backends._release_cupy_tables()  # CuPy imported, no table used it
    assert events == []
    table = backends.Cupy(4, 3, torch.float32, torch.device("cuda", 0))
    assert list(backends._CUPY_TABLES) == [table] and table.array[1] is table.pinned and not table.host.any()
    backends._release_cupy_tables()
    assert table.array is None and table.pinned is None and table.host is None
    assert events == [("pinned pool", True), ("device pool", True)]  # after the table let go
