"""The `Table` every report returns, and what the tables read off the tidy rows: parameter
columns, each result's newest run, a row's label and configuration, a value or ratio as text.

Every table is a `Table`: the frame to show, plus the result rows it was computed from, so
each export carries a provenance footer (speedbench.report.exports writes it). The speedup and
memory tables are in speedbench.report.ratios, the paired speedups in speedbench.report.paired_speedups,
the run-to-run noise in speedbench.report.reruns, the floor table in speedbench.report.floors and
the marks every table carries in speedbench.report.marks; the history and change tables are in
speedbench.report.commits, the claims table in speedbench.report.claims, the GPU-vs-GPU tables in
speedbench.report.machines_compare.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from speedbench.results.load import COLUMNS

__all__ = ["Table", "param_columns", "latest", "newest_runs", "case_label", "shared_config", "natural", "fmt_ratio",
           "fmt_value", "UNDEFINED"]


@dataclass
class Table:
    """A table to show or export, and the measured rows it was computed from."""

    title: str
    frame: pd.DataFrame
    sources: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    # What the CSV export holds: the same rows as numbers (ratio, low, high, value, unit, N,
    # result ID) for a script or a plot, where `frame` holds them as text for a reader.
    # None: the CSV holds `frame`.
    data: pd.DataFrame | None = None


# Columns the tables add to the tidy frame; everything else outside COLUMNS is a parameter.
_DERIVED = {"baseline", "baseline_value", "ratio", "ratio_low", "ratio_high", "interval", "change",
            "environment_change",  # history(): where the environment changed, and how
            "significant", "direction", "test", "p_value", "step", "step_direction", "step_p", "result_id_base",
            "config", "width", "wide_because", "dropped",  # paired(): the configuration without its variant, the
                                                # interval's width and why it is wider than the target,
                                                # and the disturbed rounds left out
            # floor_figures(): the GB/s beside a % of a floor, as numbers, as shown, and their results
            "achieved_text", "gbps", "floor_gbps", "gbps_text", "floor_gbps_text", "gbps_result_id",
            "floor_gbps_result_id"}


def param_columns(df: pd.DataFrame) -> list[str]:
    """Parameter columns other than `variant` (workload first)."""
    return ["workload", *[c for c in df.columns if c not in COLUMNS and c not in _DERIVED]]


def latest(df: pd.DataFrame) -> pd.DataFrame:
    """Only each machine's most recent commit (by commit date) per benchmark, each result of
    it once (`newest_runs`)."""
    if df.empty:
        return df
    newest = df.groupby(["machine", "benchmark"])["commit_date"].transform("max")
    return newest_runs(df[df["commit_date"] == newest])


def newest_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Each result (machine, commit, benchmark, parameters) once: its latest run. A commit
    measured again under another environment name (another interpreter's result file) gave
    every table two rows nothing told apart, and every chart two bars under one label."""
    # every parameter column too: a frame built by hand may set one without `params`
    keys = list(dict.fromkeys(c for c in ("machine", "commit", "benchmark", "params", "variant", *param_columns(df))
                              if c in df))
    if df.empty or not keys or not _repeated(df[keys]).any():  # the usual case: each result once
        return df
    # positions, oldest run first (a run without a date before any dated one; ties keep the
    # frame's order), so that the last of each result is its newest
    when = df["run_date"].reset_index(drop=True) if "run_date" in df else pd.Series(0, index=range(len(df)))
    order = when.sort_values(kind="stable", na_position="first").index.to_numpy()
    older = np.zeros(len(df), dtype=bool)
    older[order] = _repeated(df[keys].iloc[order]).to_numpy()
    return df[~older]


def _repeated(keys: pd.DataFrame) -> pd.Series:
    """Rows whose keys a later row repeats."""
    try:
        return keys.duplicated(keep="last")
    except TypeError:  # a list in a column built by hand: compared as text
        return keys.astype(str).duplicated(keep="last")


def case_label(df: pd.DataFrame) -> pd.Series:
    """What tells a row apart within a technique on one machine: its workload, its other
    parameters as name=value, then its variant ("mlp / speedlib", "knob=conv_bias / on")."""
    def label(params: str, workload, variant) -> str:
        parts = [p for p in (params or "").split(", ") if p and not p.startswith(("variant=", "workload="))]
        head = [workload] if isinstance(workload, str) and workload else []
        return " / ".join([", ".join(head + parts), variant if isinstance(variant, str) else ""]).strip(" /")

    return pd.Series([label(p, w, v) for p, w, v in zip(df["params"], df["workload"], df["variant"], strict=True)],
                     index=df.index, dtype=object)


def shared_config(params: str) -> str:
    """A row's parameters without its variant: the configuration its variants share."""
    return ", ".join(p for p in (params or "").split(", ") if p and not p.startswith("variant="))


# A ratio with a 0 below the line (a variant that took no time, a baseline that retained no
# bytes) has no value: said so, where "infx" read as a figure.
UNDEFINED = "undefined (divides by 0)"



def natural(text) -> list:
    """A sort key in which numbers compare as numbers: batch=64 before batch=256."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(text))]

def fmt_ratio(ratio: float, low: float, high: float) -> str:
    if pd.isna(ratio):
        return ""
    if not math.isfinite(ratio):
        return UNDEFINED
    text = f"{ratio:.3g}x"
    return text if pd.isna(low) else f"{text} [{low:.3g}, {high:.3g}]"


def fmt_value(value: float, unit: str | None) -> str:
    if pd.isna(value):
        return ""
    if unit == "seconds":
        return f"{value * 1e3:.4g} ms" if value < 1 else f"{value:.4g} s"
    if unit == "x":  # a ratio reads "1.04x", as everywhere else, not "1.044 x"
        return f"{value:.3g}x"
    if unit == "bytes":  # GiB from 1 GiB up: "1.535e+04 MiB" is not how anyone reads 15 GiB
        return f"{value / 2**30:.4g} GiB" if value >= 2**30 else f"{value / 2**20:.4g} MiB"
    return f"{value:.4g} {unit}" if unit else f"{value:.4g}"


def _shown(df: pd.DataFrame) -> list[str]:
    """Parameter columns (not `variant`) that hold a value here, in a stable order."""
    return [c for c in param_columns(df) if c in df and df[c].notna().any()]
