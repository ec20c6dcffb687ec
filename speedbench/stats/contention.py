"""Which rounds something else disturbed, and whether a result can be cited as clean.

The counters (speedbench.measure.interference, stored per round beside every paired comparison and
every unpaired timing) are judged here, when results are loaded, so that a threshold can be
revised without measuring again. No torch, no pandas: the loader, the report and the
dashboard all use it.

A round is *disturbed* when, during it,
  - other processes (or a hypervisor) kept more than OTHERS_CORES_MAX of a core busy beyond
    the cores the benchmark leaves free (the machine's CPUs less its torch threads: none, by
    default), or, where that share cannot be read (no /proc/stat), the scheduler preempted
    the measuring process more than PREEMPTIONS_MAX times a second, or
  - another process ran on the GPU, or
  - the GPU's SM clock was more than CLOCK_DROP_MAX % below the comparison's median round
    (a clock held down by heat or a hardware slowdown; a clock that every round shares,
    such as one capped by the work's own power draw, is the work's, not a disturbance).
The thresholds come from the flat-buffer Adam comparison (bench_contiguous.AdamStep, 2 x 15
rounds) on the 2-core VM, idle, then with one busy-loop process per core, then idle again
(docs/measurement.md gives the commands):
  others' CPU share   idle 0-3 % in every round of both idle runs (0.06 of a core at most);
                      busy 50-57 % in every round (a whole core): half a core lies between.
                      Counted in cores, not as a share of the machine, because every torch
                      thread needs its core: on a 16-core GPU host one data-loader process is
                      6 % of the machine and still stalls one of 16 intra-op threads.
  preemptions/s       idle 29-91; busy 79-237: the two overlap. In the full suite, idle, a
                      DataLoader's own workers preempted the measuring process 183 times a
                      second with 0 % to others: preemption says the process shared its
                      cores, not with whom. So the share of the machine decides, and the
                      preemption rate (always recorded and shown) judges a round only where the
                      share cannot be read, above everything idle rounds showed.

A result's verdict:
  clean      no round disturbed;
  dropped    some were, but no more than MAX_DISTURBED_SHARE of them and at least
             MIN_CLEAN_ROUNDS (enough for a 99 % interval) were not: the paired estimate
             and interval are computed from the undisturbed rounds alone, and how many were
             left out is kept;
  contended  more were disturbed: the figure stays in the file and in every table, marked,
             but is never cited as clean (the headline and claims prefer a clean result);
  unknown    measured before the counters existed, or where none could be read.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["State", "Verdict", "judge", "keep", "disturbances", "summary", "summary_line", "OTHERS_CORES_MAX",
           "others_limit", "PREEMPTIONS_MAX", "CLOCK_DROP_MAX",
           "MAX_DISTURBED_SHARE", "MIN_CLEAN_ROUNDS", "CLEAN", "DROPPED", "CONTENDED", "UNKNOWN", "MARK",
           "COUNTER_METRICS"]

OTHERS_CORES_MAX = 0.5  # cores busy with other work beyond the free ones: idle rounds 0.06, busy 1.0
PREEMPTIONS_MAX = 250.0  # involuntary context switches per second; idle rounds reached 183
CLOCK_DROP_MAX = 10.0  # % below the median round's SM clock
MAX_DISTURBED_SHARE = 1 / 3
MIN_CLEAN_ROUNDS = 8  # the fewest rounds with a 99 % Wilcoxon interval (speedbench.stats.paired)



class State(StrEnum):
    """A result's verdict on its counters (the module docstring says each), as the `contention`
    column and the environment records hold it: plain strings, so files and frames keep their text."""

    CLEAN = "clean"
    DROPPED = "dropped"
    CONTENDED = "contended"
    UNKNOWN = "unknown"


CLEAN, DROPPED, CONTENDED, UNKNOWN = State.CLEAN, State.DROPPED, State.CONTENDED, State.UNKNOWN  # the short names
# The mark a contended figure carries wherever it is shown (the dagger marks an earlier
# benchmark version; this one a busy machine).
MARK = "‡"

# The asv metrics that hold the counters (benchmarks/common.py `_Interference`), by the name
# `judge` knows them under.
COUNTER_METRICS = {"interference": "others_cpu", "preemptions": "preemptions", "gpu_clock": "gpu_clock",
                   "gpu_neighbours": "gpu_neighbours"}


@dataclass(frozen=True)
class Verdict:
    state: State
    disturbed: tuple[bool, ...]  # per round; empty when unknown
    note: str  # the counters behind the verdict, in words ("" when clean or unknown)

    @property
    def dropped(self) -> int:
        """Rounds the estimate leaves out: the disturbed ones, where the verdict drops them."""
        return sum(self.disturbed) if self.state == DROPPED else 0

    def keep(self, samples: Sequence[float]) -> list[float]:
        """The samples (one per round) the estimate is computed from."""
        return keep(samples, self.state, self.disturbed)


def keep(samples: Sequence[float], state: str, disturbed: Sequence[bool]) -> list[float]:
    """`samples` (one per round) without the disturbed rounds where the verdict `state` drops
    them; all of them otherwise."""
    if state != DROPPED or len(samples) != len(disturbed):
        return list(samples)
    return [x for x, bad in zip(samples, disturbed, strict=True) if not bad]


def others_limit(cores: float | None, threads: float | None = None) -> float | None:
    """The share of the machine (%) that other work may take before a round counts as
    disturbed: OTHERS_CORES_MAX of a core beyond the `cores` the `threads` leave free (all of
    them busy where `threads` is unknown). None where the machine's size is unknown."""
    if not cores or cores <= 0 or cores != cores:  # None, 0 or NaN
        return None
    threads = cores if not threads or threads != threads else threads
    return 100.0 * (max(cores - threads, 0.0) + OTHERS_CORES_MAX) / cores


def disturbances(counters: dict[str, Sequence[float]], cores: float | None = None,
                 threads: float | None = None) -> list[list[str]]:
    """Per round, what disturbed it in words (an empty list: nothing). `counters` maps the
    names of speedbench.measure.interference (others_cpu, preemptions, gpu_clock, gpu_neighbours) to
    one value per round; a counter that is missing is not judged. `cores`, `threads`: the
    machine's CPUs and the torch threads the benchmark ran (its environment record); without
    `cores` the others' share cannot be judged, and preemptions stand in for it."""
    rounds = max((len(v) for v in counters.values()), default=0)
    out: list[list[str]] = [[] for _ in range(rounds)]
    clocks = counters.get("gpu_clock") or []
    typical = statistics.median(clocks) if clocks else None
    limit = others_limit(cores, threads)
    for i in range(rounds):
        def at(name: str):
            values = counters.get(name) or []
            return values[i] if i < len(values) else None  # noqa: B023 - called at once, in this round

        others, preempted = at("others_cpu"), at("preemptions")
        neighbours, clock = at("gpu_neighbours"), at("gpu_clock")
        if limit is None:
            others = None  # a share of an unknown machine: preemptions judge instead
        if others is not None and others > limit:
            out[i].append(f"others kept {others * cores / 100:.1f} of {cores:g} CPUs busy")
        if others is None and preempted is not None and preempted > PREEMPTIONS_MAX:
            out[i].append(f"{preempted:.0f} preemptions/s")
        if neighbours is not None and neighbours > 0:
            out[i].append(f"{neighbours:.0f} other process(es) on the GPU")
        if clock is not None and typical and clock < typical * (1 - CLOCK_DROP_MAX / 100):
            out[i].append(f"SM clock {clock:.0f} % of max (median round {typical:.0f} %)")
    return out


def judge(counters: dict[str, Sequence[float]], rounds: int, cores: float | None = None,
          threads: float | None = None) -> Verdict:
    """The verdict on a result of `rounds` rounds (or one unpaired measurement: rounds=1)
    from its counters (`disturbances` says what `cores` and `threads` are); UNKNOWN where no
    counter covers those rounds."""
    usable = {k: list(v) for k, v in counters.items() if v is not None and len(v) == rounds and rounds > 0}
    if not usable:
        return Verdict(UNKNOWN, (), "")
    per_round = disturbances(usable, cores, threads)
    disturbed = tuple(bool(r) for r in per_round)
    bad = sum(disturbed)
    if not bad:
        return Verdict(CLEAN, disturbed, "")
    clean = rounds - bad
    state = DROPPED if bad <= MAX_DISTURBED_SHARE * rounds and clean >= MIN_CLEAN_ROUNDS else CONTENDED
    return Verdict(state, disturbed, _note(state, per_round, usable, bad, rounds, cores))


def _note(state: State, per_round: list[list[str]], counters: dict[str, list[float]], bad: int, rounds: int,
          cores: float | None = None) -> str:
    """E.g. "contended: 15 of 15 rounds disturbed (other processes kept 1.0 of 2 CPUs busy,
    182 preemptions/s in the disturbed rounds, median)"."""
    what = []
    # strict=False: a counter that was not recorded is [] here, and gives no values
    others = [v for v, r in zip(counters.get("others_cpu") or [], per_round, strict=False) if r]
    if others:
        median = statistics.median(others)
        what.append(f"other processes kept {median * cores / 100:.1f} of {cores:g} CPUs busy" if cores else
                    f"{median:.0f} % of the CPUs to other processes")
    for name, unit in (("preemptions", "preemptions/s"), ("gpu_neighbours", "other GPU processes"),
                       ("gpu_clock", "% of max SM clock")):
        values = [v for v, r in zip(counters.get(name) or [], per_round, strict=False) if r]  # as `others`
        if values:
            what.append(f"{statistics.median(values):.0f} {unit}")
    counted = f"{bad} of {rounds} round{'s' if rounds != 1 else ''} disturbed"
    if state == DROPPED:
        head = f"{bad} disturbed round{'s' if bad != 1 else ''} left out of {rounds}"
    elif rounds == 1:
        head = "contended: the measurement was disturbed"
    else:
        head = f"contended: {counted}"
    return f"{head} ({', '.join(what)} in the disturbed rounds, median)" if what else head


def summary(results: dict[str, dict[str, Sequence[float]]], cores: float | None = None,
            threads: float | None = None) -> dict:
    """What one run's counters said, for its environment record and the line `speedlib run`
    prints after each commit. `results`: per measurement (a class's configuration), the
    counters of its rounds (`judge`'s input); `cores` and `threads` as `judge` takes them."""
    states: dict[State, int] = {}
    rounds = disturbed = 0
    pooled: dict[str, list[float]] = {}
    busy = []
    for name, counters in sorted(results.items()):
        n = max((len(v) for v in counters.values()), default=0)
        verdict = judge(counters, n, cores, threads)
        states[verdict.state] = states.get(verdict.state, 0) + 1
        rounds += len(verdict.disturbed)
        disturbed += sum(verdict.disturbed)
        if verdict.state == CONTENDED:
            busy.append(name)
        for counter, values in counters.items():
            pooled.setdefault(counter, []).extend(values)
    medians = {f"{k}_median": statistics.median(v) for k, v in sorted(pooled.items()) if v}
    return {"measurements": len(results), "rounds": rounds, "disturbed_rounds": disturbed, "verdicts": states,
            "contended": busy, "cores": cores, "threads": threads, **medians}


def summary_line(s: dict) -> str:
    """`summary` in one line: what a user sees when a run was disturbed."""
    if not s.get("measurements"):
        return "no interference counters were recorded"
    busy = s["contended"]
    head = (f"{MARK} {len(busy)} of {s['measurements']} measurements contended ({', '.join(busy)})" if busy else
            f"{s['disturbed_rounds']} of {s['rounds']} rounds disturbed, left out" if s["disturbed_rounds"] else
            f"no round of {s['rounds']} disturbed")
    said = []
    if "others_cpu_median" in s:
        cores = s.get("cores")
        said.append(f"other processes kept {s['others_cpu_median'] * cores / 100:.2g} of {cores:g} CPUs busy"
                    if cores else f"{s['others_cpu_median']:.0f} % of the CPUs to other processes")
    if "preemptions_median" in s:
        said.append(f"{s['preemptions_median']:.0f} preemptions/s")
    tail = (f": their figures are marked {MARK}, not clean; rerun on a quiet machine "
            "(speedlib env --check says what is busy; --require-quiet refuses to start on a busy one)") if busy else ""
    return f"{head} (median over all rounds: {', '.join(said)}){tail}" if said else head + tail
