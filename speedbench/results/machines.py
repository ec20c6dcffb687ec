"""What a machine name stands for: one kind of hardware, measured with one torch/CUDA build at a time.

A machine directory under results/ is a history: each commit in it is read against the one
before. That reading means something only where nothing but the code changed, and the same
code gave the flat-buffer ResNet-50 headline 3.26x on a 2-core Intel Xeon VM and 4.18x on a
2-core AMD EPYC one, both once filed as `cpu-2core`. So:

- `speedbench.measure.hardware.machine_name()` names a CPU-only machine after its CPU model as well as
  its cores ('cpu-2core-intel-xeon'); GPU machines keep their GPU's name, the hardware that
  decides their numbers.
- `check_directory()` refuses a run whose hardware, or torch/CUDA build, differs from what the
  machine directory's environment records say: `speedlib run` exits 2 with the fix. A build
  change is accepted knowingly with --new-build; it then starts a new environment there.
- `environment_keys()` and `describe_change()` apply the same rule to results already filed:
  history, the regression gate and the noise table compare rows of one environment only.

No torch import: the report and the dashboard use this module too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from speedbench.results import files
from speedbench.results.common import printable
from speedbench.results.tree import ResultsTree

__all__ = ["ENVIRONMENT", "environment_keys", "describe", "describe_change",
           "MachineMismatch", "directory_records", "check_directory", "hardware", "clash"]

# The fields of an environment record that make two results comparable, with the words a
# change of each is described in. Rows that differ in any are different series.
# The torch threads too: $SPEEDLIB_THREADS changes how a step uses the CPUs, so runs at two
# thread counts are two series (the pre-flight check suggests setting it on a busy machine).
ENVIRONMENT = {"cpu_model": "CPU", "gpu_model": "GPU", "gpu_count": "GPUs", "torch": "torch", "cuda": "CUDA",
               "torch_threads": "torch threads"}


def _text(value) -> str:
    """A field's value as text for comparing and showing: '' where unknown; a count read back
    as a float (a column with gaps) reads as the integer it is."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def environment_keys(df: pd.DataFrame, suffix: str = "") -> pd.Series:
    """One text key per row naming its environment (ENVIRONMENT's fields, from the columns
    named with `suffix` as a merge leaves them), to compare, group and merge on. A column the
    frame lacks counts as the same for every row: frames built by hand carry no environment,
    and all of their rows compare."""
    key = pd.Series("", index=df.index, dtype=object)
    for c in ENVIRONMENT:
        if f"{c}{suffix}" in df:
            key = key + "\x1f" + df[f"{c}{suffix}"].map(_text).astype(object)
    return key


def describe(record: Mapping) -> str:
    """An environment in words: 'CPU AMD EPYC, torch 2.15.0+cu132, CUDA 13.2' (unknowns left out)."""
    shown = [(ENVIRONMENT[c], _text(record.get(c))) for c in ENVIRONMENT]
    shown = [(w, v) for w, v in shown if v and not (w == "GPUs" and v in ("0", "1"))]  # counts that say nothing
    return ", ".join(f"{w} {v}" for w, v in shown) or "environment unknown"


def describe_change(old: Mapping, new: Mapping, suffix: str = "") -> str:
    """What differs from `old` to `new`: 'torch 2.15.0+cu132 -> 2.14.1+cu130, CUDA 13.2 -> 13.0'.
    `suffix`: `old`'s fields carry it (one merged row holding both sides)."""
    changes = []
    for field, word in ENVIRONMENT.items():
        a, b = _text(old.get(f"{field}{suffix}")), _text(new.get(field))
        if a != b:
            changes.append(f"{word} {a or 'unknown'} -> {b or 'unknown'}")
    return ", ".join(changes)


# --- a run against the directory it would be filed under --------------------------------------

class MachineMismatch(ValueError):
    """This run's hardware or build differs from what its machine directory recorded (or that
    directory is a file); the message says what differs and how to file the run."""


def directory_records(machine_dir: Path) -> list[dict]:
    """The environment records under `machine_dir`/environment, oldest first. A line that is
    not a record, or a file the loader would not read, is passed over here: the results
    loader reports it."""
    records = []
    machine_dir = Path(machine_dir)
    for file in ResultsTree(machine_dir.parent).machine(machine_dir.name).environment_records():
        try:
            # Regular files only, of a size the loader reads: opening a FIFO would wait for
            # a writer, and the run with it.
            if not file.is_file() or file.stat().st_size > files.MAX_FILE_BYTES:
                continue
            lines = file.read_bytes().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # RecursionError: nested too deeply to read
                continue
            if isinstance(record, dict):
                records.append(record)
    return sorted(records, key=lambda r: str(r.get("recorded_at") or ""))


def hardware(record: Mapping) -> dict:
    """The fields naming the hardware a run used: on a GPU machine its GPU model and count,
    on a CPU-only one its CPU model; {} for a record that names none (unknown)."""
    if not {"gpu_model", "gpu_count", "cpu_model"} & record.keys():
        return {}
    gpu = bool(record.get("gpu_model")) or bool(record.get("gpu_count"))
    fields = ("gpu_model", "gpu_count") if gpu else ("cpu_model",)
    return {"kind": "GPU" if gpu else "CPU", **{f: _text(record[f]) for f in fields if f in record}}


def _build(record: Mapping) -> dict:
    return {f: _text(record[f]) for f in ("torch", "cuda") if f in record}


def _differs(old: dict, new: dict) -> bool:
    """Whether a field both sides know differs (the kind, GPU or CPU, included)."""
    return any(old[f] != new[f] for f in old.keys() & new.keys())


def clash(seen: Iterable[dict], new: dict) -> dict | None:
    """The first of `seen` (`hardware` of records) that names other hardware than `new`, or None."""
    return next((h for h in seen if _differs(h, new)), None)


def check_directory(results_dir: Path, machine: str, env: Mapping, new_build: bool = False) -> str | None:
    """Refuse (MachineMismatch) to file a run of environment `env` under `machine` when that
    directory's records name other hardware (any record), or another torch/CUDA build (its
    newest record) unless `new_build`; then the line to print about the new build is returned.
    A directory without records takes any run."""
    results_dir = Path(results_dir)
    where = printable(str(results_dir / machine))
    if (results_dir / machine).exists() and not (results_dir / machine).is_dir():  # asv would fail on it, mid-run
        raise MachineMismatch(f"{where} is a file, not a machine directory: move it away, or run with --machine "
                              "NEWNAME")
    records = directory_records(results_dir / machine)
    mine = hardware(env)
    other = next((r for r in reversed(records) if _differs(hardware(r), mine)), None)
    if other is not None:
        named = env.get("machine") or machine
        # Two CPU models can share a short name ('Intel Xeon CPU @ 2.20GHz', 'Intel Xeon Processor').
        fix = (f"{printable(named)} (the name this hardware gives)" if named != machine else
               f"NEWNAME (e.g. {printable(machine)}-2: this hardware's short name is the directory's)")
        raise MachineMismatch(
            f"{where} holds runs on {printable(describe(hardware(other)))} (recorded "
            f"{printable(other.get('recorded_at') or 'at an unknown time')}) and this run is on "
            f"{printable(describe(mine))}: a machine name stands for one kind of hardware, and its history would "
            f"mix the two. Run with --machine {fix} instead.")
    if not records:
        return None
    last = records[-1]
    if any(_build(last).get(f) != v for f, v in _build(env).items() if f in _build(last)):
        if new_build:
            return (f"--new-build: {where} was last measured with {printable(describe(_build(last)))}; this run's "
                    f"{printable(describe(_build(env)))} starts a new environment there, which history and the "
                    "regression gate do not compare across")
        torch = _text(env.get("torch")).replace("+", "-") or "unknown"
        raise MachineMismatch(
            f"{where} was last measured with {printable(describe(_build(last)))} and this run has "
            f"{printable(describe(_build(env)))} on the same hardware: history and the regression gate would read "
            f"a build change as a code change. Pass --new-build to file it there as a new environment (they do not "
            f"compare across it), or --machine {printable(f'{machine}-torch-{torch}')} "
            "for a directory of its own.")
    return None
