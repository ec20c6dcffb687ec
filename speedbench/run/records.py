"""What a `speedlib run` reads and writes beside asv's result files: the environment record
of each commit, the benchmarks asv recorded as failed, the interference counters the
benchmarks recorded, and the .tar.gz that carries a run's results to another checkout.

Apart from speedbench/run/suite.py (which re-exports these names) because they are the run's
records, read and written where the results tree (speedbench.results.tree) says: none of them
starts asv or touches git.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import itertools
import json
import shlex
from collections.abc import Sequence
from pathlib import Path

from speedbench.results.atomic import append_line, disk_full
from speedbench.results.common import printable
from speedbench.results.tree import ResultsError, ResultsTree
from speedbench.run.errors import SuiteError
from speedbench.stats.contention import COUNTER_METRICS


def _record_environment(path: Path, sha: str, env: dict, command: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "commit": sha,
        "recorded_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(command),
        **env,
    }
    with _writing(path):  # appended: a rerun never loses the last record
        append_line(path, json.dumps(record, sort_keys=True))


@contextlib.contextmanager
def _writing(path: Path):
    """An OSError while speedlib writes one of its own files (safekeep writes them whole or
    not at all) as one line that says the file is unharmed."""
    try:
        yield
    except OSError as e:
        todo = "free some space" if disk_full(e) else "move what is in its way, or give the run another place"
        raise SuiteError(f"could not write {printable(str(path))} ({e.strerror or e}){disk_full(e)}; it is as it was "
                         f"before: {todo} and run again") from None


def failed_benchmarks(results_dir: Path, machine: str, sha: str, since_ms: int = 0) -> list[str]:
    """One printable line per benchmark of `sha` that asv recorded as failed (result null)
    and that started at `since_ms` or later: the result file keeps earlier runs' entries of
    the commit, and a failure from one of those is not this run's."""
    lines = []
    for path in ResultsTree(results_dir).machine(machine).result_files(sha):
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("commit_hash") != sha:
            continue
        for name, entry in sorted(data.get("results", {}).items()):
            record = dict(zip(data["result_columns"], entry, strict=False))  # asv drops trailing nulls
            if not isinstance(record.get("started_at"), (int, float)) or record["started_at"] < since_ms:
                continue
            params = record.get("params") or []
            combos = list(itertools.product(*params))  # a benchmark without parameters has one, ()
            values = record.get("result")
            values = values if isinstance(values, list) else [values] * len(combos)
            # a damaged file's values may not match its parameters: those it has are read
            bad = [c for c, v in zip(combos, values, strict=False) if v is None]
            if not bad:
                continue
            line = f"{sha[:8]} {name}"
            if params:  # which parameter sets, as asv prints them (reprs)
                line += f" for {len(bad)} of {len(combos)} parameter sets: " + "; ".join(
                    f"({', '.join(c)})" for c in bad)
            lines.append(printable(line))  # names come from benchmark code
    return lines


def interference_counters(results_dir: Path, machine: str, sha: str, since_ms: int = 0) -> dict[str, dict]:
    """The interference counters (benchmarks/common.py `_Interference`) that asv recorded for
    `sha` from `since_ms` on, one entry per measurement: a paired configuration's rounds are
    stored once per variant, and counted once."""
    found: dict[tuple, dict] = {}
    for path in ResultsTree(results_dir).machine(machine).result_files(sha):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # unreadable: `speedlib report` names it; the run goes on
        if not isinstance(data, dict) or data.get("commit_hash") != sha:
            continue
        for name, entry in (data.get("results") or {}).items():
            cls, _, method = name.rpartition(".")
            metric = COUNTER_METRICS.get(method.removeprefix("track_"))
            entry = entry if isinstance(entry, list) else []
            record = dict(zip(data.get("result_columns") or [], entry, strict=False))  # asv drops trailing nulls
            started = record.get("started_at")
            if metric is None or not isinstance(started, (int, float)) or started < since_ms:
                continue
            params = record.get("params") or []
            # samples stop where asv stored no more (a skipped set's trailing nulls are dropped)
            for combo, samples in zip(itertools.product(*params), record.get("samples") or [], strict=False):
                if isinstance(samples, list) and samples and all(isinstance(v, (int, float)) for v in samples):
                    found.setdefault((cls, combo), {})[metric] = samples
    unique: dict[str, tuple[str, dict]] = {}
    for (cls, combo), counters in found.items():
        # named by the parameters before the variant where that tells them apart (a paired
        # configuration), else by all of them (one launch per parameter set)
        label = f"{cls}({', '.join(combo[:-1] or combo)})"
        unique.setdefault(json.dumps([cls, sorted(counters.items())]), (label, counters))
    out: dict[str, dict] = {}
    for label, counters in unique.values():
        out[label if label not in out else f"{label} {len(out)}"] = counters
    return out


def pack_results(results_dir: Path, machine: str, shas: Sequence[str], dest: Path) -> Path:
    """The archive of what a run of `shas` wrote (ResultsTree's MachineDir.pack_run); a
    SuiteError (one line) when there is nothing to pack or it cannot be written."""
    try:
        with _writing(dest):
            return ResultsTree(results_dir).machine(machine).pack_run(shas, dest)
    except ResultsError as e:
        raise SuiteError(str(e)) from None
