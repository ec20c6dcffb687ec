"""asv result files -> one tidy pandas DataFrame (one row per benchmark x parameter set).

Reads `results/benchmarks.json`, every `results/<machine>/*.json` (asv format version 2) and
the environment records `speedlib run` writes beside them (`<machine>/environment/*.jsonl`).
It never writes anything. A file that cannot be trusted is skipped and reported with its
path and reason instead of stopping the load; results that were skipped (NaN), failed
(null) or come from an older version of their benchmark are kept apart from measured ones.
No Streamlit import: the dashboard, the report and the CLI all use this.

Each row's `result_id` names that one measured result: a hash of machine, commit, benchmark,
parameters and the time asv started it. asv rewrites a commit's result file whenever a later
run adds benchmarks to it, so a hash of the file would rename results that did not change.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

__all__ = ["LoadedResults", "Problem", "load_results", "format_table", "metric_kind", "higher_is_better", "result_id"]

# asv's statistics columns -> our column names
_STATS = {
    "stats_q_25": "q25",
    "stats_q_75": "q75",
    "stats_ci_99_a": "ci99_low",
    "stats_ci_99_b": "ci99_high",
    "stats_number": "number",
    "stats_repeat": "repeat",
}
_SKIP_FILES = {"machine.json", "benchmarks.json"}
# Environment-record keys carried onto every row (provenance for exports and the dashboard).
ENV_COLUMNS = ("gpu_model", "gpu_count", "driver", "cuda", "cudnn", "nccl", "torch", "torchvision",
               "cupy", "python", "cpu_model", "command", "recorded_at")
# Parameters with a meaning of their own; any others keep their asv name as column.
_NAMED_PARAMS = ("workload", "variant")
COLUMNS = ("machine", "gpu", "commit", "commit_date", "run_date", "benchmark", "technique", "suite",
           "metric", "kind", "params", "workload", "variant", "value", "unit", "q25", "q75", "iqr",
           "ci99_low", "ci99_high", "n", "number", "repeat", "samples", "status", "version",
           "result_id", "file", *ENV_COLUMNS)


@dataclass(frozen=True)
class Problem:
    """Something under results/ that was not loaded (or loaded with a gap), and why."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class LoadedResults:
    measured: pd.DataFrame
    not_measured: pd.DataFrame  # status "skipped" (NaN), "failed" (null) or "outdated"
    problems: list[Problem] = field(default_factory=list)


class _Malformed(ValueError):
    """A result file whose structure is not asv's: the whole file is skipped."""


def metric_kind(benchmark_type: str | None, unit: str | None) -> str:
    """What a benchmark measures, from its asv type and unit."""
    unit = unit or ""
    if benchmark_type == "time" or unit == "seconds":
        return "time"
    if unit == "bytes" or benchmark_type == "peakmemory":
        return "memory"
    if unit == "x":  # per-round ratios of a paired comparison (benchmarks/common.py)
        return "paired speedup"
    if unit.startswith("% of"):
        return "fraction of floor"
    if unit.endswith("/s"):
        return "bandwidth" if unit[:-2].endswith("B") else "throughput"
    return "other"


def higher_is_better(kind: str) -> bool:
    return kind in ("fraction of floor", "bandwidth", "throughput", "paired speedup")


def _strip(value: str) -> str:
    """asv stores parameter values as reprs: "'mlp'" -> "mlp"."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_file(data) -> None:
    if not isinstance(data, dict):
        raise _Malformed(f"top level is {type(data).__name__}, not an object")
    if data.get("version") != 2:
        raise _Malformed(f"result format version {data.get('version')!r}, expected 2 (asv 0.6)")
    for key, kind in (("commit_hash", str), ("result_columns", list), ("results", dict)):
        if not isinstance(data.get(key), kind):
            raise _Malformed(f"'{key}' missing or not a {kind.__name__}")
    if "date" in data and not _is_number(data["date"]):
        raise _Malformed("'date' is not a number")


def _check_entry(name: str, record: dict) -> tuple[list[tuple], list]:
    """The entry's parameter combinations and values; raises _Malformed when types are wrong."""
    params = record.get("params") or []
    if not isinstance(params, list) or not all(isinstance(p, list) and all(isinstance(v, str) for v in p) for p in params):
        raise _Malformed(f"{name}: 'params' is not a list of lists of strings")
    combos = list(itertools.product(*params))  # asv's order: the last parameter varies fastest
    values = record.get("result")
    if not isinstance(values, list):
        values = [values] * len(combos)
    if len(values) != len(combos):
        raise _Malformed(f"{name}: {len(values)} results for {len(combos)} parameter sets")
    if not all(v is None or _is_number(v) for v in values):
        raise _Malformed(f"{name}: a result is neither a number nor null")
    for col in _STATS:
        stat = record.get(col)
        if stat is not None and not (isinstance(stat, list) and all(s is None or _is_number(s) for s in stat)):
            raise _Malformed(f"{name}: '{col}' is not a list of numbers")
    return combos, values


def _stat(record: dict, col: str, i: int) -> float:
    stat = record.get(col)
    if isinstance(stat, list) and i < len(stat) and stat[i] is not None:
        return float(stat[i])
    return math.nan


def result_id(machine: str, commit: str, benchmark: str, params: tuple[str, ...], started_at) -> str:
    """12 hex digits naming one measured result; `params` as asv stores them (reprs).
    Nothing else from the file goes in, so the ID survives asv rewriting the file."""
    started = int(started_at) if _is_number(started_at) else None
    key = json.dumps([machine, commit, benchmark, list(params), started])
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _rows_of(path: Path, data: dict, machine: str, benchmarks: dict, problems: list[Problem]) -> list[dict]:
    _check_file(data)
    columns = data["result_columns"]
    commit_date = pd.to_datetime(data["date"], unit="ms", utc=True) if "date" in data else pd.NaT
    rows, unknown, outdated = [], [], []
    for name, entry in data["results"].items():
        if not isinstance(entry, list):
            raise _Malformed(f"{name}: entry is {type(entry).__name__}, not a list")
        record = dict(zip(columns, entry))  # trailing nulls are dropped by asv: zip stops there
        combos, values = _check_entry(name, record)
        meta = benchmarks.get(name)
        if meta is None:
            unknown.append(name)
            continue
        stale = record.get("version") != meta.get("version")
        if stale:
            outdated.append(name)
        names = meta.get("param_names") or [f"param{i}" for i in range(len(combos[0]))]
        module, _, rest = name.partition(".")
        suite, _, metric = rest.rpartition(".")
        kind = metric_kind(meta.get("type"), meta.get("unit"))
        started = record.get("started_at")
        run_date = pd.Timestamp(started, unit="ms", tz="UTC") if _is_number(started) else pd.NaT
        samples_all = record.get("samples")
        for i, combo in enumerate(combos):
            value = values[i]
            if stale:
                status = "outdated"
            elif value is None:
                status = "failed"
            elif math.isnan(value):
                status = "skipped"
            else:
                status = "measured"
            sample = samples_all[i] if isinstance(samples_all, list) and i < len(samples_all) else None
            sample = [float(s) for s in sample] if isinstance(sample, list) and all(_is_number(s) for s in sample) else []
            q25, q75 = _stat(record, "stats_q_25", i), _stat(record, "stats_q_75", i)
            repeat = _stat(record, "stats_repeat", i)
            row = {
                "machine": machine,
                "commit": data["commit_hash"],
                "commit_date": commit_date,
                "run_date": run_date,
                "benchmark": name,
                "technique": module.removeprefix("bench_"),
                "suite": suite,
                "metric": metric.split("_", 1)[-1],
                "kind": kind,
                "params": ", ".join(f"{n}={_strip(v)}" for n, v in zip(names, combo)),
                **{n: _strip(v) for n, v in zip(names, combo)},
                "value": math.nan if value is None else float(value),  # skipped is NaN already
                "unit": meta.get("unit"),
                "q25": q25, "q75": q75, "iqr": q75 - q25,
                "ci99_low": _stat(record, "stats_ci_99_a", i),
                "ci99_high": _stat(record, "stats_ci_99_b", i),
                # N = values the median was taken over: the samples when kept, else asv's repeat count,
                # else 1 (a track_* benchmark reports one value).
                "n": len(sample) or (int(repeat) if not math.isnan(repeat) else 1),
                "number": _stat(record, "stats_number", i),
                "repeat": repeat,
                "samples": sample,
                "status": status,
                "version": record.get("version"),
                "result_id": result_id(machine, data["commit_hash"], name, combo, started),
                "file": str(path),
            }
            rows.append(row)
    if unknown:
        problems.append(Problem(str(path), f"{len(unknown)} result(s) of benchmarks not in benchmarks.json "
                                           f"skipped: {', '.join(sorted(unknown))}"))
    if outdated:
        problems.append(Problem(str(path), f"{len(outdated)} result(s) from an older version of their benchmark "
                                           f"set aside: {', '.join(sorted(outdated))}"))
    return rows


def _timestamp(text) -> pd.Timestamp:
    try:
        return pd.Timestamp(text) if isinstance(text, str) else pd.NaT
    except ValueError:
        return pd.NaT


def _environment_records(machine_dir: Path, problems: list[Problem]) -> dict[str, list[dict]]:
    """commit -> its environment records (one per `speedlib run`), oldest first."""
    records: dict[str, list[dict]] = {}
    for file in sorted((machine_dir / "environment").glob("*.jsonl")):
        try:
            lines = file.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            problems.append(Problem(str(file), f"unreadable ({e})"))
            continue
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or not isinstance(record.get("commit"), str):
                    raise ValueError("not an object with a 'commit'")
                records.setdefault(record["commit"], []).append(record)
            except ValueError as e:
                problems.append(Problem(f"{file}:{number}", f"environment record skipped ({e})"))
    for recs in records.values():
        recs.sort(key=lambda r: str(r.get("recorded_at", "")))
    return records


def _join_environment(rows: list[dict], records: dict[str, list[dict]], problems: list[Problem]) -> None:
    """Each row gets the record of the run that produced it: the first one written after the
    benchmark started (speedlib appends a record when asv finishes), else the latest."""
    missing = set()
    stamps = {commit: [_timestamp(r.get("recorded_at")) for r in recs] for commit, recs in records.items()}
    chosen: dict[tuple, dict] = {}
    for row in rows:
        key = (row["commit"], row["run_date"])
        if key not in chosen:
            recs = records.get(row["commit"])
            if not recs:
                missing.add(row["file"])
                chosen[key] = {}
            else:
                at, times = row["run_date"], stamps[row["commit"]]
                i = len(recs) - 1
                if not pd.isna(at) and not any(pd.isna(t) for t in times):
                    i = min(bisect.bisect_left(times, at), len(recs) - 1)
                chosen[key] = recs[i]
        record = chosen[key]
        for name in ENV_COLUMNS:
            row[name] = record.get(name)
        row["gpu"] = record.get("gpu_model") or ("CPU only" if record else "unknown")
    for file in sorted(missing):
        problems.append(Problem(file, "no environment record for this commit: GPU, driver and versions unknown"))


def load_results(path: str | Path) -> LoadedResults:
    """Every result under `path` (all machines, all commits) as tidy frames."""
    root = Path(path)
    problems: list[Problem] = []
    rows: list[dict] = []
    bench_file = root / "benchmarks.json"
    benchmarks = None
    if not root.is_dir():
        problems.append(Problem(str(root), "no results directory here"))
    elif not bench_file.is_file():
        problems.append(Problem(str(bench_file), "missing: without it units and parameter names are unknown, "
                                                 "so no result file was read"))
    else:
        try:
            benchmarks = json.loads(bench_file.read_text(encoding="utf-8"))
            if not isinstance(benchmarks, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as e:
            problems.append(Problem(str(bench_file), f"unreadable ({e}), so no result file was read"))
            benchmarks = None
    if benchmarks is not None:
        for machine_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            if not (machine_dir / "machine.json").is_file():
                if any(machine_dir.glob("*.json")):
                    problems.append(Problem(str(machine_dir), "no machine.json: not an asv machine directory, skipped"))
                continue
            machine_rows: list[dict] = []
            for file in sorted(machine_dir.glob("*.json")):
                if file.name in _SKIP_FILES:
                    continue
                try:
                    data = json.loads(file.read_text(encoding="utf-8"))
                    machine_rows += _rows_of(file, data, machine_dir.name, benchmarks, problems)
                except (OSError, UnicodeDecodeError) as e:
                    problems.append(Problem(str(file), f"unreadable ({e})"))
                except json.JSONDecodeError as e:
                    problems.append(Problem(str(file), f"not valid JSON, truncated? ({e})"))
                except _Malformed as e:
                    problems.append(Problem(str(file), f"not an asv result file: {e}"))
            _join_environment(machine_rows, _environment_records(machine_dir, problems), problems)
            rows += machine_rows
    df = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in df:
            df[col] = pd.Series(dtype="object")
    extra = [c for c in df.columns if c not in COLUMNS]
    df = df[[*COLUMNS[:COLUMNS.index("value")], *extra, *COLUMNS[COLUMNS.index("value"):]]]
    measured = df[df["status"] == "measured"].reset_index(drop=True)
    return LoadedResults(measured, df[df["status"] != "measured"].reset_index(drop=True), problems)


def format_table(df: pd.DataFrame, columns: tuple[str, ...] = ("machine", "commit", "benchmark", "params", "value", "unit")) -> str:
    """Measured rows as a plain-text table, commits shortened to 8 characters."""
    table = df.assign(commit=df["commit"].str[:8])[list(columns)]
    return table.to_string(index=False, float_format=lambda v: f"{v:.4g}")
