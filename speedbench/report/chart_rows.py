"""What the ratio, sample and value charts draw, whichever library draws them: plotly for the
static site (speedbench.report.charts), Vega-Lite for the dashboard (speedbench.report.vega).
Each bar's label and what marks it, the notes that say what a mark means, and each axis's unit
and span. No chart library here."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from speedbench import report, words
from speedbench.report.ticks import ratio_ticks

__all__ = ["config_label", "ratio_bars", "ratio_notes", "ratio_span", "samples", "sample_scale",
           "value_rows", "FLOOR_HOVER"]

# A floor chart's hover: (label, column of report.floor_figures), the floor table's text.
FLOOR_HOVER = (("achieved", "achieved_text"), ("GB/s", "gbps_text"), ("floor GB/s", "floor_gbps_text"))


def config_label(rows: pd.DataFrame) -> pd.Series:
    """A row's configuration without its variant, in the words a chart label needs: its
    benchmark class where the rows span several (they share metric names), and every
    parameter ("AdamStep: resnet50", "densenet_bc, batch=4"), so that no chart pools two
    configurations. A class every row shares is left out: a page of TrainingStep rows labelled
    each box "TrainingStep workload=..." and the labels overlapped."""
    one_class = rows["suite"].nunique() <= 1

    def label(suite, params) -> str:
        parts = ", ".join(p.removeprefix("workload=") for p in report.shared_config(params).split(", ") if p)
        return parts or str(suite) if one_class else f"{suite}: {parts}".rstrip(": ")

    return pd.Series([label(s, p) for s, p in zip(rows["suite"], rows["params"], strict=True)], index=rows.index,
                     dtype=object)


def ratio_bars(s: pd.DataFrame, y: str, color: str, exact: bool = False) -> list[tuple[str, pd.DataFrame]]:
    """`s`'s ratios as bars, one group per `color` value in sorted order, each bar labelled by its
    `y` column. Per bar: `unsure` (its interval includes 1x), `lone` (no interval: one value per
    variant, unless `exact`, counts that need none), `busy` (contended), `marks` (the tables' marks
    for contended and failed GPU tests), and the hover's words (`interval`, `n`, `said`).

    A label repeated within a group would draw two configurations as one stacked bar (a tuning
    page once showed four knobs' 0.43x-1.29x as one 3.9x bar), so it is refused."""
    out = []
    for name, g in s.groupby(color, sort=True):
        if g[y].duplicated().any():
            raise ValueError(f"chart labels repeat within {name!r}: {sorted(set(g[y][g[y].duplicated()]))}")
        unsure = (g["ratio_low"] <= 1.0) & (g["ratio_high"] >= 1.0)
        lone = pd.Series(False, index=g.index) if exact else g["ratio_low"].isna() | g["ratio_high"].isna()
        busy = report.contended(g)
        failed = report.gpu_tests_failed(g)
        n = g["n"] if "n" in g else pd.Series(math.nan, index=g.index)
        out.append((str(name), pd.DataFrame({
            "label": g[y].astype(str), "ratio": g["ratio"].where(np.isfinite(g["ratio"])),  # report.UNDEFINED: no bar
            "low": g["ratio_low"], "high": g["ratio_high"], "unsure": unsure, "lone": lone, "busy": busy,
            "marks": [" ".join(m for m, on in ((report.CONTENDED, b), (report.GPU_TESTS_FAILED, f)) if on)
                      for b, f in zip(busy, failed, strict=True)],
            "interval": [report.fmt_ratio(r, lo, hi).partition(" ")[2]
                         for r, lo, hi in zip(g["ratio"], g["ratio_low"], g["ratio_high"], strict=True)],
            "n": ["" if pd.isna(k) else f"N={k:g}" for k in n],
            "said": [("contended, not a clean figure; " if b else "")
                     + ("interval includes 1x" if u else "single value, no interval" if x else "")
                     for u, x, b in zip(unsure, lone, busy, strict=True)]}, index=g.index)))
    return out


def ratio_notes(s: pd.DataFrame, exact: bool, looks: dict[str, str]) -> list[str]:
    """What each kind of marked bar in `s` means, one line each, for the marks the chart has.
    `looks`: how the drawing library shows an `unsure`, `lone` and `busy` bar."""
    notes = []
    if ((s["ratio_low"] <= 1.0) & (s["ratio_high"] >= 1.0)).any():
        notes.append(f"{looks['unsure']}: its 99 % interval includes 1x (not told apart from the baseline)")
    if not exact and (s["ratio_low"].isna() | s["ratio_high"].isna()).any():
        notes.append(f"{looks['lone']}: a single value per variant, no interval (how sure it is is unknown)")
    if report.contended(s).any():
        notes.append(f"{looks['busy']} ({report.CONTENDED}): contended, other work kept the machine busy; "
                     "not a clean figure")
    if report.gpu_tests_failed(s).any():
        notes.append(f"{report.GPU_TESTS_FAILED}: the GPU tests failed on that machine at that commit")
    return notes


def ratio_span(s: pd.DataFrame) -> tuple[float, float, list[float]]:
    """A ratio axis's low and high ends and its ticks: log scale, so that 0.5x and 2x lie equally
    far from the 1x line. The axis spans the data and 1x, and a little more, and the ticks are
    chosen inside that span: ticks picked over a wider one left a lone "1x" in view."""
    values = pd.concat([s["ratio"], s["ratio_low"], s["ratio_high"]]).dropna()
    values = values[(values > 0) & np.isfinite(values)]  # a ratio over 0 has no value and no place on the axis
    low, high = (min(values.min(), 1.0), max(values.max(), 1.0)) if len(values) else (0.5, 2.0)
    low, high = low / 1.1, high * 1.1
    return low, high, ratio_ticks(low, high)


def sample_scale(rows: pd.DataFrame) -> tuple[float, str]:
    """The factor and unit a sample chart writes `rows`' values in: milliseconds for seconds."""
    return (1e3, "ms") if (rows["unit"] == "seconds").all() else (1.0, str(rows["unit"].iloc[0]))


def samples(rows: pd.DataFrame) -> pd.DataFrame:
    """Every timed sample of `rows`, one row each (`config`, `variant`, `value` in sample_scale's
    unit); a result without samples counts its value once."""
    scale, _ = sample_scale(rows)
    out = [(config, variant, v * scale)
           for config, variant, got, value in zip(config_label(rows), rows["variant"], rows["samples"], rows["value"],
                                                  strict=True)
           for v in (got or [value])]
    return pd.DataFrame(out, columns=["config", "variant", "value"])


def value_rows(rows: pd.DataFrame, unit: str) -> tuple[pd.DataFrame, float, str, str]:
    """A value chart's bars: `rows` with `_config` (metric, where they span several, and the
    configuration) in natural order, the factor and unit the tables write the values in, and the
    title's metrics."""
    scale, unit = (2**-30, "GiB") if unit == "bytes" and rows["value"].max() >= 2**30 else \
        (2**-20, "MiB") if unit == "bytes" else (1.0, unit)
    several = rows["metric"].nunique() > 1
    rows = rows.assign(_config=((rows["metric"].map(words.metric) + ": ") if several else "") + config_label(rows))
    rows = rows.iloc[sorted(range(len(rows)), key=lambda i: report.natural(rows["_config"].iloc[i]))]
    return rows, scale, unit, ", ".join(dict.fromkeys(words.metric(m) for m in rows["metric"]))
