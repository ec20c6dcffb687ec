"""asv result files -> one tidy pandas DataFrame (one row per benchmark x parameter set).

Reads `results/benchmarks.json`, every `results/<machine>/*.json` (asv format version 2), the
environment records `speedlib run` writes beside them (`<machine>/environment/*.jsonl`) and
the GPU tests' verdicts `speedlib slot` writes (`<machine>/gpu-tests/*.json`).
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

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

# The loader's parts, each in a module of its own: the names other modules and the tests
# use are re-exported here, so `speedbench.results.load` stays the one place to import from.
from speedbench.results.common import Problem, Status, _is_number, printable
from speedbench.results.environment import _environment_records, _join_environment
from speedbench.results.files import (
    MAX_FILE_BYTES,
    _children,
    _first_visit,
    _NotJson,
    _parse_json,
    _read,
    _real_dir,
    _subdirectory,
    _Unreadable,
    _utf8_name,
)
from speedbench.results.gpu_tests import _join_gpu_tests, _verdicts
from speedbench.results.result_file import (
    _RESERVED,
    COLUMNS,
    INTERFERENCE_UNITS,
    MAX_COMBINATIONS,
    MAX_FILE_COMBINATIONS,
    MAX_PARAM_CHARS,
    RENAMED_PARAM_PREFIX,
    _Benchmark,
    _describe,
    _file_rows,
    _Malformed,
    is_commit,
    metric_kind,
    params_over_limits,
    result_id,
    too_many_combinations,
)
from speedbench.results.across_rows import attach_counters, one_version_per_machine
from speedbench.results.tree import BENCHMARKS, MACHINE_FILE, ResultsError, ResultsTree
from speedbench.stats.significance import higher_is_better

__all__ = ["LoadedResults", "Problem", "load_results", "format_table", "metric_kind", "higher_is_better", "result_id",
           "printable", "MAX_FILE_BYTES", "MAX_COMBINATIONS", "MAX_FILE_COMBINATIONS", "MAX_PARAM_CHARS",
           "too_many_combinations", "params_over_limits", "is_commit", "COLUMNS", "INTERFERENCE_UNITS"]

_SKIP_FILES = {MACHINE_FILE, BENCHMARKS}


@dataclass
class LoadedResults:
    measured: pd.DataFrame
    not_measured: pd.DataFrame  # status "skipped" (NaN), "failed" (null), "outdated" or "invalid"
    problems: list[Problem] = field(default_factory=list)


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


# --- the whole tree ----------------------------------------------------------------------

def _load_benchmarks(root: Path, problems: list[Problem]) -> dict[str, _Benchmark] | None:
    """benchmarks.json's checked entries; None (reported) when the tree cannot be read."""
    try:
        if not stat.S_ISDIR(os.stat(root).st_mode):
            problems.append(Problem(str(root), "not a directory: no results directory here"))
            return None
    except OSError as e:
        problems.append(Problem(str(root), f"no results directory here ({e.strerror or e})"))
        return None
    bench_file = ResultsTree(root).benchmarks
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
    if MACHINE_FILE not in {c.name for c in children}:
        if any(c.suffix == ".json" for c in children):
            problems.append(Problem(str(machine_dir), f"no {MACHINE_FILE}: not an asv machine directory, skipped"))
        return []
    rows: list[dict] = []
    machine_real = _real_dir(machine_dir, root_real)
    _check_machine_json(machine_dir / MACHINE_FILE, root_real, machine_real, problems)
    for file in children:
        if file.suffix == ".json" and file.name not in _SKIP_FILES and _utf8_name(file, "result file", problems):
            rows += _file_rows(file, machine_dir.name, root_real, benchmarks, problems, machine_real, seen)
    _join_environment(rows, _environment_records(machine_dir, root_real, problems), problems)
    _join_gpu_tests(rows, _verdicts(machine_dir, root_real, problems))
    return rows


def _machine_dirs(root: Path, root_real: Path, problems: list[Problem]) -> list[Path]:
    """The directories under `root` to load as machines, real directories before links: a
    link to one of them, met first, would file its results under the link's name."""
    found = [d for d in _children(root, problems)
             if _subdirectory(d, root_real, problems) and _utf8_name(d, "machine directory", problems)]
    return sorted(found, key=os.path.islink)  # stable: by name within each


def _killed_run(root: Path, problems: list[Problem]) -> None:
    """A `speedlib run` killed outright while asv wrote here left its copy of asv's files
    (speedbench.results.safekeep): what asv left may read as damaged until the next run puts it back."""
    tree = ResultsTree(root)
    snapshot = tree.left_by_killed_run()
    if snapshot is not None:
        problems.append(Problem(str(snapshot), "a speedlib run was killed while asv wrote here; the files from "
                                               "before it are kept in this directory, and the next speedlib run "
                                               "puts them back"))
    stage = tree.left_by_stopped_merge()
    if stage is None:
        return
    stopped = "a speedlib merge was stopped while renaming its files, so some are merged and some not yet; "
    try:
        tree.check_stopped_merge()  # the merge's own check of its journal, which moves nothing
    except ResultsError as e:
        problems.append(Problem(str(stage), f"{stopped}its journal is one a merge refuses, so the next speedlib "
                                            f"merge or speedlib run stops with: {e}"))
        return
    except OSError:  # unreadable to this user: the merge's user may read it, and finish it
        pass
    problems.append(Problem(str(stage), f"{stopped}the next speedlib merge or speedlib run finishes it"))


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
    rows = attach_counters(rows)
    one_version_per_machine(rows, problems)
    df = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in df:
            df[col] = pd.Series(dtype="object")
    for col in ("commit_date", "run_date"):  # UTC times even where none is known (else a naive dtype)
        df[col] = pd.to_datetime(df[col], utc=True)
    extra = [c for c in df.columns if c not in COLUMNS]
    df = df[[*COLUMNS[:COLUMNS.index("value")], *extra, *COLUMNS[COLUMNS.index("value"):]]]
    measured = df[df["status"] == Status.MEASURED].reset_index(drop=True)
    return LoadedResults(measured, df[df["status"] != Status.MEASURED].reset_index(drop=True), problems)


def format_table(df: pd.DataFrame,
                 columns: tuple[str, ...] = ("machine", "commit", "benchmark", "params", "value", "unit")) -> str:
    """Measured rows as a plain-text table, commits shortened to 8 characters."""
    table = df.assign(commit=df["commit"].str[:8])[list(columns)]
    # Names come from result files: escaped, so that none can drive the terminal.
    table = table.map(lambda v: printable(v) if isinstance(v, str) else v)
    return table.to_string(index=False, float_format=lambda v: f"{v:.4g}")
