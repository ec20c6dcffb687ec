"""The environment records `speedlib run` writes beside asv's results
(`<machine>/environment/*.jsonl`), and their joining onto the rows they describe.

Each record says what one run ran on (GPU, driver, versions, CPUs); the loader gives every
row the record of the run that produced it (`_join_environment`). Apart from
speedbench.results.load because these files are not asv's: their own format, their own checks
and their own problems, read through speedbench.results.files like every other file.
ENV_COLUMNS are columns of the loader's frames (speedbench.results.result_file's COLUMNS).
"""

from __future__ import annotations

import bisect
import json
import math
from enum import StrEnum
from pathlib import Path

import pandas as pd

from speedbench.results.common import Problem, _is_number, _to_float
from speedbench.results.dates import FIRST_DATE, LAST_DATE
from speedbench.results.files import _children, _read, _real_dir, _subdirectory, _Unreadable
from speedbench.results.tree import ENVIRONMENT_DIR


class NoGpuModel(StrEnum):
    """What a row's `gpu` column holds where it names no GPU model."""

    CPU_ONLY = "CPU only"  # the run's environment record names none: a CPU machine
    UNKNOWN = "unknown"  # no record, or its GPU model was left out as unusable

# Environment-record keys carried onto every row (provenance for exports and the dashboard).
ENV_COLUMNS = ("gpu_model", "gpu_count", "driver", "cuda", "cudnn", "nccl", "torch", "torchvision",
               "cupy", "python", "cpu_model", "command", "recorded_at",
               # the machine's CPUs and the torch threads the benchmarks set: how many cores
               # other work may take before a round counts as disturbed (speedbench.stats.contention)
               "cpu_cores", "torch_threads",
               # what the pre-flight check found busy as the run started ("" when quiet): marks its figures
               "busy_at_start")

# Fields that name something (shown as text); the others are counts or versions as numbers.
_ENV_TEXT = ("gpu_model", "driver", "cuda", "torch", "torchvision", "cupy", "python", "cpu_model", "command",
             "recorded_at", "nccl", "busy_at_start")


def _timestamp(text) -> pd.Timestamp:
    """A time with its timezone, in UTC; NaT for anything else (a naive time is no instant)."""
    if not isinstance(text, str):
        return pd.NaT
    try:
        t = pd.Timestamp(text)
    except (ValueError, OverflowError, TypeError):
        return pd.NaT
    if t is pd.NaT or t.tzinfo is None or not FIRST_DATE <= t <= LAST_DATE:
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
    env_dir = machine_dir / ENVIRONMENT_DIR
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
                           "gpu": record.get("gpu_model") or (NoGpuModel.CPU_ONLY if record and "gpu_model" not in
                                                              left_out else NoGpuModel.UNKNOWN)}
        row.update(chosen[key])
    for file in sorted(missing):
        problems.append(Problem(file, "no environment record for this commit: GPU, driver and versions unknown"))

