"""'auto', HostTable's default: one page-locked table, moved by whichever of its paths measured
fastest on this machine, as torch.backends.cudnn.benchmark picks a convolution algorithm.

Why measure: which path wins depends on the host as much as on the GPU. A random-row gather
of 131072 x 512 bytes from a 10M-row table: on an H100 host (bdb0cb6d) index_select + one
copy reached 42.4 % of the pinned copy bandwidth and the GPU reading host rows itself 33-39 %;
on an H200 host (838236b) the GPU's own reads reached 18 GB/s (33 %), index_select packed
12.9 GB/s. No fixed choice is right everywhere.

The paths, all over the same page-locked table:
  pinned  index_select on the CPU into a pinned buffer, then one copy (PyTorch's pinned path)
  uva     the GPU reads (writes) the rows itself, speedlib/transfer/kernel.py; `sorted`
          reads them in index order, the caller's order restored in the same pass
  split   both at once: the kernel moves the batch's tail while the CPU packs its head and a
          copy engine carries it, the head's share set from the two paths' measured times so
          that both finish together: the two are limited by different things (the host's
          memory latency, the GPU's reads of host pages), so together they may fill more of
          the bus than either alone. On an H200 (d93fd5c1) 'auto' gathered at 58 % of the
          pinned copy, above every single path measured beside it (PyTorch's pinned path
          49.5 %, uva 33 %); whether the split or sorted uva won there was not recorded.
Write-back mirrors each.

The first gather (write-back) of a batch size times every path on the call's own rows: one
untimed call each (Triton compiles, buffers are allocated), then ROUNDS rounds taking turns,
the device synchronised around each call; the split is timed after, with the better kernel
order, beside the two it combines. The smallest median wins, remembered for the process per
device, table shape, dtype, direction and batch size (rounded up to a power of two), so later
tables of that shape measure nothing. Every path moves the same bytes, so the measured calls
return real rows, and repeating a write is harmless (HostTable gives duplicate rows one
value). A table that cannot be page-locked (a file mapping, or more than the OS will lock) has
the pinned path alone and measures nothing; a CPU 'device' is the pageable path.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from speedlib.transfer.backends import Pageable, Pinned, Uva, locked_zeros
from speedlib.transfer.kernel import copy_rows

ROUNDS = 3


@dataclass(frozen=True)
class Path:
    """One way to move rows: `name` pinned, uva or split; `sort`: the kernel reads (writes) rows
    in index order; `share`: the split's fraction of rows the CPU packs."""

    name: str
    sort: bool = False
    share: float | None = None

    def __str__(self) -> str:
        kernel = " sorted" if self.sort else ""
        if self.name == "split":
            return f"split ({self.share:.0%} of rows packed on the CPU, uva{kernel} the rest)"
        return f"{self.name}{kernel}"


def turns(paths: list[Path], run: Callable[[Path], object], sync: Callable[[], None],
          clock: Callable[[], float] = time.perf_counter, rounds: int = ROUNDS) -> tuple[dict[Path, float], object]:
    """({path: median seconds of `rounds` calls}, the last call's result): one untimed call each,
    then the paths taking turns, the order rotated every round so none always runs first."""
    out = None
    for path in paths:
        out = run(path)
    sync()
    times: dict[Path, list[float]] = {p: [] for p in paths}
    for r in range(rounds):
        for path in paths[r % len(paths):] + paths[:r % len(paths)]:
            start = clock()
            out = run(path)
            sync()
            times[path].append(clock() - start)
    return {p: statistics.median(t) for p, t in times.items()}, out


def split_share(cpu_seconds: float, gpu_seconds: float) -> float:
    """The fraction of rows the CPU should pack so that it and the kernel finish together: each
    moves rows at n / its seconds, so the head k solves k * cpu_seconds = (n - k) * gpu_seconds."""
    return gpu_seconds / (cpu_seconds + gpu_seconds)


def choose(paths: list[Path], run: Callable[[Path], object], sync: Callable[[], None],
           clock: Callable[[], float] = time.perf_counter) -> tuple[Path, dict[Path, float], object]:
    """(the fastest path, every path's median seconds, the last result): the single paths
    first, then the split at the share their times give, taking turns with the two it joins."""
    times, out = turns(paths, run, sync, clock)
    pinned = next((p for p in paths if p.name == "pinned"), None)
    kernels = [p for p in paths if p.name == "uva"]
    if pinned is not None and kernels:
        kernel = min(kernels, key=times.get)
        split = Path("split", kernel.sort, round(split_share(times[pinned], times[kernel]), 3))
        # Timed taking turns with the two it joins, whose times from these rounds replace their first.
        again, out = turns([split, pinned, kernel], run, sync, clock)
        times.update(again)
    return min(times, key=times.get), times, out


class CudaLane:
    """The split's copy engine on a GPU: a side stream beside the caller's, events between them."""

    def __init__(self, device: torch.device):
        self.device = device
        self.side = torch.cuda.Stream(device)

    def mark(self) -> torch.cuda.Event:
        """An event after the work the caller has queued so far."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def copy(self, src: torch.Tensor, dst: torch.Tensor, after: torch.cuda.Event) -> torch.cuda.Event:
        """dst <- src on the side stream once `after` has passed; the event of its end."""
        with torch.cuda.stream(self.side):
            self.side.wait_event(after)
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.side)
        return done

    def join(self, done: torch.cuda.Event) -> None:
        """The caller's stream waits for `done`: its next work sees the copied rows."""
        torch.cuda.current_stream(self.device).wait_event(done)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


class Split:
    """Rows moved by the CPU (the head) and the GPU's kernel (the tail) at once.

    pinned: the Pinned path over the table (its staging buffers); view: the table as the GPU
    sees it; lane: CudaLane on GPUs (tests pass one that copies on the CPU); kernel: passed to
    copy_rows (tests pass Triton's interpreter)."""

    def __init__(self, pinned: Pinned, view: torch.Tensor, lane, kernel=None):
        self.pinned, self.view, self.lane, self.kernel = pinned, view, lane, kernel

    def gather(self, idx: torch.Tensor, k: int, sort: bool) -> torch.Tensor:
        host, n = self.pinned.host, idx.shape[0]
        head = idx[:k].cpu()  # before the kernel is queued: from GPU indices this copy waits for the stream
        out = torch.empty(n, host.shape[1], dtype=host.dtype, device=self.view.device)
        ready = self.lane.mark()  # out's memory is free of the caller's earlier work from here
        # The kernel first, so the bus is busy while the CPU packs the head.
        tail = idx[k:].to(self.view.device, non_blocking=True)
        if sort:
            rows, where = torch.sort(tail)
            copy_rows(self.view, out[k:], src_rows=rows, dst_rows=where, kernel=self.kernel)
        else:
            copy_rows(self.view, out[k:], src_rows=tail, kernel=self.kernel)
        if k:
            i, stage = self.pinned.stage(k)
            torch.index_select(host, 0, head, out=stage)
            done = self.lane.copy(stage, out[:k], after=ready)
            self.pinned.release(i, done)
            self.lane.join(done)
        return out

    def write(self, idx: torch.Tensor, values: torch.Tensor, k: int, sort: bool) -> None:
        head = idx[:k].cpu()  # before the kernel is queued, as in gather
        ready = self.lane.mark()  # the values are computed once the caller's queued work is done
        tail = idx[k:].to(self.view.device, non_blocking=True)
        rest = values[k:].to(self.view.device, non_blocking=True)
        if sort:
            rows, where = torch.sort(tail)
            copy_rows(rest, self.view, src_rows=where, dst_rows=rows, kernel=self.kernel)
        else:
            copy_rows(rest, self.view, dst_rows=tail, kernel=self.kernel)
        if k:
            i, stage = self.pinned.stage(k)
            done = self.lane.copy(values[:k], stage, after=ready)
            self.pinned.release(i, done)
            done.synchronize()  # the head's rows are in the staging buffer before the CPU reads them
            self.pinned.host.index_copy_(0, head, stage)


# The path chosen per (device, rows, dim, dtype, op, batch bucket), for the process.
CHOICES: dict[tuple, Path] = {}


def _bucket(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()  # n rounded up to a power of two


class Auto:
    """HostTable's 'auto' backend (see the module docstring)."""

    def __init__(self, rows: int, dim: int, dtype: torch.dtype, device: torch.device, host: torch.Tensor | None = None):
        self.device, self.shape, self.dtype = device, (rows, dim), dtype
        self._gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
        # Each measured call ends when the device is idle; tests of the choice pass their own clock.
        self._sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
        self._clock = time.perf_counter
        self.chosen: dict[str, Path] = {}  # op -> the path this table uses
        self.measured: dict[str, dict[Path, float]] = {}  # op -> seconds per path, where this table measured
        self.paths: list[Path]
        if device.type != "cuda":
            self._pageable = Pageable(rows, dim, dtype, device, host)
            self.host, self.paths = self._pageable.host, [Path("pageable")]
            return
        if host is None:
            try:
                host = locked_zeros(rows, dim, dtype, device, owner=self)
            except RuntimeError as e:  # the OS would not lock that much: index on the CPU instead
                warnings.warn(f"speedlib.transfer 'auto': the table could not be page-locked ({e}); it is moved "
                              "by the 'pinned' path alone (CPU indexing, one copy)", RuntimeWarning, stacklevel=3)
                host = None
            locked = host is not None
            if not locked:
                host = torch.zeros(rows, dim, dtype=dtype)
        else:
            locked = False  # a file mapping is indexed on the CPU, never locked whole
        self.host = host
        self._pinned = Pinned(rows, dim, dtype, device, host)
        self.paths = [Path("pinned")]
        if locked:
            self._kernel = {s: Uva(rows, dim, dtype, device, sort_indices=s, locked=host) for s in (False, True)}
            self._split = Split(self._pinned, self._kernel[False].view, CudaLane(device))
            self.paths += [Path("uva"), Path("uva", sort=True)]

    def _key(self, op: str, n: int) -> tuple:
        return (str(self.device), self._gpu, self.shape, self.dtype, op, _bucket(n))

    def _path(self, op: str, n: int, run: Callable[[Path], object]):
        """The result of `run` on this table's path for (op, n), measuring the paths the first time."""
        if len(self.paths) == 1:
            self.chosen[op] = self.paths[0]
            return run(self.paths[0])
        key = self._key(op, n)
        if key in CHOICES:
            self.chosen[op] = CHOICES[key]
            return run(CHOICES[key])
        best, times, out = choose(self.paths, run, self._sync, self._clock)
        CHOICES[key], self.chosen[op], self.measured[op] = best, best, times
        return out

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        return self._path("gather", idx.shape[0], lambda p: self._gather(p, idx))

    def write(self, idx: torch.Tensor, values: torch.Tensor) -> None:
        self._path("scatter", idx.shape[0], lambda p: self._write(p, idx, values))

    def _gather(self, path: Path, idx: torch.Tensor) -> torch.Tensor:
        if path.name == "pageable":
            return self._pageable.gather(idx)
        if path.name == "pinned":
            return self._pinned.gather(idx)
        if path.name == "uva":
            return self._kernel[path.sort].gather(idx)
        return self._split.gather(idx, round(path.share * idx.shape[0]), path.sort)

    def _write(self, path: Path, idx: torch.Tensor, values: torch.Tensor) -> None:
        if path.name == "pageable":
            self._pageable.write(idx, values)
        elif path.name == "pinned":
            self._pinned.write(idx, values)
        elif path.name == "uva":
            self._kernel[path.sort].write(idx, values)
        else:
            self._split.write(idx, values, round(path.share * idx.shape[0]), path.sort)
