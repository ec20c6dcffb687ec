"""asv result files -> one tidy pandas DataFrame (one row per benchmark x parameter set).

Reads `results/<machine>/*.json` (asv format version 2) and the `benchmarks.json` beside
them; never writes anything. A file that cannot be read is reported with its path and
reason instead of stopping the load. Skipped (NaN) and failed (null) results are kept
apart from measured ones. No Streamlit import: the dashboard and the CLI both use this.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

__all__ = ["LoadedResults", "load_results", "format_table"]

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


@dataclass
class LoadedResults:
    measured: pd.DataFrame
    not_measured: pd.DataFrame  # status "skipped" (NaN) or "failed" (null)
    problems: list[str] = field(default_factory=list)


def _strip(value: str) -> str:
    """asv stores parameter values as reprs: "'mlp'" -> "mlp"."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _rows_of(path: Path, data: dict, machine: str, benchmarks: dict) -> list[dict]:
    columns = data["result_columns"]
    rows = []
    for name, entry in data["results"].items():
        record = dict(zip(columns, entry))  # trailing nulls are dropped by asv: zip stops there
        meta = benchmarks.get(name, {})
        params = record.get("params") or []
        combos = list(itertools.product(*params)) if params else [()]
        values = record.get("result")
        if not isinstance(values, list):
            values = [values] * len(combos)
        if len(values) != len(combos):
            raise ValueError(f"{name}: {len(values)} results for {len(combos)} parameter sets")
        names = meta.get("param_names") or [f"param{i}" for i in range(len(params))]
        for i, combo in enumerate(combos):
            value = values[i]
            status = "measured"
            if value is None:
                status = "failed"
            elif isinstance(value, float) and math.isnan(value):
                status = "skipped"
            row = {
                "machine": machine,
                "commit": data["commit_hash"],
                "date": pd.to_datetime(data.get("date"), unit="ms", utc=True),
                "env_name": data.get("env_name"),
                "benchmark": name,
                "kind": meta.get("type"),
                "params": ", ".join(f"{n}={_strip(v)}" for n, v in zip(names, combo)),
                **{n: _strip(v) for n, v in zip(names, combo)},
                "value": value if status == "measured" else math.nan,
                "unit": meta.get("unit"),
                "status": status,
                "version": record.get("version"),
                "file": str(path),
            }
            for col, ours in _STATS.items():
                stat = record.get(col)
                row[ours] = stat[i] if isinstance(stat, list) and i < len(stat) and stat[i] is not None else math.nan
            samples = record.get("samples")
            sample = samples[i] if isinstance(samples, list) and i < len(samples) else None
            row["samples"] = sample if isinstance(sample, list) else []
            rows.append(row)
    return rows


def load_results(path: str | Path) -> LoadedResults:
    """Every result under `path` (all machines, all commits) as tidy frames."""
    root = Path(path)
    problems: list[str] = []
    rows: list[dict] = []
    benchmarks: dict = {}
    bench_file = root / "benchmarks.json"
    if bench_file.is_file():
        try:
            benchmarks = json.loads(bench_file.read_text())
        except (OSError, ValueError) as e:
            problems.append(f"{bench_file}: unreadable ({e})")
    elif root.is_dir():
        problems.append(f"{bench_file}: missing, so units and parameter names are unknown")
    for machine_dir in sorted(p for p in root.glob("*") if (p / "machine.json").is_file()):
        for file in sorted(machine_dir.glob("*.json")):
            if file.name in _SKIP_FILES:
                continue
            try:
                data = json.loads(file.read_text())
                rows += _rows_of(file, data, machine_dir.name, benchmarks)
            except (OSError, ValueError, KeyError, TypeError) as e:
                problems.append(f"{file}: {type(e).__name__}: {e}")
    df = pd.DataFrame(rows)
    if df.empty:
        empty = pd.DataFrame(columns=["machine", "commit", "benchmark", "params", "value", "unit", "status"])
        return LoadedResults(empty, empty.copy(), problems)
    measured = df[df["status"] == "measured"].reset_index(drop=True)
    return LoadedResults(measured, df[df["status"] != "measured"].reset_index(drop=True), problems)


def format_table(df: pd.DataFrame, columns: tuple[str, ...] = ("machine", "commit", "benchmark", "params", "value", "unit")) -> str:
    """Measured rows as a plain-text table, commits shortened to 8 characters."""
    table = df.assign(commit=df["commit"].str[:8])[list(columns)]
    return table.to_string(index=False, float_format=lambda v: f"{v:.4g}")
