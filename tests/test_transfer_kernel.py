"""The host tables' backends on their own: the 'uva' backend's row-copy kernel
(speedlib/_transfer_kernel.py), run on the CPU by Triton's interpreter, and on a GPU every
backend against 'pageable', for every index dtype and duplicate pattern. Every result is
compared bitwise with plain indexing, on tables of random bits (tests/transfer_bits.py).
'auto's measured choice has tests of its own (tests/test_transfer_auto.py)."""

from __future__ import annotations

import functools
import subprocess
import sys
import warnings

import pytest
import torch
from transfer_bits import PATTERNS, _cupy_ok, bits, indices, needs_cuda, needs_triton, same_bits

from speedlib import _host_table, _transfer_kernel
from speedlib.transfer import HostEmbedding, HostTable

# --- the uva row-copy kernel, in Triton's interpreter ------------------------------------------

@needs_triton
@pytest.mark.parametrize("dtype,dim", [(torch.float32, 128), (torch.float16, 3), (torch.bfloat16, 8),
                                       (torch.float64, 5), (torch.float16, 1), (torch.float32, 1500)])
@pytest.mark.parametrize("sort", [False, True], ids=["as-given", "sorted"])
def test_the_kernel_gathers_whole_rows_bitwise(interpreted, dtype, dim, sort):
    table = bits(90, dim, dtype)
    for pattern in ("random, with repeats", "one row over and over", "descending, distinct"):
        idx = indices(pattern, 37, 90)
        out = _transfer_kernel.gather(table, idx, sort=sort, kernel=interpreted)
        assert same_bits(out, table[idx]), pattern
        assert _transfer_kernel.KERNEL == "triton"


@needs_triton
@pytest.mark.parametrize("dtype,dim", [(torch.float32, 128), (torch.float16, 3), (torch.bfloat16, 8)])
@pytest.mark.parametrize("sort", [False, True], ids=["as-given", "sorted"])
def test_the_kernel_writes_whole_rows_back_bitwise(interpreted, dtype, dim, sort):
    table = bits(90, dim, dtype)
    expected = table.clone()
    idx = torch.randperm(90, generator=torch.Generator().manual_seed(8))[:41]
    values = bits(41, dim, dtype, seed=6)
    expected.index_copy_(0, idx, values)
    _transfer_kernel.scatter(table, idx, values, sort=sort, kernel=interpreted)
    assert same_bits(table, expected)


def test_rows_are_moved_as_the_widest_words_that_divide_them_and_their_addresses():
    k = _transfer_kernel
    assert k._width(torch.zeros(2, 128)) == 4 and k._words(torch.zeros(2, 128), 4).shape == (2, 128)
    assert k._width(torch.zeros(2, 8, dtype=torch.bfloat16)) == 4  # 16-byte rows
    assert k._words(torch.zeros(2, 8, dtype=torch.bfloat16), 4).shape == (2, 4)
    assert k._width(torch.zeros(2, 3, dtype=torch.float16)) == 2  # 6-byte rows
    assert k._words(torch.zeros(2, 5, dtype=torch.float64), 4).shape == (2, 10)
    # A view starting two bytes into its storage cannot be read as int32 words
    odd = torch.zeros(9, 4, dtype=torch.float16).view(-1)[1:33].view(8, 4)
    assert odd.data_ptr() % 4 == 2 and k._width(odd, torch.zeros(8, 4, dtype=torch.float16)) == 2


@needs_triton
def test_the_kernel_copies_rows_of_a_view_that_starts_off_a_word(interpreted):
    base = bits(41, 4, torch.float16)
    table = base.view(-1)[1:1 + 40 * 4].view(40, 4)  # one float16, two bytes, off int32 alignment
    idx = indices("random, with repeats", 17, 40)
    assert same_bits(_transfer_kernel.gather(table, idx, kernel=interpreted), table[idx])


@needs_triton
def test_once_the_kernel_has_run_a_later_error_is_raised_not_hidden(interpreted, monkeypatch):
    calls = []

    class Failing:
        def __getitem__(self, grid):
            raise RuntimeError("an illegal memory access")

    monkeypatch.setattr(_transfer_kernel, "_kernel", lambda: interpreted if not calls.append(1) and len(calls) == 1
                        else Failing())
    monkeypatch.setattr(_transfer_kernel, "_unusable", [])
    monkeypatch.setattr(_transfer_kernel, "_ran", [])
    table = bits(20, 4, torch.float32)
    idx = indices("random, with repeats", 11, 20)
    assert same_bits(_transfer_kernel.gather(table, idx), table[idx]) and _transfer_kernel.KERNEL == "triton"
    with pytest.raises(RuntimeError, match="an illegal memory access"):
        _transfer_kernel.gather(table, idx)
    assert _transfer_kernel._unusable == []


def test_without_a_kernel_the_copy_says_why_once_and_falls_back_exactly(monkeypatch):
    def no_triton():
        raise ImportError("No module named 'triton'")

    monkeypatch.setattr(_transfer_kernel, "_kernel", no_triton)
    monkeypatch.setattr(_transfer_kernel, "_unusable", [])
    monkeypatch.setattr(_transfer_kernel, "_ran", [])
    table = bits(20, 4, torch.float32)
    idx = indices("random, with repeats", 11, 20)
    with pytest.warns(RuntimeWarning, match="Triton row-copy kernel cannot run here .*No module named 'triton'"):
        out = _transfer_kernel.gather(table, idx, sort=True)
    assert same_bits(out, table[idx]) and _transfer_kernel.KERNEL == "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the second copy is quiet
        expected = table.clone()
        expected[idx.unique()] = 1.0
        _transfer_kernel.scatter(table, idx.unique(), torch.ones(idx.unique().numel(), 4))
    assert same_bits(table, expected)


# --- the backends' options --------------------------------------------------------------------

def test_backend_options_are_checked_and_kept_for_the_backend():
    assert _host_table._options("uva", True) == {"sort_indices": True}
    assert _host_table._options("cupy", False) == {}
    assert _host_table._options("auto", False) == {}


@needs_cuda
def test_options_reach_the_table_its_repr_and_an_embeddings_state_tables():
    table = HostTable(100, 8, backend="uva", sort_indices=True)
    assert table.options == {"sort_indices": True} and "sort_indices=True" in repr(table)
    emb = HostEmbedding(100, 8, functools.partial(torch.optim.Adam, lr=0.1), weight=table)
    (emb(torch.tensor([1, 2, 2])).sum()).backward()
    emb.step()
    state_tables = list(emb._state_tables.values())  # Adam's two moments, rows as the weight's
    assert len(state_tables) == 2 and all(t.options == {"sort_indices": True} for t in state_tables)


def test_backend_options_are_refused_where_they_would_do_nothing():
    with pytest.raises(ValueError, match="sort_indices orders the 'uva' kernel's reads"):
        HostTable(4, 2, backend="pinned", sort_indices=True)
    with pytest.raises(ValueError, match="sort_indices is measured by the 'auto' backend itself"):
        HostTable(4, 2, device="cpu", sort_indices=True)
    with pytest.raises(TypeError, match="sort_indices must be True or False"):
        HostTable(4, 2, backend="uva", sort_indices="yes")
    with pytest.raises(TypeError, match="sort_indices must be True or False"):
        HostTable(4, 2, backend="pinned", sort_indices=None)
    with pytest.raises(TypeError, match="threads"):  # the staged path's option went with it
        HostTable(4, 2, backend="pinned", threads=2)


# --- on a GPU: the backends themselves ------------------------------------------------------------

def _gpu_backends():
    out = [("auto", {}), ("pinned", {}), ("uva", {}), ("uva", {"sort_indices": True}), ("device", {})]
    if _cupy_ok():
        out.append(("cupy", {}))
    return out


@needs_cuda
@pytest.mark.parametrize("backend,options", _gpu_backends())
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_gpu_backends_gather_and_write_back_bitwise_as_pageable(backend, options, index_dtype, pattern):
    dtype = torch.float32 if backend == "cupy" else torch.bfloat16
    weight = bits(500, 24, dtype)
    reference = HostTable.from_tensor(weight, backend="pageable", device="cpu")
    table = HostTable.from_tensor(weight, backend=backend, **options)
    idx = indices(pattern, 333, 500).to(index_dtype)
    for where in ("cpu", table.device):
        got = table.gather(idx.to(where))
        assert got.device == table.device and same_bits(got.cpu(), reference.gather(idx))
    values = bits(333, 24, dtype, seed=11)
    table.scatter_(idx, values.to(table.device))
    reference.scatter_(idx, values)  # duplicates: the last one wins on both
    assert same_bits(table.cpu(), reference.cpu())


@needs_cuda
@pytest.mark.parametrize("backend", ["pinned", "uva"])
def test_a_gather_on_a_side_stream_is_ordered_on_that_stream(backend):
    weight = bits(4000, 128, torch.float32)
    table = HostTable.from_tensor(weight, backend=backend)
    idx = indices("random, with repeats", 3000, 4000)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(10_000_000)  # the caller's stream is busy: its reads of `out` come late
        out = table.gather(idx)
        checksum = out.view(torch.int32).sum(dtype=torch.int64)  # queued on the caller's stream
        del out  # freed while the caller's sum is still queued: its memory must not be reused yet
        other_idx = indices("random, with repeats", 3000, 4000, seed=9)
        other = table.gather(other_idx)
        again = other.view(torch.int32).sum(dtype=torch.int64)
    stream.synchronize()
    expected = weight.view(torch.int32)[idx].sum(dtype=torch.int64).item()
    other_expected = weight.view(torch.int32)[other_idx].sum(dtype=torch.int64).item()
    assert expected != other_expected  # so that rows written over the first output would show
    assert checksum.item() == expected and again.item() == other_expected


@needs_cuda
@needs_triton
def test_the_uva_backend_runs_the_triton_kernel_on_a_gpu():
    table = HostTable.from_tensor(bits(100, 128, torch.float32), backend="uva")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback would warn
        table.gather(torch.arange(10))
    assert _transfer_kernel.KERNEL == "triton"


def test_speedlib_imports_and_tables_work_without_numpy():
    """torch does not require NumPy, and neither does `import speedlib` or a table."""
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'numpy': raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import speedlib, speedlib.transfer\n"
            "t = speedlib.HostTable(10, 4, device='cpu')\n"
            "print(tuple(t.gather([1, 2]).shape), 'numpy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "(2, 4) False"
