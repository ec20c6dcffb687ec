"""Host tables and CPU-hosted embeddings: every backend against plain indexing, and training
against PyTorch's own embeddings and optimizers (several lookups per step, padding_idx,
from_pretrained, clipping, int32 indices, loading checkpoints), on two gloo ranks against one
process, and in memory-mapped files; and the misuses refused (a second trainer of one table,
stepping the embedding's optimizer directly).

The GPU backends (pinned, cupy, uva, device) are skipped without a GPU; what they share with
'pageable' (index checks, the duplicate rule, shapes, dtypes, the embedding's update logic)
runs on every machine through 'pageable'.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import mmap
import os
import pickle
import subprocess
import sys
import textwrap
import types
import warnings
import weakref

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from speedlib.transfer import BACKENDS, HostEmbedding, HostTable, last_write_wins

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.gpu(reason="this backend moves rows to a CUDA device; this machine has none")
GPU_BACKENDS = [b for b in BACKENDS if b not in ("pageable", "auto")]  # auto is pageable on a CPU device


def _cupy_ok() -> bool:
    try:
        import cupy  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def _backend_params(backends):
    """Each backend as a pytest param, skipped with its reason where this machine cannot run it."""
    out = []
    for b in backends:
        marks = []
        if b != "pageable":
            marks.append(needs_cuda)
        if b == "cupy" and not _cupy_ok():
            marks.append(pytest.mark.skip(reason="CuPy is not installed"))
        out.append(pytest.param(b, marks=marks, id=b))
    return out


ALL = _backend_params(BACKENDS)


def _device(backend: str) -> torch.device:
    # A table names its CUDA device with the index ('cuda:0'), as tensors made there do.
    return torch.device("cuda", torch.cuda.current_device()) if HAS_CUDA else torch.device("cpu")


def _train_device(backend: str) -> torch.device:
    """Where an embedding trained against a CPU reference runs: the CPU for 'pageable' even on
    GPU machines, so that comparisons with nn.Embedding and torch.optim on the CPU can be
    bitwise (GPU kernels round differently) and its outputs meet CPU targets. Training on a
    GPU is compared with a tolerance in the *_on_gpu_backends_* tests, 'pageable' included."""
    return torch.device("cpu") if backend == "pageable" else _device(backend)


def _reference(rows=1000, dim=16, dtype=torch.float32, seed=0):
    return torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed)).to(dtype)


# --- the duplicate rule -------------------------------------------------------------------

def _last_wins_by_loop(table: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    out = table.clone()
    for i, v in zip(idx.tolist(), values):
        out[i] = v  # Python assignment order: the last occurrence stays
    return out


def test_last_write_wins_keeps_the_last_occurrence():
    idx = torch.tensor([5, 2, 5, 7, 2, 5])
    values = torch.arange(6.0).unsqueeze(1)
    rows, vals = last_write_wins(idx, values)
    assert rows.tolist() == [2, 2, 5, 5, 5, 7]
    assert vals.squeeze(1).tolist() == [4.0, 4.0, 5.0, 5.0, 5.0, 3.0]


def test_last_write_wins_matches_sequential_assignment_on_random_input():
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 50, (2000,), generator=gen)
    values = torch.randn(2000, 3, generator=gen)
    rows, vals = last_write_wins(idx, values)
    got = torch.zeros(50, 3).index_copy_(0, rows, vals)
    assert torch.equal(got, _last_wins_by_loop(torch.zeros(50, 3), idx, values))


def test_last_write_wins_passes_tiny_inputs_through():
    for n in (0, 1):
        idx, values = torch.arange(n), torch.ones(n, 2)
        rows, vals = last_write_wins(idx, values)
        assert rows is idx and vals is values


# --- every backend against plain indexing ---------------------------------------------------

@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_gather_equals_plain_indexing(backend, dtype):
    if backend == "cupy" and dtype == torch.bfloat16:
        pytest.skip("NumPy (and so the cupy backend) has no bfloat16; the constructor's TypeError is tested")
    dev = _device(backend)
    ref = _reference(dtype=dtype)
    table = HostTable.from_tensor(ref, backend=backend, device=dev)
    gen = torch.Generator().manual_seed(2)
    idx = torch.randint(0, 1000, (7, 33), generator=gen)
    for indices in (idx, idx.to(torch.int32), idx.to(dev), idx.sort(dim=1).values):
        out = table.gather(indices)
        assert out.device == dev and out.dtype == dtype and out.shape == (7, 33, 16)
        assert torch.equal(out.cpu(), ref[indices.cpu().long()])


@pytest.mark.parametrize("backend", ALL)
def test_scatter_writes_rows_and_the_last_duplicate_wins(backend):
    dev = _device(backend)
    ref = _reference()
    table = HostTable.from_tensor(ref, backend=backend, device=dev)
    gen = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 1000, (4096,), generator=gen)  # about 1,800 of them are repeats
    values = torch.randn(4096, 16, generator=gen)
    table.scatter_(idx, values.to(dev))
    assert torch.equal(table.cpu().cpu(), _last_wins_by_loop(ref, idx, values))
    # ...and from host values, with indices of another shape.
    table.scatter_(idx.reshape(64, 64), values.reshape(64, 64, 16))
    assert torch.equal(table.gather(torch.arange(1000)).cpu(), _last_wins_by_loop(ref, idx, values))


@pytest.mark.parametrize("backend", ALL)
def test_scatter_takes_int32_indices_like_int64(backend):
    """gather accepts int32 indices; every write path must too (index_copy_ takes only int64)."""
    dev = _device(backend)
    gen = torch.Generator().manual_seed(4)
    idx = torch.randint(0, 1000, (8, 16), generator=gen)  # with repeats
    values = torch.randn(8, 16, 16, generator=gen)
    want = _last_wins_by_loop(_reference(), idx.reshape(-1), values.reshape(-1, 16))
    for indices in (idx.to(torch.int32), idx.to(torch.int32).to(dev)):
        table = HostTable.from_tensor(_reference(), backend=backend, device=dev)
        table.scatter_(indices, values)
        assert torch.equal(table.cpu().cpu(), want)


@pytest.mark.parametrize("backend", ALL)
def test_empty_index_gathers_nothing_and_writes_nothing(backend):
    dev = _device(backend)
    table = HostTable.from_tensor(_reference(), backend=backend, device=dev)
    assert table.gather(torch.zeros(0, dtype=torch.long)).shape == (0, 16)
    table.scatter_(torch.zeros(0, dtype=torch.long), torch.zeros(0, 16))
    assert torch.equal(table.cpu().cpu(), _reference())


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("bad", [-1, 1000, 10**9])
def test_out_of_range_raises_index_error_before_writing(backend, bad):
    dev = _device(backend)
    table = HostTable.from_tensor(_reference(), backend=backend, device=dev)
    idx = torch.tensor([0, 1, bad, 2])
    with pytest.raises(IndexError, match=f"index {bad} is out of range for a table of 1000 rows"):
        table.gather(idx)
    with pytest.raises(IndexError, match="out of range"):
        table.scatter_(idx, torch.zeros(4, 16))
    with pytest.raises(IndexError, match="out of range"):
        table.scatter_(idx.to(dev), torch.zeros(4, 16, device=dev))
    assert torch.equal(table.cpu().cpu(), _reference())  # rows 0, 1, 2 were not written either


def test_bad_input_gives_clear_errors():
    table = HostTable.from_tensor(_reference(), backend="pageable", device="cpu")
    with pytest.raises(TypeError, match="int32 or int64, got torch.float32"):
        table.gather(torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="int32 or int64, got torch.bool"):
        table.gather(torch.tensor([True]))
    with pytest.raises(TypeError, match="holds torch.float32, got torch.float64 values"):
        table.scatter_(torch.tensor([1]), torch.zeros(1, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"must have shape \(2, 16\), got \(2, 8\)"):
        table.scatter_(torch.tensor([1, 2]), torch.zeros(2, 8))
    with pytest.raises(TypeError, match="values must be a tensor"):
        table.scatter_(torch.tensor([1]), [[0.0] * 16])
    with pytest.raises(TypeError, match="cast explicitly"):
        table.copy_(torch.zeros(2, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match="cannot copy"):
        table.copy_(torch.zeros(2, 16), start=999)
    assert torch.equal(table.cpu(), _reference())


@pytest.mark.parametrize("row", [
    pytest.param(lambda: torch.arange(4, dtype=torch.float64), id="tensor-of-another-dtype"),
    pytest.param(lambda: torch.arange(4.0).reshape(1, 4), id="1xdim-tensor"),
    pytest.param(lambda: [0.0, 1.0, 2.0, 3.0], id="list"),
    pytest.param(lambda: (0, 1, 2, 3), id="tuple-of-ints"),
    pytest.param(lambda: np.arange(4, dtype=np.float32), id="ndarray"),
    pytest.param(lambda: np.arange(4, dtype=np.int16), id="int16-ndarray"),
])
def test_fill_takes_a_row_as_a_tensor_a_list_or_an_array(row):
    table = HostTable(3, 4, dtype=torch.float16, backend="pageable", device="cpu")
    assert table.fill_(row()) is table
    assert torch.equal(table.cpu(), torch.arange(4, dtype=torch.float16).expand(3, 4))


def test_fill_with_one_number_sets_every_value_as_tensor_fill_does():
    table = HostTable(3, 4, backend="pageable", device="cpu")
    table.fill_(2.5)
    assert torch.equal(table.cpu(), torch.full((3, 4), 2.5))
    table.fill_(torch.tensor(-1.0))
    assert torch.equal(table.cpu(), torch.full((3, 4), -1.0))


@pytest.mark.parametrize("row,error,message", [
    ([1.0, 2.0], ValueError, r"4 values \(one row\) or one number, got 2 values"),
    (torch.zeros(2, 4), ValueError, r"4 values \(one row\) or one number, got 8 values"),
    ("abc", TypeError, "a row must be a tensor, a list or array of numbers, or a number, got str"),
    ([["a"]] * 4, TypeError, "a row must be .* got list"),
    (None, TypeError, "got NoneType"),
    ([True, False, True, False], TypeError, "got list of torch.bool"),
    (torch.ones(4, dtype=torch.complex64), TypeError, "got Tensor of torch.complex64"),
])
def test_a_bad_fill_row_is_refused_and_writes_nothing(row, error, message):
    table = HostTable.from_tensor(_reference(rows=3, dim=4), backend="pageable", device="cpu")
    with pytest.raises(error, match=message):
        table.fill_(row)
    assert torch.equal(table.cpu(), _reference(rows=3, dim=4))


def test_constructor_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        HostTable(10, 4, backend="gpu", device="cpu")
    with pytest.raises(ValueError, match="rows must be a positive int"):
        HostTable(0, 4, backend="pageable", device="cpu")
    with pytest.raises(ValueError, match="dim must be a positive int"):
        HostTable(10, 2.5, backend="pageable", device="cpu")
    with pytest.raises(TypeError, match="not torch.int64"):
        HostTable(10, 4, dtype=torch.int64, backend="pageable", device="cpu")
    for backend in GPU_BACKENDS:
        with pytest.raises(ValueError, match="use 'pageable' on CPUs"):
            HostTable(10, 4, backend=backend, device="cpu")
    with pytest.raises(ValueError, match="2-D"):
        HostTable.from_tensor(torch.zeros(3), backend="pageable", device="cpu")


def test_a_cuda_table_without_cuda_fails_at_construction(monkeypatch):
    """Even 'pageable' (host memory) refuses a CUDA device here, not at its first gather."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="torch sees no CUDA device: use device='cpu'"):
        HostTable(10, 4, backend="pageable", device="cuda")
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        HostTable(10, 4, backend="pageable", device="cuda:0")
    with pytest.raises(RuntimeError, match="backend 'auto' needs CUDA.*use device='cpu'"):
        HostTable(10, 4, device="cuda")


def test_empty_and_float_index_lists_name_the_problem():
    table = HostTable.from_tensor(_reference(), backend="pageable", device="cpu")
    with pytest.raises(ValueError, match=r"indices is an empty list; .*torch.empty\(0, dtype=torch.int64\)"):
        table.gather([])
    with pytest.raises(ValueError, match="indices is an empty tuple"):
        table.scatter_((), torch.zeros(0, 16))
    with pytest.raises(TypeError, match="got torch.float32; floating-point indices are not row numbers"):
        table.gather([1.0, 2.0])
    with pytest.raises(TypeError, match="a tensor or a list of ints, got list"):
        table.gather(["a"])
    assert table.gather(torch.empty(0, dtype=torch.int64)).shape == (0, 16)  # the way to ask for no rows
    assert torch.equal(table.cpu(), _reference())

@needs_cuda
def test_indices_on_another_gpu_are_refused():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    table = HostTable(10, 4, backend="device", device="cuda:0")
    with pytest.raises(ValueError, match="indices are on cuda:1"):
        table.gather(torch.tensor([1], device="cuda:1"))


@pytest.mark.skipif(not _cupy_ok(), reason="CuPy is not installed")
@needs_cuda
def test_cupy_backend_refuses_bfloat16():
    with pytest.raises(TypeError, match="NumPy has no torch.bfloat16"):
        HostTable(10, 4, dtype=torch.bfloat16, backend="cupy")


def test_mapped_host_describes_the_table_bytes_in_place():
    from speedlib._transfer_backends import _MappedHost  # noqa: PLC0415 - the uva backend's CPU-side logic

    host = torch.zeros(6, 5, dtype=torch.bfloat16)
    cai = _MappedHost(host).__cuda_array_interface__
    assert cai["data"] == (host.data_ptr(), False)
    assert cai["shape"] == (6, 10) and cai["typestr"] == "|u1" and cai["strides"] is None


class _FakeCudart:
    """torch.cuda.cudart() stood in: records each call and the device current during it."""

    def __init__(self, calls: list, current: list, result: int = 0):
        self.calls, self.current, self.result = calls, current, result

    def cudaHostRegister(self, ptr, nbytes, flags):  # noqa: N802 - CUDA's name
        self.calls.append(("register", ptr, nbytes, flags, self.current[-1]))
        return self.result

    def cudaHostUnregister(self, ptr):  # noqa: N802
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
    from speedlib import _transfer_backends as transfer  # noqa: PLC0415 - the backends' internals

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
    host = transfer._locked_zeros(rows, dim, torch.bfloat16, dev, owner)
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
        transfer._locked_zeros(rows, dim, torch.float32, dev, owner)
    del owner
    gc.collect()
    assert [c[0] for c in calls] == ["register", "unregister", "register"]


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


def test_a_table_refuses_pickling_with_advice():
    table = HostTable(10, 4, backend="pageable", device="cpu")
    with pytest.raises(TypeError, match="send indices to worker processes"):
        pickle.dumps(table)


# --- processes: DataLoader workers and interpreter exit -------------------------------------

class _RowsDataset(torch.utils.data.Dataset):
    """Items are indices, or (with a table) host rows read in the worker."""

    def __init__(self, table: HostTable | None = None):
        self.table = table

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        idx = i * 7 % 1000
        return torch.tensor(idx) if self.table is None else self.table.cpu()[idx].clone()


@pytest.mark.parametrize("backend", ALL)
def test_dataloader_workers_leave_the_table_working(backend):
    """Workers fork after CUDA is up; the table must work while and after they run."""
    dev = _device(backend)
    ref = _reference()
    table = HostTable.from_tensor(ref, backend=backend, device=dev)
    table.gather(torch.tensor([1, 2]))  # CUDA (where used) is initialised before the workers fork
    loader = torch.utils.data.DataLoader(_RowsDataset(), batch_size=16, num_workers=2)
    rows = torch.cat([table.gather(idx) for idx in loader])
    assert torch.equal(rows.cpu(), ref[torch.arange(64) * 7 % 1000])
    assert torch.equal(table.gather(torch.arange(1000)).cpu(), ref)


@pytest.mark.parametrize("backend", _backend_params(["pageable", "pinned"]))
def test_dataloader_workers_read_rows_of_a_table_in_plain_memory(backend):
    """pageable and pinned keep the table in ordinary memory, which forked workers can read."""
    ref = _reference()
    table = HostTable.from_tensor(ref, backend=backend, device=_device(backend))
    table.gather(torch.tensor([1, 2]))
    loader = torch.utils.data.DataLoader(_RowsDataset(table), batch_size=16, num_workers=2)
    assert torch.equal(torch.cat(list(loader)), ref[torch.arange(64) * 7 % 1000])
    assert torch.equal(table.gather(torch.arange(1000)).cpu(), ref)


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
    from speedlib import _transfer_backends as transfer  # noqa: PLC0415 - the backends' internals

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
    monkeypatch.setattr(transfer, "_cupy", None)
    monkeypatch.setattr(transfer, "_CUPY_TABLES", weakref.WeakSet())
    transfer._release_cupy_tables()  # CuPy imported, no table used it
    assert events == []
    table = transfer._Cupy(4, 3, torch.float32, torch.device("cuda", 0))
    assert list(transfer._CUPY_TABLES) == [table] and table.array[1] is table.pinned and not table.host.any()
    transfer._release_cupy_tables()
    assert table.array is None and table.pinned is None and table.host is None
    assert events == [("pinned pool", True), ("device pool", True)]  # after the table let go


# --- CPU-hosted embedding training ---------------------------------------------------------

ROWS, DIM = 40, 6


def _batches(steps=5, coverage="partial", seed=0):
    """(indices, target) per step; partial coverage touches few rows, with repeats."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        if coverage == "full":
            idx = torch.cat([torch.randperm(ROWS, generator=gen), torch.randint(0, ROWS, (8,), generator=gen)]).reshape(-1, 4)
        else:
            idx = torch.randint(0, ROWS // 2, (6, 4), generator=gen)  # rows >= 20 never touched
        out.append((idx, torch.randn(*idx.shape, DIM, generator=gen)))
    return out


def _loss(out, target):
    return ((out - target) ** 2).sum() / out.shape[0]


def _train_reference(weight, make_opt, batches, sparse=False, padding_idx=None):
    emb = nn.Embedding(ROWS, DIM, sparse=sparse, _weight=weight.clone(), padding_idx=padding_idx)
    opt = make_opt(emb.parameters())
    outs = []
    for idx, target in batches:
        opt.zero_grad()
        out = emb(idx)
        outs.append(out.detach().clone())
        _loss(out, target).backward()
        opt.step()
    return emb.weight.detach(), outs


def _train_host(weight, make_opt, batches, backend="pageable", emb=None, device=None, **kwargs):
    """Train a HostEmbedding built from `weight` (or `emb`, built by the caller) on `batches`."""
    if emb is None:
        emb = HostEmbedding(ROWS, DIM, make_opt, backend=backend, device=device or _train_device(backend), weight=weight,
                            **kwargs)
    outs = []
    for idx, target in batches:
        out = emb(idx)
        outs.append(out.detach().cpu().clone())
        _loss(out, target.to(out.device)).backward()
        emb.step()
    return emb, outs


def test_embedding_with_sgd_equals_nn_embedding_exactly():
    w = _reference(ROWS, DIM)
    make = functools.partial(torch.optim.SGD, lr=0.1)
    ref_w, ref_outs = _train_reference(w, make, _batches())
    emb, outs = _train_host(w, make, _batches())
    assert all(torch.equal(a, b) for a, b in zip(outs, ref_outs))
    assert torch.equal(emb.table.cpu(), ref_w)
    assert torch.equal(emb.table.cpu()[ROWS // 2:], w[ROWS // 2:])  # untouched rows stay


def test_embedding_with_adam_equals_sparse_adam():
    w = _reference(ROWS, DIM)
    ref_w, _ = _train_reference(w, functools.partial(torch.optim.SparseAdam, lr=0.05), _batches(), sparse=True)
    emb, _ = _train_host(w, functools.partial(torch.optim.Adam, lr=0.05), _batches())
    # Not bitwise: SparseAdam adds eps before dividing by the bias correction, Adam after.
    torch.testing.assert_close(emb.table.cpu(), ref_w, rtol=1e-5, atol=1e-6)
    assert not torch.equal(emb.table.cpu(), w)


def test_embedding_with_adagrad_equals_sparse_adagrad():
    w = _reference(ROWS, DIM)
    make = functools.partial(torch.optim.Adagrad, lr=0.1, initial_accumulator_value=0.3)
    ref_w, _ = _train_reference(w, make, _batches(), sparse=True)
    emb, _ = _train_host(w, make, _batches())
    torch.testing.assert_close(emb.table.cpu(), ref_w, rtol=1e-6, atol=1e-7)
    # Untouched rows keep the initial accumulator, as in a fresh Adagrad.
    assert torch.equal(emb._state_tables["sum"].cpu()[ROWS // 2:], torch.full((ROWS // 2, DIM), 0.3))


@pytest.mark.parametrize("make", [
    functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=0.01),
    functools.partial(torch.optim.Adam, lr=0.05),
    functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.1),
    functools.partial(torch.optim.RMSprop, lr=0.01, momentum=0.5, centered=True),
    functools.partial(torch.optim.Adagrad, lr=0.1),
], ids=["sgd-momentum", "adam", "adamw", "rmsprop", "adagrad"])
def test_embedding_touching_every_row_equals_dense_training(make):
    """When each step touches every row, touched-rows updates are dense updates."""
    w = _reference(ROWS, DIM)
    ref_w, ref_outs = _train_reference(w, make, _batches(coverage="full"))
    emb, outs = _train_host(w, make, _batches(coverage="full"))
    torch.testing.assert_close(emb.table.cpu(), ref_w, rtol=1e-6, atol=1e-6)
    for a, b in zip(outs, ref_outs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_weight_decay_and_momentum_leave_untouched_rows_alone():
    w = _reference(ROWS, DIM)
    emb, _ = _train_host(w, functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.5), _batches())
    assert torch.equal(emb.table.cpu()[ROWS // 2:], w[ROWS // 2:])
    for table in emb._state_tables.values():
        assert not table.cpu()[ROWS // 2:].any()


def test_embedding_state_dict_round_trip_continues_identically():
    w = _reference(ROWS, DIM)
    make = functools.partial(torch.optim.Adam, lr=0.05)
    batches = _batches(steps=4)
    first, _ = _train_host(w, make, batches[:2])
    saved = {k: v.clone() for k, v in nn.Sequential(first).state_dict().items()}
    assert set(saved) == {"0.weight", "0.optimizer.step", "0.optimizer.exp_avg", "0.optimizer.exp_avg_sq"}
    restored = nn.Sequential(HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu"))
    restored.load_state_dict(saved)
    for model in (first, restored[0]):
        for idx, target in batches[2:]:
            _loss(model(idx), target).backward()
            model.step()
    assert torch.equal(first.table.cpu(), restored[0].table.cpu())
    with pytest.raises(RuntimeError, match="Missing key"):
        nn.Sequential(HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu")).load_state_dict({})


@pytest.mark.parametrize("backend", ALL)
def test_embedding_trains_on_int32_indices_as_on_int64(backend):
    """int32 lookups train like int64 ones (step() writes rows found from those indices)."""
    w, make = _reference(ROWS, DIM), functools.partial(torch.optim.Adam, lr=0.05)
    want, _ = _train_host(w, make, _batches(), backend=backend)
    got, _ = _train_host(w, make, [(idx.to(torch.int32), t) for idx, t in _batches()], backend=backend)
    assert torch.equal(got.table.cpu().cpu(), want.table.cpu().cpu())
    assert not torch.equal(got.table.cpu().cpu(), w)


def _assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key], key


@pytest.mark.parametrize("make", [
    functools.partial(torch.optim.Adam, lr=0.05),
    functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
    functools.partial(torch.optim.Adagrad, lr=0.1, initial_accumulator_value=0.3),  # has state before any step
], ids=["adam", "sgd-momentum", "adagrad"])
def test_loading_a_state_saved_before_any_step_starts_the_optimizer_afresh(make):
    """A state without optimizer entries (saved before the first step, or only the weight)
    must not leave the target's own optimizer state (Adam's step count, momentum) in place."""
    w, batches = _reference(ROWS, DIM), _batches(steps=6)
    source = HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu", weight=w)
    tables = []
    for saved in (source.state_dict(), {"weight": w.clone()}):
        target, _ = _train_host(_reference(ROWS, DIM, seed=3), make, batches[:3])
        target.load_state_dict(saved)
        _assert_same_state(target.state_dict(), source.state_dict())
        tables.append(_train_host(None, None, batches[3:], emb=target)[0].table.cpu())
    _train_host(None, None, batches[3:], emb=source)
    assert all(torch.equal(t, source.table.cpu()) for t in tables)


def test_a_frozen_embedding_without_optimizer_loads_a_trained_checkpoint():
    """Inference loads a trained checkpoint, optimizer entries and all, as with nn.Embedding."""
    trained, _ = _train_host(_reference(ROWS, DIM), functools.partial(torch.optim.Adam, lr=0.05), _batches(steps=2))
    frozen = HostEmbedding.from_pretrained(torch.zeros(ROWS, DIM), backend="pageable", device="cpu")
    frozen.load_state_dict(trained.state_dict())  # strict
    assert torch.equal(frozen.table.cpu(), trained.table.cpu())
    with pytest.raises(RuntimeError, match='Unexpected key.*"bias"'):  # other keys are still unexpected
        frozen.load_state_dict({**trained.state_dict(), "bias": torch.zeros(1)})


def test_a_table_has_one_trainer_at_a_time():
    """Two trainers would each write back rows gathered before the other's step(): refused."""
    make = functools.partial(torch.optim.SGD, lr=0.1)
    table = HostTable.from_tensor(_reference(ROWS, DIM), backend="pageable", device="cpu")
    trainer = HostEmbedding(ROWS, DIM, make, weight=table)
    with pytest.raises(ValueError, match="already trained by another HostEmbedding.*several times per step"):
        HostEmbedding(ROWS, DIM, make, weight=table)
    reader = HostEmbedding(ROWS, DIM, make, weight=table, freeze=True)  # frozen ones share the table
    _loss(trainer(torch.tensor([1, 2])), torch.zeros(2, DIM)).backward()
    trainer.step()
    assert torch.equal(reader(torch.tensor([1, 2])), table.cpu()[[1, 2]])  # and see the trainer's writes
    with pytest.raises(ValueError, match="already trained"):
        reader.freeze = False
    trainer.freeze = True  # training passes to another once the trainer is frozen...
    reader.freeze = False
    with pytest.raises(ValueError, match="already trained"):
        trainer.freeze = False
    del reader
    gc.collect()
    trainer.freeze = False  # ...or gone


def test_stepping_the_optimizer_directly_is_emb_step_and_lr_schedulers_still_work():
    """emb.optimizer.step() (a loop stepping every optimizer, GradScaler) is emb.step(): it
    writes the rows back; a following emb.step() raises instead of updating twice. LR
    schedulers, which wrap optimizer.step to count calls, keep working through emb.step()."""
    w, make = _reference(ROWS, DIM), functools.partial(torch.optim.SGD, lr=0.1)
    emb = HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu", weight=w)
    ref = nn.Embedding.from_pretrained(w.clone(), freeze=False)
    ref_opt = make(ref.parameters())
    scheds = [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5) for opt in (emb.optimizer, ref_opt)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step, (idx, target) in enumerate(_batches(steps=3)):
            _loss(emb(idx), target).backward()
            if step == 0:
                emb.optimizer.step()
                with pytest.raises(RuntimeError, match="needs a forward pass.*already stepped"):
                    emb.step()
            else:
                emb.step()
            ref_opt.zero_grad()
            _loss(ref(idx), target).backward()
            ref_opt.step()
            for sched in scheds:
                sched.step()
    assert not [c for c in caught if "lr_scheduler" in str(c.message)]  # the schedulers saw the optimizer steps
    assert emb.optimizer.param_groups[0]["lr"] == 0.1 * 0.5 ** 3
    assert torch.equal(emb.table.cpu(), ref.weight.detach())


def test_embedding_misuse_is_explained():
    make = functools.partial(torch.optim.SGD, lr=0.1)
    emb = HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu")
    with pytest.raises(RuntimeError, match="needs a forward pass"):
        emb.step()
    emb(torch.tensor([1]))
    emb(torch.tensor([2]))  # a second lookup in one step is fine (word2vec's positives and negatives)
    emb.step()  # no backward ran: nothing changes, and the next forward is allowed
    with torch.no_grad():
        assert torch.equal(emb(torch.tensor([[1, 2]])), emb.table.cpu()[torch.tensor([[1, 2]])])
    with pytest.raises(IndexError):
        emb(torch.tensor([ROWS]))
    with pytest.raises(TypeError, match="callable"):
        HostEmbedding(ROWS, DIM, torch.optim.SGD([torch.zeros(1, requires_grad=True)]), backend="pageable", device="cpu")
    with pytest.raises(TypeError, match="must return a torch.optim.Optimizer"):
        HostEmbedding(ROWS, DIM, lambda params: params, backend="pageable", device="cpu")
    with pytest.raises(ValueError, match="weight must have shape"):
        HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu", weight=torch.zeros(3, 3))


def test_embedding_rows_are_not_model_parameters():
    """A model optimizer built from model.parameters() must not update the rows a second time."""
    model = nn.Sequential(HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.1), backend="pageable",
                                        device="cpu"), nn.Linear(DIM, 1))
    assert [p.shape for p in model.parameters()] == [torch.Size([1, DIM]), torch.Size([1])]


def test_lr_scheduler_keys_do_not_break_new_state():
    emb = HostEmbedding(ROWS, DIM, functools.partial(torch.optim.Adam, lr=0.05), backend="pageable", device="cpu")
    torch.optim.lr_scheduler.StepLR(emb.optimizer, step_size=1)  # adds initial_lr to the group
    emb(torch.tensor([1, 2])).sum().backward()
    emb.step()
    assert set(emb._state_tables) == {"exp_avg", "exp_avg_sq"}


# Training on the GPU, every backend including 'pageable' delivering rows there.
ON_GPU = [pytest.param("pageable", marks=needs_cuda, id="pageable-to-cuda"), *_backend_params(GPU_BACKENDS)]


@pytest.mark.parametrize("backend", ON_GPU)
def test_embedding_on_gpu_backends_equals_pageable(backend):
    """Against 'pageable' trained on the CPU: Adam's GPU kernels round differently from the
    CPU's, so equal to a tolerance, not bitwise."""
    w = _reference(ROWS, DIM)
    make = functools.partial(torch.optim.Adam, lr=0.05)
    host, _ = _train_host(w, make, _batches())
    gpu, _ = _train_host(w, make, _batches(), backend=backend, device="cuda")
    assert host.table.device.type == "cpu" and gpu.table.device.type == "cuda"
    torch.testing.assert_close(gpu.table.cpu().cpu(), host.table.cpu(), rtol=1e-5, atol=1e-6)


def test_benchmark_module_imports_no_torch():
    """asv starts a process per benchmark, most of which only report what setup_cache
    measured: importing the module must not cost them torch (benchmarks.common)."""
    code = "import sys; from benchmarks import bench_transfer; print('torch' in sys.modules)"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of the benchmark")
def test_benchmark_skips_what_a_cpu_cannot_run_and_pairs_the_rest(monkeypatch):
    """One process measures a class (setup_cache); its track_* processes report. What a CPU
    cannot run is NaN (asv's skip), never a failure; plain PyTorch's pageable path (the
    baseline), speedlib's 'pageable' and 'auto' take turns and their ratios are per round;
    EmbeddingStep's baseline is plain PyTorch's SparseAdam on the host. A small batch stands in
    for workloads.embedding()."""
    import math  # noqa: PLC0415

    from benchmarks import bench_transfer as bench  # noqa: PLC0415
    from speedbench.measure import workloads  # noqa: PLC0415

    spec = workloads.EmbeddingBatch(rows=131072, dim=128, batch=4096)  # a 64 MiB table
    monkeypatch.setattr(bench, "_spec", lambda: spec)
    monkeypatch.setattr(bench, "BATCH_BYTES", spec.batch * spec.dim * 4)
    for cls in (bench.Transfer, bench.EmbeddingStep):
        monkeypatch.setattr(cls, "pairs", 3)
        monkeypatch.setattr(cls, "warmup", 0)

    floor = bench.FractionOfFloor()
    cache = floor.measure_all()
    for variant in bench.VARIANTS:
        assert math.isnan(floor.track_gather_fraction_of_floor(cache, variant))
        assert math.isnan(floor.track_scatter_fraction_of_floor(cache, variant))
    copy = bench.CopyBandwidth()
    assert math.isnan(copy.track_copy_bandwidth(copy.measure_all(), "h2d", "pinned"))
    device = bench.DeviceFootprint()
    assert math.isnan(device.track_device_footprint(device.measure_all(), "pageable"))
    assert bench.Transfer.baseline == "torch_pageable" and bench.EmbeddingStep.baseline == "sparse_adam_host"

    # Resident memory grows by the table only in a fresh process, as asv's setup_cache is:
    # in this one, memory earlier tests freed can take the table without growing it.
    code = ("import json; from benchmarks import bench_transfer as bench; from speedbench.measure import workloads\n"
            f"spec = workloads.EmbeddingBatch(rows={spec.rows}, dim={spec.dim}, batch={spec.batch})\n"
            "bench._spec = lambda: spec\n"
            "host = bench.Footprint(); cache = host.measure_all()\n"
            "print(json.dumps([host.track_host_footprint(cache, v) for v in ('uva', 'pageable', 'torch_pageable', 'auto')]))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    uva, *host_tables = json.loads(out.stdout.strip().splitlines()[-1])
    assert math.isnan(uva)
    table_bytes = spec.rows * spec.dim * 4
    assert all(0.75 * table_bytes < used < 1.25 * table_bytes for used in host_tables), host_tables

    transfer = bench.Transfer()
    cache = transfer.measure_all()
    assert not bench._tables  # the tables went with the class's measurement
    for op in bench.OPS:
        for order in bench.ORDERS:
            base = transfer.track_seconds(cache, op, order, "torch_pageable")["samples"]
            assert math.isnan(transfer.track_speedup(cache, op, order, "torch_pageable"))  # the CPU's baseline
            for variant in ("pageable", "auto"):
                seconds = transfer.track_seconds(cache, op, order, variant)["samples"]
                assert len(seconds) == len(base) == 3 and min(seconds + base) > 0
                gbps = transfer.track_bandwidth(cache, op, order, variant)["samples"]
                assert gbps == pytest.approx([spec.batch * spec.dim * 4 / s / 1e9 for s in seconds])
                ratios = transfer.track_speedup(cache, op, order, variant)["samples"]
                assert ratios == pytest.approx([b / s for b, s in zip(base, seconds)])  # per round
            for variant in [*GPU_BACKENDS, "torch_pinned"]:
                assert math.isnan(transfer.track_seconds(cache, op, order, variant))
                assert math.isnan(transfer.track_speedup(cache, op, order, variant))

    steps = bench.EmbeddingStep()
    cache = steps.measure_all()
    assert math.isnan(steps.track_seconds(cache, "uva")) and math.isnan(steps.track_seconds(cache, "sparse_adam"))
    sparse = steps.track_seconds(cache, "sparse_adam_host")["samples"]
    for variant in ("pageable", "auto"):
        mine = steps.track_seconds(cache, variant)["samples"]
        ratios = steps.track_speedup(cache, variant)["samples"]
        assert len(mine) == len(sparse) == len(ratios) == 3 and min(mine + sparse) > 0
        assert ratios == pytest.approx([a / b for a, b in zip(sparse, mine)])  # per round, never of medians


def test_benchmark_looks_up_sparse_adam_indices_on_the_tables_device(monkeypatch):
    """sparse_adam's nn.Embedding is on the GPU and the indices arrive pinned on the host, as
    on a GPU machine. Without a GPU, fake tensors stand in: FakeTensorMode gives tensors a
    CUDA device without memory and refuses an op mixing devices, as CUDA kernels do. Autograd
    would start its CUDA worker (which needs a GPU), so backward is a no-op: the lookup is
    where devices meet."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

    from benchmarks import bench_transfer as bench  # noqa: PLC0415
    from speedbench.measure import devices as measure  # noqa: PLC0415

    monkeypatch.setattr(measure, "device", lambda prefer=None: torch.device("cuda", 0))
    monkeypatch.setattr(measure, "synchronize", lambda dev=None: None)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *args, **kwargs: self)  # fake tensors cannot pin
    monkeypatch.setattr(torch.Tensor, "backward", lambda self, *args, **kwargs: None)
    with FakeTensorMode(allow_non_fake_inputs=True):
        trainer = bench._EmbeddingTrainer("sparse_adam")  # two warm-up steps
        trainer.step()
    assert trainer.idx.device.type == "cpu"  # the indices still arrive on the host: moving them is timed


# --- several lookups per step, lookups without backward ------------------------------------

def _sgns_batches(steps=4, batch=8, negatives=3, seed=5):
    """(centre, positive, negatives) word indices; contexts use rows < 20 only, so they repeat."""
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, ROWS, (batch,), generator=gen), torch.randint(0, ROWS // 2, (batch,), generator=gen),
             torch.randint(0, ROWS // 2, (batch, negatives), generator=gen)) for _ in range(steps)]


def _sgns_loss(centre, pos, neg):
    """Skip-gram with negative sampling: the positive context scores high, the negatives low."""
    return -(F.logsigmoid((centre * pos).sum(-1)) + F.logsigmoid(-(centre.unsqueeze(1) * neg).sum(-1)).sum(-1)).mean()


def _sgns_reference(w_in, w_out, make_opt, batches, shared, sparse=False):
    emb_in = nn.Embedding.from_pretrained(w_in.clone(), freeze=False, sparse=sparse)
    emb_out = emb_in if shared else nn.Embedding.from_pretrained(w_out.clone(), freeze=False, sparse=sparse)
    opt = make_opt(list(emb_in.parameters()) + ([] if shared else list(emb_out.parameters())))
    for centre, pos, neg in batches:
        opt.zero_grad()
        _sgns_loss(emb_in(centre), emb_out(pos), emb_out(neg)).backward()
        opt.step()
    return emb_in.weight.detach(), emb_out.weight.detach()


def _sgns_host(w_in, w_out, make_opt, batches, shared, backend="pageable", device=None, **kwargs):
    def build(w):
        return HostEmbedding(ROWS, DIM, make_opt, backend=backend, device=device or _train_device(backend), weight=w,
                             **kwargs)

    emb_in = build(w_in)
    emb_out = emb_in if shared else build(w_out)
    for centre, pos, neg in batches:
        _sgns_loss(emb_in(centre), emb_out(pos), emb_out(neg)).backward()  # emb_out: two lookups, one step
        for emb in {emb_in, emb_out}:
            emb.step()
    return emb_in.table.cpu().cpu(), emb_out.table.cpu().cpu()  # 'device' tables: .cpu() is a copy


@pytest.mark.parametrize("shared", [False, True], ids=["in-and-out-tables", "one-table"])
def test_word2vec_lookups_in_one_step_with_sgd_equal_nn_embedding(shared):
    """Positives and negatives looked up separately, one backward, one step: the gradients of a
    row used by both lookups add up, and every touched row moves once, as with nn.Embedding."""
    w_in, w_out, make = _reference(ROWS, DIM, seed=1), _reference(ROWS, DIM, seed=2), functools.partial(torch.optim.SGD, lr=0.5)
    batches = _sgns_batches()
    got, want = _sgns_host(w_in, w_out, make, batches, shared), _sgns_reference(w_in, w_out, make, batches, shared)
    if shared:  # three lookups of one row: autograd may add the three gradients in another order
        torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-7)
    else:  # two lookups: a + b == b + a, so the sums are bitwise those of nn.Embedding
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not torch.equal(got[1], w_out if not shared else w_in)


@pytest.mark.parametrize("shared", [False, True], ids=["in-and-out-tables", "one-table"])
def test_word2vec_lookups_in_one_step_with_adam_equal_sparse_adam(shared):
    """Adam's state makes a row updated twice in a step, or a gradient split over two updates,
    visibly different from SparseAdam's one update with the summed gradient."""
    w_in, w_out = _reference(ROWS, DIM, seed=1), _reference(ROWS, DIM, seed=2)
    batches = _sgns_batches()
    # eps enters SparseAdam before the bias correction and Adam after it. Here gradients that
    # nearly cancel make it matter (2e-4 apart with the default 1e-8), so both get an eps
    # too small to count; what remains is rounding (1e-7).
    got = _sgns_host(w_in, w_out, functools.partial(torch.optim.Adam, lr=0.05, eps=1e-12), batches, shared)
    want = _sgns_reference(w_in, w_out, functools.partial(torch.optim.SparseAdam, lr=0.05, eps=1e-12), batches, shared,
                           sparse=True)
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ON_GPU)
def test_several_lookups_with_padding_on_gpu_backends_equal_pageable(backend):
    """The GPU-indexed backends find distinct rows and merge lookups on the GPU; compared with
    'pageable' on the CPU to a tolerance, as GPU kernels round differently."""
    w_in, w_out, make = _reference(ROWS, DIM, seed=1), _reference(ROWS, DIM, seed=2), functools.partial(torch.optim.Adam, lr=0.05)
    host = _sgns_host(w_in, w_out, make, _sgns_batches(), False, padding_idx=1)
    gpu = _sgns_host(w_in, w_out, make, _sgns_batches(), False, backend=backend, device="cuda", padding_idx=1)
    for g, h in zip(gpu, host):
        torch.testing.assert_close(g, h, rtol=1e-5, atol=1e-6)
    assert torch.equal(gpu[1][1], w_out[1])


def test_lookups_without_backward_touch_nothing():
    """Lookups whose outputs never reach a backward, before the training lookup, after it, or
    between backward and step(), leave the table and state as if they had not happened.
    AdamW's weight decay would move any row counted as touched, even with a zero gradient."""
    w = _reference(ROWS, DIM)
    make = functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.5)
    plain, _ = _train_host(w, make, _batches())
    emb = HostEmbedding(ROWS, DIM, make, backend="pageable", device="cpu", weight=w)
    unused = torch.arange(ROWS // 2, ROWS).reshape(4, -1)  # rows no training batch uses
    emb(unused[0])
    emb.step()  # only lookups without backward since the last step: nothing changes, no error
    assert torch.equal(emb.table.cpu(), w)
    for idx, target in _batches():
        emb(unused[1])  # evaluation without torch.no_grad(), result dropped
        out = emb(idx)
        dropped = _loss(emb(unused[2]), torch.zeros(DIM))  # a loss never backpropagated
        _loss(out, target).backward()
        emb(unused[3])  # between backward and step
        emb.step()
        del dropped
    assert torch.equal(emb.table.cpu(), plain.table.cpu())
    assert torch.equal(emb.table.cpu()[ROWS // 2:], w[ROWS // 2:])
    for key, table in emb._state_tables.items():
        assert torch.equal(table.cpu(), plain._state_tables[key].cpu()), key


def test_a_gradient_arriving_after_step_updates_the_current_rows():
    """An output looked up before step() and backpropagated after it: its gradient is applied
    at the next step() to the rows as they are then, as nn.Embedding + SGD does."""
    w, a, b = _reference(ROWS, DIM), torch.tensor([1, 2, 3]), torch.tensor([3, 4])  # row 3 in both
    target = torch.randn(3, DIM, generator=torch.Generator().manual_seed(9))
    ref = nn.Embedding.from_pretrained(w.clone(), freeze=False)
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    emb = HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.5), backend="pageable", device="cpu", weight=w)
    for model, step in ((ref, opt.step), (emb, emb.step)):
        late = _loss(model(a), target)
        _loss(model(b), target[:2]).backward()
        step()
        opt.zero_grad()
        late.backward()
        step()
    assert torch.equal(emb.table.cpu(), ref.weight.detach())


def test_zero_grad_drops_gathered_gradients():
    w = _reference(ROWS, DIM)
    emb = HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.5), backend="pageable", device="cpu", weight=w)
    emb(torch.tensor([1, 2])).sum().backward()
    emb.zero_grad()
    emb.step()
    assert torch.equal(emb.table.cpu(), w)


# --- padding_idx, from_pretrained, clipping -------------------------------------------------

def _with_padding(batches, pad):
    out = []
    for idx, target in batches:
        idx = idx.clone()
        idx[:, 0] = pad  # a padded position in every sample
        out.append((idx, target))
    return out


@pytest.mark.parametrize("pad", [3, -1], ids=["pad-3", "pad-minus-1"])
def test_padding_idx_equals_nn_embedding(pad):
    w = _reference(ROWS, DIM)
    make = functools.partial(torch.optim.SGD, lr=0.1)
    batches = _with_padding(_batches(), pad % ROWS)
    ref_w, ref_outs = _train_reference(w, make, batches, padding_idx=pad)
    emb, outs = _train_host(w, make, batches, padding_idx=pad)
    assert emb.padding_idx == pad % ROWS
    assert all(torch.equal(a, b) for a, b in zip(outs, ref_outs))  # lookups return the padding row's value
    assert torch.equal(emb.table.cpu(), ref_w)
    assert torch.equal(emb.table.cpu()[pad], w[pad])


def test_padding_row_is_never_written_not_even_by_weight_decay_or_momentum():
    """The padding row is not a touched row: no update, no optimizer state, whatever the optimizer."""
    w, pad = _reference(ROWS, DIM), 3
    batches = _with_padding(_batches(), pad)
    for make in (functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.5),
                 functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=0.1)):
        emb, _ = _train_host(w, make, batches, padding_idx=pad)
        assert torch.equal(emb.table.cpu()[pad], w[pad])
        assert emb._state_tables and all(not t.cpu()[pad].any() for t in emb._state_tables.values())
    # ...and the other rows train as with SparseAdam on nn.Embedding(padding_idx=...).
    ref_w, _ = _train_reference(w, functools.partial(torch.optim.SparseAdam, lr=0.05), batches, sparse=True, padding_idx=pad)
    emb, _ = _train_host(w, functools.partial(torch.optim.Adam, lr=0.05), batches, padding_idx=pad)
    torch.testing.assert_close(emb.table.cpu(), ref_w, rtol=1e-5, atol=1e-6)


def test_padding_row_starts_as_zeros_with_random_init_as_in_nn_embedding():
    torch.manual_seed(0)
    emb = HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.1), backend="pageable", device="cpu",
                        padding_idx=-2)
    assert emb.padding_idx == ROWS - 2 == nn.Embedding(ROWS, DIM, padding_idx=-2).padding_idx
    table = emb.table.cpu()
    assert not table[ROWS - 2].any() and table[ROWS - 1].all()
    # A given weight keeps its padding row, as nn.Embedding's _weight and from_pretrained do.
    w = _reference(ROWS, DIM)
    kept = HostEmbedding(ROWS, DIM, None, freeze=True, backend="pageable", device="cpu", weight=w, padding_idx=0)
    assert torch.equal(kept.table.cpu()[0], w[0])


@pytest.mark.parametrize("pad,error,message", [
    (ROWS, ValueError, "padding_idx must be within num_embeddings"),
    (-ROWS - 1, ValueError, "padding_idx must be within num_embeddings"),
    (1.5, TypeError, "padding_idx must be an int"),
    (True, TypeError, "padding_idx must be an int"),
])
def test_bad_padding_idx_is_refused(pad, error, message):
    with pytest.raises(error, match=message):
        HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.1), backend="pageable", device="cpu",
                      padding_idx=pad)


def test_from_pretrained_frozen_looks_up_only():
    w = _reference(ROWS, DIM, dtype=torch.float64)
    emb = HostEmbedding.from_pretrained(w, backend="pageable", device="cpu")  # frozen, no optimizer needed
    ref = nn.Embedding.from_pretrained(w)
    idx = torch.tensor([[1, 2], [2, 7]])
    out = emb(idx)
    assert emb.freeze and emb.table.dtype == torch.float64
    assert torch.equal(out, ref(idx)) and not out.requires_grad and not ref(idx).requires_grad
    emb.step()  # a frozen table's step() writes nothing
    w.add_(1.0)  # the table holds a copy
    assert torch.equal(emb.table.cpu(), w - 1.0)
    with pytest.raises(ValueError, match="without an optimizer"):
        emb.freeze = False


def test_from_pretrained_unfrozen_trains_as_nn_embedding_from_pretrained():
    w, pad = _reference(ROWS, DIM), 2
    make = functools.partial(torch.optim.SGD, lr=0.1)
    batches = _with_padding(_batches(), pad)
    ref = nn.Embedding.from_pretrained(w.clone(), freeze=False, padding_idx=pad)
    opt = make(ref.parameters())
    for idx, target in batches:
        opt.zero_grad()
        _loss(ref(idx), target).backward()
        opt.step()
    emb = HostEmbedding.from_pretrained(w, make, freeze=True, padding_idx=pad, backend="pageable", device="cpu")
    assert not emb(batches[0][0]).requires_grad  # frozen: no gradient anywhere...
    emb.step()
    assert torch.equal(emb.table.cpu(), w)
    emb.freeze = False  # ...until unfrozen
    emb, _ = _train_host(None, None, batches, emb=emb)
    assert emb.padding_idx == pad and torch.equal(emb.table.cpu(), ref.weight.detach())


def test_from_pretrained_and_new_arguments_refuse_bad_input():
    make = functools.partial(torch.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="must be 2-D"):
        HostEmbedding.from_pretrained(torch.zeros(5), backend="pageable", device="cpu")
    with pytest.raises(TypeError, match="embeddings must be a tensor"):
        HostEmbedding.from_pretrained([[1.0, 2.0]], backend="pageable", device="cpu")
    with pytest.raises(ValueError, match="optimizer=None is for frozen embeddings only"):
        HostEmbedding.from_pretrained(torch.zeros(5, 2), freeze=False, backend="pageable", device="cpu")
    table = HostTable(ROWS, DIM, backend="pageable", device="cpu")
    with pytest.raises(ValueError, match="brings its own backend"):
        HostEmbedding(ROWS, DIM, make, weight=table, backend="pageable")
    with pytest.raises(ValueError, match="weight must have shape"):
        HostEmbedding(ROWS + 1, DIM, make, weight=table)
    # A HostTable weight is trained in place.
    emb = HostEmbedding.from_pretrained(table, make, freeze=False)
    assert emb.table is table


def test_touched_rows_clip_like_nn_embedding():
    """clip_grad_norm_ over the model's parameters and touched_rows() clips exactly what it
    clips with nn.Embedding: rows no lookup used have zero gradient and add nothing to the
    norm. Two overlapping lookups per step: the norm is of their summed gradient."""
    w, max_norm = _reference(ROWS, DIM), 0.5
    gen = torch.Generator().manual_seed(4)
    steps = [(torch.randint(0, 10, (6,), generator=gen), torch.randint(5, 15, (6,), generator=gen)) for _ in range(4)]
    torch.manual_seed(0)
    head = nn.Linear(DIM, 1)
    results = []
    for host in (False, True):
        lin = nn.Linear(DIM, 1)
        lin.load_state_dict(head.state_dict())
        if host:
            emb = HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.5), backend="pageable", device="cpu",
                                weight=w)
            assert emb.touched_rows().grad is None  # before any backward: nothing to clip
            opt = torch.optim.SGD(lin.parameters(), lr=0.5)
        else:
            emb = nn.Embedding.from_pretrained(w.clone(), freeze=False)
            opt = torch.optim.SGD([*lin.parameters(), emb.weight], lr=0.5)
        norms = []
        for a, b in steps:
            opt.zero_grad()
            (lin(emb(a)).square().mean() + lin(emb(b)).square().mean()).backward()
            params = [*lin.parameters(), emb.touched_rows() if host else emb.weight]
            norms.append(torch.nn.utils.clip_grad_norm_(params, max_norm))
            opt.step()
            if host:
                emb.step()
        results.append((torch.stack(norms), emb.table.cpu() if host else emb.weight.detach(), lin.weight.detach()))
    (ref_norms, ref_w, ref_lin), (norms, got_w, got_lin) = results
    assert (ref_norms > max_norm).all()  # every step was clipped
    torch.testing.assert_close(norms, ref_norms, rtol=1e-6, atol=0)
    torch.testing.assert_close(got_w, ref_w, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got_lin, ref_lin, rtol=1e-6, atol=1e-7)


# --- DistributedDataParallel ----------------------------------------------------------------

_DDP_RANK = textwrap.dedent("""
    import datetime, functools, sys
    import torch, torch.distributed as dist
    from speedlib.transfer import HostEmbedding

    rank, init, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)  # two ranks share the machine's cores
    w, batches, max_norm = torch.load(folder + "/data.pt")
    make = functools.partial(torch.optim.SGD, lr=0.5, momentum=0.9)
    early = HostEmbedding(8, 2, make, backend="pageable", device="cpu")  # built before the process group
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    result = {}
    early(torch.tensor([1])).sum().backward()
    try:
        early.step()
    except RuntimeError as e:
        result["early"] = str(e)
    torch.manual_seed(rank)  # different random tables: construction makes them rank 0's
    result["seeded"] = HostEmbedding(50, 3, make, backend="pageable", device="cpu").table.cpu().clone()
    singles = [dist.new_group([0]), dist.new_group([1])]  # every rank creates every group, in one order
    alone = HostEmbedding(8, 2, make, backend="pageable", device="cpu", process_group=singles[rank])
    emb = HostEmbedding(w.shape[0], w.shape[1], make, backend="pageable", device="cpu", weight=w)
    for step, (idx, target) in enumerate(batches):
        idx, target = idx.tensor_split(2)[rank], target.tensor_split(2)[rank]
        out = emb(idx)
        (((out - target) ** 2).sum() / out.shape[0]).backward()  # the mean over the local batch
        if step % 2:  # clipping sees the gradient summed over the ranks, as under DDP
            result.setdefault("norms", []).append(float(torch.nn.utils.clip_grad_norm_([emb.touched_rows()], max_norm)))
        emb.step()
    if rank == 0:  # a single-rank group needs no collective, so one rank stepping alone cannot hang
        alone(torch.tensor([0])).sum().backward()
        alone.step()
    result["table"], result["momentum"] = emb.table.cpu().clone(), emb._state_tables["momentum_buffer"].cpu().clone()
    torch.save(result, f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()
""")


def _run_ranks(script: str, tmp_path, world: int = 2, timeout: float = 120) -> list[dict]:
    """Start `world` ranks of `script` (args: rank, init method, directory), each saving
    rank<r>.pt; a rank that fails or hangs fails the test within `timeout` seconds."""
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), init, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    try:
        logs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:  # after a timeout, or a rank that failed while its peer waits
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} failed:\n{log}"
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


def test_ddp_ranks_train_one_table_as_one_process_on_the_global_batch(tmp_path):
    """Two gloo ranks, each with half of every batch (different rows, some shared): every
    rank ends with the table and momentum of one process trained on the whole batch."""
    w, batches, max_norm = _reference(ROWS, DIM), _batches(steps=4), 1.0
    torch.save((w, batches, max_norm), tmp_path / "data.pt")
    ranks = _run_ranks(_DDP_RANK, tmp_path)
    single = HostEmbedding(ROWS, DIM, functools.partial(torch.optim.SGD, lr=0.5, momentum=0.9), backend="pageable",
                           device="cpu", weight=w)
    norms = []
    for step, (idx, target) in enumerate(batches):
        _loss(single(idx), target).backward()
        if step % 2:
            norms.append(float(torch.nn.utils.clip_grad_norm_([single.touched_rows()], max_norm)))
        single.step()
    assert all(n > max_norm for n in norms)  # the clipping did something
    for r, got in enumerate(ranks):
        assert "initialised after this HostEmbedding was built" in got["early"], r
        assert torch.equal(got["seeded"], ranks[0]["seeded"]), r
        torch.testing.assert_close(got["table"], single.table.cpu(), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got["momentum"], single._state_tables["momentum_buffer"].cpu(), rtol=1e-6, atol=1e-6)
        assert got["norms"] == pytest.approx(norms, rel=1e-6)
    # The ranks apply the same update to the same rows: their tables are bitwise equal.
    assert torch.equal(ranks[0]["table"], ranks[1]["table"]) and torch.equal(ranks[0]["momentum"], ranks[1]["momentum"])


# --- memory-mapped tables -------------------------------------------------------------------

def _in_file_mapping(address: int, path) -> bool:
    """Whether `address` lies in a mapping of `path` in this process (Linux's /proc/self/maps):
    true of a memory-mapped table, false of any copy of it in ordinary memory."""
    target = os.path.realpath(path)
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == target:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                if lo <= address < hi:
                    return True
    return False


needs_proc_maps = pytest.mark.skipif(not os.path.exists("/proc/self/maps"),
                                     reason="tells a file mapping from a copy through Linux's /proc/self/maps")


@needs_proc_maps
@pytest.mark.parametrize("backend", ["pageable", pytest.param("pinned", marks=needs_cuda)])
def test_memory_mapped_table_trains_in_the_file(tmp_path, backend):
    """'pinned' indexes the mapped file on the CPU into its pinned staging buffers; its
    Adam runs on the GPU, so it matches the CPU reference to rounding, not bitwise."""
    tolerance = {"rtol": 0, "atol": 0} if backend == "pageable" else {"rtol": 1e-5, "atol": 1e-6}
    w, path = _reference(ROWS, DIM), tmp_path / "emb.npy"
    np.save(path, w.numpy())
    make = functools.partial(torch.optim.Adam, lr=0.05)
    in_ram, _ = _train_host(w, make, _batches())
    emb = HostEmbedding.from_pretrained(path, make, freeze=False, backend=backend,
                                        device="cpu" if backend == "pageable" else None)
    assert emb.table.file == str(path) and emb.table.writable
    assert _in_file_mapping(emb.table.cpu().data_ptr(), path)  # mapped, not read into RAM
    emb, _ = _train_host(None, None, _batches(), emb=emb)
    torch.testing.assert_close(emb.table.cpu(), in_ram.table.cpu(), **tolerance)
    assert _in_file_mapping(emb.table.cpu().data_ptr(), path)  # still the file after training
    emb.table.flush()
    on_disk = torch.from_numpy(np.load(path))  # read afresh, not mapped
    torch.testing.assert_close(on_disk, in_ram.table.cpu(), **tolerance)
    assert not torch.equal(on_disk, w)


def test_from_file_takes_an_open_memmap_without_copying(tmp_path):
    path = tmp_path / "emb.npy"
    np.save(path, _reference(ROWS, DIM).numpy())
    mapped = np.load(path, mmap_mode="r+")
    table = HostTable.from_file(mapped, backend="pageable", device="cpu")
    table.scatter_(torch.tensor([3, 3]), torch.stack([torch.zeros(DIM), torch.ones(DIM)]))
    assert (mapped[3] == 1).all()  # the write went into the caller's mapping itself
    assert torch.equal(table.gather(torch.tensor([3])), torch.ones(1, DIM))
    assert "file=" in repr(table)


def test_read_only_mapping_looks_up_but_never_writes(tmp_path):
    w, path = _reference(ROWS, DIM), tmp_path / "emb.npy"
    np.save(path, w.numpy())
    make = functools.partial(torch.optim.SGD, lr=0.1)
    frozen = HostEmbedding.from_pretrained(path, make, backend="pageable", device="cpu")  # frozen: opened read-only
    assert not frozen.table.writable and "read-only" in repr(frozen.table)
    assert torch.equal(frozen(torch.tensor([1, 5])), w[[1, 5]])
    frozen.step()  # nothing to write
    with pytest.raises(ValueError, match="read-only and cannot be trained"):
        frozen.freeze = False
    with pytest.raises(ValueError, match="read-only: open it with mode 'r\\+'"):
        frozen.table.scatter_(torch.tensor([1]), torch.zeros(1, DIM))
    with pytest.raises(ValueError, match="read-only"):
        frozen.table.copy_(torch.zeros(1, DIM))
    with pytest.raises(ValueError, match="read-only and cannot be trained"):
        HostEmbedding.from_pretrained(np.load(path, mmap_mode="r"), make, freeze=False, backend="pageable", device="cpu")
    with pytest.raises(ValueError, match="no writable weight"):  # a write through a view would crash, not raise
        frozen.weight.data.zero_()
    with pytest.raises(ValueError, match="max_norm renormalises .* read-only"):
        HostEmbedding.from_pretrained(path, max_norm=1.0, backend="pageable", device="cpu")
    assert torch.equal(torch.from_numpy(np.load(path)), w)


def test_from_file_refuses_bad_files_and_backends(tmp_path):
    good = tmp_path / "good.npy"
    np.save(good, np.zeros((4, 3), dtype=np.float32))
    cases = [
        (tmp_path / "missing.npy", {}, FileNotFoundError, "no file .*open_memmap"),
        (np.zeros((4, 3), dtype=np.int64), {}, TypeError, "path to a .npy file or a numpy.memmap"),
        (good, {"mode": "w+"}, ValueError, "mode must be 'r\\+'"),
        (good, {"backend": "uva"}, ValueError, "only 'auto', 'pageable' or 'pinned' can map a file"),
        (good, {"backend": "device"}, ValueError, "only 'auto', 'pageable' or 'pinned' can map a file"),
    ]
    for name, array in [("ints", np.zeros((4, 3), dtype=np.int64)), ("cube", np.zeros((2, 2, 2), dtype=np.float32)),
                        ("fortran", np.asfortranarray(np.zeros((4, 3), dtype=np.float32))),
                        ("bigendian", np.zeros((4, 3), dtype=">f4")), ("objects", np.array([[None]], dtype=object))]:
        np.save(tmp_path / f"{name}.npy", array)
    np.savez(tmp_path / "two.npz", a=np.zeros((2, 2)), b=np.zeros((2, 2)))
    cases += [
        (tmp_path / "ints.npy", {}, TypeError, "holds native-endian float16, float32 or float64, not int64"),
        (tmp_path / "bigendian.npy", {}, TypeError, "native-endian"),
        (tmp_path / "cube.npy", {}, ValueError, "2-D"),
        (tmp_path / "fortran.npy", {}, ValueError, "C-contiguous"),
        (tmp_path / "objects.npy", {}, ValueError, "not a .npy array of numbers"),
        (tmp_path / "two.npz", {}, ValueError, "not a single .npy array"),
    ]
    for file, kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            HostTable.from_file(file, **{"backend": "pageable", "device": "cpu", **kwargs})
    assert HostTable.from_file(good, backend="pageable", device="cpu").shape == (4, 3)


def test_a_table_larger_than_memory_is_a_memory_error_that_says_what_to_do():
    """torch's allocator says only how many bytes it could not get, and nothing of the table."""
    with pytest.raises(MemoryError, match=r"a 1000000000000 x 1000000 torch.float32 table needs .* GiB.*from_file"):
        HostTable(10**12, 10**6, backend="pageable", device="cpu")


# --- drop-in gaps with nn.Embedding (issue 31): .weight, nn.Embedding's options, dtypes, GradScaler, Adam ---

def _host(weight=None, make=functools.partial(torch.optim.SGD, lr=0.1), backend="pageable", **kwargs):
    return HostEmbedding(ROWS, DIM, make, backend=backend, device=_train_device(backend), weight=weight, **kwargs)


@pytest.mark.parametrize("backend", ALL)
def test_weight_initialisers_write_into_the_table_as_into_nn_embedding(backend):
    """`emb.weight.data.uniform_(...)`, `.normal_`, `.copy_` and nn.init change the rows the
    table holds, exactly as they change nn.Embedding's weight. The reference lives where the
    weight does ('device': the GPU), so both draw from the same generator."""
    emb = _host(backend=backend)
    ref = nn.Embedding(ROWS, DIM, device=emb.weight.device)
    inits = [lambda w: w.data.uniform_(-0.1, 0.1), lambda w: w.data.normal_(0, 0.02),
             lambda w: nn.init.xavier_uniform_(w), lambda w: w.data.copy_(torch.arange(ROWS * DIM).reshape(ROWS, DIM).float())]
    for init in inits:
        for w in (emb.weight, ref.weight):
            torch.manual_seed(7)
            init(w)
        assert torch.equal(emb.table.cpu().cpu(), ref.weight.detach().cpu())
        idx = torch.tensor([[3, 5], [5, 39]])
        assert torch.equal(emb(idx).detach().cpu(), ref(idx.to(ref.weight.device)).detach().cpu())
    assert emb.weight.shape == ref.weight.shape and emb.weight.dtype == ref.weight.dtype
    assert [p.shape for p in emb.parameters()] == []  # still no parameter for a model optimizer


def test_weight_written_between_backward_and_step_is_what_step_updates():
    """A write through .weight after the lookup reaches the update, as with nn.Embedding (whose
    optimizer steps the weight as it is at step time)."""
    w, (idx, target) = _reference(ROWS, DIM), _batches(steps=1)[0]
    ref = nn.Embedding.from_pretrained(w.clone(), freeze=False)
    emb = _host(w)
    for e in (ref, emb):
        _loss(e(idx), target).backward()
        with torch.no_grad():
            e.weight[idx[0, 0]] = 3.0
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    emb.step()
    assert torch.equal(emb.table.cpu(), ref.weight.detach())


def test_tying_the_table_to_another_layer_is_refused_with_what_to_do():
    """A layer computing with the table would get no gradient into it (only lookups train
    it): silently untied. Refused, naming the full-vocabulary lookup that ties correctly."""
    emb = _host(_reference(ROWS, DIM))
    h = torch.randn(3, DIM, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"emb\(torch.arange\(emb.num_embeddings\)\)"):
        F.linear(h, emb.weight)
    with pytest.raises(RuntimeError, match=r"emb\(torch.arange"):
        F.linear(h.detach(), nn.Parameter(emb.weight))
    with pytest.raises(AttributeError, match="cannot be replaced.*copy_"):
        emb.weight = nn.Parameter(torch.zeros(ROWS, DIM))
    # Reading the table under grad mode stays possible, and the tie that works trains as tying does.
    assert torch.equal(emb.weight.sum(0), emb.table.cpu().sum(0))
    ref = nn.Embedding.from_pretrained(_reference(ROWS, DIM), freeze=False)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for e in (ref, emb):
        logits = F.linear(e(torch.tensor([1, 2, 2])), e.weight if e is ref else e(torch.arange(e.num_embeddings)))
        F.cross_entropy(logits, torch.tensor([4, 5, 6])).backward()
    ref_opt.step()
    emb.step()
    torch.testing.assert_close(emb.table.cpu(), ref.weight.detach(), rtol=0, atol=1e-7)


@pytest.mark.parametrize("options", [
    {"max_norm": 1.0}, {"max_norm": 2.5, "norm_type": 1.0}, {"scale_grad_by_freq": True}, {"sparse": True},
    {"max_norm": 1.0, "scale_grad_by_freq": True, "padding_idx": 2},
], ids=["max-norm", "max-norm-l1", "scale-grad-by-freq", "sparse", "all-with-padding"])
def test_nn_embedding_options_train_as_in_nn_embedding(options):
    w, make = _reference(ROWS, DIM), functools.partial(torch.optim.SGD, lr=0.1)
    batches = _with_padding(_batches(), options["padding_idx"]) if "padding_idx" in options else _batches()
    ref = nn.Embedding(ROWS, DIM, _weight=w.clone(), **options)
    opt = make(ref.parameters())
    ref_outs = []
    for idx, target in batches:
        opt.zero_grad()
        out = ref(idx)
        ref_outs.append(out.detach().clone())
        _loss(out, target).backward()
        opt.step()
    emb, outs = _train_host(w, make, batches, **options)
    # A sparse gradient sums repeated indices in another order than a dense one: one ulp apart.
    tol = {"rtol": 1e-6, "atol": 1e-6} if options.get("sparse") else {"rtol": 0, "atol": 1e-7}
    for a, b in zip(outs, ref_outs):
        torch.testing.assert_close(a, b, **tol)
    torch.testing.assert_close(emb.table.cpu(), ref.weight.detach(), **tol)
    assert not torch.equal(emb.table.cpu(), w)


def test_max_norm_renormalises_looked_up_rows_in_place_also_without_gradients():
    """nn.Embedding renormalises the rows a lookup uses in the weight itself, frozen or not."""
    w = _reference(ROWS, DIM) * 3
    ref = nn.Embedding.from_pretrained(w.clone(), max_norm=1.0)
    emb = HostEmbedding.from_pretrained(w, max_norm=1.0, backend="pageable", device="cpu")
    idx = torch.tensor([[1, 4], [4, 9]])
    with torch.no_grad():
        assert torch.equal(emb(idx), ref(idx))
    assert torch.equal(emb.table.cpu(), ref.weight.detach())
    assert not torch.equal(emb.table.cpu(), w)


def test_sparse_false_and_impossible_options_are_refused_by_name():
    with pytest.raises(ValueError, match="sparse=False.*only the rows a batch touched"):
        _host(sparse=False)
    with pytest.raises(ValueError, match="max_norm must be positive"):
        _host(max_norm=0.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sprase'"):
        _host(sprase=True)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_weight_dtype_is_inferred_as_from_pretrained_does(dtype):
    w = _reference(ROWS, DIM, dtype=dtype)
    emb, ref = _host(w), nn.Embedding.from_pretrained(w, freeze=False)
    pre = HostEmbedding.from_pretrained(w, backend="pageable", device="cpu")
    idx = torch.tensor([1, 7])
    assert emb.table.dtype == pre.table.dtype == ref.weight.dtype == dtype
    assert torch.equal(emb(idx).detach(), ref(idx).detach()) and torch.equal(emb.weight, pre.weight)
    with pytest.raises(TypeError, match="cast explicitly"):  # an explicit dtype that disagrees is not a silent cast
        _host(w, dtype=torch.float32)


def _amp_batches():
    """Partial-coverage batches and, at step 2, a target so large that the scaled loss overflows."""
    batches = _batches(steps=5)
    batches[2] = (batches[2][0], torch.full_like(batches[2][1], 3e38))
    return batches


def test_grad_scaler_steps_the_embedding_optimizer_as_any_other():
    """scaler.step(emb.optimizer) unscales, checks for infs and skips the overflowing step,
    exactly as for nn.Embedding + SGD under the same scaler."""
    w, make = _reference(ROWS, DIM), functools.partial(torch.optim.SGD, lr=0.1)
    ref = nn.Embedding.from_pretrained(w.clone(), freeze=False)
    ref_opt, emb = make(ref.parameters()), _host(w)
    scalers = [torch.amp.GradScaler("cpu", init_scale=1024.0) for _ in range(2)]
    for idx, target in _amp_batches():
        for (model, opt), scaler in zip([(ref, ref_opt), (emb, emb.optimizer)], scalers):
            opt.zero_grad()
            scaler.scale(_loss(model(idx), target)).backward()
            scaler.step(opt)
            scaler.update()
    assert scalers[0].get_scale() == scalers[1].get_scale() < 1024.0  # the overflowing step was skipped
    assert torch.equal(emb.table.cpu(), ref.weight.detach())
    assert torch.isfinite(emb.table.cpu()).all()


def test_grad_scaler_with_unscale_then_emb_step_also_matches():
    w, make = _reference(ROWS, DIM), functools.partial(torch.optim.SGD, lr=0.1)
    ref = nn.Embedding.from_pretrained(w.clone(), freeze=False)
    ref_opt, emb = make(ref.parameters()), _host(w)
    scalers = [torch.amp.GradScaler("cpu", init_scale=1024.0) for _ in range(2)]
    for idx, target in _batches(steps=3):
        ref_opt.zero_grad()
        scalers[0].scale(_loss(ref(idx), target)).backward()
        scalers[0].step(ref_opt)
        scalers[0].update()
        scalers[1].scale(_loss(emb(idx), target)).backward()
        scalers[1].unscale_(emb.optimizer)
        scalers[1].step(emb.optimizer)  # after unscale_: no second unscale
        scalers[1].update()
    assert torch.equal(emb.table.cpu(), ref.weight.detach())


def test_adam_is_sparse_adam_whose_eps_is_scaled_by_the_bias_correction():
    """What HostEmbedding + Adam(eps) is exactly: SparseAdam whose eps at step t is
    eps * sqrt(1 - beta2**t) (SparseAdam adds eps before dividing by that square root, Adam
    after). With gradients ~1e-8 plain SparseAdam differs visibly; the rescaled one does not."""
    w, eps, beta2, lr = _reference(ROWS, DIM), 1e-8, 0.999, 0.05
    batches = _batches()
    tiny = lambda out, target: _loss(out, target) * 1e-8  # noqa: E731 - gradients ~1e-8, near eps
    ref = nn.Embedding(ROWS, DIM, sparse=True, _weight=w.clone())
    plain = nn.Embedding(ROWS, DIM, sparse=True, _weight=w.clone())
    ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=lr, eps=eps)
    plain_opt = torch.optim.SparseAdam(plain.parameters(), lr=lr, eps=eps)
    emb = _host(w, functools.partial(torch.optim.Adam, lr=lr, eps=eps))
    for t, (idx, target) in enumerate(batches, start=1):
        ref_opt.param_groups[0]["eps"] = eps * (1 - beta2 ** t) ** 0.5
        for model, opt in ((ref, ref_opt), (plain, plain_opt), (emb, emb.optimizer)):
            opt.zero_grad()
            tiny(model(idx), target).backward()
            model.step() if model is emb else opt.step()
    torch.testing.assert_close(emb.table.cpu(), ref.weight.detach(), rtol=1e-6, atol=1e-6)
    assert (emb.table.cpu() - plain.weight.detach()).abs().max() > 1e-3  # the docs' old "1e-5" does not hold here


def test_fraction_of_floor_reports_the_gbps_its_percent_was_computed_from(monkeypatch):
    """FractionOfFloor keeps both terms of each %, GB/s, from the one measurement: gather over
    the host->device floor, write-back over device->host, each floor timed once in the same
    process. The % tracks are unchanged; a variant that cannot run is NaN in every track.
    Fakes stand in for the GPU: 12.5 GB/s over a 25 GB/s floor is 50 %."""
    import math  # noqa: PLC0415

    from benchmarks import bench_transfer as bench  # noqa: PLC0415
    from speedbench.measure import devices as measure  # noqa: PLC0415

    floors, timed = {"h2d": 25e9, "d2h": 20e9}, []

    def copy(dev, direction, pinned):
        assert pinned and dev == "fake-gpu"
        timed.append(direction)
        return floors[direction]

    class FakeTable:
        def __init__(self, variant, spec, dev, indices):
            self.variant = variant

        def op(self, op):
            return lambda order: (op, order)

    def median_bandwidth(fn, dev):
        op, order = fn()
        assert order == "random"
        return {"gather": 12.5e9, "scatter": 5e9}[op]

    def runs_here(variant, dev):
        if variant == "cupy":
            raise NotImplementedError("CuPy is not installed")

    monkeypatch.setattr(bench.common, "gpu_only", lambda what: None)
    monkeypatch.setattr(bench, "_device", lambda: "fake-gpu")
    monkeypatch.setattr(bench, "_spec", lambda: None)
    monkeypatch.setattr(bench, "_host_indices", lambda spec, dev: {})
    monkeypatch.setattr(bench, "_runs_here", runs_here)
    monkeypatch.setattr(bench, "_Table", FakeTable)
    monkeypatch.setattr(bench, "_median_bandwidth", median_bandwidth)
    monkeypatch.setattr(measure, "host_copy_bandwidth", copy)

    floor = bench.FractionOfFloor()
    cache = {("uva",): ("ok", floor.measure_one("uva")), ("cupy",): ("skip", "CuPy is not installed")}
    assert timed == ["h2d", "d2h"]  # one floor per direction, in the measuring process
    assert floor.track_gather_fraction_of_floor(cache, "uva") == pytest.approx(50.0)
    assert floor.track_scatter_fraction_of_floor(cache, "uva") == pytest.approx(25.0)
    assert floor.track_gather_bandwidth(cache, "uva") == pytest.approx(12.5)
    assert floor.track_h2d_floor(cache, "uva") == pytest.approx(25.0)
    assert floor.track_scatter_bandwidth(cache, "uva") == pytest.approx(5.0)
    assert floor.track_d2h_floor(cache, "uva") == pytest.approx(20.0)
    tracks = (floor.track_gather_fraction_of_floor, floor.track_scatter_fraction_of_floor, floor.track_gather_bandwidth,
              floor.track_scatter_bandwidth, floor.track_h2d_floor, floor.track_d2h_floor)
    assert all(math.isnan(track(cache, "cupy")) for track in tracks)
    # the GB/s are kind "bandwidth" (unit GB/s), the % still "fraction of floor", each in its own words
    from speedbench import words  # noqa: PLC0415
    from speedbench.results.load import metric_kind  # noqa: PLC0415

    for track in tracks[2:]:
        assert track.unit == "GB/s" and metric_kind("track", track.unit) == "bandwidth"
        assert words.metric(track.__name__.removeprefix("track_")) != track.__name__.removeprefix("track_")
    assert metric_kind("track", floor.track_gather_fraction_of_floor.unit) == "fraction of floor"


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of the benchmark")
def test_fraction_of_floor_gbps_are_skips_on_a_cpu():
    """GPUs only, as the % are: a CPU records NaN (asv's skip) for every variant."""
    import math  # noqa: PLC0415

    from benchmarks import bench_transfer as bench  # noqa: PLC0415

    floor = bench.FractionOfFloor()
    cache = floor.measure_all()
    for variant in bench.VARIANTS:
        for track in (floor.track_gather_bandwidth, floor.track_scatter_bandwidth, floor.track_h2d_floor,
                      floor.track_d2h_floor):
            assert math.isnan(track(cache, variant))


def test_the_plain_pytorch_baselines_move_the_rows_speedlib_moves(monkeypatch):
    """bench_transfer's baselines are torch alone: the pageable one as it is, the pinned one's
    logic with stand-ins for what needs a GPU (pinning, the copy's event), on a batch shorter
    than its buffer; each gathers the rows a speedlib table gathers and writes back alike."""
    import types  # noqa: PLC0415

    from benchmarks import bench_transfer as bench  # noqa: PLC0415

    class Event:
        def record(self):
            self.recorded = True

        def synchronize(self):
            assert self.recorded

    class Stream:
        def synchronize(self):
            pass

    def unpinned(make):
        return lambda *shape, pin_memory=False, **kw: make(*shape, **kw)

    fake = types.SimpleNamespace(zeros=unpinned(torch.zeros), empty=unpinned(torch.empty), index_select=torch.index_select,
                                 cuda=types.SimpleNamespace(Event=Event, current_stream=Stream))
    weight = torch.randn(50, 4, generator=torch.Generator().manual_seed(2))
    idx = torch.tensor([7, 3, 7, 49, 0])
    reference = HostTable.from_tensor(weight, backend="pageable", device="cpu")
    pinned = bench._TorchPinned.__new__(bench._TorchPinned)  # its __init__ pins: the GPU test below runs it
    pinned.torch, pinned.device, pinned.copied = fake, torch.device("cpu"), None
    pinned.table, pinned.buffer = fake.zeros(50, 4, pin_memory=True), fake.empty(8, 4, pin_memory=True)
    pageable = bench._storage("torch_pageable", 50, 4, torch.device("cpu"), 8)
    for table in (pageable, pinned):
        table.table.copy_(weight)
        for _ in range(2):  # the second gather waits for the first's copy before refilling the buffer
            assert torch.equal(table.gather(idx), reference.gather(idx))
        values = torch.randn(3, 4)
        rows = torch.tensor([1, 4, 2])
        table.scatter_(rows, values)
        reference.scatter_(rows, values)
        assert torch.equal(table.table, reference.cpu())
        reference.copy_(weight)
    assert type(bench._storage("pageable", 5, 4, torch.device("cpu"), 2)).__name__ == "HostTable"


@needs_cuda
def test_the_plain_pytorch_pinned_baseline_gathers_and_writes_back_on_a_gpu():
    from benchmarks import bench_transfer as bench  # noqa: PLC0415

    weight = torch.randn(300, 16)
    table = bench._storage("torch_pinned", 300, 16, torch.device("cuda"), 64)
    assert table.table.is_pinned() and table.buffer.is_pinned()
    table.table.copy_(weight)
    idx = torch.randint(0, 300, (64,)).pin_memory()
    first, second = table.gather(idx), table.gather(idx.flip(0))
    assert torch.equal(first.cpu(), weight[idx]) and torch.equal(second.cpu(), weight[idx.flip(0)])
    rows = torch.randperm(300)[:40]
    table.scatter_(rows, first[:40])
    weight[rows] = first[:40].cpu()
    assert torch.equal(table.table, weight)


def test_fraction_of_floor_prints_what_auto_chose_with_its_gather_bandwidth(capsys):
    """What 'auto' measured reaches `speedlib run --show-stderr` through a track (asv keeps a
    setup_cache's output only when it fails): the path kept, and every path's median."""
    from benchmarks import bench_transfer as bench  # noqa: PLC0415
    from speedlib._transfer_auto import Path  # noqa: PLC0415

    table = HostTable(20, 4, device="cpu")
    table._impl.chosen = {"gather": Path("split", share=0.42)}
    table._impl.measured = {"gather": {Path("pinned"): 2e-3, Path("split", share=0.42): 1.25e-3}}
    line = bench._what_auto_chose(table)
    assert line == ("bench_transfer auto gather: split (42% of rows packed on the CPU, uva the rest) "
                    "(pinned 2 ms, split (42% of rows packed on the CPU, uva the rest) 1.25 ms)")
    floor = bench.FractionOfFloor()
    cache = {("auto",): ("ok", {"gather_bandwidth": 30.0, "chose": line})}
    assert floor.track_gather_bandwidth(cache, "auto") == 30.0
    assert capsys.readouterr().err.strip() == line
