"""Speedup and memory tables from results measured one variant per process: each variant beside
its baseline (`speedups`, `speedup_table`, `memory_table`), and what the baselines are.

Ratios and their uncertainty: a speedup is baseline / variant for lower-is-better metrics
(time, memory) and variant / baseline for higher-is-better ones (bandwidth, % of floor),
on the same machine, commit and parameters. Its interval combines the two 99 % confidence
intervals asv reports, worst case against best case (baseline low / variant high, and
baseline high / variant low), so it is conservative; where asv kept no interval (track_*
benchmarks report one value), the interquartile range is used, and where there is neither
the ratio has no interval.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from speedbench.report.floors import FLOOR_ONLY
from speedbench.report.marks import _identity, _numbers, with_earlier_note
from speedbench.report.rows import UNDEFINED, Table, _shown, fmt_ratio, fmt_value, param_columns
from speedbench.results.load import higher_is_better
from speedbench.techniques import TECHNIQUES

__all__ = ["speedups", "speedup_table", "memory_table", "MEMORY_NOTE", "BASELINE_NOTE"]


def _interval_bounds(df: pd.DataFrame, suffix: str = "") -> tuple[pd.Series, pd.Series, pd.Series]:
    """(low, high, label) per row: asv's 99 % CI, else the IQR, else nothing."""
    ci = df[f"ci99_low{suffix}"].notna() & df[f"ci99_high{suffix}"].notna()
    low = df[f"ci99_low{suffix}"].where(ci, df[f"q25{suffix}"])
    high = df[f"ci99_high{suffix}"].where(ci, df[f"q75{suffix}"])
    label = pd.Series(np.where(ci, "99% CI", np.where(low.notna(), "IQR", "none")), index=df.index)
    return low, high, label


def _with_ratio(m: pd.DataFrame) -> None:
    """Add ratio (how much better the unsuffixed side is than the `_base` side), its
    interval and the interval's kind, as the module docstring describes."""
    low, high, label = _interval_bounds(m)
    blow, bhigh, blabel = _interval_bounds(m, "_base")
    up = m["kind"].map(higher_is_better).astype(bool)
    m["ratio"] = np.where(up, m["value"] / m["value_base"], m["value_base"] / m["value"])
    m["ratio_low"] = np.where(up, low / bhigh, blow / high)
    m["ratio_high"] = np.where(up, high / blow, bhigh / low)
    m["interval"] = np.where(label == blabel, label, "IQR")
    none = (label == "none") | (blabel == "none")
    m.loc[none, ["ratio_low", "ratio_high"]] = np.nan
    m.loc[none, "interval"] = "none"


def speedups(df: pd.DataFrame, baseline: str | None = None) -> pd.DataFrame:
    """Every measured row beside its baseline (same machine, commit, benchmark, parameters).

    `baseline` overrides each technique's default baseline variant. Columns added:
    baseline, baseline_value, ratio (x better: >1 means the variant wins), ratio_low,
    ratio_high, interval ("99% CI", "IQR" or "none").
    """
    if df.empty or "variant" not in df:
        return df.iloc[0:0].assign(baseline=[], baseline_value=[], ratio=[], ratio_low=[], ratio_high=[], interval=[])
    params = [c for c in param_columns(df) if c in df]
    rows = df.assign(**{c: df[c].fillna("") for c in params})
    keys = ["machine", "commit", "benchmark", *params]
    # Each row's preference for being the baseline (lower is preferred; NaN: not a baseline),
    # then per comparison group the most preferred baseline present.
    chains = {t: (baseline,) if baseline is not None else TECHNIQUES[t].baselines if t in TECHNIQUES else ()
              for t in rows["technique"].unique()}
    rank = np.array([chains[t].index(v) if v in chains[t] else np.nan
                     for t, v in zip(rows["technique"], rows["variant"], strict=True)], dtype=float)
    usable = ~np.isnan(rank)
    base = rows[usable].assign(_rank=rank[usable]).sort_values("_rank", kind="stable").drop_duplicates(keys)
    merged = rows.merge(base[[*keys, "variant", "value", "ci99_low", "ci99_high", "q25", "q75",
                              *(["result_id"] if "result_id" in base else [])]],
                        on=keys, suffixes=("", "_base"))  # result_id_base: cited beside the row's own
    _with_ratio(merged)
    return merged.rename(columns={"variant_base": "baseline", "value_base": "baseline_value"}).drop(
        columns=["ci99_low_base", "ci99_high_base", "q25_base", "q75_base"])


def _against_baseline(df: pd.DataFrame, kind: str, baseline: str | None) -> pd.DataFrame:
    """Speedups of one metric kind without the baseline's own rows, in table order; the GB/s
    that only the floor table reads (FLOOR_ONLY) are left out."""
    rows = df[df["kind"] == kind]
    if "metric" in rows:
        rows = rows[~rows["metric"].isin(FLOOR_ONLY)]
    s = speedups(rows, baseline)
    s = s[s["variant"] != s["baseline"]]
    return s.sort_values(["technique", "machine", "commit_date", "benchmark", *_shown(s), "variant"], kind="stable")


def _ratio_numbers(s: pd.DataFrame) -> dict:
    return {"baseline": s["baseline"], "ratio": s["ratio"], "low": s["ratio_low"], "high": s["ratio_high"]}


def speedup_table(df: pd.DataFrame, kind: str = "time", baseline: str | None = None) -> Table:
    """Each variant against its baseline, per machine and commit, for one metric kind."""
    s = _against_baseline(df, kind, baseline)
    frame = pd.DataFrame({
        **_identity(s),
        "variant": s["variant"], "baseline": s["baseline"],
        "value": [fmt_value(v, u) for v, u in zip(s["value"], s["unit"], strict=True)],
        "baseline value": [fmt_value(v, u) for v, u in zip(s["baseline_value"], s["unit"], strict=True)],
        "speedup": [fmt_ratio(r, lo, hi)
                    for r, lo, hi in zip(s["ratio"], s["ratio_low"], s["ratio_high"], strict=True)],
        "interval": s["interval"], "N": s["n"],
    })
    notes = ["speedup = baseline / variant for time, variant / baseline for bandwidth and % of floor; "
             ">1 means the variant is better", "[low, high]: from the two 99 % confidence intervals (worst case)",
             _baseline_note(s, baseline)]
    data = _numbers(s, **_ratio_numbers(s), interval=s["interval"], value=s["value"],
                    baseline_value=s["baseline_value"], unit=s["unit"])
    return Table(f"Speedup ({kind})", frame.reset_index(drop=True), s, with_earlier_note(notes, s), data)


def memory_table(df: pd.DataFrame, baseline: str | None = None) -> Table:
    """Memory per variant (peak, saved activations, retained bytes): its ratio to the baseline's,
    and the change in percent."""
    s = _against_baseline(df, "memory", baseline)
    # Memory is stated as the sources and the design targets state it, variant / baseline
    # ("0.55x the memory"), in the grid, the claims, this table and its CSV alike: an export
    # that gave baseline / variant here (2.68) beside 0.373x in the grid misled anyone
    # merging the two. speedups() keeps "x better" internally; this inverts it, bounds too.
    s = s.assign(ratio=1 / s["ratio"], ratio_low=1 / s["ratio_high"], ratio_high=1 / s["ratio_low"])
    change = (s["ratio"] - 1) * 100
    frame = pd.DataFrame({
        **_identity(s),
        "variant": s["variant"], "baseline": s["baseline"],
        # bytes, not "peak": the table holds saved activations and retained bytes too
        "bytes": [fmt_value(v, "bytes") for v in s["value"]],
        "baseline bytes": [fmt_value(v, "bytes") for v in s["baseline_value"]],
        "memory ratio": [fmt_ratio(r, lo, hi)
                         for r, lo, hi in zip(s["ratio"], s["ratio_low"], s["ratio_high"], strict=True)],
        "change": [f"{c:+.1f} %" if math.isfinite(c) else UNDEFINED if pd.notna(c) else "" for c in change],
        "N": s["n"],
    })
    data = _numbers(s, **_ratio_numbers(s), value=s["value"], baseline_value=s["baseline_value"], unit=s["unit"],
                    change_percent=change)
    return Table("Memory (peak, saved activations, retained bytes)", frame.reset_index(drop=True), s,
                 with_earlier_note([MEMORY_NOTE, "change = variant / baseline - 1", _baseline_note(s, baseline)], s),
                 data)


MEMORY_NOTE = ("memory ratio = variant bytes / baseline bytes (ratio in the CSV): below 1x the variant needs less "
               "memory")
BASELINE_NOTE = ("baseline: plain PyTorch, a variant written with torch alone in its benchmark, never a speedlib code "
                 "path (speedbench.techniques lists them)")


def _baseline_note(s: pd.DataFrame, baseline: str | None) -> str:
    """What the baselines are: plain PyTorch, unless a reader chose another variant (the
    dashboard's picker), whose ratios move with that variant's code."""
    techniques = [t for t in s["technique"].unique() if t in TECHNIQUES] if "technique" in s else []
    if baseline is None or all(baseline in TECHNIQUES[t].plain for t in techniques):
        return BASELINE_NOTE
    return (f"baseline: {baseline}, chosen here, is not plain PyTorch (speedlib's code, or another package's): a "
            "ratio against it moves with that code; each technique's own baselines are plain PyTorch")
