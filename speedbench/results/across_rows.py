"""What the results loader settles across rows once every file is read: the interference
counters' verdict on each result (speedbench.stats.contention), and which version of each
benchmark stands on each machine.

Apart from speedbench.results.load because neither looks at a file: both judge rows against
other rows of the same load (a result against the counters of its run, a version against
the others a machine measured), after the files have been read and checked.
"""

from __future__ import annotations

import math
import statistics

import pandas as pd

from speedbench.results.common import Problem, Status, _is_number, _to_float
from speedbench.stats import contention

# How far apart a measurement and its counters may have started and still be of one run:
# asv runs a class's track_* processes back to back once its setup_cache has measured.
_SAME_RUN_S = 3600


def attach_counters(rows: list[dict]) -> list[dict]:
    """The rows without the interference counters' own rows, each other row with the
    verdict on the counters of its run (speedbench.stats.contention): its class, parameters and
    result file, started within the same run, one counter per round it measured. Rows with
    no counters (measured before they existed) are UNKNOWN."""
    counters: dict[tuple, dict[str, tuple]] = {}
    kept = []
    for r in rows:
        name = contention.COUNTER_METRICS.get(r["metric"]) if r["kind"] == "interference" else None
        if name is None:
            kept.append(r)
        elif r["status"] == Status.MEASURED and r["samples"]:
            key = (r["file"], r["benchmark"].rsplit(".", 1)[0], r["params"])
            counters.setdefault(key, {})[name] = (r["samples"], r["run_date"])
    verdicts: dict[tuple, contention.Verdict] = {}
    for r in kept:
        found = counters.get((r["file"], r["benchmark"].rsplit(".", 1)[0], r["params"]), {})
        rounds = len(r["samples"]) or 1
        usable = {}
        for name, (samples, started) in found.items():
            known = not (pd.isna(started) or pd.isna(r["run_date"]))
            apart = abs((started - r["run_date"]).total_seconds()) if known else 0
            if apart <= _SAME_RUN_S:
                usable[name] = samples
        cores, threads = _count(r.get("cpu_cores")), _count(r.get("torch_threads"))
        key = (rounds, cores, threads, *((n, tuple(v)) for n, v in sorted(usable.items())))
        if key not in verdicts:
            verdicts[key] = contention.judge(usable, rounds, cores, threads)
        v = verdicts[key]
        r["contention"], r["disturbed"], r["contention_note"] = v.state, list(v.disturbed), v.note
        if r.get("busy_at_start"):  # the pre-flight check found the machine busy: no round clears that
            busy = f"contended: the machine was busy as the run started ({r['busy_at_start']})"
            # every round counts then, none left out: only the rounds' own contended note still holds
            r["contention_note"] = f"{busy}; {v.note}" if v.state == contention.CONTENDED else busy
            r["contention"] = contention.CONTENDED
        # the medians over the result's rounds, so an export shows 0 % apart from 14 %
        for name in ("others_cpu", "preemptions"):
            values = usable.get(name) if len(usable.get(name) or []) == rounds else None
            r[name] = statistics.median(values) if values else math.nan
    return kept


def _count(value) -> float | None:
    """A positive count from an environment record, else None (absent, damaged, not a number)."""
    return float(value) if _is_number(value) and math.isfinite(_to_float(value)) and value > 0 else None


def one_version_per_machine(rows: list[dict], problems: list[Problem]) -> None:
    """One version of each benchmark per machine. Rows of the version benchmarks.json names
    stand; where a machine has none of them, its rows of the version it measured last stand
    instead, flagged `earlier_version` (the benchmark's code has changed since, so they do not
    enter a history beside newer versions; a GPU measured once keeps its numbers until it
    measures the new version). Every other row is set aside as "outdated"."""
    current = {(r["machine"], r["benchmark"]) for r in rows if not r["earlier_version"]}
    last: dict[tuple, tuple] = {}  # (machine, benchmark) -> (run date, version) of its newest earlier run
    for r in rows:
        key = (r["machine"], r["benchmark"])
        if r["earlier_version"] and key not in current:
            when = r["run_date"] if not pd.isna(r["run_date"]) else pd.Timestamp.min.tz_localize("UTC")
            if key not in last or when > last[key][0]:
                last[key] = (when, r["version"])
    kept: dict[str, set] = {}
    apart: dict[str, set] = {}
    for r in rows:
        if not r["earlier_version"]:
            continue
        key = (r["machine"], r["benchmark"])
        if key in last and r["version"] == last[key][1]:
            kept.setdefault(r["file"], set()).add(r["benchmark"])
        else:
            r["status"] = Status.OUTDATED
            apart.setdefault(r["file"], set()).add(r["benchmark"])
    for file, names in apart.items():
        problems.append(Problem(file, f"{len(names)} result(s) from an older version of their benchmark set aside: "
                                      f"{', '.join(sorted(names))}", True, "outdated"))
    for file, names in kept.items():
        problems.append(Problem(file, f"{len(names)} result(s) from an earlier version of their benchmark kept, the "
                                      f"newest this machine has (flagged in tables): {', '.join(sorted(names))}", True,
                                "earlier"))

