"""The host tables' backends on their own: the 'uva' backend's row-copy kernel
(speedlib/transfer/kernel.py), run on the CPU by Triton's interpreter, and on a GPU every
backend against 'pageable', for every index dtype and duplicate pattern. Every result is
compared bitwise with plain indexing, on tables of random bits (tests/transfer_bits.py).
'auto's measured choice has tests of its own (tests/test_transfer_auto.py)."""

from __future__ import annotations

import functools
import gc
import subprocess
import sys
import warnings

import pytest
import torch
from transfer_bits import PATTERNS, _cupy_ok, bits, indices, needs_cuda, needs_huge_pages, needs_triton, same_bits

from speedlib.transfer import HostEmbedding, HostTable
from speedlib.transfer import kernel as row_kernel
from speedlib.transfer import table as host_table

# --- the uva row-copy kernel, in Triton's interpreter ------------------------------------------

@needs_triton
@pytest.mark.parametrize("dtype,dim", [(torch.float32, 128), (torch.float16, 3), (torch.bfloat16, 8),
                                       (torch.float64, 5), (torch.float16, 1), (torch.float32, 1500)])
@pytest.mark.parametrize("sort", [False, True], ids=["as-given", "sorted"])
def test_the_kernel_gathers_whole_rows_bitwise(interpreted, dtype, dim, sort):
    table = bits(90, dim, dtype)
    for pattern in ("random, with repeats", "one row over and over", "descending, distinct"):
        idx = indices(pattern, 37, 90)
        out = row_kernel.gather(table, idx, sort=sort, kernel=interpreted)
        assert same_bits(out, table[idx]), pattern
        assert row_kernel.KERNEL == "triton"


@needs_triton
@pytest.mark.parametrize("dtype,dim", [(torch.float32, 128), (torch.float16, 3), (torch.bfloat16, 8)])
@pytest.mark.parametrize("sort", [False, True], ids=["as-given", "sorted"])
def test_the_kernel_writes_whole_rows_back_bitwise(interpreted, dtype, dim, sort):
    table = bits(90, dim, dtype)
    expected = table.clone()
    idx = torch.randperm(90, generator=torch.Generator().manual_seed(8))[:41]
    values = bits(41, dim, dtype, seed=6)
    expected.index_copy_(0, idx, values)
    row_kernel.scatter(table, idx, values, sort=sort, kernel=interpreted)
    assert same_bits(table, expected)


def test_rows_are_moved_as_the_widest_words_that_divide_them_and_their_addresses():
    k = row_kernel
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
    assert same_bits(row_kernel.gather(table, idx, kernel=interpreted), table[idx])


@needs_triton
def test_once_the_kernel_has_run_a_later_error_is_raised_not_hidden(interpreted, monkeypatch):
    calls = []

    class Failing:
        def __getitem__(self, grid):
            raise RuntimeError("an illegal memory access")

    monkeypatch.setattr(row_kernel, "_kernel", lambda: interpreted if not calls.append(1) and len(calls) == 1
                        else Failing())
    monkeypatch.setattr(row_kernel, "_unusable", [])
    monkeypatch.setattr(row_kernel, "_ran", [])
    table = bits(20, 4, torch.float32)
    idx = indices("random, with repeats", 11, 20)
    assert same_bits(row_kernel.gather(table, idx), table[idx]) and row_kernel.KERNEL == "triton"
    with pytest.raises(RuntimeError, match="an illegal memory access"):
        row_kernel.gather(table, idx)
    assert row_kernel._unusable == []


def test_without_a_kernel_the_copy_says_why_once_and_falls_back_exactly(monkeypatch):
    def no_triton():
        raise ImportError("No module named 'triton'")

    monkeypatch.setattr(row_kernel, "_kernel", no_triton)
    monkeypatch.setattr(row_kernel, "_unusable", [])
    monkeypatch.setattr(row_kernel, "_ran", [])
    table = bits(20, 4, torch.float32)
    idx = indices("random, with repeats", 11, 20)
    with pytest.warns(RuntimeWarning, match="Triton row-copy kernel cannot run here .*No module named 'triton'"):
        out = row_kernel.gather(table, idx, sort=True)
    assert same_bits(out, table[idx]) and row_kernel.KERNEL == "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the second copy is quiet
        expected = table.clone()
        expected[idx.unique()] = 1.0
        row_kernel.scatter(table, idx.unique(), torch.ones(idx.unique().numel(), 4))
    assert same_bits(table, expected)


# --- issue 52's hypotheses: the whole-line gather and the bytes in flight, in Triton's interpreter -----

@pytest.fixture
def interpreted_lines(monkeypatch):
    """The whole-line gather kernel (Shape(lines=True)) run by Triton's interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return row_kernel.build(lines=True)


LINES = row_kernel.Shape(lines=True)


@needs_triton
@pytest.mark.parametrize("dtype,dim", [(torch.float32, 16), (torch.float32, 128), (torch.float32, 24),
                                       (torch.float16, 3), (torch.bfloat16, 8), (torch.float64, 5),
                                       (torch.float32, 1024)])
@pytest.mark.parametrize("sort", [False, True], ids=["as-given", "sorted"])
def test_the_whole_line_gather_is_bitwise_plain_indexing(interpreted_lines, dtype, dim, sort):
    """Rows narrower than a line (64 B, 6 B), of whole lines (512 B, 4 KiB) and straddling two
    (96 B); the first and last rows, whose lines reach the table's ends."""
    table = bits(90, dim, dtype)
    for pattern in ("random, with repeats", "first and last rows", "descending, distinct"):
        idx = indices(pattern, 37, 90)
        out = row_kernel.gather(table, idx, sort=sort, shape=LINES, kernel=interpreted_lines)
        assert same_bits(out, table[idx]), pattern


@needs_triton
def test_the_whole_line_gather_keeps_only_the_rows_own_bytes(interpreted_lines):
    """A table that starts and ends inside lines of a larger buffer: the lines the kernel reads
    reach into the buffer's other bytes, which must never reach the result."""
    base = bits(64, 5, torch.float32, seed=3)
    table = base.view(-1)[7:7 + 40 * 5].view(40, 5)  # 28 bytes into the buffer, 20-byte rows
    idx = indices("first and last rows", 9, 40)
    out = row_kernel.gather(table, idx, shape=LINES, kernel=interpreted_lines)
    assert same_bits(out, table[idx])


def test_the_whole_line_window_covers_a_row_at_its_worst_offset():
    k = row_kernel
    buffer = torch.zeros(2048 + 32, dtype=torch.int32)
    line_start = buffer[(-buffer.data_ptr() % 128) // 4:][:2048].view(-1, 16)  # a table starting on a line
    assert line_start.data_ptr() % 128 == 0
    assert k._span(line_start, 16, 4) == 32  # 64-byte rows: two to a line, each inside one
    assert k._span(line_start.view(-1, 128), 128, 4) == 128  # whole lines: exactly the row
    assert k._span(line_start.view(-1, 8)[:, :6].contiguous(), 24, 4) == 64  # 96-byte rows straddle two lines
    off = line_start.view(-1)[1:1 + 16 * 100].view(100, 16)  # 4 bytes past a line: rows start anywhere
    assert k._span(off, 16, 4) == 64


@needs_triton
@pytest.mark.parametrize("in_flight", [1024, 4096, 65536])
@pytest.mark.parametrize("dtype,dim", [(torch.float32, 128), (torch.float16, 3), (torch.float32, 1500)])
def test_every_in_flight_size_gathers_and_writes_back_bitwise(interpreted, interpreted_lines, in_flight, dtype, dim):
    table = bits(90, dim, dtype)
    idx = indices("random, with repeats", 37, 90)
    for lines, kernel in ((False, interpreted), (True, interpreted_lines)):
        shape = row_kernel.Shape(lines=lines, in_flight=in_flight)
        for sort in (False, True):
            assert same_bits(row_kernel.gather(table, idx, sort=sort, shape=shape, kernel=kernel), table[idx])
    expected = table.clone()
    rows = torch.randperm(90, generator=torch.Generator().manual_seed(8))[:41]
    values = bits(41, dim, dtype, seed=6)
    expected.index_copy_(0, rows, values)
    # write-back never reads whole lines (they would write the neighbours' bytes): the row kernel
    row_kernel.scatter(table, rows, values, shape=row_kernel.Shape(lines=True, in_flight=in_flight),
                             kernel=interpreted)
    assert same_bits(table, expected)


def test_a_kernel_shape_takes_what_the_kernel_can_use():
    k = row_kernel
    assert k.Shape() == k.DEFAULT and k._warps(None) is None
    assert [k._warps(n) for n in (1024, 16384, 65536, 1 << 20)] == [4, 4, 8, 16]
    for bad in (1000, 512, 3 * 1024, True, 4096.0):
        with pytest.raises(ValueError, match="bytes in flight must be a power of two of at least 1024"):
            k.Shape(in_flight=bad)
    with pytest.raises(TypeError, match="lines must be True or False"):
        k.Shape(lines=1)
    with pytest.raises(ValueError, match="reads rows through src_rows"):
        k.copy_rows(torch.zeros(4, 2), torch.zeros(4, 2), dst_rows=torch.arange(4), shape=k.Shape(lines=True))
    s, d, words, block_words, block_rows, extra, options = k._prepared(torch.zeros(8, 128), torch.zeros(8, 128),
                                                                        k.Shape(in_flight=65536))
    assert (words, block_words, block_rows, options) == (128, 128, 128, {"num_warps": 8})  # 64 KiB of int32 words
    assert k._prepared(torch.zeros(8, 128), torch.zeros(8, 128))[3:] == (128, 32, (), {})  # as it always was


def test_a_hypothesis_never_falls_back_to_torch(monkeypatch):
    """Only the default kernel may be replaced by torch's indexing; a variant that cannot run is
    an error, so a measurement of it can never be a measurement of something else."""
    def no_triton(lines=False):
        raise ImportError("No module named 'triton'")

    monkeypatch.setattr(row_kernel, "_kernel", no_triton)
    monkeypatch.setattr(row_kernel, "_unusable", [])
    monkeypatch.setattr(row_kernel, "_ran", [])
    table = bits(20, 4, torch.float32)
    idx = indices("random, with repeats", 11, 20)
    for shape in (row_kernel.Shape(lines=True), row_kernel.Shape(in_flight=4096)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(ImportError, match="triton"):
                row_kernel.gather(table, idx, shape=shape)
    assert row_kernel._unusable == []
    with pytest.warns(RuntimeWarning, match="cannot run here"):
        assert same_bits(row_kernel.gather(table, idx), table[idx])


def _ptx(kernel, signature: dict, constexprs: dict, aligned: tuple[str, ...], warps: int = 4) -> str:
    """The PTX Triton makes of `kernel` for an H100/H200 (sm_90), specialised as a launch would
    be: the arguments named in `aligned` divisible by 16 (pointers 16-byte aligned, counts a
    multiple of 16), as Triton finds them at launch. No GPU needed: Triton's NVIDIA backend
    compiles on the CPU."""
    import triton  # noqa: PLC0415 - needs_triton
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415 - needs_triton

    names = [*signature, *constexprs]
    src = triton.compiler.ASTSource(
        fn=kernel, signature={**signature, **dict.fromkeys(constexprs, "constexpr")},
        constexprs={(names.index(c),): v for c, v in constexprs.items()},
        attrs={(names.index(a),): [["tt.divisibility", 16]] for a in aligned})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]


def _loads(ptx: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in ptx.splitlines():
        if "ld.global" in line:
            op = line.split()[1]
            out[op] = out.get(op, 0) + 1
    return out


@needs_triton
def test_rows_of_16_word_multiples_are_read_as_16_byte_vectors_on_sm90(monkeypatch):
    """The wide-load hypothesis checked where no GPU is needed: for 512-byte rows (the suite's
    table) the row kernel's reads of the table are already 16-byte vectors (ld.global.v4.b32);
    where the row's word count is not known to be a multiple of 16 they are single words; the
    whole-line kernel reads 64-byte rows as 16-byte vectors too, where the table's word count is
    known to be a multiple of 16 as well (it is where a row's is). The index loads are b64."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rows = row_kernel.build()
    sig = {"src": "*i32", "src_rows": "*i64", "dst": "*i32", "dst_rows": "*i64", "n": "i32", "words": "i32"}
    const = {"HAS_SRC_ROWS": True, "HAS_DST_ROWS": False, "BLOCK_ROWS": 32, "BLOCK_WORDS": 128}
    wide = _loads(_ptx(rows, sig, const, aligned=("src", "src_rows", "dst", "dst_rows", "words")))
    assert wide.get("ld.global.v4.b32", 0) == 8 and "ld.global.b32" not in wide  # 128 B a thread: 8 vectors
    narrow = _loads(_ptx(rows, sig, const, aligned=("src", "src_rows", "dst", "dst_rows")))
    assert narrow.get("ld.global.b32", 0) == 32 and "ld.global.v4.b32" not in narrow
    lines = row_kernel.build(lines=True)
    sig = {**sig, "src_words": "i64", "span": "i32"}
    const = {"HAS_DST_ROWS": False, "BLOCK_ROWS": 128, "BLOCK_WORDS": 32, "LINE_WORDS": 32}
    got = _loads(_ptx(lines, sig, const, aligned=("src", "src_rows", "dst", "dst_rows", "words", "src_words", "span")))
    assert got.get("ld.global.v4.b32", 0) == 8 and "ld.global.b32" not in got


# --- the backends' options --------------------------------------------------------------------

def test_backend_options_are_checked_and_kept_for_the_backend():
    assert host_table._options("uva", True) == {"sort_indices": True}
    assert host_table._options("cupy", False) == {}
    assert host_table._options("auto", False) == {}


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
    out = [("auto", {}), ("pinned", {}), ("uva", {}), ("uva", {"sort_indices": True}), ("device", {}),
           # issue 52's hypotheses, alone and together
           ("uva", {"whole_lines": True}), ("uva", {"bytes_in_flight": 4096}),
           ("uva", {"whole_lines": True, "bytes_in_flight": 65536, "sort_indices": True}),
           pytest.param("uva", {"huge_pages": True}, marks=needs_huge_pages)]
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
@needs_huge_pages
def test_a_huge_page_uva_table_is_pinned_whole_and_unlocked_when_freed():
    """On a GPU: the table in 2 MiB pages is registered (pinned) from its 2 MiB-aligned start, and
    unlocked with the table."""
    weight = bits(3000, 200, torch.float32)  # 2.4 MB: two huge pages
    table = HostTable.from_tensor(weight, backend="uva", huge_pages=True)
    host = table.cpu()
    assert host.data_ptr() % (2 << 20) == 0 and host.is_pinned() and same_bits(host, weight)
    del table
    gc.collect()
    assert not host.is_pinned()


@needs_cuda
@needs_triton
def test_the_uva_backend_runs_the_triton_kernel_on_a_gpu():
    table = HostTable.from_tensor(bits(100, 128, torch.float32), backend="uva")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback would warn
        table.gather(torch.arange(10))
    assert row_kernel.KERNEL == "triton"


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
