"""The host-table gather's machinery (speedlib/_transfer_staging.py, speedlib/_transfer_kernel.py).

On the CPU: the chunked, overlapped schedule of the 'pinned' backend, driven by
copy engines ("lanes") that copy on the CPU, as late as a GPU stream may, or at once; and the
'uva' backend's Triton row-copy kernel, run by Triton's interpreter. Every result is compared
bitwise with plain indexing, on tables of random bits (NaN payloads included).
On a GPU: every GPU backend against 'pageable', for every index dtype and duplicate pattern,
'pinned' with chunks small enough that a batch crosses in many.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest
import torch

from speedlib import _transfer_kernel, _transfer_staging
from speedlib.transfer import HostTable

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.gpu(reason="these backends move rows to a CUDA device; this machine has none")
try:
    import triton  # noqa: F401
    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (CPU-only torch builds lack it)")


def _bits(rows: int, dim: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """A table of random bit patterns: NaNs with payloads, infinities, subnormals. A copy that
    went through arithmetic or a float conversion would change some of them."""
    raw = torch.randint(0, 256, (rows, dim * dtype.itemsize), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    return raw.view(dtype)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8),
                                                                       b.contiguous().view(torch.uint8))


PATTERNS = {
    "random, with repeats": lambda n, rows, g: torch.randint(0, rows, (n,), generator=g),
    "one row over and over": lambda n, rows, g: torch.full((n,), rows // 2),
    "sorted": lambda n, rows, g: torch.randint(0, rows, (n,), generator=g).sort().values,
    "descending, distinct": lambda n, rows, g: torch.randperm(rows, generator=g)[:n].sort(descending=True).values,
    "first and last rows": lambda n, rows, g: torch.tensor([0, rows - 1] * (n // 2) + [0] * (n % 2)),
}


def _indices(pattern: str, n: int, rows: int, seed: int = 1) -> torch.Tensor:
    return PATTERNS[pattern](n, rows, torch.Generator().manual_seed(seed)).to(torch.int64)


# --- chunks and byte rows -----------------------------------------------------------------

def test_chunks_cover_every_row_once_and_never_split_one():
    assert _transfer_staging.chunks(10, row_bytes=8, chunk_bytes=24) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert _transfer_staging.chunks(6, row_bytes=8, chunk_bytes=24) == [(0, 3), (3, 6)]
    assert _transfer_staging.chunks(0, row_bytes=8, chunk_bytes=24) == []
    # a row wider than a chunk still travels, one row a chunk
    assert _transfer_staging.chunks(3, row_bytes=100, chunk_bytes=24) == [(0, 1), (1, 2), (2, 3)]
    # the benchmark's batch: 131072 rows of 512 bytes in 2 MiB chunks
    big = _transfer_staging.chunks(131072, row_bytes=512)
    assert len(big) == 32 and {b - a for a, b in big} == {4096}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_byte_rows_share_the_tensors_memory_one_record_a_row(dtype):
    t = _bits(5, 3, dtype)
    rows = _transfer_staging.byte_rows(t)
    assert rows.shape == (5,) and rows.itemsize == 3 * dtype.itemsize
    assert rows.__array_interface__["data"][0] == t.data_ptr()
    rows[1] = rows[4]
    assert _same_bits(t[1], t[4])


def test_byte_rows_refuse_what_is_not_rows():
    for bad in (torch.zeros(4), torch.zeros(4, 3).t(), torch.zeros(2, 2, 2)):
        with pytest.raises(ValueError, match="contiguous 2-D CPU tensor"):
            _transfer_staging.byte_rows(bad)


# --- the schedule, with copy engines on the CPU ----------------------------------------------

class _Done:
    def synchronize(self) -> None:
        pass


class EagerLane:
    """Copies the moment a copy is queued. Logs every step, with the buffer it touched."""

    def __init__(self):
        self.log: list = []
        self.lock = threading.Lock()

    def pinned(self, rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(rows, dim, dtype=dtype)

    def output(self, rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(rows, dim, dtype=dtype)

    def start(self) -> None:
        self.log.append(("start",))

    def copy(self, src: torch.Tensor, dst: torch.Tensor):
        dst.copy_(src)
        done = _Done()
        with self.lock:
            self.log.append(("copy", src.data_ptr(), dst.data_ptr(), done))
        return done

    def finish(self, last) -> None:
        self.log.append(("finish", last))


class _Queued:
    def __init__(self, lane: LazyLane, n: int):
        self.lane, self.n = lane, n

    def synchronize(self) -> None:
        if self.lane.honest:
            self.lane.run_until(self.n)


class LazyLane(EagerLane):
    """A stream that copies as late as a stream may: in order, and only when someone waits
    for an event at or after the copy (or at drain()). A staging buffer refilled before its
    copy was waited for is read after it changed. `honest=False`: events claim to be done
    without anything having been copied, which must corrupt the result."""

    def __init__(self, honest: bool = True):
        super().__init__()
        self.honest, self.queue, self.copied = honest, [], 0

    def copy(self, src: torch.Tensor, dst: torch.Tensor):
        with self.lock:
            self.queue.append((src, dst))
            event = _Queued(self, self.copied + len(self.queue))
            self.log.append(("copy", src.data_ptr(), dst.data_ptr(), event))
        return event

    def run_until(self, n: int) -> None:
        with self.lock:
            while self.copied < n:
                src, dst = self.queue.pop(0)
                dst.copy_(src)
                self.copied += 1

    def drain(self) -> None:
        self.run_until(self.copied + len(self.queue))


def _staged(lane, host, *, threads=3, rows_a_chunk=5, stages=2):
    return _transfer_staging.Staged(lane, host, threads=threads, stages=stages,
                                    chunk_bytes=rows_a_chunk * host.shape[1] * host.element_size())


def _gathered(staged, lane, idx):
    out = staged.gather(idx)
    if isinstance(lane, LazyLane):
        # What the caller's stream does after finish(): run on once the last copy is done.
        lane.log[-1][1].synchronize()
        assert lane.queue == []  # ... which means every copy
    return out


@pytest.mark.parametrize("lane_type", [EagerLane, LazyLane])
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_chunked_gather_is_bitwise_plain_indexing(lane_type, pattern, dtype):
    host = _bits(97, 6, dtype)
    idx = _indices(pattern, 61, 97)
    lane = lane_type()
    staged = _staged(lane, host)
    out = _gathered(staged, lane, idx)
    assert _same_bits(out, host.index_select(0, idx))
    # Called again on the same ring of buffers, with another batch: still exact.
    idx2 = _indices("random, with repeats", 43, 97, seed=7)
    assert _same_bits(_gathered(staged, lane, idx2), host[idx2])


@pytest.mark.parametrize("threads,stages,rows_a_chunk", [(1, 1, 1), (1, 3, 4), (2, 1, 3), (4, 2, 2), (4, 4, 7),
                                                         (8, 3, 1000)])
def test_every_thread_count_and_ring_size_gathers_exactly(threads, stages, rows_a_chunk):
    host = _bits(300, 5, torch.float16)
    idx = _indices("random, with repeats", 257, 300)
    lane = LazyLane()
    out = _gathered(_staged(lane, host, threads=threads, stages=stages, rows_a_chunk=rows_a_chunk), lane, idx)
    assert _same_bits(out, host[idx])


def test_a_lane_whose_events_lie_corrupts_the_gather_so_the_lazy_lane_would_catch_early_reuse():
    """The check above has teeth: if buffers were refilled before their copies finished (here,
    because the events say so falsely), the lazy lane copies changed buffers."""
    host = _bits(97, 6, torch.float32)
    idx = _indices("random, with repeats", 61, 97)
    lane = LazyLane(honest=False)
    out = _staged(lane, host).gather(idx)
    lane.drain()
    assert not _same_bits(out, host[idx])


def test_the_callers_stream_waits_for_the_last_copy_and_the_copies_wait_for_nothing_of_the_callers():
    """A gather's copies need nothing the caller queued before (its output is allocated on
    the side stream), so a gather for the next step can overlap this step's compute; the
    caller's stream waits for the last copy, in order after all the others on the side stream."""
    host = _bits(50, 4, torch.float32)
    lane = LazyLane()
    _gathered(_staged(lane, host, threads=1, rows_a_chunk=4), lane, _indices("random, with repeats", 30, 50))
    kinds = [entry[0] for entry in lane.log]
    assert kinds == ["copy"] * 8 + ["finish"]  # 30 rows, 4 a chunk
    assert lane.log[-1][1] is lane.log[-2][3]  # the caller waits for the last copy's event, nothing else
    copies = [entry for entry in lane.log if entry[0] == "copy"]
    assert len({src for _, src, _, _ in copies}) == 2  # a ring of two staging buffers, reused in turn


def test_the_ring_has_a_buffer_for_every_worker_and_one_in_flight():
    host = _bits(10, 4, torch.float32)
    assert _staged(EagerLane(), host, threads=1, stages=2).stages == 2
    assert _staged(EagerLane(), host, threads=2, stages=4).stages == 4
    assert _staged(EagerLane(), host, threads=16, stages=4).stages == 17


def test_a_buffer_is_refilled_only_after_the_copy_that_last_read_it():
    """Every pack into a buffer that was copied from before waits for that buffer's latest
    copy: the event it waits on belongs to a copy out of the same buffer, the newest one
    queued before the pack was."""
    host = _bits(200, 4, torch.float32)
    lane = LazyLane()
    staged = _staged(lane, host, threads=4, stages=3, rows_a_chunk=4)  # a ring of five
    packs = []
    real = _transfer_staging._pack

    def pack(after, table, idx, buf):
        with lane.lock:
            packs.append((after, buf.__array_interface__["data"][0], len(lane.log)))
        real(after, table, idx, buf)

    idx = _indices("random, with repeats", 120, 200)
    try:
        _transfer_staging._pack = pack
        out = _gathered(staged, lane, idx)
    finally:
        _transfer_staging._pack = real
    assert _same_bits(out, host[idx])
    copies = {id(entry[3]): entry for entry in lane.log if entry[0] == "copy"}
    assert len(packs) == 30 and sum(after is None for after, _, _ in packs) == staged.stages
    for after, buf, logged in packs:
        if after is None:
            continue
        _, src, _, _ = copies[id(after)]
        assert src == buf  # the wait is for a copy out of this very buffer ...
        newer = [e for e in lane.log[:logged] if e[0] == "copy" and e[1] == buf]
        assert newer[-1][3] is after  # ... the newest one queued before this pack


def test_a_gather_right_after_another_waits_for_the_copies_still_in_flight():
    """A gather returns with copies still queued (on a GPU the caller's stream waits for them,
    not the calling thread): the next gather on the table refills each buffer only after the
    previous call's copy out of it, and both outputs come out exact."""
    host = _bits(300, 4, torch.float32)
    lane = LazyLane()
    staged = _staged(lane, host, threads=2, stages=3, rows_a_chunk=5)
    first_idx, second_idx = _indices("random, with repeats", 40, 300), _indices("sorted", 90, 300, seed=4)
    first = staged.gather(first_idx)  # 8 chunks over a ring of 3: the last 3 copies still queued
    assert len(lane.queue) > 0
    packs, real = [], _transfer_staging._pack

    def pack(after, *args):
        packs.append(after)
        real(after, *args)

    try:
        _transfer_staging._pack = pack
        second = staged.gather(second_idx)
    finally:
        _transfer_staging._pack = real
    lane.drain()
    assert _same_bits(first, host[first_idx]) and _same_bits(second, host[second_idx])
    assert len(packs) == 18 and all(after is not None for after in packs)  # every buffer had a copy to wait for


def test_tables_share_worker_pools_and_the_default_stays_bounded(monkeypatch):
    a, b = EagerLane(), EagerLane()
    assert _transfer_staging._pool(3, a) is _transfer_staging._pool(3, b)  # same threads, same (no) device
    assert _transfer_staging._pool(2, a) is not _transfer_staging._pool(3, a)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 64)
    assert _transfer_staging.default_threads() == _transfer_staging.MAX_DEFAULT_THREADS == 16
    monkeypatch.setattr(torch, "get_num_threads", lambda: 6)
    assert _transfer_staging.default_threads() == 6


@pytest.mark.parametrize("lane_type", [EagerLane, LazyLane])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_chunked_write_back_is_bitwise_index_copy(lane_type, dtype, monkeypatch):
    # Slow workers: with an eager lane, a buffer refilled before its worker read it would show.
    real = _transfer_staging._unpack
    monkeypatch.setattr(_transfer_staging, "_unpack", lambda *a: (time.sleep(0.002), real(*a)))
    host, expected = _bits(120, 6, dtype), None
    expected = host.clone()
    idx = torch.randperm(120, generator=torch.Generator().manual_seed(3))[:77]
    values = _bits(77, 6, dtype, seed=9)
    expected.index_copy_(0, idx, values)
    lane = lane_type()
    _staged(lane, host, threads=4, stages=2, rows_a_chunk=3).scatter(idx, values)
    # Back from scatter means in the table: nothing was waited for here, nothing is queued.
    assert _same_bits(host, expected)
    assert not isinstance(lane, LazyLane) or lane.queue == []
    assert [e[0] for e in lane.log].count("finish") == 0 and lane.log[0] == ("start",)


def test_write_back_reuses_a_buffer_only_after_its_rows_are_in_the_table(monkeypatch):
    host = _bits(64, 2, torch.float32)
    lane = EagerLane()
    reads, real = [], _transfer_staging._unpack

    def unpack(after, table, idx, buf):
        time.sleep(0.001)
        real(after, table, idx, buf)
        with lane.lock:
            lane.log.append(("read", buf.__array_interface__["data"][0]))

    monkeypatch.setattr(_transfer_staging, "_unpack", unpack)
    idx = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    values = _bits(64, 2, torch.float32, seed=4)
    _staged(lane, host, threads=4, stages=2, rows_a_chunk=4).scatter(idx, values)
    assert _same_bits(host[idx], values)
    pending: dict[int, int] = {}  # buffer -> copies into it not yet read back
    for entry in lane.log[1:]:
        buf = entry[2] if entry[0] == "copy" else entry[1]
        pending[buf] = pending.get(buf, 0) + (1 if entry[0] == "copy" else -1)
        assert pending[buf] in (0, 1), f"buffer {buf:#x} refilled before its rows were read"
    assert set(pending.values()) == {0} and len(pending) == 5  # threads + 1 buffers


class _FailingLane(EagerLane):
    def __init__(self, fail_at: int):
        super().__init__()
        self.fail_at, self.calls = fail_at, 0

    def copy(self, src, dst):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("the copy engine failed")
        return super().copy(src, dst)


@pytest.mark.parametrize("op", ["gather", "scatter"])
def test_a_failed_copy_is_raised_with_no_worker_left_running_and_the_next_transfer_is_exact(op):
    host = _bits(80, 3, torch.float32)
    lane = _FailingLane(fail_at=3)
    staged = _staged(lane, host, threads=4, stages=2, rows_a_chunk=4)
    idx = torch.randperm(80, generator=torch.Generator().manual_seed(2))[:50]
    values = _bits(50, 3, torch.float32, seed=5)
    run = (lambda: staged.gather(idx)) if op == "gather" else (lambda: staged.scatter(idx, values))
    with pytest.raises(RuntimeError, match="the copy engine failed"):
        run()
    assert not staged._lock.locked()
    if op == "gather":
        # The caller's stream still waits for the copies that were queued: the output's memory
        # must not be reused while they write into it.
        assert lane.log[-1][0] == "finish" and lane.log[-1][1] is lane.log[-2][3]
        assert _same_bits(staged.gather(idx), host[idx])
    else:
        staged.scatter(idx, values)
        assert _same_bits(host[idx], values)


def test_one_chunk_runs_on_the_calling_thread_and_many_on_the_pool():
    host = _bits(40, 4, torch.float32)
    names = []
    real = _transfer_staging._pack

    def pack(*args):
        names.append(threading.current_thread().name)
        real(*args)

    _transfer_staging._pack = pack
    try:
        staged = _staged(EagerLane(), host, threads=2, rows_a_chunk=100)
        staged.gather(torch.arange(10))  # one chunk
        staged.chunk_bytes = 4 * 4 * 2
        staged.gather(torch.arange(10))  # five chunks
    finally:
        _transfer_staging._pack = real
    assert names[0] == threading.current_thread().name
    assert len(names) == 6 and all(n.startswith("speedlib-staging") for n in names[1:])


def test_an_empty_batch_queues_nothing():
    lane = EagerLane()
    staged = _staged(lane, _bits(10, 2, torch.float32))
    assert staged.gather(torch.empty(0, dtype=torch.int64)).shape == (0, 2)
    staged.scatter(torch.empty(0, dtype=torch.int64), torch.empty(0, 2))
    assert lane.log == []


def test_a_read_only_file_mapping_can_be_gathered_from(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, _bits(30, 4, torch.float32).numpy())
    host = torch.from_numpy(np.load(path, mmap_mode="r").copy())  # the reference
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        mapped = torch.from_numpy(np.load(path, mmap_mode="r"))
    idx = _indices("random, with repeats", 25, 30)
    lane = EagerLane()
    assert _same_bits(_gathered(_staged(lane, mapped), lane, idx), host[idx])


# --- the uva row-copy kernel, in Triton's interpreter ------------------------------------------

@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when the kernel is decorated, in build()
    return _transfer_kernel.build()


@needs_triton
@pytest.mark.parametrize("dtype,dim", [(torch.float32, 128), (torch.float16, 3), (torch.bfloat16, 8),
                                       (torch.float64, 5), (torch.float16, 1), (torch.float32, 1500)])
@pytest.mark.parametrize("sort", [False, True], ids=["as-given", "sorted"])
def test_the_kernel_gathers_whole_rows_bitwise(interpreted, dtype, dim, sort):
    table = _bits(90, dim, dtype)
    for pattern in ("random, with repeats", "one row over and over", "descending, distinct"):
        idx = _indices(pattern, 37, 90)
        out = _transfer_kernel.gather(table, idx, sort=sort, kernel=interpreted)
        assert _same_bits(out, table[idx]), pattern
        assert _transfer_kernel.KERNEL == "triton"


@needs_triton
@pytest.mark.parametrize("dtype,dim", [(torch.float32, 128), (torch.float16, 3), (torch.bfloat16, 8)])
@pytest.mark.parametrize("sort", [False, True], ids=["as-given", "sorted"])
def test_the_kernel_writes_whole_rows_back_bitwise(interpreted, dtype, dim, sort):
    table = _bits(90, dim, dtype)
    expected = table.clone()
    idx = torch.randperm(90, generator=torch.Generator().manual_seed(8))[:41]
    values = _bits(41, dim, dtype, seed=6)
    expected.index_copy_(0, idx, values)
    _transfer_kernel.scatter(table, idx, values, sort=sort, kernel=interpreted)
    assert _same_bits(table, expected)


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
    base = _bits(41, 4, torch.float16)
    table = base.view(-1)[1:1 + 40 * 4].view(40, 4)  # one float16, two bytes, off int32 alignment
    idx = _indices("random, with repeats", 17, 40)
    assert _same_bits(_transfer_kernel.gather(table, idx, kernel=interpreted), table[idx])


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
    table = _bits(20, 4, torch.float32)
    idx = _indices("random, with repeats", 11, 20)
    assert _same_bits(_transfer_kernel.gather(table, idx), table[idx]) and _transfer_kernel.KERNEL == "triton"
    with pytest.raises(RuntimeError, match="an illegal memory access"):
        _transfer_kernel.gather(table, idx)
    assert _transfer_kernel._unusable == []


def test_without_a_kernel_the_copy_says_why_once_and_falls_back_exactly(monkeypatch):
    def no_triton():
        raise ImportError("No module named 'triton'")

    monkeypatch.setattr(_transfer_kernel, "_kernel", no_triton)
    monkeypatch.setattr(_transfer_kernel, "_unusable", [])
    monkeypatch.setattr(_transfer_kernel, "_ran", [])
    table = _bits(20, 4, torch.float32)
    idx = _indices("random, with repeats", 11, 20)
    with pytest.warns(RuntimeWarning, match="Triton row-copy kernel cannot run here .*No module named 'triton'"):
        out = _transfer_kernel.gather(table, idx, sort=True)
    assert _same_bits(out, table[idx]) and _transfer_kernel.KERNEL == "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the second copy is quiet
        expected = table.clone()
        expected[idx.unique()] = 1.0
        _transfer_kernel.scatter(table, idx.unique(), torch.ones(idx.unique().numel(), 4))
    assert _same_bits(table, expected)


# --- the backends' options --------------------------------------------------------------------

def test_backend_options_are_checked_and_kept_for_the_backend(monkeypatch):
    from speedlib import _host_table  # noqa: PLC0415 - the options' checks

    assert _host_table._options("pinned", 3, False) == {"threads": 3}
    assert _host_table._options("pinned", np.int64(2), False) == {"threads": 2}  # any integer
    assert _host_table._options("uva", None, True) == {"sort_indices": True}
    assert _host_table._options("cupy", None, False) == {}


@needs_cuda
@pytest.mark.parametrize("backend,options", [("pinned", {"threads": 3}), ("uva", {"sort_indices": True})])
def test_options_reach_the_table_its_repr_and_an_embeddings_state_tables(backend, options):
    import functools  # noqa: PLC0415

    from speedlib.transfer import HostEmbedding  # noqa: PLC0415

    table = HostTable(100, 8, backend=backend, **options)
    assert table.options == options and all(f"{k}={v!r}" in repr(table) for k, v in options.items())
    if backend == "pinned":
        assert table._impl.staged.threads == 3
    emb = HostEmbedding(100, 8, functools.partial(torch.optim.Adam, lr=0.1), weight=table)
    (emb(torch.tensor([1, 2, 2])).sum()).backward()
    emb.step()
    state_tables = list(emb._state_tables.values())  # Adam's two moments, rows as the weight's
    assert len(state_tables) == 2 and all(t.options == options for t in state_tables)


def test_backend_options_are_refused_where_they_would_do_nothing():
    with pytest.raises(ValueError, match="threads packs rows on the CPU for 'pinned'; backend 'pageable'"):
        HostTable(4, 2, backend="pageable", device="cpu", threads=2)
    with pytest.raises(ValueError, match="backend 'cupy' has no such threads"):
        HostTable(4, 2, backend="cupy", threads=2)
    with pytest.raises(ValueError, match="threads must be a positive int"):
        HostTable(4, 2, backend="pinned", threads=0)
    with pytest.raises(ValueError, match="sort_indices orders the 'uva' kernel's reads"):
        HostTable(4, 2, backend="pinned", sort_indices=True)
    with pytest.raises(TypeError, match="sort_indices must be True or False"):
        HostTable(4, 2, backend="uva", sort_indices="yes")
    with pytest.raises(TypeError, match="sort_indices must be True or False"):
        HostTable(4, 2, backend="pinned", sort_indices=None)
    with pytest.raises(ValueError, match="threads must be a positive int"):
        HostTable(4, 2, backend="pinned", threads=2.0)


# --- on a GPU: the backends themselves ------------------------------------------------------------

def _gpu_backends():
    out = [("pinned", {}), ("uva", {}), ("uva", {"sort_indices": True}), ("device", {})]
    try:
        import cupy  # noqa: F401
        out.append(("cupy", {}))
    except ImportError:
        pass
    return out


@needs_cuda
@pytest.mark.parametrize("backend,options", _gpu_backends())
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_gpu_backends_gather_and_write_back_bitwise_as_pageable(backend, options, index_dtype, pattern):
    dtype = torch.float32 if backend == "cupy" else torch.bfloat16
    weight = _bits(500, 24, dtype)
    reference = HostTable.from_tensor(weight, backend="pageable", device="cpu")
    table = HostTable.from_tensor(weight, backend=backend, **options)
    if backend == "pinned":
        table._impl.staged.chunk_bytes = 7 * 24 * dtype.itemsize  # many chunks, a short last one
    idx = _indices(pattern, 333, 500).to(index_dtype)
    for where in ("cpu", table.device):
        got = table.gather(idx.to(where))
        assert got.device == table.device and _same_bits(got.cpu(), reference.gather(idx))
    values = _bits(333, 24, dtype, seed=11)
    table.scatter_(idx, values.to(table.device))
    reference.scatter_(idx, values)  # duplicates: the last one wins on both
    assert _same_bits(table.cpu(), reference.cpu())


@needs_cuda
def test_a_gather_on_a_side_stream_is_ordered_on_that_stream():
    weight = _bits(4000, 128, torch.float32)
    table = HostTable.from_tensor(weight, backend="pinned")
    table._impl.staged.chunk_bytes = 64 << 10  # 24 chunks, on the worker threads
    idx = _indices("random, with repeats", 3000, 4000)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(10_000_000)  # the caller's stream is busy: its reads of `out` come late
        out = table.gather(idx)
        checksum = out.view(torch.int32).sum(dtype=torch.int64)  # queued on the caller's stream
        del out  # freed while the caller's sum is still queued: its memory must not be reused yet
        other_idx = _indices("random, with repeats", 3000, 4000, seed=9)
        other = table.gather(other_idx)  # the next output, from the side stream's pool
        again = other.view(torch.int32).sum(dtype=torch.int64)
    stream.synchronize()
    expected = weight.view(torch.int32)[idx].sum(dtype=torch.int64).item()
    other_expected = weight.view(torch.int32)[other_idx].sum(dtype=torch.int64).item()
    assert expected != other_expected  # so that rows written over the first output would show
    assert checksum.item() == expected and again.item() == other_expected


@needs_cuda
@needs_triton
def test_the_uva_backend_runs_the_triton_kernel_on_a_gpu():
    table = HostTable.from_tensor(_bits(100, 128, torch.float32), backend="uva")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback would warn
        table.gather(torch.arange(10))
    assert _transfer_kernel.KERNEL == "triton"


def test_speedlib_imports_and_pageable_tables_work_without_numpy():
    """NumPy is the staging workers' tool, imported when a table is staged: torch does not
    require it, and neither does `import speedlib`."""
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'numpy': raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "import speedlib, speedlib.transfer\n"
            "t = speedlib.HostTable(10, 4, backend='pageable', device='cpu')\n"
            "print(tuple(t.gather([1, 2]).shape), 'numpy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "(2, 4) False"
