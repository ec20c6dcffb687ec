"""One asv result file -> its rows (speedbench.results.load walks the tree and re-exports the public names):
the checks of its layout, entries and limits, and the frame's columns."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from speedbench.results.common import Problem, Status, _is_number, _to_float
from speedbench.results.dates import FIRST_DATE, LAST_DATE
from speedbench.results.environment import ENV_COLUMNS
from speedbench.results.files import _first_visit, _NotJson, _parse_json, _read_identified, _Unreadable
from speedbench.results.tree import BENCHMARKS

__all__ = ["COLUMNS", "INTERFERENCE_UNITS", "MAX_COMBINATIONS", "MAX_FILE_COMBINATIONS", "MAX_PARAM_CHARS",
           "RENAMED_PARAM_PREFIX", "metric_kind", "result_id", "too_many_combinations", "params_over_limits",
           "is_commit"]

# asv's statistics columns -> our column names
_STATS = {
    "stats_q_25": "q25",
    "stats_q_75": "q75",
    "stats_ci_99_a": "ci99_low",
    "stats_ci_99_b": "ci99_high",
    "stats_number": "number",
    "stats_repeat": "repeat",
}
# The most parameter combinations one benchmark may have. The suite's largest has 30, and asv
# starts a process per combination to report each, so a thousand would keep a GPU slot busy
# for hours while its rows take a few MB. A few KB of JSON can list parameters that multiply
# out to 1e12 (asv writes a failed benchmark's result as one null for all of them): they are
# counted before any is built, so no file makes the loader, a plan or a page fill memory.
MAX_COMBINATIONS = 1000
# The most parameter combinations one result file may hold in all. Each benchmark under
# MAX_COMBINATIONS is not enough: 64 MiB (MAX_FILE_BYTES) holds some 10^5 small entries, each
# listing up to a thousand combinations, or 10^8 rows. The whole suite's file holds about
# 300, so a hundred times that leaves room for any real suite.
MAX_FILE_COMBINATIONS = 30_000
# The longest text one parameter value may have. Every row carries its combination's values
# as text, so a few long values crossed with many others multiply: a 1 MB value among a
# thousand combinations took gigabytes. The suite's longest value has 20 characters.
MAX_PARAM_CHARS = 200
# The units of the interference counters' tracks (benchmarks/common.py `_Interference`).
INTERFERENCE_UNITS = ("% of CPU time to other processes", "preemptions/s", "% of maximum SM clock",
                      "other processes on the GPU")
# Parameters with a meaning of their own; any others keep their asv name as column.
_NAMED_PARAMS = ("workload", "variant")
COLUMNS = ("machine", "gpu", "commit", "commit_date", "run_date", "benchmark", "technique", "suite",
           "metric", "kind", "params", "workload", "variant", "value", "unit", "q25", "q75", "iqr",
           "ci99_low", "ci99_high", "n", "number", "repeat", "samples", "status", "version",
           "earlier_version", "result_id", "unrated", "file",
           # speedbench.stats.contention's verdict on the run's interference counters
           "contention", "disturbed", "contention_note", "others_cpu", "preemptions", *ENV_COLUMNS,
           # the commit's GPU tests on the machine (speedbench.results.gpu_tests): status and words
           "gpu_tests", "gpu_tests_note")
# A benchmark parameter named like one of these would overwrite that column of its rows (a
# parameter `machine` would refile the row under another machine): it gets this prefix.
_RESERVED = frozenset(COLUMNS) - set(_NAMED_PARAMS)
RENAMED_PARAM_PREFIX = "param_"

class _Malformed(ValueError):
    """A result file (or one of its entries) whose structure is not asv's: it is skipped."""


def metric_kind(benchmark_type: str | None, unit: str | None) -> str:
    """What a benchmark measures, from its asv type and unit."""
    unit = unit or ""
    if benchmark_type == "time" or unit == "seconds":
        return "time"
    if unit == "bytes" or benchmark_type == "peakmemory":
        return "memory"
    if unit == "x":  # per-round ratios of a paired comparison (benchmarks/common.py)
        return "paired speedup"
    if unit in INTERFERENCE_UNITS:  # what else the machine did per round: read with, not as, results
        return "interference"
    if unit.startswith("% of"):
        return "fraction of floor"
    if unit.endswith("/s"):
        return "bandwidth" if unit[:-2].endswith("B") else "throughput"
    return "other"


def _strip(value: str) -> str:
    """asv stores parameter values as reprs: "'mlp'" -> "mlp"."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _describe(value) -> str:
    """A short, safe description of a value from a file, for a problem's reason (never its
    repr: a 4000-digit integer or a deeply nested list would make the message itself fail)."""
    if _is_number(value):
        return f"{_to_float(value):g}"
    if isinstance(value, str):  # a long one by its start and its end: what is wrong may be at either
        return repr(value if len(value) <= 40 else f"{value[:24]}...{value[-13:]}")
    return f"a {type(value).__name__}"


def _ms_time(value, what: str) -> pd.Timestamp:
    """asv's milliseconds since the epoch as a UTC time; _Malformed when no date can hold it."""
    if not _is_number(value):
        raise _Malformed(f"{what} is {_describe(value)}, not a number")
    ms = _to_float(value)
    if not math.isfinite(ms):
        raise _Malformed(f"{what} {_describe(value)} is not a finite time")
    try:
        t = pd.Timestamp(ms, unit="ms", tz="UTC")
    except (ValueError, OverflowError):
        t = None
    if t is None or not FIRST_DATE <= t <= LAST_DATE:
        raise _Malformed(f"{what} {_describe(value)} is out of the range of dates (the years 1677 to 2262)")
    return t


def _check_file(data) -> pd.Timestamp:
    """Raises _Malformed unless `data` is laid out as an asv result file; its commit date."""
    if not isinstance(data, dict):
        raise _Malformed(f"top level is {type(data).__name__}, not an object")
    if not _is_number(data.get("version")) or data["version"] != 2:
        raise _Malformed(f"result format version {_describe(data.get('version'))}, expected 2 (asv 0.6)")
    for key, kind in (("commit_hash", str), ("result_columns", list), ("results", dict)):
        if not isinstance(data.get(key), kind):
            raise _Malformed(f"'{key}' missing or not a {kind.__name__}")
    if not all(isinstance(c, str) for c in data["result_columns"]):
        raise _Malformed("'result_columns' is not a list of strings")
    if "result" not in data["result_columns"]:  # else every entry would read as failed
        raise _Malformed("'result_columns' does not name 'result': no value of any entry can be read")
    _check_commit_hash(data["commit_hash"])
    return _ms_time(data["date"], "'date'") if "date" in data else pd.NaT


# A commit as git names it: 7 (its shortest abbreviation) to 64 (a SHA-256 repository's)
# hexadecimal digits. The hash goes into every row, the result IDs and the command an export
# gives to reproduce a figure, so nothing else may pass.
_COMMIT_HASH = re.compile(r"[0-9a-fA-F]{7,64}")


def is_commit(commit) -> bool:
    """Whether `commit` is a commit hash (7 to 64 hex digits), safe to check out by name."""
    return isinstance(commit, str) and bool(_COMMIT_HASH.fullmatch(commit))


def _check_commit_hash(commit) -> None:
    if not is_commit(commit):
        length = f" ({len(commit)} characters)" if len(commit) > 40 else ""  # _describe shortens it
        raise _Malformed(f"'commit_hash' {_describe(commit)}{length} is not a commit hash (7 to 64 hexadecimal digits)")


# Statistics that count (timings per sample, samples): a negative count is no count, and
# one beyond any run's length (asv's largest are around a million) is no measurement either.
_COUNTS = ("stats_number", "stats_repeat")
_MAX_COUNT = 1e12


def _check_stats(name: str, record: dict) -> None:
    for col in _STATS:
        stat = record.get(col)
        if stat is None:
            continue
        if not (isinstance(stat, list) and all(s is None or _is_number(s) for s in stat)):
            raise _Malformed(f"{name}: '{col}' is not a list of numbers")
        if col not in _COUNTS:
            # asv writes -Infinity and Infinity as the interval of a result with too few
            # samples for one (a --quick run): kept, as asv keeps them.
            continue
        numbers = [_to_float(s) for s in stat if s is not None]
        if any(math.isinf(s) for s in numbers):
            raise _Malformed(f"{name}: '{col}' holds an infinite or overflowing number")
        if any(s < 0 or s > _MAX_COUNT for s in numbers):
            raise _Malformed(f"{name}: '{col}' holds a negative or implausibly large count")


def too_many_combinations(params: list[list]) -> str | None:
    """Why the values of each parameter in `params` may not be multiplied out (their product
    counted without building one, against MAX_COMBINATIONS); None when they may."""
    count = math.prod(float(len(p)) for p in params)  # a float: the count of a hostile file has no bound
    if count <= MAX_COMBINATIONS:
        return None
    shown = f"{count:.0f}" if count < 1e6 else f"{count:.3g}"
    return f"{shown} parameter combinations, over the limit of {MAX_COMBINATIONS} for one benchmark"


def _check_file_combinations(results: dict, columns: list) -> None:
    """_Malformed when the entries of one file multiply out past MAX_FILE_COMBINATIONS in
    all: counted before any row is built. An entry that is over MAX_COMBINATIONS on its own,
    or whose parameters cannot be read, is skipped and reported alone (_check_entry): it
    builds no row, so it does not count here."""
    at = columns.index("params") if "params" in columns else None
    total = 0.0
    for entry in results.values():
        params = entry[at] if at is not None and isinstance(entry, list) and len(entry) > at else None
        readable = isinstance(params, list) and all(isinstance(p, list) for p in params)
        count = math.prod(float(len(p)) for p in params) if readable else 1.0
        total += count if count <= MAX_COMBINATIONS else 0.0
    if total > MAX_FILE_COMBINATIONS:
        shown = f"{total:.0f}" if total < 1e6 else f"{total:.3g}"
        raise _Malformed(f"{shown} parameter combinations in all, over the limit of {MAX_FILE_COMBINATIONS} "
                         "for one result file")


def params_over_limits(params: list[list]) -> str | None:
    """Why `params` (lists of values) may not be expanded into rows or names: too many
    combinations, or a value too long (MAX_COMBINATIONS, MAX_PARAM_CHARS); None when they may."""
    too_many = too_many_combinations(params)
    if too_many:
        return too_many
    longest = max((len(v) if isinstance(v, str) else 0 for p in params for v in p), default=0)
    if longest > MAX_PARAM_CHARS:
        return f"a parameter value of {longest} characters, over the limit of {MAX_PARAM_CHARS}"
    return None


def _check_entry(name: str, record: dict) -> tuple[list[tuple], list]:
    """The entry's parameter combinations and values (floats or None); raises _Malformed when
    types are wrong or the combinations are too many."""
    params = record.get("params") or []
    if not isinstance(params, list) or not all(isinstance(p, list) and all(isinstance(v, str) for v in p)
                                               for p in params):
        raise _Malformed(f"{name}: 'params' is not a list of lists of strings")
    too_many = params_over_limits(params)
    if too_many:
        raise _Malformed(f"{name}: {too_many}")
    combos = list(itertools.product(*params))  # asv's order: the last parameter varies fastest
    values = record.get("result")
    if not isinstance(values, list):
        values = [values] * len(combos)
    if len(values) != len(combos):
        raise _Malformed(f"{name}: {len(values)} results for {len(combos)} parameter sets")
    if not all(v is None or _is_number(v) for v in values):
        raise _Malformed(f"{name}: a result is neither a number nor null")
    if record.get("version") is not None and not isinstance(record["version"], str):
        raise _Malformed(f"{name}: 'version' is not a string")
    _check_stats(name, record)
    return combos, [None if v is None else _to_float(v) for v in values]


def _stat(record: dict, col: str, i: int) -> float:
    stat = record.get(col)
    if isinstance(stat, list) and i < len(stat) and stat[i] is not None:
        return _to_float(stat[i])
    return math.nan


def _samples(record: dict, i: int) -> list[float]:
    """The timed samples of parameter set `i`: kept only when every one is a finite number."""
    samples = record.get("samples")
    sample = samples[i] if isinstance(samples, list) and i < len(samples) else None
    if not isinstance(sample, list) or not all(_is_number(s) for s in sample):
        return []
    sample = [_to_float(s) for s in sample]
    return sample if all(math.isfinite(s) for s in sample) else []


def _stored_samples(record: dict, i: int) -> bool:
    """Whether the file stores samples for parameter set `i` (a track_* of one value stores none)."""
    samples = record.get("samples")
    return isinstance(samples, list) and i < len(samples) and samples[i] not in (None, [])


def result_id(machine: str, commit: str, benchmark: str, params: tuple[str, ...], started_at) -> str:
    """12 hex digits naming one measured result; `params` as asv stores them (reprs).
    Nothing else from the file goes in, so the ID survives asv rewriting the file."""
    started = int(started_at) if _is_number(started_at) and math.isfinite(_to_float(started_at)) else None
    # Byte for byte json.dumps([machine, commit, benchmark, list(params), started]), the key IDs
    # have always hashed, written out with json's C string encoder: json.dumps's own Python
    # layers cost an eighth of loading 5000 files (one call per row).
    text = _json_string
    key = (f"[{text(machine)}, {text(commit)}, {text(benchmark)}, [{', '.join(map(text, params))}], "
           f"{'null' if started is None else started}]")
    return hashlib.sha256(key.encode()).hexdigest()[:12]


_json_string = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str (ensure_ascii)


@dataclass(frozen=True)
class _Benchmark:
    """An entry of benchmarks.json, its fields checked."""

    type: str | None
    unit: str | None
    version: str | None
    param_names: tuple[str, ...]

    def names(self, count: int) -> list[str]:
        """Names for `count` parameters: asv's, param<i> where benchmarks.json names none."""
        names = list(self.param_names[:count])
        return names + [f"param{i}" for i in range(len(names), count)]

    def columns(self, count: int) -> list[str]:
        """Their columns: a parameter named like a column of the frame gets RENAMED_PARAM_PREFIX."""
        return [RENAMED_PARAM_PREFIX + n if n in _RESERVED else n for n in self.names(count)]


# Kinds whose value is a duration or a ratio: zero or less is no measurement.
_POSITIVE_KINDS = ("time", "paired speedup")


def _status(value: float | None, kind: str) -> Status:
    if value is None:
        return Status.FAILED
    if math.isnan(value):
        return Status.SKIPPED
    if math.isinf(value) or (kind in _POSITIVE_KINDS and value <= 0):
        return Status.INVALID
    return Status.MEASURED


def _config(names: list[str], combo: tuple) -> tuple:
    """`combo` without its variant: the configuration whose variants took turns."""
    return tuple(v for n, v in zip(names, combo, strict=True) if n != "variant")


def _unrated(names: list[str], combos: list[tuple], values: list) -> dict[tuple, tuple[str, ...]]:
    """Per configuration of a paired class's speedups, the variants whose ratio the entry left
    empty (NaN): its baseline is one of them (a ratio against itself is never stored). The report
    finds the baseline by them where the selection measured no seconds of the class (`--bench
    track_speedup`), so the ratios measured are shown, against the variant they were taken
    against."""
    if "variant" not in names:
        return {}
    where = names.index("variant")
    out: dict[tuple, list[str]] = {}
    for combo, value in zip(combos, values, strict=False):
        if isinstance(value, float) and math.isnan(value):
            out.setdefault(_config(names, combo), []).append(_strip(combo[where]))
    return {k: tuple(v) for k, v in out.items()}


def _rows_of(path: Path, data, machine: str, benchmarks: dict[str, _Benchmark], problems: list[Problem]) -> list[dict]:
    """The rows of one parsed result file. A file whose layout is not asv's raises _Malformed;
    an entry with wrong types is skipped and reported, the file's other entries kept."""
    commit_date = _check_file(data)
    if not data["results"]:  # asv never writes one; a file emptied by hand or by a bad merge
        problems.append(Problem(str(path), "holds no results"))
    columns = data["result_columns"]
    _check_file_combinations(data["results"], columns)
    rows, unknown, invalid, malformed, unnamed, bad_samples = [], [], [], [], [], []
    for name, entry in data["results"].items():
        try:
            if not isinstance(entry, list):
                raise _Malformed(f"{name}: entry is {type(entry).__name__}, not a list")
            record = dict(zip(columns, entry, strict=False))  # trailing nulls are dropped by asv: zip stops there
            combos, values = _check_entry(name, record)
            started = record.get("started_at")
            run_date = pd.NaT if started is None else _ms_time(started, f"{name}: 'started_at'")
        except _Malformed as e:
            malformed.append(str(e))
            continue
        meta = benchmarks.get(name)
        if meta is None:
            unknown.append(name)
            continue
        stale = record.get("version") != meta.version
        count = len(record.get("params") or [])
        names, param_columns = meta.names(count), meta.columns(count)
        if len(meta.param_names) < count:
            unnamed.append(name)
        module, _, rest = name.partition(".")
        suite, _, metric = rest.rpartition(".")
        kind = metric_kind(meta.type, meta.unit)
        unrated = _unrated(names, combos, values) if kind == "paired speedup" else {}
        for i, combo in enumerate(combos):
            value = values[i]
            status = _status(value, kind)
            if status == Status.INVALID and name not in invalid:
                invalid.append(name)
            sample = _samples(record, i)
            if not sample and _stored_samples(record, i) and name not in bad_samples:
                bad_samples.append(name)
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
                "params": ", ".join(f"{n}={_strip(v)}" for n, v in zip(names, combo, strict=True)),
                **{c: _strip(v) for c, v in zip(param_columns, combo, strict=True)},
                "value": math.nan if value is None else value,  # skipped is NaN already
                "unit": meta.unit,
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
                "earlier_version": stale,  # settled per machine by one_version_per_machine
                "result_id": result_id(machine, data["commit_hash"], name, combo, started),
                "unrated": unrated.get(_config(names, combo), ()),
                "file": str(path),
            }
            rows.append(row)
    for count, what, names, expected in (
            (len(malformed), "entr(ies) with wrong types or over a limit skipped", malformed, False),
            (len(unknown), f"result(s) of benchmarks not in {BENCHMARKS} skipped", unknown, True),
            (len(invalid), "benchmark(s) with an infinite value, or a time or ratio of zero or less, set aside as "
                           "not measured", invalid, False),
            (len(unnamed), f"benchmark(s) with more parameters than {BENCHMARKS} names, the others shown as "
                           "param<i>", unnamed, False),
            (len(bad_samples), "benchmark(s) whose samples are not all finite numbers: their samples set aside, so "
                               "no per-round estimate, interval or contention verdict", bad_samples, False)):
        if count:
            problems.append(Problem(str(path), f"{count} {what}: {', '.join(sorted(names))}", expected,
                                    "removed" if expected else ""))
    return rows


def _file_rows(file: Path, machine: str, root_real: Path, benchmarks: dict[str, _Benchmark],
               problems: list[Problem], parent_real: Path | None, seen: dict[tuple[int, int], Path]) -> list[dict]:
    try:
        raw, identity = _read_identified(file, root_real, parent_real)
        if not _first_visit(file, identity, seen, "file", problems):
            return []
        return _rows_of(file, _parse_json(raw), machine, benchmarks, problems)
    except _Unreadable as e:
        problems.append(Problem(str(file), f"unreadable ({e})"))
    except _NotJson as e:
        problems.append(Problem(str(file), str(e)))
    except _Malformed as e:
        problems.append(Problem(str(file), f"not an asv result file: {e}"))
    except Exception as e:  # noqa: BLE001 - a file anyone can drop here must not stop the load
        # Every case known is caught above with its own reason; this names one not foreseen.
        problems.append(Problem(str(file), f"not loaded: unexpected {type(e).__name__} ({e})"))
    return []
