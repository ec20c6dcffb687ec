"""Run-to-run noise: the same commit measured twice on one machine, its paired speedups and its
times set side by side (`paired_noise`, `noise`, `noise_table`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from speedbench.report.paired_speedups import PAIRED_NOISE_TARGET, paired
from speedbench.report.rows import Table, fmt_ratio, fmt_value
from speedbench.results import machines

__all__ = ["paired_noise", "noise", "noise_table", "NOISE_TARGET", "NOT_COMPARED"]


# What a rerun is matched on: the same result, in the same environment (speedbench.results.machines).
# A second run on another CPU or torch build measures the environment's effect, not noise.
_RERUN = ["machine", "commit", "benchmark", "params"]
_ENVIRONMENT_KEY = "_environment"
# Said wherever two results are not set against each other because their environments differ
# (noise table, history, regression gate).
NOT_COMPARED = "not compared"


def _beside_rerun(a: pd.DataFrame, b: pd.DataFrame, columns: list[str], also: tuple[str, ...] = ()) -> pd.DataFrame:
    """`a`'s rows with `b`'s `columns` (suffixed _second) where machine, commit, benchmark,
    parameters, environment and the columns `also` name agree."""
    keys = [*_RERUN, *also, _ENVIRONMENT_KEY]
    a, b = (d.assign(**{_ENVIRONMENT_KEY: machines.environment_keys(d)}) for d in (a, b))
    return a.merge(b[[*keys, *columns]], on=keys, suffixes=("", "_second")).drop(columns=_ENVIRONMENT_KEY)


def _rerun_elsewhere(first: pd.DataFrame, second: pd.DataFrame) -> tuple[int, list[str]]:
    """Results the noise table compares (times, paired speedups) measured in both runs but in
    different environments: how many, and how the environment differed on each machine."""
    kinds = ("time", "paired speedup")
    m = first[first["kind"].isin(kinds)].merge(second[second["kind"].isin(kinds)], on=_RERUN,
                                               suffixes=("_first", ""))
    m = m[machines.environment_keys(m, "_first") != machines.environment_keys(m)]
    return len(m), sorted({f"{r['machine']}: {machines.describe_change(r, r, '_first')}" for r in m.to_dict("records")})


def paired_noise(first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """Every paired speedup measured in both runs (same machine, commit, benchmark, parameters
    and environment): run_to_run = larger / smaller estimate - 1, noisiest first."""
    # the baseline too: one variant's seconds give a ratio against each of the headline's baselines
    m = _beside_rerun(paired(first), paired(second), ["ratio", "ratio_low", "ratio_high"], also=("baseline",))
    m["run_to_run"] = np.fmax(m["ratio"], m["ratio_second"]) / np.fmin(m["ratio"], m["ratio_second"]) - 1
    m["within_target"] = m["run_to_run"] <= PAIRED_NOISE_TARGET
    return m.sort_values("run_to_run", ascending=False, kind="stable").reset_index(drop=True)


# The project's repeatability target: a time benchmark rerun on the same machine and commit must land
# within 3 % of the first run.
NOISE_TARGET = 0.03


def noise(first: pd.DataFrame, second: pd.DataFrame) -> pd.DataFrame:
    """Every time benchmark measured in both runs of the same machine and commit, in the same
    environment.

    Columns added: value_second, run_to_run (|second - first| over the smaller of the two),
    spread (the larger of the two runs' interquartile range over median) and
    within_target (run_to_run <= NOISE_TARGET). Sorted noisiest first.
    """
    a, b = (d[d["kind"] == "time"] for d in (first, second))
    m = _beside_rerun(a, b, ["value", "iqr"])
    m["run_to_run"] = (m["value_second"] - m["value"]).abs() / np.minimum(m["value"], m["value_second"])
    m["spread"] = np.fmax(m["iqr"] / m["value"], m["iqr_second"] / m["value_second"])
    m["within_target"] = m["run_to_run"] <= NOISE_TARGET
    return m.sort_values("run_to_run", ascending=False, kind="stable").reset_index(drop=True)


def noise_table(first: pd.DataFrame, second: pd.DataFrame) -> Table:
    """The same commit measured twice on one machine: how far each paired speedup and each
    time benchmark moved, paired speedups first (the headline)."""
    pr, m = paired_noise(first, second), noise(first, second)
    frame = pd.concat([pd.DataFrame({
        "machine": pr["machine"], "commit": pr["commit"].str[:8], "benchmark": pr["benchmark"], "params": pr["params"],
        "first": [fmt_ratio(r, lo, hi)
                  for r, lo, hi in zip(pr["ratio"], pr["ratio_low"], pr["ratio_high"], strict=True)],
        "second": [fmt_ratio(r, lo, hi) for r, lo, hi in
                   zip(pr["ratio_second"], pr["ratio_low_second"], pr["ratio_high_second"], strict=True)],
        "run to run": [f"{r * 100:.1f} %" for r in pr["run_to_run"]],
        "IQR / median": "", "target": f"{PAIRED_NOISE_TARGET:.0%}",
        "within": np.where(pr["within_target"], "yes", "NO"),
    }), pd.DataFrame({
        "machine": m["machine"], "commit": m["commit"].str[:8], "benchmark": m["benchmark"], "params": m["params"],
        "first": [fmt_value(v, u) for v, u in zip(m["value"], m["unit"], strict=True)],
        "second": [fmt_value(v, u) for v, u in zip(m["value_second"], m["unit"], strict=True)],
        "run to run": [f"{r * 100:.1f} %" for r in m["run_to_run"]],
        "IQR / median": [f"{x * 100:.1f} %" if pd.notna(x) else "" for x in m["spread"]],
        "target": f"{NOISE_TARGET:.0%}", "within": np.where(m["within_target"], "yes", "NO"),
    })], ignore_index=True)
    notes = []
    if len(pr):
        worst = pr["run_to_run"].max()
        notes.append(f"{int(pr['within_target'].sum())} of {len(pr)} paired speedups within "
                     f"{PAIRED_NOISE_TARGET:.0%} run to run (worst {worst * 100:.1f} %); "
                     "run to run = larger / smaller - 1")
    notes += [f"{int(m['within_target'].sum())} of {len(m)} times within {NOISE_TARGET:.0%} run to run; "
              "run to run = |second - first| / min(first, second); IQR / median: the larger of the two runs'"]
    apart, how = _rerun_elsewhere(first, second)
    if apart:
        notes.append(f"{apart} result(s) measured in both runs but in different environments, {NOT_COMPARED} "
                     f"(the difference would be the environment's, not noise): {'; '.join(how)}")
    rows = pd.concat([pr, m], ignore_index=True)
    return Table("Run-to-run noise", frame, rows, notes)
