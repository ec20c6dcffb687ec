"""'auto', HostTable's default (speedlib/transfer/auto.py): its paths timed taking turns, the
fastest kept per device and shape, and the split path (CPU head, GPU kernel tail) bitwise.

On the CPU the choice is driven by stand-in paths on a clock of their own, so which path is
fastest is known exactly; the split runs with copy engines ("lanes") that copy on the CPU, at
once or as late as a stream may, and the kernel in Triton's interpreter. On a GPU: every path
of a real table, forced one by one, against plain indexing, and the choice itself.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from transfer_bits import bits, indices, needs_cuda, needs_triton, same_bits

from speedlib.transfer import HostTable, auto
from speedlib.transfer.auto import Path, Split, choose, split_share, turns
from speedlib.transfer.backends import Pinned

PINNED, UVA, SORTED = Path("pinned"), Path("uva"), Path("uva", sort=True)


class Clock:
    """Time that passes only when a stand-in path runs: each path costs what `cost` says."""

    def __init__(self, cost: dict):
        self.now, self.cost, self.calls = 0.0, cost, []

    def __call__(self) -> float:
        return self.now

    def run(self, path: Path):
        self.calls.append(path)
        self.now += self.cost(path) if callable(self.cost) else self.cost[path]
        return path


def _costs(single: dict, overhead: float = 0.0):
    """Stand-in costs: each single path's seconds, and a split's if its CPU head and GPU tail
    ran side by side at their paths' rates, plus `overhead` for splitting at all."""
    def cost(path: Path) -> float:
        if path.name == "split":
            kernel = single[Path("uva", sort=path.sort)]
            return max(path.share * single[PINNED], (1 - path.share) * kernel) + overhead
        return single[path]
    return cost


# --- timing and choosing -------------------------------------------------------------------------

def test_turns_calls_each_path_once_untimed_then_rounds_in_rotated_order():
    clock = Clock({PINNED: 3.0, UVA: 1.0, SORTED: 2.0})
    times, last = turns([PINNED, UVA, SORTED], clock.run, sync=lambda: None, clock=clock, rounds=3)
    assert times == {PINNED: 3.0, UVA: 1.0, SORTED: 2.0}
    assert clock.calls == [PINNED, UVA, SORTED,  # untimed: compiles, allocations
                           PINNED, UVA, SORTED, UVA, SORTED, PINNED, SORTED, PINNED, UVA]
    assert last == UVA


def test_the_median_of_the_rounds_counts_not_one_slow_call():
    slow = iter([9.0, 1.0, 1.0, 1.0])  # the first timed call of uva is disturbed
    clock = Clock(lambda p: 2.0 if p == PINNED else next(slow, 1.0))
    times, _ = turns([UVA, PINNED], clock.run, sync=lambda: None, clock=clock)
    assert times[UVA] == 1.0 and times[PINNED] == 2.0


def test_the_split_share_makes_both_halves_finish_together():
    assert split_share(cpu_seconds=3.0, gpu_seconds=1.0) == 0.25  # the CPU is 3x slower: a quarter
    assert split_share(2.0, 2.0) == 0.5
    share = split_share(0.8, 0.3)
    assert share * 0.8 == pytest.approx((1 - share) * 0.3)


def test_the_fastest_path_wins_and_a_split_joins_the_faster_kernel_order():
    # the CPU path at 4 s, the kernel at 2 s as given and 1.5 s sorted: together about 1.1 s
    clock = Clock(_costs({PINNED: 4.0, UVA: 2.0, SORTED: 1.5}))
    best, times, _ = choose([PINNED, UVA, SORTED], clock.run, sync=lambda: None, clock=clock)
    assert best == Path("split", sort=True, share=round(1.5 / 5.5, 3))
    assert times[best] == pytest.approx(4.0 * round(1.5 / 5.5, 3))
    assert set(times) == {PINNED, UVA, SORTED, best}


def test_a_split_that_does_not_pay_is_not_chosen():
    clock = Clock(_costs({PINNED: 3.0, UVA: 1.0}, overhead=1.0))  # splitting costs more than it saves
    best, times, _ = choose([PINNED, UVA], clock.run, sync=lambda: None, clock=clock)
    assert best == UVA and times[Path("split", share=0.25)] == 1.75


def test_only_the_cpu_path_means_nothing_to_split():
    clock = Clock({PINNED: 1.0})
    best, times, _ = choose([PINNED], clock.run, sync=lambda: None, clock=clock)
    assert best == PINNED and list(times) == [PINNED]


def test_paths_name_themselves_for_users():
    assert str(SORTED) == "uva sorted"
    assert str(Path("split", share=0.31)) == "split (31% of rows packed on the CPU, uva the rest)"


# --- the table: measured once per shape, remembered, reported ------------------------------------

@pytest.fixture
def fresh_choices(monkeypatch):
    monkeypatch.setattr(auto, "CHOICES", {})


def _stand_in(table: HostTable, single: dict, overhead: float = 1.0) -> Clock:
    """Make a CPU 'auto' table choose among stand-in paths costing `single` (a split: _costs);
    the rows themselves still come from the pageable path, so results stay real."""
    impl, clock = table._impl, Clock(_costs(single, overhead))
    impl.paths = list(single)
    impl._clock = clock

    def gather(path, idx):
        clock.run(path)
        return impl._pageable.gather(idx)

    def write(path, idx, values):
        clock.run(path)
        impl._pageable.write(idx, values)
    impl._gather, impl._write = gather, write
    return clock


def test_auto_on_a_cpu_is_pageable_and_measures_nothing(fresh_choices):
    weight = bits(50, 6, torch.float32)
    table = HostTable.from_tensor(weight, device="cpu")
    assert table.backend == "auto" and table.chosen == {}
    idx = indices("random, with repeats", 20, 50)
    assert same_bits(table.gather(idx), weight[idx])
    table.scatter_(idx, weight[idx])
    assert table.chosen == {"gather": "pageable", "scatter": "pageable"}
    assert same_bits(table.cpu(), weight) and auto.CHOICES == {} and table._impl.measured == {}


def test_the_first_use_measures_and_later_tables_of_that_shape_reuse_the_choice(fresh_choices):
    weight = bits(64, 4, torch.float32)
    first = HostTable.from_tensor(weight, device="cpu")
    costs = {PINNED: 2.0, UVA: 1.0, SORTED: 1.5}
    clock = _stand_in(first, costs)  # a split would take 1.67 s: uva wins
    idx = indices("random, with repeats", 30, 64)
    assert same_bits(first.gather(idx), weight[idx])  # the measured calls return real rows
    assert first.chosen == {"gather": "uva"} and first._impl.measured["gather"][UVA] == 1.0
    measured_calls = len(clock.calls)
    assert measured_calls == 3 + 3 * 3 + 3 + 3 * 3  # untimed + rounds, then the split beside its two
    first.gather(idx)
    assert len(clock.calls) == measured_calls + 1 and clock.calls[-1] == UVA
    # Another table of the same shape, batch size in the same power of two: no measurement
    second = HostTable.from_tensor(weight, device="cpu")
    other = _stand_in(second, costs)
    second.gather(indices("random, with repeats", 32, 64))
    assert other.calls == [UVA] and second.chosen == {"gather": "uva"} and second._impl.measured == {}
    # ... but the other direction, another batch size or another shape is measured anew
    second.scatter_(idx, weight[idx])
    assert len(other.calls) > 1 and second._impl.measured["scatter"]
    third = HostTable.from_tensor(weight[:, :2].contiguous(), device="cpu")
    third_clock = _stand_in(third, costs)
    third.gather(idx)
    assert len(third_clock.calls) > 1


def test_backend_names_one_path_and_chosen_says_so():
    table = HostTable(10, 3, backend="pageable", device="cpu")
    assert table.chosen == {"gather": "pageable", "scatter": "pageable"}


# --- the split path, on the CPU ------------------------------------------------------------------

class _Event:
    def __init__(self, pending=()):
        self.pending = list(pending)

    def synchronize(self) -> None:
        for copy in self.pending:
            copy()
        self.pending.clear()


class EagerLane:
    """Copies at once: the split's arithmetic (which rows go where) on its own."""

    def mark(self):
        return _Event()

    def copy(self, src, dst, after):
        dst.copy_(src)
        return _Event()

    def join(self, done) -> None:
        pass


class LazyLane(EagerLane):
    """Copies as late as a stream may: when something waits for them. A split that read a
    staging buffer or returned rows before waiting would see them unfilled."""

    def copy(self, src, dst, after):
        return _Event([lambda: dst.copy_(src)])

    def join(self, done) -> None:
        done.synchronize()  # the caller's later reads wait for it


class _HostPinned(Pinned):
    _pin = False  # no GPU here: stage in plain host memory


def _split(host: torch.Tensor, lane, kernel) -> Split:
    pinned = _HostPinned(*host.shape, host.dtype, torch.device("cpu"), host)
    return Split(pinned, host, lane, kernel=kernel)


@needs_triton
@pytest.mark.parametrize("lane_type", [EagerLane, LazyLane])
@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("sort", [False, True], ids=["as-given", "sorted"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_split_gather_is_bitwise_plain_indexing(interpreted, lane_type, share, sort, dtype):
    host = bits(80, 6, dtype)
    split = _split(host, lane_type(), interpreted)
    for pattern in ("random, with repeats", "descending, distinct"):
        idx = indices(pattern, 33, 80)
        assert same_bits(split.gather(idx, round(share * 33), sort), host[idx]), pattern


@needs_triton
@pytest.mark.parametrize("lane_type", [EagerLane, LazyLane])
@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("sort", [False, True], ids=["as-given", "sorted"])
def test_a_split_write_back_is_bitwise_index_copy(interpreted, lane_type, share, sort):
    host = bits(80, 6, torch.float32)
    expected = host.clone()
    idx = torch.randperm(80, generator=torch.Generator().manual_seed(3))[:37]
    values = bits(37, 6, torch.float32, seed=5)
    expected.index_copy_(0, idx, values)
    _split(host, lane_type(), interpreted).write(idx, values, round(share * 37), sort)
    assert same_bits(host, expected)


@needs_triton
def test_a_split_refills_a_staging_buffer_only_after_its_copy(interpreted):
    """Three gathers in a row on the lazy lane: the third packs into the first's buffer, which
    the first's copy must have read by then (its event is waited for)."""
    host = bits(60, 4, torch.float32)
    lane = LazyLane()
    lane.join = lambda done: None  # nothing downstream waits: only the ring's own wait orders copies
    split = _split(host, lane, interpreted)
    idx = [indices("random, with repeats", 20, 60, seed=s) for s in (1, 2, 3)]
    outs = [split.gather(i, 10, False) for i in idx]
    for event in split.pinned._events:
        if event is not None:
            event.synchronize()  # what a later wait would do
    assert all(same_bits(out, host[i]) for out, i in zip(outs, idx, strict=True))


# --- on a GPU: every path of a real table ---------------------------------------------------------

def _every_path():
    return [PINNED, UVA, SORTED, Path("split", share=0.0), Path("split", share=0.4),
            Path("split", sort=True, share=0.7), Path("split", share=1.0)]


@needs_cuda
@pytest.mark.parametrize("path", _every_path(), ids=str)
@pytest.mark.parametrize("pattern", ["random, with repeats", "one row over and over", "sorted"])
def test_every_auto_path_gathers_and_writes_back_bitwise(path, pattern, fresh_choices):
    weight = bits(700, 24, torch.bfloat16)
    table = HostTable.from_tensor(weight)
    key = table._impl._key
    idx = indices(pattern, 333, 700)
    auto.CHOICES.update({key("gather", 333): path, key("scatter", 333): path})  # forced
    for where in ("cpu", table.device):
        assert same_bits(table.gather(idx.to(where)).cpu(), weight[idx])
    assert table.chosen == {"gather": str(path)} and table._impl.measured == {}
    values = bits(333, 24, torch.bfloat16, seed=4)
    reference = HostTable.from_tensor(weight, backend="pageable", device="cpu")
    table.scatter_(idx, values.to(table.device))
    reference.scatter_(idx, values)
    assert same_bits(table.cpu(), reference.cpu())


@needs_cuda
def test_a_split_gather_on_a_busy_stream_is_ordered_on_that_stream(fresh_choices):
    weight = bits(4000, 128, torch.float32)
    table = HostTable.from_tensor(weight)
    idx = indices("random, with repeats", 3000, 4000)
    auto.CHOICES[table._impl._key("gather", 3000)] = Path("split", share=0.5)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(10_000_000)  # the caller's stream is busy: its reads of `out` come late
        out = table.gather(idx)
        checksum = out.view(torch.int32).sum(dtype=torch.int64)
        del out  # freed while the sum is still queued: the next gather must not write over it yet
        other_idx = indices("random, with repeats", 3000, 4000, seed=9)
        again = table.gather(other_idx).view(torch.int32).sum(dtype=torch.int64)
    stream.synchronize()
    expected = weight.view(torch.int32)[idx].sum(dtype=torch.int64).item()
    other_expected = weight.view(torch.int32)[other_idx].sum(dtype=torch.int64).item()
    assert expected != other_expected
    assert checksum.item() == expected and again.item() == other_expected


@needs_cuda
def test_auto_measures_every_path_on_a_gpu_and_keeps_the_fastest(fresh_choices):
    weight = bits(20000, 64, torch.float32)
    table = HostTable.from_tensor(weight)
    idx = indices("random, with repeats", 4096, 20000)
    assert same_bits(table.gather(idx).cpu(), weight[idx])
    times = table._impl.measured["gather"]
    assert {p.name for p in times} == {"pinned", "uva", "split"}
    assert table.chosen["gather"] == str(min(times, key=times.get))


@needs_cuda
def test_a_table_the_os_will_not_lock_is_moved_by_the_pinned_path_alone(monkeypatch, fresh_choices):
    def refuse(*args, **kwargs):
        raise RuntimeError("cudaHostRegister failed with cudaError 2")

    monkeypatch.setattr(auto, "locked_zeros", refuse)
    with pytest.warns(RuntimeWarning, match="could not be page-locked .*cudaError 2.*'pinned' path alone"):
        table = HostTable(100, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table.gather(torch.arange(10))
    assert table.chosen == {"gather": "pinned"} and table._impl.measured == {}
