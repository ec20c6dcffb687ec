"""Chunked, overlapped host<->device row transfers: how the 'pinned' backend moves rows.

Why chunks: a gather of random rows is two jobs, the CPU packing the rows into one
contiguous buffer and the bus carrying that buffer to the GPU. One `index_select` followed by
one copy runs them one after the other, so each waits for the other; on an H100
(2026-11-23) that left the pinned backend at 42.4 % of the pinned host->device copy
bandwidth. Cut into chunks, worker threads pack the next chunks while the current one
crosses the bus, and the slower job alone sets the pace.

Gather (`Staged.gather`):
  - the batch is cut into chunks of about `chunk_bytes` (rows are never split);
  - a worker thread packs chunk i into staging buffer i % stages (pinned memory, so its
    copy can run asynchronously), once the copy that last read that buffer is done; the
    ring has one buffer more than there are workers (at least STAGES), so every worker can
    pack while a copy is in flight;
  - the calling thread queues each packed chunk's copy on the lane's side stream, in
    order, and keeps the event recorded after it;
  - the output is allocated on the side stream and marked as used by the caller's stream,
    and the caller's stream waits for the last copy's event: the copies need not wait for
    work the caller queued before (a gather for the next step overlaps this step's
    compute), and the caller sees the rows only once they are there. The calling thread
    waits for the GPU only where the ring makes it: a buffer is refilled after its last copy.
Write-back (`Staged.scatter`) mirrors it: the side stream first waits for the caller's stream
(the values are computed there), chunks of the values are copied into staging buffers, and
workers write each chunk into the table once its copy's event has fired. It returns when
every row is in the table, as the one-shot write did: the table is host memory, which the
caller may read next.

Workers pack with NumPy's `take` and `put` on rows viewed as opaque byte records: one
thread each (torch's `index_select` would start an OpenMP team of its own from every worker
thread), the GIL released while they copy, and every dtype moved as bytes, so the result is
bitwise the one-shot path's. Indices must already be checked (HostTable does): 'clip' mode
only spares NumPy a second bounds check. Repeated indices are reads in a gather; in a
write-back HostTable.scatter_ has given every copy of a row the same bytes
(`last_write_wins`), so where two workers write one row they write the same thing.

A `lane` is the copy engine: `TorchLane` (torch streams and events) on GPUs. Tests drive the
schedule with lanes that copy on the CPU, at once or as late as a stream may, which is how a
buffer reused too early would show. ('cupy' is not staged: it stays SpeedTorch's approach,
see _transfer_backends._STAGED.) NumPy is imported when a table is staged, not with the
module: `import speedlib` needs only torch.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

import torch

# 2 MiB chunks: small enough that packing the first one does not keep the bus waiting long
# and that the ring costs little pinned memory (4 to threads + 1 buffers: 8 MiB at 2 threads,
# 34 MiB at 16; the one-shot path pinned two whole batches, 128 MiB for the benchmark's);
# large enough that a copy is far longer than the ~10 us it takes to queue. Not yet tuned on
# a GPU: issue 28 measures it.
CHUNK_BYTES = 2 << 20
STAGES = 4


def byte_rows(t: torch.Tensor):
    """The rows of the 2-D contiguous CPU tensor `t` as a 1-D NumPy array of opaque records,
    sharing t's memory (bfloat16, which NumPy lacks, included)."""
    import numpy as np  # noqa: PLC0415 - only staged tables need it

    if t.dim() != 2 or not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError(f"byte_rows takes a contiguous 2-D CPU tensor, got {tuple(t.shape)} on {t.device}")
    raw = t.view(torch.uint8).numpy()  # rows x (dim * itemsize) bytes, no copy
    return raw.view(np.dtype((np.void, raw.shape[1]))).reshape(-1)


def chunks(n: int, row_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> list[tuple[int, int]]:
    """[start, stop) bounds cutting n rows into chunks of at most chunk_bytes (one row at least)."""
    step = max(1, chunk_bytes // row_bytes)
    return [(a, min(a + step, n)) for a in range(0, n, step)]


# At most this many workers by default: each brings a 2 MiB pinned buffer to every staged
# table (an embedding trained with Adam has three), and a host's cores also feed the GPU.
MAX_DEFAULT_THREADS = 16


def default_threads() -> int:
    # torch's intra-op thread count: the one knob users already set (OMP_NUM_THREADS,
    # torch.set_num_threads) for how many cores PyTorch may keep busy; capped, see above.
    return max(1, min(torch.get_num_threads(), MAX_DEFAULT_THREADS))


# Worker pools, shared by the tables of one process with the same thread count and lane
# device: an embedding's weight and state tables take turns, and need not each keep threads.
# Sharing cannot deadlock: a worker only ever waits for a copy that is already queued.
_pools: dict[tuple, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(threads: int, lane) -> ThreadPoolExecutor:
    setup = getattr(lane, "setup_thread", None)
    key = (os.getpid(), threads, getattr(lane, "device", None))  # a forked child has none of the parent's threads
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = ThreadPoolExecutor(threads, thread_name_prefix="speedlib-staging", initializer=setup)
        return pool


class TorchLane:
    """Copies on a side stream of `device`, with torch's events."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def setup_thread(self) -> None:
        # A worker's first CUDA call would otherwise bind it to device 0 (a context there, in
        # a process that trains on another GPU), as DataLoader's pin_memory thread avoids too.
        torch.cuda.set_device(self.device)

    def pinned(self, rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(rows, dim, dtype=dtype, pin_memory=True)

    def output(self, rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        with torch.cuda.stream(self.stream):
            out = torch.empty(rows, dim, dtype=dtype, device=self.device)
        # Freed by the caller later: the allocator must wait for the caller's uses too.
        out.record_stream(torch.cuda.current_stream(self.device))
        return out

    def start(self) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(self.device))

    def copy(self, src: torch.Tensor, dst: torch.Tensor):
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event(blocking=True)  # waiting workers sleep rather than spin on a core
            done.record(self.stream)
        return done

    def finish(self, last) -> None:
        torch.cuda.current_stream(self.device).wait_event(last)


def _pack(after, host, idx, buf) -> None:
    import numpy as np  # noqa: PLC0415 - imported by byte_rows already: a dictionary lookup

    if after is not None:
        after.synchronize()  # the copy that last read this buffer is done
    np.take(host, idx, axis=0, out=buf, mode="clip")


def _unpack(after, host, idx, buf) -> None:
    import numpy as np  # noqa: PLC0415

    after.synchronize()  # this chunk's rows have arrived in the buffer
    np.put(host, idx, buf, mode="clip")


def _done(fn, *args) -> Future:
    """fn(*args) run here, as a finished future: one chunk is not worth a thread hand-off."""
    f: Future = Future()
    try:
        f.set_result(fn(*args))
    except BaseException as e:  # noqa: BLE001 - handed to whoever reads the future, as a pool would
        f.set_exception(e)
    return f


def _drain(events: list, buffers: list) -> None:
    """Free staging buffers only after the copies using them finished: a lane's allocator need
    not know which stream still reads a buffer (torch's pinned one does; a test lane's does not)."""
    for e in events:
        if e is not None:
            e.synchronize()
    buffers.clear()


class Staged:
    """Moves rows between a host table (`host`, a 2-D CPU tensor) and a device through a
    bounded ring of pinned staging buffers; one transfer at a time per instance."""

    def __init__(self, lane, host: torch.Tensor, *, threads: int | None = None,
                 chunk_bytes: int = CHUNK_BYTES, stages: int = STAGES):
        self.lane, self.host, self.rows = lane, host, byte_rows(host)
        self.threads = default_threads() if threads is None else threads
        self.chunk_bytes = chunk_bytes
        # A buffer per worker and one being copied: with fewer, workers would sit idle.
        self.stages = max(stages, self.threads + 1) if self.threads > 1 else stages
        self._buffers: list = [None] * self.stages  # (torch view for the copy, byte rows for the workers)
        self._events: list = [None] * self.stages  # the last copy that used each buffer
        self._lock = threading.Lock()
        weakref.finalize(self, _drain, self._events, self._buffers)

    def _run(self, many: bool, fn, *args) -> Future:
        if not many or self.threads == 1:
            return _done(fn, *args)
        return _pool(self.threads, self.lane).submit(fn, *args)

    def _buffer(self, k: int, rows: int):
        buf = self._buffers[k]
        if buf is None or buf[0].shape[0] < rows:
            if self._events[k] is not None:
                self._events[k].synchronize()  # the old buffer may still be read by a copy
            pinned = self.lane.pinned(rows, self.host.shape[1], self.host.dtype)
            buf = self._buffers[k] = (pinned, byte_rows(pinned))
        return buf[0][:rows], buf[1][:rows]

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        """host[idx] on the lane's device: `idx` int64 on the CPU, checked."""
        out = self.lane.output(idx.numel(), self.host.shape[1], self.host.dtype)
        bounds = chunks(idx.numel(), self.rows.itemsize, self.chunk_bytes)
        if not bounds:
            return out
        idx_np, many = idx.numpy(), len(bounds) > 1
        with self._lock:
            packing: deque[tuple[Future, torch.Tensor]] = deque()  # (the worker, the buffer it fills)
            last = None

            def pack(i: int) -> None:
                a, b = bounds[i]
                k = i % self.stages
                pinned, rows = self._buffer(k, b - a)
                packing.append((self._run(many, _pack, self._events[k], self.rows, idx_np[a:b], rows), pinned))

            try:
                for i in range(min(self.stages, len(bounds))):
                    pack(i)
                for i, (a, b) in enumerate(bounds):
                    k = i % self.stages
                    packing[0][0].result()  # (waited for before it leaves the deque: see finally)
                    _, pinned = packing.popleft()
                    last = self._events[k] = self.lane.copy(pinned, out[a:b])
                    if i + self.stages < len(bounds):
                        pack(i + self.stages)  # into the buffer just queued: its worker waits for that copy
            finally:
                for f, _ in packing:  # after an error: no worker may still write a buffer when the lock is let go
                    f.exception()
                if last is not None:
                    # Even after an error: the caller's stream must not reuse `out`'s memory
                    # while copies queued into it still run.
                    self.lane.finish(last)
        return out

    def scatter(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        """host[idx[i]] = values[i]: `idx` int64 on the CPU, checked, repeated rows carrying
        the same bytes; `values` on the lane's device. Returns once every row is in the table."""
        bounds = chunks(idx.numel(), self.rows.itemsize, self.chunk_bytes)
        if not bounds:
            return
        idx_np, many = idx.numpy(), len(bounds) > 1
        with self._lock:
            self.lane.start()  # the values were computed on the caller's stream
            writing: list[Future | None] = [None] * self.stages
            try:
                for i, (a, b) in enumerate(bounds):
                    k = i % self.stages
                    if writing[k] is not None:
                        writing[k].result()  # the workers are done reading this buffer
                    pinned, rows = self._buffer(k, b - a)
                    self._events[k] = self.lane.copy(values[a:b], pinned)
                    writing[k] = self._run(many, _unpack, self._events[k], self.rows, idx_np[a:b], rows)
            finally:
                errors = [f.exception() for f in writing if f is not None]
            for e in errors:
                if e is not None:
                    raise e
