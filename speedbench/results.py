"""asv result files -> one tidy pandas DataFrame (one row per benchmark x parameter set).

Reads `results/benchmarks.json`, every `results/<machine>/*.json` (asv format version 2) and
the environment records `speedlib run` writes beside them (`<machine>/environment/*.jsonl`).
It never writes anything, never raises on what it finds and never blocks: a file, an entry
or a line that cannot be trusted is skipped and reported (a `Problem` with its path and
reason) while everything else is kept. Only regular files inside the results tree are
read, each up to MAX_FILE_BYTES; FIFOs, devices, symlinks that leave the tree or loop, and
unreadable directories are reported without being opened. Results that were skipped (NaN),
failed (null), come from an older version of their benchmark, or hold a value no
measurement can have (an infinite time, a time of zero or less) are kept apart from the
measured ones. No Streamlit import: the dashboard, the report and the CLI all use this.

Each row's `result_id` names that one measured result: a hash of machine, commit, benchmark,
parameters and the time asv started it. asv rewrites a commit's result file whenever a later
run adds benchmarks to it, so a hash of the file would rename results that did not change.
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import itertools
import json
import math
import os
import re
import stat
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from speedbench import contention, safekeep

__all__ = ["LoadedResults", "Problem", "load_results", "format_table", "metric_kind", "higher_is_better", "result_id",
           "printable", "MAX_FILE_BYTES", "MAX_COMBINATIONS", "MAX_FILE_COMBINATIONS", "MAX_PARAM_CHARS", "too_many_combinations",
           "params_over_limits", "is_commit"]

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
# The largest file read (result file, benchmarks.json, environment records). asv's files for
# this suite are well under 1 MiB; the limit only keeps a stray huge file, or a link to an
# endless one, from filling memory.
MAX_FILE_BYTES = 64 * 2**20
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
# Environment-record keys carried onto every row (provenance for exports and the dashboard).
ENV_COLUMNS = ("gpu_model", "gpu_count", "driver", "cuda", "cudnn", "nccl", "torch", "torchvision",
               "cupy", "python", "cpu_model", "command", "recorded_at",
               # the machine's CPUs and the torch threads the benchmarks set: how many cores
               # other work may take before a round counts as disturbed (speedbench.contention)
               "cpu_cores", "torch_threads")
# Parameters with a meaning of their own; any others keep their asv name as column.
_NAMED_PARAMS = ("workload", "variant")
COLUMNS = ("machine", "gpu", "commit", "commit_date", "run_date", "benchmark", "technique", "suite",
           "metric", "kind", "params", "workload", "variant", "value", "unit", "q25", "q75", "iqr",
           "ci99_low", "ci99_high", "n", "number", "repeat", "samples", "status", "version",
           "earlier_version", "result_id", "file",
           # speedbench.contention's verdict on the run's interference counters
           "contention", "disturbed", "contention_note", "others_cpu", "preemptions", *ENV_COLUMNS)
# A benchmark parameter named like one of these would overwrite that column of its rows (a
# parameter `machine` would refile the row under another machine): it gets this prefix.
_RESERVED = frozenset(COLUMNS) - set(_NAMED_PARAMS)
RENAMED_PARAM_PREFIX = "param_"


def printable(text) -> str:
    """`text` with every character that could move the cursor, colour a terminal, start a new
    line or not encode (control characters, lone surrogates from undecodable file names)
    written as its Python escape. Names come from files anyone can drop in results/."""
    return "".join(c if c.isprintable() else _escape(c) for c in str(text))


def _escape(c: str) -> str:
    # A byte of an undecodable file name arrives as a lone surrogate (U+DC80 to U+DCFF, Python's
    # surrogateescape): shown as the byte it stands for, as `ls -b` would.
    return f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else repr(c)[1:-1]


@dataclass(frozen=True)
class Problem:
    """Something under results/ that was not loaded (or loaded with a gap), and why."""

    path: str
    reason: str
    # True for the ordinary traces of history, not damage: results of a benchmark that has
    # since changed (outdated) or been removed. A viewer may list them more quietly.
    expected: bool = False
    # Which of those traces (speedbench.problems counts them apart): "removed" (a benchmark no
    # longer in benchmarks.json), "outdated" (set aside) or "earlier" (kept, flagged †).
    kind: str = ""

    def __str__(self) -> str:
        return printable(f"{self.path}: {self.reason}")


@dataclass
class LoadedResults:
    measured: pd.DataFrame
    not_measured: pd.DataFrame  # status "skipped" (NaN), "failed" (null), "outdated" or "invalid"
    problems: list[Problem] = field(default_factory=list)


class _Malformed(ValueError):
    """A result file (or one of its entries) whose structure is not asv's: it is skipped."""


class _Unreadable(OSError):
    """A path the loader will not read: not a regular file, outside the tree, too large."""


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


def higher_is_better(kind: str) -> bool:
    return kind in ("fraction of floor", "bandwidth", "throughput", "paired speedup")


def _strip(value: str) -> str:
    """asv stores parameter values as reprs: "'mlp'" -> "mlp"."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _to_float(x) -> float:
    """A JSON number as a float. json reads 1e400 as inf, but an integer too large for a float
    stays an int; it becomes an infinity here, so one check catches every overflow."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _describe(value) -> str:
    """A short, safe description of a value from a file, for a problem's reason (never its
    repr: a 4000-digit integer or a deeply nested list would make the message itself fail)."""
    if _is_number(value):
        return f"{_to_float(value):g}"
    if isinstance(value, str):  # a long one by its start and its end: what is wrong may be at either
        return repr(value if len(value) <= 40 else f"{value[:24]}...{value[-13:]}")
    return f"a {type(value).__name__}"


# The dates a result may carry: those pandas' nanosecond times hold, the years 1677 to 2262.
# pandas 2 and later parse dates beyond in a coarser unit, but `.value`, a frame that mixes
# them with nanosecond times and the pages' arithmetic overflow on them (a record dated 2300
# stopped the load); and no measurement was made in 1600 or 9999.
_FIRST_DATE = pd.Timestamp.min.tz_localize("UTC")
_LAST_DATE = pd.Timestamp.max.tz_localize("UTC")


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
    if t is None or not _FIRST_DATE <= t <= _LAST_DATE:
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
    if not isinstance(params, list) or not all(isinstance(p, list) and all(isinstance(v, str) for v in p) for p in params):
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


def _benchmark(meta) -> _Benchmark:
    """`meta` (one entry of benchmarks.json) checked; _Malformed says which field is wrong."""
    if not isinstance(meta, dict):
        raise _Malformed(f"is {_describe(meta)}, not an object")
    for key in ("type", "unit", "version"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise _Malformed(f"'{key}' is {_describe(meta[key])}, not a string")
    names = meta.get("param_names") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _Malformed("'param_names' is not a list of strings")
    # The loader reads the parameters from the result files; a plan and the pages expand these.
    params = meta.get("params")
    too_many = isinstance(params, list) and all(isinstance(p, list) for p in params) and params_over_limits(params)
    if too_many:
        raise _Malformed(too_many)
    return _Benchmark(meta.get("type"), meta.get("unit"), meta.get("version"), tuple(names))


def _benchmarks(raw: dict, path: str, problems: list[Problem]) -> dict[str, _Benchmark]:
    """The entries of benchmarks.json that can be trusted; the others reported (their results
    are then reported as of benchmarks not in benchmarks.json)."""
    good, bad, renamed = {}, [], []
    for name, meta in raw.items():
        if name == "version" and _is_number(meta):  # benchmarks.json's own format version
            continue
        try:
            good[name] = _benchmark(meta)
        except _Malformed as e:
            bad.append(f"{name} ({e})")
            continue
        renamed += [f"{name}: {n}" for n in good[name].param_names if n in _RESERVED]
    if bad:
        problems.append(Problem(path, f"{len(bad)} benchmark entr(ies) with wrong types or over a limit skipped: "
                                      f"{'; '.join(bad)}"))
    if renamed:
        problems.append(Problem(path, f"parameter(s) named like a column of the results, shown as "
                                      f"{RENAMED_PARAM_PREFIX}<name>: {'; '.join(renamed)}"))
    return good


# Kinds whose value is a duration or a ratio: zero or less is no measurement.
_POSITIVE_KINDS = ("time", "paired speedup")


def _status(value: float | None, kind: str) -> str:
    if value is None:
        return "failed"
    if math.isnan(value):
        return "skipped"
    if math.isinf(value) or (kind in _POSITIVE_KINDS and value <= 0):
        return "invalid"
    return "measured"


def _rows_of(path: Path, data, machine: str, benchmarks: dict[str, _Benchmark], problems: list[Problem]) -> list[dict]:
    """The rows of one parsed result file. A file whose layout is not asv's raises _Malformed;
    an entry with wrong types is skipped and reported, the file's other entries kept."""
    commit_date = _check_file(data)
    if not data["results"]:  # asv never writes one; a file emptied by hand or by a bad merge
        problems.append(Problem(str(path), "holds no results"))
    columns = data["result_columns"]
    _check_file_combinations(data["results"], columns)
    rows, unknown, invalid, malformed, unnamed = [], [], [], [], []
    for name, entry in data["results"].items():
        try:
            if not isinstance(entry, list):
                raise _Malformed(f"{name}: entry is {type(entry).__name__}, not a list")
            record = dict(zip(columns, entry))  # trailing nulls are dropped by asv: zip stops there
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
        for i, combo in enumerate(combos):
            value = values[i]
            status = _status(value, kind)
            if status == "invalid" and name not in invalid:
                invalid.append(name)
            sample = _samples(record, i)
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
                **{c: _strip(v) for c, v in zip(param_columns, combo)},
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
                "earlier_version": stale,  # settled per machine by _settle_versions
                "result_id": result_id(machine, data["commit_hash"], name, combo, started),
                "file": str(path),
            }
            rows.append(row)
    for count, what, names, expected in (
            (len(malformed), "entr(ies) with wrong types or over a limit skipped", malformed, False),
            (len(unknown), "result(s) of benchmarks not in benchmarks.json skipped", unknown, True),
            (len(invalid), "benchmark(s) with an infinite value, or a time or ratio of zero or less, set aside as "
                           "not measured", invalid, False),
            (len(unnamed), "benchmark(s) with more parameters than benchmarks.json names, the others shown as "
                           "param<i>", unnamed, False)):
        if count:
            problems.append(Problem(str(path), f"{count} {what}: {', '.join(sorted(names))}", expected,
                                    "removed" if expected else ""))
    return rows


class _NotJson(ValueError):
    """A file that is not UTF-8 JSON a Python process can hold; the message says why."""


def _parse_json(raw: bytes):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _NotJson(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise _NotJson("nested too deeply to read") from None
    except ValueError as e:  # JSONDecodeError, and integers too long for Python to convert
        raise _NotJson(f"not valid JSON, truncated? ({e})") from None


# --- reading the tree: only regular files inside it, never blocking -------------------------

def _inside(path: Path, root_real: Path, parent_real: Path | None = None) -> Path:
    """The real path of `path`; _Unreadable when it loops or leaves the results tree.
    `parent_real`: the real path of `path`'s directory, already checked to be inside the
    tree. Then an entry that is no symlink is known without resolving every component of
    its path again (thousands of files share one directory)."""
    if parent_real is not None:
        try:
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                return parent_real / path.name
        except OSError:
            pass  # resolved below, which names the reason
    try:
        real = path.resolve(strict=True)
    except RuntimeError:  # Python < 3.13 reports a symlink loop so
        raise _Unreadable("a symlink loop") from None
    except OSError as e:
        raise _Unreadable("a symlink loop" if e.errno == errno.ELOOP else f"cannot be resolved ({e.strerror})") from None
    if real != root_real and root_real not in real.parents:
        raise _Unreadable(f"a symlink out of the results tree (to {real})")
    return real


def _real_dir(directory: Path, root_real: Path) -> Path | None:
    """The real path of a directory `_subdirectory` accepted, for `_inside`'s shortcut; None
    (every file resolved in full) should it have changed since."""
    try:
        return _inside(directory, root_real)
    except _Unreadable:
        return None


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _read(path: Path, root_real: Path, parent_real: Path | None = None) -> bytes:
    """The bytes of a regular file inside the tree, at most MAX_FILE_BYTES; _Unreadable
    otherwise. Anything else is refused before it is opened: opening a FIFO could block or
    release a writer waiting on it, reading a device could never end."""
    return _read_identified(path, root_real, parent_real)[0]


def _read_identified(path: Path, root_real: Path, parent_real: Path | None = None) -> tuple[bytes, tuple[int, int]]:
    """`_read`, and the (st_dev, st_ino) of the file it read: which file that was, whichever
    link led there."""
    real = _inside(path, root_real, parent_real)
    try:
        st = os.stat(real)
        if not stat.S_ISREG(st.st_mode):
            raise _Unreadable(f"{_kind_of(st.st_mode)}, not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise _Unreadable(f"{st.st_size} bytes, over the limit of {MAX_FILE_BYTES} bytes for one file")
        # O_NONBLOCK and O_NOFOLLOW: should the path have been swapped for a FIFO or a link
        # since the checks above, the open neither waits nor follows it.
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except _Unreadable:
        raise
    except OSError as e:
        raise _Unreadable(e.strerror or str(e)) from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise _Unreadable("not a regular file")
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_FILE_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_FILE_BYTES:  # it grew while being read
            raise _Unreadable(f"over the limit of {MAX_FILE_BYTES} bytes for one file")
        return b"".join(chunks), (opened.st_dev, opened.st_ino)
    except _Unreadable:
        raise
    except OSError as e:
        raise _Unreadable(e.strerror or str(e)) from None
    finally:
        os.close(fd)


def _children(directory: Path, problems: list[Problem]) -> list[Path]:
    """The entries of `directory`, sorted by name; an unreadable directory is reported."""
    try:
        with os.scandir(directory) as it:
            names = sorted(entry.name for entry in it)
    except OSError as e:
        problems.append(Problem(str(directory), f"unreadable directory ({e.strerror or e}), skipped"))
        return []
    return [directory / n for n in names]


def _subdirectory(path: Path, root_real: Path, problems: list[Problem]) -> bool:
    """Whether `path` is a directory inside the tree to descend into. Links that loop, dangle
    or leave the tree, and entries that cannot be examined, are reported; files are not."""
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno != errno.ENOENT or os.path.islink(path):
            problems.append(Problem(str(path), f"cannot be examined ({e.strerror or e}), skipped"))
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    try:
        _inside(path, root_real)
    except _Unreadable as e:
        problems.append(Problem(str(path), f"{e}, skipped"))
        return False
    return True


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


# --- environment records -----------------------------------------------------------------

# Fields that name something (shown as text); the others are counts or versions as numbers.
_ENV_TEXT = ("gpu_model", "driver", "cuda", "torch", "torchvision", "cupy", "python", "cpu_model", "command",
             "recorded_at", "nccl")


def _timestamp(text) -> pd.Timestamp:
    """A time with its timezone, in UTC; NaT for anything else (a naive time is no instant)."""
    if not isinstance(text, str):
        return pd.NaT
    try:
        t = pd.Timestamp(text)
    except (ValueError, OverflowError, TypeError):
        return pd.NaT
    if t is pd.NaT or t.tzinfo is None or not _FIRST_DATE <= t <= _LAST_DATE:
        return pd.NaT
    return t.tz_convert("UTC")


def _clean_environment(record: dict) -> list[str]:
    """Drop (set to None) fields of `record` that a page or an export could not show; their names."""
    bad = []
    for key in ENV_COLUMNS:
        value = record.get(key)
        if value is None:
            continue
        if key in _ENV_TEXT:
            ok = isinstance(value, str) and (key != "recorded_at" or not pd.isna(_timestamp(value)))
        else:
            ok = _is_number(value) and math.isfinite(_to_float(value)) or isinstance(value, str)
        if not ok:
            record[key] = None
            bad.append(key)
    return bad


def _environment_line(line: bytes) -> dict:
    """One record; ValueError says why it cannot be used."""
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise ValueError("nested too deeply to read") from None
    if not isinstance(record, dict) or not isinstance(record.get("commit"), str):
        raise ValueError("not an object with a 'commit'")
    return record


def _environment_records(machine_dir: Path, root_real: Path, problems: list[Problem]) -> dict[str, list[tuple]]:
    """commit -> its (recorded_at, record, fields left out) (one per `speedlib run`), oldest
    first, those without a usable time last. Each line stands alone: a bad one is reported
    and skipped."""
    records: dict[str, list[tuple]] = {}
    env_dir = machine_dir / "environment"
    if not _subdirectory(env_dir, root_real, problems):
        return records
    env_real = _real_dir(env_dir, root_real)
    for file in _children(env_dir, problems):
        if file.suffix != ".jsonl":
            continue
        try:
            raw = _read(file, root_real, env_real)
        except _Unreadable as e:
            problems.append(Problem(str(file), f"unreadable ({e})"))
            continue
        for number, line in enumerate(raw.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                record = _environment_line(line)
            except ValueError as e:  # also invalid UTF-8 and JSON errors
                problems.append(Problem(f"{file}:{number}", f"environment record skipped ({e})"))
                continue
            bad = _clean_environment(record)
            if bad:
                problems.append(Problem(f"{file}:{number}", f"environment field(s) left out: {', '.join(bad)} (wrong "
                                                            "type, or a time without a timezone or outside the years "
                                                            "1677 to 2262)"))
            records.setdefault(record["commit"], []).append((_timestamp(record.get("recorded_at")), record, bad))
    for recs in records.values():
        recs.sort(key=lambda r: (pd.isna(r[0]), 0 if pd.isna(r[0]) else r[0].value))
    return records


def _join_environment(rows: list[dict], records: dict[str, list[tuple]], problems: list[Problem]) -> None:
    """Each row gets the record of the run that produced it: the first one written after the
    benchmark started (speedlib appends a record when asv finishes), else the latest."""
    missing = set()
    chosen: dict[tuple, dict] = {}
    for row in rows:
        key = (row["commit"], row["run_date"])
        if key not in chosen:
            recs = records.get(row["commit"])
            if not recs:
                missing.add(row["file"])
                chosen[key] = ({}, [])
            else:
                at, times = row["run_date"], [t for t, _, _ in recs]
                i = len(recs) - 1
                if not pd.isna(at) and not any(pd.isna(t) for t in times):
                    i = min(bisect.bisect_left(times, at), len(recs) - 1)
                chosen[key] = recs[i][1:]
            record, left_out = chosen[key]
            # The columns one run's rows share, built once per run (rows number tens of thousands).
            # No GPU model in a record means a CPU machine, unless the model was left out as unusable.
            chosen[key] = {**{name: record.get(name) for name in ENV_COLUMNS},
                           "gpu": record.get("gpu_model") or ("CPU only" if record and "gpu_model" not in left_out
                                                              else "unknown")}
        row.update(chosen[key])
    for file in sorted(missing):
        problems.append(Problem(file, "no environment record for this commit: GPU, driver and versions unknown"))


# --- the whole tree ----------------------------------------------------------------------

def _utf8_name(path: Path, what: str, problems: list[Problem]) -> bool:
    """Whether the name of `path` (`what`: a machine directory, the machine column of its
    rows, or a result file, their file column) is text. Python keeps undecodable bytes of a
    file name as lone surrogates, which no page or export can encode (nor pandas store)."""
    try:
        path.name.encode("utf-8")
    except UnicodeEncodeError:
        problems.append(Problem(str(path), f"{what} name is not UTF-8, skipped; rename it"))
        return False
    return True


def _first_visit(path: Path, identity: tuple[int, int], seen: dict[tuple[int, int], Path], what: str,
                 problems: list[Problem]) -> bool:
    """Whether `path` is the first way to the file or directory `identity` (st_dev, st_ino)
    names. A symlink inside the tree or a hard link is a second way: its results would be
    counted twice, so they are read once, from the first, and the second reported."""
    first = seen.setdefault(identity, path)
    if first != path:
        problems.append(Problem(str(path), f"the same {what} as {first} (a link): its results are loaded once, "
                                           "from there"))
        return False
    return True


def _load_benchmarks(root: Path, problems: list[Problem]) -> dict[str, _Benchmark] | None:
    """benchmarks.json's checked entries; None (reported) when the tree cannot be read."""
    try:
        if not stat.S_ISDIR(os.stat(root).st_mode):
            problems.append(Problem(str(root), "not a directory: no results directory here"))
            return None
    except OSError as e:
        problems.append(Problem(str(root), f"no results directory here ({e.strerror or e})"))
        return None
    bench_file = root / "benchmarks.json"
    try:
        os.lstat(bench_file)
    except FileNotFoundError:
        problems.append(Problem(str(bench_file), "missing: without it units and parameter names are unknown, "
                                                 "so no result file was read"))
        return None
    except OSError as e:  # a directory without read or search permission hides what it holds
        problems.append(Problem(str(bench_file), f"unreadable ({e.strerror or e}), so no result file was read; "
                                                 "check the results directory's permissions"))
        return None
    try:
        raw = _parse_json(_read(bench_file, root.resolve()))
        if not isinstance(raw, dict):
            raise _NotJson("not a JSON object")
    except (_Unreadable, _NotJson) as e:
        problems.append(Problem(str(bench_file), f"unreadable ({e}), so no result file was read"))
        return None
    return _benchmarks(raw, str(bench_file), problems)


def _check_machine_json(path: Path, root_real: Path, parent_real: Path | None, problems: list[Problem]) -> None:
    """Report a machine.json that is not asv's (a JSON object). The loader takes nothing from
    it (the directory's name is the machine's), so the results beside it load all the same."""
    try:
        if not isinstance(_parse_json(_read(path, root_real, parent_real)), dict):
            raise _NotJson("not a JSON object")
    except (_Unreadable, _NotJson) as e:
        why = f"unreadable ({e})" if isinstance(e, _Unreadable) else str(e)
        problems.append(Problem(str(path), f"{why}; the results beside it are loaded all the same (restore it from "
                                           "git, or a `speedlib run` on this machine writes it anew)"))


def _machine_rows(machine_dir: Path, root_real: Path, benchmarks: dict[str, _Benchmark],
                  problems: list[Problem], seen: dict[tuple[int, int], Path]) -> list[dict]:
    children = _children(machine_dir, problems)
    if "machine.json" not in {c.name for c in children}:
        if any(c.suffix == ".json" for c in children):
            problems.append(Problem(str(machine_dir), "no machine.json: not an asv machine directory, skipped"))
        return []
    rows: list[dict] = []
    machine_real = _real_dir(machine_dir, root_real)
    _check_machine_json(machine_dir / "machine.json", root_real, machine_real, problems)
    for file in children:
        if file.suffix == ".json" and file.name not in _SKIP_FILES and _utf8_name(file, "result file", problems):
            rows += _file_rows(file, machine_dir.name, root_real, benchmarks, problems, machine_real, seen)
    _join_environment(rows, _environment_records(machine_dir, root_real, problems), problems)
    return rows


def _machine_dirs(root: Path, root_real: Path, problems: list[Problem]) -> list[Path]:
    """The directories under `root` to load as machines, real directories before links: a
    link to one of them, met first, would file its results under the link's name."""
    found = [d for d in _children(root, problems)
             if _subdirectory(d, root_real, problems) and _utf8_name(d, "machine directory", problems)]
    return sorted(found, key=os.path.islink)  # stable: by name within each


# How far apart a measurement and its counters may have started and still be of one run:
# asv runs a class's track_* processes back to back once its setup_cache has measured.
_SAME_RUN_S = 3600


def _attach_counters(rows: list[dict]) -> list[dict]:
    """The rows without the interference counters' own rows, each other row with the
    verdict on the counters of its run (speedbench.contention): its class, parameters and
    result file, started within the same run, one counter per round it measured. Rows with
    no counters (measured before they existed) are UNKNOWN."""
    counters: dict[tuple, dict[str, tuple]] = {}
    kept = []
    for r in rows:
        name = contention.COUNTER_METRICS.get(r["metric"]) if r["kind"] == "interference" else None
        if name is None:
            kept.append(r)
        elif r["status"] == "measured" and r["samples"]:
            key = (r["file"], r["benchmark"].rsplit(".", 1)[0], r["params"])
            counters.setdefault(key, {})[name] = (r["samples"], r["run_date"])
    verdicts: dict[tuple, contention.Verdict] = {}
    for r in kept:
        found = counters.get((r["file"], r["benchmark"].rsplit(".", 1)[0], r["params"]), {})
        rounds = len(r["samples"]) or 1
        usable = {}
        for name, (samples, started) in found.items():
            apart = abs((started - r["run_date"]).total_seconds()) if not (pd.isna(started) or pd.isna(r["run_date"])) else 0
            if apart <= _SAME_RUN_S:
                usable[name] = samples
        cores, threads = _count(r.get("cpu_cores")), _count(r.get("torch_threads"))
        key = (rounds, cores, threads, *((n, tuple(v)) for n, v in sorted(usable.items())))
        if key not in verdicts:
            verdicts[key] = contention.judge(usable, rounds, cores, threads)
        v = verdicts[key]
        r["contention"], r["disturbed"], r["contention_note"] = v.state, list(v.disturbed), v.note
        # the medians over the result's rounds, so an export shows 0 % apart from 14 %
        for name in ("others_cpu", "preemptions"):
            values = usable.get(name) if len(usable.get(name) or []) == rounds else None
            r[name] = statistics.median(values) if values else math.nan
    return kept


def _count(value) -> float | None:
    """A positive count from an environment record, else None (absent, damaged, not a number)."""
    return float(value) if _is_number(value) and math.isfinite(_to_float(value)) and value > 0 else None


def _settle_versions(rows: list[dict], problems: list[Problem]) -> None:
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
            r["status"] = "outdated"
            apart.setdefault(r["file"], set()).add(r["benchmark"])
    for file, names in apart.items():
        problems.append(Problem(file, f"{len(names)} result(s) from an older version of their benchmark set aside: "
                                      f"{', '.join(sorted(names))}", True, "outdated"))
    for file, names in kept.items():
        problems.append(Problem(file, f"{len(names)} result(s) from an earlier version of their benchmark kept, the "
                                      f"newest this machine has (flagged in tables): {', '.join(sorted(names))}", True,
                                "earlier"))


def _killed_run(root: Path, problems: list[Problem]) -> None:
    """A `speedlib run` killed outright while asv wrote here left its copy of asv's files
    (speedbench.safekeep): what asv left may read as damaged until the next run puts it back."""
    snapshot = safekeep.left_by_killed_run(root)
    if snapshot is not None:
        problems.append(Problem(str(snapshot), "a speedlib run was killed while asv wrote here; the files from "
                                               "before it are kept in this directory, and the next speedlib run "
                                               "puts them back"))


def load_results(path: str | Path) -> LoadedResults:
    """Every result under `path` (all machines, all commits) as tidy frames."""
    root = Path(path)
    problems: list[Problem] = []
    _killed_run(root, problems)
    rows: list[dict] = []
    benchmarks = _load_benchmarks(root, problems)
    if benchmarks is not None:
        root_real = root.resolve()
        seen: dict[tuple[int, int], Path] = {}  # (st_dev, st_ino) -> the path it was loaded from
        for machine_dir in _machine_dirs(root, root_real, problems):
            try:
                st = os.stat(machine_dir)
            except OSError:  # gone since it was listed: its listing reports it
                st = None
            if st is None or _first_visit(machine_dir, (st.st_dev, st.st_ino), seen, "directory", problems):
                rows += _machine_rows(machine_dir, root_real, benchmarks, problems, seen)
    rows = _attach_counters(rows)
    _settle_versions(rows, problems)
    df = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in df:
            df[col] = pd.Series(dtype="object")
    for col in ("commit_date", "run_date"):  # UTC times even where none is known (else a naive dtype)
        df[col] = pd.to_datetime(df[col], utc=True)
    extra = [c for c in df.columns if c not in COLUMNS]
    df = df[[*COLUMNS[:COLUMNS.index("value")], *extra, *COLUMNS[COLUMNS.index("value"):]]]
    measured = df[df["status"] == "measured"].reset_index(drop=True)
    return LoadedResults(measured, df[df["status"] != "measured"].reset_index(drop=True), problems)


def format_table(df: pd.DataFrame, columns: tuple[str, ...] = ("machine", "commit", "benchmark", "params", "value", "unit")) -> str:
    """Measured rows as a plain-text table, commits shortened to 8 characters."""
    table = df.assign(commit=df["commit"].str[:8])[list(columns)]
    # Names come from result files: escaped, so that none can drive the terminal.
    table = table.map(lambda v: printable(v) if isinstance(v, str) else v)
    return table.to_string(index=False, float_format=lambda v: f"{v:.4g}")
