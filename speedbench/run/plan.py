"""Which of the suite's chunks (speedbench.chunks) a run takes, and what each will cost.

Part of the harness, not the library: no torch here, so `speedlib run --plan` answers at
once on a machine that is about to spend its slot.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path

from speedbench.chunks import Chunk, ChunkError
from speedbench.results.common import printable
from speedbench.results.tree import ResultsTree
from speedbench.stats.contention import COUNTER_METRICS

__all__ = ["benchmark_listing", "select_chunks",
           "with_counters", "estimate_seconds",
           "SECONDS_PER_COMBINATION", "SECONDS_PER_CLASS", "SECONDS_PER_REPORT", "REPORT_SECONDS", "LAUNCH_METHOD",
           "HEADROOM", "PlanError",
           "record_chunk_time", "recorded_chunk_seconds", "seconds_per_combination", "chunk_cost",
           "chunk_times_note"]

# A chunk's cost, process by process. Each class is one measuring process (benchmarks/common.py:
# its setup_cache measures every parameter combination, variants taking turns): a start
# (torch and CUDA) plus work per combination. Then asv starts one short, torch-free process
# per method and combination to report from the cache.
SECONDS_PER_CLASS = 3.0
# How asv starts those processes (speedlib run passes it). `spawn` starts a fresh interpreter
# that imports asv_runner and the benchmark module each time; `forkserver` forks them from
# one server that imported the suite once. On one H100 (2026-11-23, spawn) a chunk's wall
# time minus the setup_cache time asv recorded for it, over its method x combination
# processes, came to 0.4-0.6 s each (amp: 102.7 - 90.8 s over 24; checkpoint memory:
# 78.0 - 48.3 s over 60): a fifth of a GPU suite of about 500 such processes. On the 2-core
# VM (2026-11-24), ActivationMemory's 30 combinations against its 10 transformer ones cost
# 0.26 s per extra reporting process under spawn and 0.014 s under forkserver. Forking is
# safe for CUDA because the server never initialises it: importing the benchmark modules
# imports no torch (tests/harness/run/test_suite.py checks), the measuring happens in the forked child.
LAUNCH_METHOD = "forkserver"
# Seconds per reporting process by launch method: spawn as measured on the H100; forkserver
# has no GPU measurement yet, so 3.5x what the 2-core VM measured.
REPORT_SECONDS = {"spawn": 0.5, "forkserver": 0.05}
SECONDS_PER_REPORT = REPORT_SECONDS[LAUNCH_METHOD]
# Work per combination where this machine has measured none of the suite's chunks: the
# H100's six headline chunks averaged 3.7 s (amp 7.6 s, checkpoint memory 1.6 s). Where the
# machine has measured chunks, their own average replaces it (seconds_per_combination).
SECONDS_PER_COMBINATION = 6.0
# Combinations differ by classes (a checkpointed DenseNet-121 at batch 256 against a peak-memory
# count), so an estimate keeps headroom; a measured chunk time replaces it after the first run.
HEADROOM = 1.5


class PlanError(ChunkError):
    """A chunk selection or a listing that cannot be used; the message says which. A ChunkError,
    so one `except ChunkError` takes what loading the chunks and planning with them refuse."""


def select_chunks(chunks: list[Chunk], names: list[str]) -> list[Chunk]:
    """`names` in suite order ("all": every chunk; a group such as "headline": every chunk
    named "headline-..."); an unknown name is an error."""
    known = [c.name for c in chunks]
    def picked(chunk: Chunk, name: str) -> bool:
        if name in ("all", chunk.name):
            return True
        # A group prefix, unless the name is a chunk's own: "headline-checkpoint" is that
        # chunk, not also "headline-checkpoint-memory" (an H100 slot lost 90 s to that).
        return name not in known and chunk.name.startswith(name + "-")

    unknown = [n for n in names if not any(picked(c, n) for c in chunks)]
    if unknown:
        raise PlanError(f"unknown chunk {unknown[0]!r}; the chunks are: {', '.join(known)} (or all)")
    return [c for c in chunks if any(picked(c, n) for n in names)]


def benchmark_listing(root: Path, results_dir: Path) -> Path | None:
    """asv's benchmark listing: the results directory's (a run writes it first thing), else
    the checkout's committed one; None before the suite ever ran. PlanError (one line) when
    that file cannot be read as a listing: a plan or a budget priced from it would be wrong."""
    for listing in (ResultsTree(results_dir).benchmarks, ResultsTree.in_checkout(root).benchmarks):
        try:
            found = listing.is_file()
            there = found or os.path.lexists(listing)
        except OSError as e:  # a results directory this user cannot read
            raise PlanError(f"{printable(str(listing))} cannot be examined ({e.strerror or e}): check the "
                            f"permissions of {printable(str(listing.parent))}") from None
        if there and not found:  # a FIFO or a directory: asv would wait on it or fail, and prices skip it
            raise PlanError(f"{printable(str(listing))} is not a regular file (a directory, FIFO, device or a link to "
                            "nothing): remove it; the next run writes the listing again")
        if found:
            _check_listing(listing)
            return listing
    return None


def _check_listing(path: Path) -> None:
    """PlanError unless `path` is JSON text holding an object (asv's listing: benchmark name ->
    its description). A run killed while asv wrote it leaves it torn; anyone can drop one in."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        problem = f"cannot be read ({e.strerror or e})"
    except UnicodeDecodeError as e:  # before ValueError, which it is
        problem = f"not UTF-8 text (byte {e.start})"
    except ValueError as e:
        problem = f"not valid JSON, torn by a killed run? ({getattr(e, 'msg', e)})"
    except RecursionError:
        problem = "not valid JSON: nested too deeply"
    else:
        if isinstance(data, dict):
            return
        problem = f"not a JSON object of benchmarks (a JSON {type(data).__name__})"
    snapshot = ResultsTree(path.parent).left_by_killed_run()
    todo = (f"a killed run left its copy in {printable(str(snapshot))}, and the next speedlib run puts it "
            "back first" if snapshot is not None else
            "restore it from git, or delete it and the next run writes it again")
    raise PlanError(f"{printable(str(path))}: {problem}: {todo}")


def _selected(chunk: Chunk, names: dict[str, list[str]]) -> tuple[dict[str, set[str]], int]:
    """({class: the parameter combinations `chunk` selects of it}, reporting processes)."""
    pattern = re.compile(chunk.regex)
    per_class: dict[str, set[str]] = {}
    reports = 0
    for name, combos in names.items():
        chosen = [c[len(name):] for c in combos if pattern.search(c)]  # the "(p0, p1)" part
        if not chosen:
            continue
        reports += len(chosen)  # asv starts a process per method and combination
        per_class.setdefault(name.rsplit(".", 1)[0], set()).update(chosen)
    return per_class, reports


# The methods that record a class's interference counters (benchmarks/common.py `_Interference`).
_COUNTER_METHODS = tuple(f"track_{metric}" for metric in COUNTER_METRICS)


def with_counters(regexes: Sequence[str], names: dict[str, list[str]]) -> list[str]:
    """`regexes` (asv --bench selections), then one selection per counter method of each class
    they select part of, over the parameter combinations they select. The counters are measured
    with every round whatever asv reports (benchmarks/common.py), but stored only by their own
    track_* methods: a selection of one method (`^bench_contiguous\\.AdamStep\\.track_speedup`)
    left its figure without them, so never judged and never marked. `names`: the listing's
    `combinations` (speedbench.results.listing); a class it does not list gets nothing added. No
    regexes: everything, counters too."""
    if not regexes:
        return []
    patterns = [re.compile(regex) for regex in regexes]

    def picked(selectable: str) -> bool:
        return any(p.search(selectable) for p in patterns)

    wanted: dict[str, set[str]] = {}  # class -> the "(p0, p1)" parts selected of its other methods
    for name, combos in names.items():
        cls, _, method = name.rpartition(".")
        if method not in _COUNTER_METHODS:
            wanted.setdefault(cls, set()).update(c[len(name):] for c in combos if picked(c))
    added = []
    for name, combos in names.items():
        cls, _, method = name.rpartition(".")
        if method in _COUNTER_METHODS:
            missing = [c[len(name):] for c in combos if c[len(name):] in wanted.get(cls, ()) and not picked(c)]
            if missing:  # the "(p0, p1)" parts, or "" for a benchmark without parameters
                alternatives = "|".join(re.escape(m) for m in missing)
                added.append(f"^{re.escape(name)}(?:{alternatives})$" if missing != [""] else f"^{re.escape(name)}$")
    return [*regexes, *added]


def estimate_seconds(chunk: Chunk, names: dict[str, list[str]],
                     per_combination: float = SECONDS_PER_COMBINATION) -> tuple[float, int, int]:
    """(seconds, parameter combinations measured, reporting processes) for `chunk`: each
    class it selects is one measuring process over the union of its selected combinations,
    then one reporting process per selected method and combination."""
    per_class, reports = _selected(chunk, names)
    n = sum(len(c) for c in per_class.values())
    seconds = SECONDS_PER_CLASS * len(per_class) + per_combination * n + SECONDS_PER_REPORT * reports
    return seconds, n, reports


# --- measured chunk times: the estimate that needs no guessing --------------------------

# The longest a chunk may be recorded to have taken over one commit: the whole suite takes
# under an hour on one GPU, and a device slot lasts minutes; a week is far beyond any real
# run, and a figure beyond it (a hand-edited or damaged line) would price every chunk out.
MAX_CHUNK_SECONDS = 7 * 24 * 3600


def record_chunk_time(results_dir: Path, machine: str, chunk: str, sha: str, seconds: float) -> None:
    """Add a line to the machine's chunk times (one per chunk and commit a run measured), or
    raise OSError (a full disk) and leave them as they were."""
    entry = {"chunk": chunk, "commit": sha, "seconds": round(seconds, 1), "launch": LAUNCH_METHOD}
    ResultsTree(results_dir).machine(machine).record_chunk_time(entry)


def _recorded(results_dir: Path, machine: str) -> dict[str, tuple[float, str]]:
    """Per chunk, (wall time, launch method) of its longest measured run over one commit on
    this machine: the worst case a budget must allow for (the H200 ran headline-amp in 105 and
    114 s, the H100 in 103 s). Lines that are not a chunk time are left out (chunk_times_note
    says so)."""
    recorded: dict[str, tuple[float, str]] = {}
    try:
        lines = ResultsTree(results_dir).machine(machine).chunk_time_lines()
    except OSError:
        return recorded  # chunk_times_note says why
    for line in lines:
        entry = _chunk_time(line)
        if entry is not None and entry[1] >= recorded.get(entry[0], (-1.0, ""))[0]:
            recorded[entry[0]] = entry[1:]
    return recorded


def _chunk_time(line: bytes) -> tuple[str, float, str] | None:
    """(chunk, seconds, launch method) of one line, or None when it is not a chunk time: torn
    by a killed run, not UTF-8, not an object, or seconds that are not a number from 0 to
    MAX_CHUNK_SECONDS (a NaN would fit any budget, a negative time make room in it, 1e308
    price every chunk out of it). Lines from before the
    launch method was recorded were spawn runs."""
    try:
        entry = json.loads(line.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("chunk"), str):
        return None
    seconds, launch = entry.get("seconds"), entry.get("launch", "spawn")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        return None
    try:
        seconds = float(seconds)
    except OverflowError:  # an integer too large for a float
        return None
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_CHUNK_SECONDS:
        return None
    return entry["chunk"], seconds, launch if isinstance(launch, str) and launch in REPORT_SECONDS else "spawn"


def chunk_times_note(results_dir: Path, machine: str) -> str | None:
    """One line saying that this machine's chunk times have lines that are not chunk times,
    which the estimates leave out; None when every line is one (or there is no file). Said once
    per command, not per chunk priced."""
    machine_dir = ResultsTree(results_dir).machine(machine)
    shown = printable(str(machine_dir.chunk_times))
    try:
        lines = machine_dir.chunk_time_lines()
    except OSError as e:
        return f"{shown} cannot be read ({e.strerror or e}): every chunk is priced by its estimate"
    bad = sum(_chunk_time(line) is None for line in lines)
    if not bad:
        return None
    return (f"{shown}: {bad} of {len(lines)} line(s) are not a chunk time (torn by a killed run, not UTF-8, or "
            "seconds that are not a number from 0 to a week): estimated as if they were absent")


def recorded_chunk_seconds(results_dir: Path, machine: str) -> dict[str, float]:
    """Per chunk, the wall time of its longest measured run over one commit on this machine."""
    return {chunk: seconds for chunk, (seconds, _) in _recorded(results_dir, machine).items()}


def seconds_per_combination(chunks: list[Chunk], names: dict[str, list[str]], results_dir: Path,
                            machine: str) -> tuple[float, str]:
    """(work per parameter combination, where it comes from): from the chunks this machine
    has measured, what their wall time leaves after the class starts and the reporting
    processes, per combination; SECONDS_PER_COMBINATION where it has measured none."""
    measured = _recorded(results_dir, machine)
    spent, combos = 0.0, 0
    for chunk in chunks:
        if chunk.name in measured:
            per_class, reports = _selected(chunk, names)
            seconds, launch = measured[chunk.name]
            spent += seconds - SECONDS_PER_CLASS * len(per_class) - REPORT_SECONDS[launch] * reports
            combos += sum(len(c) for c in per_class.values())
    if combos == 0:
        return SECONDS_PER_COMBINATION, "default"
    return max(spent / combos, 0.1), f"{machine}'s measured chunks"


def chunk_cost(chunk: Chunk, names: dict[str, list[str]], results_dir: Path, machine: str,
               per_combination: float = SECONDS_PER_COMBINATION) -> tuple[float, str]:
    """(seconds for one commit, where the figure comes from), the worst case of what is known:
    the longest run of this chunk recorded on this machine, as it was measured (a time measured
    under spawn is not cut for today's cheaper reporting processes: their number grew since, and
    the H100's 103 s headline-amp, cut so, was priced at 40 s); a chunk never measured here, the
    per-process estimate with HEADROOM at the larger of this machine's work per combination and
    SECONDS_PER_COMBINATION, never less than SECONDS_PER_CLASS (a chunk is never free)."""
    measured = _recorded(results_dir, machine)
    if chunk.name in measured:
        seconds, launch = measured[chunk.name]
        said = "the longest measured run here" + (f" (under {launch})" if launch != LAUNCH_METHOD else "")
        return max(seconds, SECONDS_PER_CLASS), said
    worst = max(per_combination, SECONDS_PER_COMBINATION)
    seconds, combos, reports = estimate_seconds(chunk, names, worst)
    return max(seconds * HEADROOM, SECONDS_PER_CLASS), (
        f"never measured here: estimate x {HEADROOM} ({combos} combinations x {worst:.1f} s, "
        f"{reports} reporting processes)")
