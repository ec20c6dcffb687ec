"""The tables built from the tidy results: speedups, memory, paired speedups, noise, floors.

Every table is a `Table`: the frame to show, plus the result rows it was computed from, so
each export carries a provenance footer (speedbench.report.exports writes it). The history and
change tables are in speedbench.report.commits, the claims table in speedbench.report.claims, the
GPU-vs-GPU tables in speedbench.report.machines_compare, which also re-exports every name of these modules.

Ratios and their uncertainty: a speedup is baseline / variant for lower-is-better metrics
(time, memory) and variant / baseline for higher-is-better ones (bandwidth, % of floor),
on the same machine, commit and parameters. Its interval combines the two 99 % confidence
intervals asv reports, worst case against best case (baseline low / variant high, and
baseline high / variant low), so it is conservative; where asv kept no interval (track_*
benchmarks report one value), the interquartile range is used, and where there is neither
the ratio has no interval.

Paired speedups (`paired`, `paired_table`, the headline): a comparison whose variants took
turns in one process stores one ratio per round (benchmarks/common.py); the speedup is the
Hodges-Lehmann estimate of those ratios with the 99 % interval of the Wilcoxon signed-rank
test (speedbench.stats.paired says why), and N is the number of rounds. The cross-process
speedups above remain for benchmarks measured one variant per process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from speedbench.results import gpu_tests as gpu_verdicts
from speedbench.results import machines
from speedbench.results.load import COLUMNS, higher_is_better
from speedbench.stats import contention
from speedbench.stats.paired import paired_ratio, ratio_estimate
from speedbench.techniques import TECHNIQUES

__all__ = ["Table", "speedups", "speedup_table", "memory_table", "floor_table", "floor_figures", "FLOOR_FIGURES",
           "FLOOR_ONLY", "NOT_RECORDED", "NOT_A_BANDWIDTH", "noise", "noise_table",
           "NOISE_TARGET", "case_label", "latest", "newest_runs", "param_columns", "paired", "paired_table",
           "paired_noise", "PAIRED_NOISE_TARGET", "PAIRED_WIDTH_TARGET", "citable", "contended", "machine_state",
           "CONTENDED", "CONTENDED_NOTE", "gpu_tests_failed", "GPU_TESTS_FAILED", "GPU_TESTS_NOTE"]



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


# Columns this module adds to the tidy frame; everything else outside COLUMNS is a parameter.
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


def case_label(df: pd.DataFrame) -> pd.Series:
    """What tells a row apart within a technique on one machine: its workload, its other
    parameters as name=value, then its variant ("mlp / speedlib", "knob=conv_bias / on")."""
    def label(params: str, workload, variant) -> str:
        parts = [p for p in (params or "").split(", ") if p and not p.startswith(("variant=", "workload="))]
        head = [workload] if isinstance(workload, str) and workload else []
        return " / ".join([", ".join(head + parts), variant if isinstance(variant, str) else ""]).strip(" /")

    return pd.Series([label(p, w, v) for p, w, v in zip(df["params"], df["workload"], df["variant"], strict=True)],
                     index=df.index, dtype=object)


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


# A ratio with a 0 below the line (a variant that took no time, a baseline that retained no
# bytes) has no value: said so, where "infx" read as a figure.
UNDEFINED = "undefined (divides by 0)"


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


def _against_baseline(df: pd.DataFrame, kind: str, baseline: str | None) -> pd.DataFrame:
    """Speedups of one metric kind without the baseline's own rows, in table order; the GB/s
    that only the floor table reads (FLOOR_ONLY) are left out."""
    rows = df[df["kind"] == kind]
    if "metric" in rows:
        rows = rows[~rows["metric"].isin(FLOOR_ONLY)]
    s = speedups(rows, baseline)
    s = s[s["variant"] != s["baseline"]]
    return s.sort_values(["technique", "machine", "commit_date", "benchmark", *_shown(s), "variant"], kind="stable")


# Marks a row or cell measured with an earlier version of its benchmark (speedbench.results.load
# keeps a machine's newest results until it measures the current version).
EARLIER = "†"
EARLIER_NOTE = (f"{EARLIER}: measured with an earlier version of the benchmark, whose code has changed since "
                "(the machine's newest results; its next run of the benchmark replaces them)")


def earlier_version(s: pd.DataFrame) -> pd.Series:
    """Per row: measured with an earlier version of its benchmark (speedbench.results.load flags it)."""
    if "earlier_version" not in s:
        return pd.Series(False, index=s.index)
    return s["earlier_version"].fillna(False).astype(bool)


# Marks a row measured while something else kept the machine busy (speedbench.stats.contention).
CONTENDED = contention.MARK
CONTENDED_NOTE = (f"{CONTENDED}: contended: other work disturbed more than "
                  f"{contention.MAX_DISTURBED_SHARE:.0%} of the rounds (or left fewer than "
                  f"{contention.MIN_CLEAN_ROUNDS} undisturbed), so the figure is shown but is not a clean one: "
                  "rerun it on a quiet machine (speedlib env --check says what is busy; speedlib run --require-quiet "
                  "refuses to measure on a busy one)")


def contended(s: pd.DataFrame) -> pd.Series:
    """Per row: measured on a machine busy enough that the figure is not a clean one; for a
    row that divides two results (one machine against another: `contention_base`), either."""
    busy = pd.Series(False, index=s.index)
    for column in ("contention", "contention_base"):
        if column in s:
            busy |= s[column].eq(contention.CONTENDED)
    return busy


# Marks a row measured at a commit whose GPU-only tests failed on its machine (the verdict
# `speedlib slot` keeps in results/<machine>/gpu-tests/: speedbench.results.gpu_tests).
GPU_TESTS_FAILED = "§"
GPU_TESTS_NOTE = (f"{GPU_TESTS_FAILED}: the GPU-only tests failed on that machine at that commit (speedlib slot's "
                  "verdict): the figure was measured, but the code behind it did not pass its own GPU tests there; "
                  "the failing tests are named below")


def gpu_tests_failed(s: pd.DataFrame) -> pd.Series:
    """Per row: measured at a commit whose GPU tests failed on its machine; for a row that
    divides two results (`gpu_tests_base`: one machine against another), on either."""
    failed = pd.Series(False, index=s.index)
    for column in ("gpu_tests", "gpu_tests_base"):
        if column in s:
            failed |= s[column].eq(gpu_verdicts.FAILED)
    return failed


def _gpu_tests_notes(s: pd.DataFrame) -> list[str]:
    """The section mark's note and each failing verdict (machine, commit, the tests that
    failed); then, in one line, the verdicts of the other GPU machines' commits here, "not
    recorded" included: a GPU figure with no verdict must not read as one that passed. CPU
    machines (not applicable) are left out."""
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for suffix in ("", "_base"):
        if f"gpu_tests{suffix}" not in s:
            continue
        machine = s[f"machine{suffix}"] if f"machine{suffix}" in s else s["machine"]
        commit = s[f"commit{suffix}"] if f"commit{suffix}" in s else s["commit"]
        for m, c, state, note in zip(machine, commit, s[f"gpu_tests{suffix}"],
                                     s[f"gpu_tests_note{suffix}"], strict=True):
            if isinstance(state, str) and state != gpu_verdicts.NOT_APPLICABLE:
                seen.setdefault((m, c), (state, note))
    failed = [f"{GPU_TESTS_FAILED} {m} {c[:8]}: GPU tests {note}"
              for (m, c), (state, note) in sorted(seen.items()) if state == gpu_verdicts.FAILED]
    others: dict[str, list[str]] = {}
    for (m, c), (state, _) in sorted(seen.items()):
        if state != gpu_verdicts.FAILED:
            others.setdefault(state, []).append(f"{m} {c[:8]}")
    said = "; ".join(f"{state}: {', '.join(where)}" for state, where in others.items())
    return ([GPU_TESTS_NOTE, *failed] if failed else []) + ([f"GPU tests (speedlib slot) at these commits: {said}"]
                                                             if said else [])


def _commit_label(s: pd.DataFrame) -> pd.Series:
    """The short commit, with the dagger where the row comes from an earlier benchmark version,
    the double dagger where the machine was contended while it was measured, and the section
    mark where the commit's GPU tests failed on that machine."""
    return (s["commit"].str[:8] + earlier_version(s).map({True: f" {EARLIER}", False: ""})
            + contended(s).map({True: f" {CONTENDED}", False: ""})
            + gpu_tests_failed(s).map({True: f" {GPU_TESTS_FAILED}", False: ""}))


def with_earlier_note(notes: list[str], s: pd.DataFrame) -> list[str]:
    """`notes` and the notes of the marks that `s` carries: the dagger's, the double dagger's
    and each contended result's counters, the section mark's and the GPU tests' verdicts."""
    out = notes + [EARLIER_NOTE] if earlier_version(s).any() else list(notes)
    out += _gpu_tests_notes(s)
    busy = s[contended(s)]
    if not busy.empty:
        out.append(CONTENDED_NOTE)
        where = busy["benchmark"].str.rsplit(".", n=1).str[0] + busy["params"].map(
            # the configuration: which of a class's rounds
            lambda p: f" ({shared_config(p)})" if shared_config(p) else "")
        for (machine, commit, bench, note), _ in busy.groupby(["machine", "commit", where, "contention_note"],
                                                              sort=True):
            out.append(f"{CONTENDED} {machine} {commit[:8]} {bench}: {note}")
    return out


_STATE_WORDS = {contention.CLEAN: "quiet: no round disturbed", contention.UNKNOWN: "not recorded", "": "not recorded"}


def machine_state(s: pd.DataFrame) -> pd.Series:
    """Per row, what the interference counters said, in a few words: "quiet: no round
    disturbed", "2 disturbed rounds left out of 15 (...)", "‡ contended: ...", or "not
    recorded" (measured before speedlib recorded them). The CSV's `contention` column holds
    the same verdict as clean, dropped, contended or unknown."""
    if "contention" not in s:
        return pd.Series("not recorded", index=s.index, dtype=object)
    notes = s["contention_note"] if "contention_note" in s else pd.Series("", index=s.index)
    return pd.Series([_STATE_WORDS.get(state) or (f"{CONTENDED} {note}" if state == contention.CONTENDED else note)
                      for state, note in zip(s["contention"].fillna(""), notes.fillna(""), strict=True)],
                     index=s.index, dtype=object)


def citable(df: pd.DataFrame) -> pd.DataFrame:
    """`latest(df)`, but where its result is contended and the same machine measured the same
    benchmark and parameters without contention at an earlier commit, the newest such result
    instead: what a headline or a claim cites. The commit column shows which was taken; a
    contended result stays (marked) where no clean one exists."""
    last = latest(df)
    busy = last[contended(last)]
    if busy.empty:
        return last
    keys = ["machine", "benchmark", "params"]
    clean = df[~contended(df)].merge(busy[keys].drop_duplicates(), on=keys, how="inner", suffixes=("", ""))
    if clean.empty:
        return last
    # the newest clean result of each key (clean keeps df's columns; merge resets the index)
    newest = clean.sort_values("commit_date", ascending=False, kind="stable").drop_duplicates(keys)
    replaced = last.merge(newest[keys], on=keys, how="left", indicator=True)["_merge"].eq("both").to_numpy()
    return pd.concat([last[~(contended(last).to_numpy() & replaced)], newest[last.columns]], ignore_index=True)


def _identity(s: pd.DataFrame) -> dict:
    """The leading columns every per-result table shows: where and what was measured."""
    return {"machine": s["machine"], "GPU": s["gpu"], "commit": _commit_label(s), "benchmark": s["benchmark"],
            **{p: s[p] for p in _shown(s)}}


def _numbers(s: pd.DataFrame, **columns) -> pd.DataFrame:
    """A table's rows as numbers: where and what was measured (full commit hash), then
    `columns`, then N and the result ID that names the measured result."""
    def column(name: str):  # frames built by hand (tests, other tools) may lack some
        return s[name] if name in s else pd.Series([""] * len(s), index=s.index, dtype=object)

    return pd.DataFrame({
        "machine": column("machine"), "gpu": column("gpu"), "commit": column("commit"),
        "technique": column("technique"), "benchmark": column("benchmark"), **{p: s[p] for p in _shown(s)},
        **({"variant": s["variant"]} if "variant" in s else {}),
        **columns, "N": column("n"),
        # the marks as columns, so a script can filter on them: †, ‡ and §
        "earlier_version": earlier_version(s), "contended": contended(s),
        "contention": column("contention"), "gpu_tests_failed": gpu_tests_failed(s),
        # the commit's GPU tests on the machine: passed, failed, incomplete, none ran, not recorded, not applicable
        "gpu_tests": column("gpu_tests"), "result_id": column("result_id"),
    }).reset_index(drop=True)


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


# --- paired speedups ------------------------------------------------------------------------

# Targets for paired ratios on a shared 2-core machine: two runs of one commit agree within
# 5 %, and a ratio's 99 % interval spans less than 1.10x (high / low).
PAIRED_NOISE_TARGET = 0.05
PAIRED_WIDTH_TARGET = 1.10


def shared_config(params: str) -> str:
    """A row's parameters without its variant: the configuration its variants share."""
    return ", ".join(p for p in (params or "").split(", ") if p and not p.startswith("variant="))


def why_wide(ratios, width: float) -> str:
    """Why an interval is wider than PAIRED_WIDTH_TARGET, from its own rounds: the Wilcoxon
    interval's width follows from the number of rounds and how far their ratios spread, so
    the reason names both ("" where the interval is within the target or has none)."""
    if not (width > PAIRED_WIDTH_TARGET):
        return ""
    q25, q75 = np.percentile(np.asarray(ratios, dtype=float), [25, 75])
    few = f"only {len(ratios)} rounds, " if len(ratios) < 15 else ""
    return (f"{few}the middle half of {len(ratios)} per-round ratios spans {q25:.3g}x-{q75:.3g}x "
            f"({(q75 / q25 - 1) * 100:.0f} % apart)")


def _comparison(benchmarks, configs) -> list[str]:
    """A paired comparison in a few words: its class and configuration, the workload by name
    alone ("TrainingStep resnet50", "TrainingStep knob=channels_last")."""
    return [f"{b.split('.')[1]} {c.replace('workload=', '')}".strip() for b, c in zip(benchmarks, configs, strict=True)]


def paired(df: pd.DataFrame) -> pd.DataFrame:
    """One row per paired speedup measured (kind "paired speedup", samples kept).

    Columns added: config (the parameters but the variant), baseline (the technique's
    baseline among the variants the class timed; a technique's class timed without one, its
    baseline then a speedlib code path, is left out), ratio, ratio_low, ratio_high (Hodges-
    Lehmann, 99 % Wilcoxon interval; NaN below 8 rounds), n (rounds), width (high / low),
    wide_because (why the interval is wider than PAIRED_WIDTH_TARGET, else "") and dropped
    (disturbed rounds left out: speedbench.stats.contention; `samples` and n are what remains).
    """
    s = df[(df["kind"] == "paired speedup") & (df["samples"].map(len) > 0)].copy() if "samples" in df else df.iloc[0:0]
    if s.empty:
        return s.assign(config=[], baseline=[], ratio=[], ratio_low=[], ratio_high=[], width=[], wide_because=[],
                        dropped=[])
    # Disturbed rounds are left out where the verdict says enough others remain (DROPPED).
    kept = [contention.keep(x, state, disturbed) if isinstance(disturbed, list) else list(x)
            for x, state, disturbed in zip(s["samples"], s.get("contention", [""] * len(s)),
                                           s.get("disturbed", [None] * len(s)), strict=True)]
    s["dropped"] = [len(x) - len(k) for x, k in zip(s["samples"], kept, strict=True)]
    s["samples"] = kept
    estimates = [ratio_estimate(x) for x in s["samples"]]
    s["ratio"] = [e.ratio for e in estimates]
    s["ratio_low"] = [e.low for e in estimates]
    s["ratio_high"] = [e.high for e in estimates]
    s["n"] = [e.n for e in estimates]
    s["width"] = s["ratio_high"] / s["ratio_low"]
    s["wide_because"] = [why_wide(x, w) for x, w in zip(s["samples"], s["width"], strict=True)]
    s["config"] = s["params"].map(shared_config)
    # The baseline: the variant of the same class and configuration that has times but, being
    # the reference, no speedup of its own; the technique's preference order breaks ties.
    timed = df[df["benchmark"].str.endswith(".track_seconds")]
    variants: dict[tuple, set] = {}
    for m, c, b, params, v in zip(timed["machine"], timed["commit"], timed["benchmark"], timed["params"],
                                  timed["variant"], strict=True):
        variants.setdefault((m, c, b.rsplit(".", 1)[0], shared_config(params)), set()).add(v)

    def baseline(machine, commit, benchmark, technique, config) -> str:
        key = (machine, commit, benchmark.rsplit(".", 1)[0], config)
        chain = TECHNIQUES[technique].baselines if technique in TECHNIQUES else ()
        found = variants.get(key, set())
        return next((b for b in chain if b in found), "")

    s["baseline"] = [baseline(*k)
                     for k in zip(s["machine"], s["commit"], s["benchmark"], s["technique"], s["config"], strict=True)]
    # Where none of a technique's class's variants is a baseline, its per-round speedups are
    # against a speedlib code path (transfer's classes before their plain-PyTorch variants
    # existed had speedlib's own pinned / pageable backend as baseline): a speedlib path is
    # never a baseline. (A benchmark of no known technique has no baselines to tell.)
    s = s[(s["baseline"] != "") | ~s["technique"].isin(list(TECHNIQUES))]
    # The headline's variant against the other baselines the overview shows it against (issue 44:
    # the H100 cell's 5.65x vs foreach was in no other table): one comparison, one number everywhere.
    others = _against_others(df, s)
    s = pd.concat([s, *others], ignore_index=True) if others else s
    # each variant's ratio against its class's baseline first, then against the others (their rows
    # are the variant's seconds rows: by class, not by benchmark, or they would lead)
    order = s.assign(_class=s["benchmark"].str.rsplit(".", n=1).str[0], _other=s["benchmark"].str.endswith(
        ".track_seconds")).sort_values(["technique", "machine", "commit_date", "_class", "config", "variant",
                                        "_other"], kind="stable")
    return s.loc[order.index]


def other_baselines(h) -> list[str]:
    """The baselines headline comparison `h` (speedbench.techniques.Headline) is shown against
    besides its source's: PyTorch's defaults, then `h.beside`."""
    return [b for b in dict.fromkeys([*(v for _, v in h.default), *h.beside]) if b != h.baseline]


def headline_rows(rows: pd.DataFrame, h) -> pd.DataFrame:
    """The rows of headline `h`'s variant at its fixed parameters (rows already of its class)."""
    keep = (rows["technique"] == h.technique) & (rows["variant"] == h.variant)
    for column, value in h.where:
        keep &= (rows[column] == value) if column in rows else False
    return rows[keep]


def _against_others(df: pd.DataFrame, pairs: pd.DataFrame) -> list[pd.DataFrame]:
    """Each paired headline's (and its whole step's) variant against `other_baselines`, from
    the same rounds (`against`); none where `pairs` already holds that comparison (an old
    run whose class baseline was one of them)."""
    if not {"suite", "samples"} <= set(df.columns):  # frames built by hand may hold neither
        return []
    def comparisons(rows: pd.DataFrame):  # one per machine, commit, class, configuration, variant and baseline
        return zip(rows["machine"], rows["commit"], rows["benchmark"].str.rsplit(".", n=1).str[0], rows["config"],
                   rows["variant"], rows["baseline"], strict=True)

    held = set(comparisons(pairs))
    out = []
    for t in TECHNIQUES.values():
        for h in (t.comparison, t.comparison.whole if t.comparison else None):
            if h is None or not h.paired:
                continue
            own = df[(df["technique"] == h.technique) & (df["suite"] == h.suite)]
            for other in other_baselines(h):
                rows = against(own, h, other)
                if rows.empty:
                    continue
                out.append(rows[[k not in held for k in comparisons(rows)]])
    return out


def against(own: pd.DataFrame, h, other: str) -> pd.DataFrame:
    """Headline `h`'s variant against `other`, another variant of its paired class, as
    `paired` gives it against the class's baseline. The class stores per-round speedups
    against that baseline only; the two variants' seconds of the same rounds give this ratio
    just as paired (round i of each, speedbench.stats.paired.paired_ratio). A row is the
    variant's own seconds row with the ratio's columns, its samples the per-round ratios and
    `other`'s seconds row as its baseline's result ID."""
    if own.empty or "samples" not in own:  # frames built by hand may hold no samples
        return own.iloc[0:0]
    seconds = own[own["benchmark"].str.endswith(".track_seconds")]
    theirs = seconds[seconds["variant"] == other]
    found = {(m, c, b, shared_config(p)): (x, i, e) for m, c, b, p, x, i, e in zip(
        theirs["machine"], theirs["commit"], theirs["benchmark"], theirs["params"], theirs["samples"],
        theirs["result_id"] if "result_id" in theirs else [None] * len(theirs), earlier_version(theirs),
        strict=True)}
    mine = headline_rows(seconds, h) if not seconds.empty else seconds
    out = []
    for (_, r), mine_earlier in zip(mine.iterrows(), earlier_version(mine), strict=True):
        config = shared_config(r["params"])
        samples, result_id, earlier = found.get((r["machine"], r["commit"], r["benchmark"], config),
                                                (None, None, False))
        if not isinstance(samples, list) or not isinstance(r["samples"], list) or len(samples) != len(r["samples"]):
            continue  # `other` did not run in these rounds
        # the rounds `paired` keeps: both variants' seconds come from the same rounds, so the
        # variant's verdict on them drops the same disturbed rounds from both
        state, disturbed = r.get("contention", ""), r.get("disturbed")
        disturbed = disturbed if isinstance(disturbed, list) else []
        theirs_kept, mine_kept = (contention.keep(x, state, disturbed) for x in (samples, r["samples"]))
        try:
            e = paired_ratio(theirs_kept, mine_kept)
        except ValueError:  # a time no measurement can have: no ratio rather than a wrong one
            continue
        ratios = [b / v for b, v in zip(theirs_kept, mine_kept, strict=True)]
        out.append({**r.to_dict(), "kind": "paired speedup", "samples": ratios, "baseline": other,
                    "ratio": e.ratio, "ratio_low": e.low, "ratio_high": e.high, "n": e.n,
                    "width": e.high / e.low, "wide_because": why_wide(ratios, e.high / e.low),
                    "config": config, "result_id_base": result_id, "earlier_version": bool(mine_earlier or earlier),
                    "dropped": len(samples) - len(theirs_kept)})
    return pd.DataFrame(out) if out else own.iloc[0:0]


def paired_table(df: pd.DataFrame) -> Table:
    """Paired speedups: the headline of every comparison measured with variants taking turns."""
    s = paired(df)
    frame = pd.DataFrame({
        "machine": s["machine"], "GPU": s["gpu"], "commit": _commit_label(s),
        # "TrainingStep workload=resnet50" is a class of amp, tuning and checkpoint alike
        "technique": s["technique"],
        "comparison": _comparison(s["benchmark"], s["config"]),
        "variant": s["variant"], "baseline": s["baseline"],
        "speedup": [fmt_ratio(r, lo, hi) + (f" {CONTENDED}" if busy else "")
                    for r, lo, hi, busy in zip(s["ratio"], s["ratio_low"], s["ratio_high"], contended(s), strict=True)],
        "N": s["n"],
        "machine state": machine_state(s),
        f"why wider than {PAIRED_WIDTH_TARGET:.2f}x": s["wide_because"],
    })
    wide = int((s["width"] > PAIRED_WIDTH_TARGET).sum())
    notes = ["speedup = baseline / variant per round, variants taking turns in one process; >1: the variant is faster",
             BASELINE_NOTE,
             "estimate: Hodges-Lehmann of the per-round ratios; [low, high]: 99 % interval from the Wilcoxon "
             "signed-rank test (none below 8 rounds); N: rounds (disturbed rounds left out, see machine state)",
             f"{wide} of {len(s)} intervals wider than {PAIRED_WIDTH_TARGET:.2f}x (high / low)" if len(s) else
             "no paired comparison measured"]
    data = _numbers(s, config=s["config"], **_ratio_numbers(s), width=s["width"], dropped=s["dropped"],
                    interference=s["contention_note"] if "contention_note" in s else "")
    return Table("Paired speedup", frame.reset_index(drop=True), s, with_earlier_note(notes, s), data)


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


# Per fraction-of-floor metric, the two figures in GB/s that its benchmark class reports from
# the same measurement, each a metric of that class: (the bandwidth achieved, the floor it was
# divided by). None: the class divides by a floor whose GB/s it does not report
# (bench_contiguous.AdamStep times the streaming bandwidth in its process and keeps only the %;
# its step_bandwidth is the numerator, from the same rounds). A metric not listed divides by
# something that is no bandwidth (bench_parallel's % of linear scaling): no GB/s applies.
FLOOR_FIGURES: dict[str, tuple[str, str | None]] = {
    "gather_fraction_of_floor": ("gather_bandwidth", "h2d_floor"),
    "scatter_fraction_of_floor": ("scatter_bandwidth", "d2h_floor"),
    "fraction_of_floor": ("step_bandwidth", None),
}
# GB/s rows that are read only beside their % in the floor table, and so left out of the
# bandwidth speedup table (the "Bandwidth and floor" tab's second table): there they would be
# a confusing duplicate. A floor's variant / baseline ratio compares two timings of the same
# bulk copy (each variant's process timed its own), which says nothing about the variant; the
# achieved GB/s of two variants, each from its own process, compare what Transfer.track_bandwidth
# compares with the backends taking turns in one process, and the claims already read that
# ratio from the %. AdamStep's step_bandwidth stays there: it was there before the floor table
# showed it, and its ratio is the flat buffer's speedup in bandwidth. Machine-against-machine
# tables keep all of them: two machines' floors are what a reader compares buses with.
FLOOR_ONLY = frozenset({"gather_bandwidth", "scatter_bandwidth", "h2d_floor", "d2h_floor"})
# What the GB/s columns say where a run recorded no such figure, and where none applies.
NOT_RECORDED = "not recorded"
NOT_A_BANDWIDTH = "n/a"
# A class's track_* processes run one after another right after its setup_cache measured them
# all (at most 30 minutes): a GB/s whose run started further from its %'s than this came from
# another run of the same commit (asv keeps each benchmark's newest entry in the commit's file,
# so a run of the % alone leaves an older GB/s beside it), and is not this measurement's.
_SAME_RUN = pd.Timedelta(hours=1)


def _fmt_gbps(value: float) -> str:
    return f"{value:.1f} GB/s" if value >= 1 else f"{value:.3g} GB/s"


def _metric_of(row: dict) -> str:
    """A row's metric; frames built by hand may carry only the benchmark's name."""
    metric = row.get("metric")
    if isinstance(metric, str) and metric:
        return metric
    return str(row.get("benchmark", "")).rsplit(".", 1)[-1].split("_", 1)[-1]


def _run_of(row: dict, metric: str) -> tuple:
    """Where a figure of `row`'s measurement is found: machine, commit, result file, benchmark
    class and parameters, and its metric."""
    file = row.get("file")
    return (row.get("machine"), row.get("commit"), None if not isinstance(file, str) else file,
            str(row.get("benchmark", "")).rsplit(".", 1)[0], row.get("params", ""), metric)


def _same_run(row: dict, candidates: list[tuple[object, dict]]):
    """The candidate (index, row) measured in `row`'s run, the closest in time; None (also
    where either has no start time: then nothing says they are one run)."""
    when = row.get("run_date")
    near = []
    for index, other in candidates:
        other_when = other.get("run_date")
        if pd.isna(when) or pd.isna(other_when):
            continue
        gap = abs(other_when - when)
        if gap <= _SAME_RUN:
            near.append((gap, index, other))
    return min(near, key=lambda g: g[0])[1:] if near else None


def _made_of(value: float, gbps: float, floor: float) -> bool:
    """Whether a % is exactly these two GB/s (FractionOfFloor computes it from them), up to
    rounding: a pair from another measurement would not divide to it."""
    return floor > 0 and math.isclose(100.0 * gbps / floor, value, rel_tol=1e-6, abs_tol=1e-9)


def _gbps_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of `df` that are a GB/s term of some % of a floor (FLOOR_FIGURES)."""
    if "metric" not in df:
        return df.iloc[0:0]
    wanted = {m for pair in FLOOR_FIGURES.values() for m in pair if m}
    return df[df["kind"].eq("bandwidth") & df["metric"].isin(wanted)]


def floor_figures(df: pd.DataFrame) -> pd.DataFrame:
    """The fraction-of-floor rows of `df` in the floor table's order, each with the two GB/s of
    its own measurement beside it (FLOOR_FIGURES): `gbps`, the bandwidth achieved, and
    `floor_gbps`, the floor it was divided by (NaN where there is none); `achieved_text` (the %),
    `gbps_text` and `floor_gbps_text` as the table and the charts show them ("12.5 GB/s", NOT_RECORDED where
    the run recorded none, NOT_A_BANDWIDTH where the floor is no bandwidth), and the result IDs
    they come from. A figure is matched by machine, commit, result file, benchmark class and
    parameters (variant, workload), within one run (_SAME_RUN): gather with the host->device
    floor, write-back with device->host, as the class names them. No GB/s is ever computed
    from the % with a floor measured in another process."""
    return _floor_figures(df)[0]


def _floor_figures(df: pd.DataFrame) -> tuple[pd.DataFrame, list]:
    """floor_figures(df), and the index in `df` of each GB/s row it took."""
    s = df[df["kind"] == "fraction of floor"].sort_values(["technique", "machine", "commit_date", "benchmark"],
                                                          kind="stable")
    figures = _gbps_rows(df)
    found: dict[tuple, list] = {}
    for index, row in zip(figures.index, figures.to_dict("records"), strict=True):
        found.setdefault(_run_of(row, row["metric"]), []).append((index, row))
    out: dict[str, list] = {c: [] for c in ("gbps", "floor_gbps", "gbps_text", "floor_gbps_text", "gbps_result_id",
                                            "floor_gbps_result_id")}
    used = []
    for row in s.to_dict("records"):
        pair = FLOOR_FIGURES.get(_metric_of(row))
        matches = [_same_run(row, found.get(_run_of(row, metric), [])) if metric else None
                   for metric in (pair or (None, None))]
        if pair is not None and pair[1] is not None and (
                any(m is None for m in matches)
                or not _made_of(row["value"], matches[0][1]["value"], matches[1][1]["value"])):
            # Both terms of the %, checked against it, or neither: a lone figure, or a pair the
            # % was not made of, would be another measurement's.
            matches = [None, None]
        for column, match in zip(("gbps", "floor_gbps"), matches, strict=True):
            if match is None:
                value, text, rid = math.nan, NOT_A_BANDWIDTH if pair is None else NOT_RECORDED, None
            else:
                index, figure = match
                used.append(index)
                value, text, rid = figure["value"], _fmt_gbps(figure["value"]), figure.get("result_id")
            out[column].append(value)
            out[f"{column}_text"].append(text)
            out[f"{column}_result_id"].append(rid)
    s = s.assign(achieved_text=pd.Series([f"{v:.1f} %" for v in s["value"]], index=s.index, dtype=object),
                 **{c: pd.Series(v, index=s.index, dtype=float if c in ("gbps", "floor_gbps") else object)
                    for c, v in out.items()})
    return s, list(dict.fromkeys(used))


def _figure_notes(s: pd.DataFrame, df: pd.DataFrame, shown) -> list[str]:
    """What the GB/s columns' "not recorded" and "n/a" mean for the rows of `s`
    (floor_figures); `df`, the rows they were looked for in, says why one is missing;
    `shown`, the GB/s columns the table draws (an "n/a" nobody sees needs no note)."""
    notes = []
    metrics = pd.Series([_metric_of(r) for r in s.to_dict("records")], index=s.index, dtype=object)
    none = s[s["gbps_text"].eq(NOT_A_BANDWIDTH)]
    if not none.empty and "GB/s" in shown:
        refs = ", ".join(sorted(set(none["unit"].fillna("").str.removeprefix("% of "))))
        notes.append(f"{NOT_A_BANDWIDTH}: the floor ({refs}) is no bandwidth, so no GB/s applies")
    classes = s["benchmark"].str.rsplit(".", n=1).str[0]
    unreported = s[s["floor_gbps_text"].eq(NOT_RECORDED)
                   & metrics.map(lambda m: m in FLOOR_FIGURES and FLOOR_FIGURES[m][1] is None)]
    for cls, rows in unreported.groupby(classes, sort=True):
        notes.append(f"floor GB/s {NOT_RECORDED} for {cls}: it times its floor "
                     f"({rows['unit'].iloc[0].removeprefix('% of ')}) in the same process but reports only the %")
    # The GB/s a run has at all, per machine, commit and class: none means its benchmark had
    # no such tracks at that commit (asv records every method of a class it runs).
    figures = _gbps_rows(df)
    has = set(zip(figures["machine"], figures["commit"], figures["benchmark"].str.rsplit(".", n=1).str[0], strict=True))
    predate, apart = [], []
    # A run is its machine and commit; where every row is one machine's (a dashboard page, which
    # names it above the table) the machine is left out: the note is Markdown there, and a
    # machine's name comes from a result file.
    several = s["machine"].nunique() > 1
    for (machine, commit, cls), rows in s.groupby(["machine", "commit", classes], sort=True):
        lacking = [(m, i)
                   for m, g, f in zip(metrics[rows.index], rows["gbps_text"], rows["floor_gbps_text"], strict=True)
                   if m in FLOOR_FIGURES for i, text in enumerate((g, f))
                   if text == NOT_RECORDED and FLOOR_FIGURES[m][i] is not None]
        if lacking:
            run = f"{f'{machine} ' if several else ''}{commit[:8]} {cls.rsplit('.', 1)[-1]}"
            (apart if (machine, commit, cls) in has else predate).append(run)
    if predate:
        notes.append(f"{NOT_RECORDED}: no GB/s result exists for " + "; ".join(predate) + ": the benchmark had "
                     "no GB/s tracks at that commit (or that run measured only the %). The next run of it records "
                     "them; none is made from a % and a floor timed in another process")
    if apart:
        notes.append(f"{NOT_RECORDED}: " + "; ".join(apart) + " recorded GB/s, but not in the run that measured "
                     "the % (or not the two it was computed from), so none is shown beside it")
    return notes


def floor_table(df: pd.DataFrame) -> Table:
    """Benchmarks that report their result as a fraction of a physical floor, each beside the
    GB/s it achieved and the floor's GB/s it was divided by, both from the same measurement
    (floor_figures); `df` may hold every kind: the GB/s are its bandwidth rows. A GB/s column
    is shown where at least one row has a figure in it; the notes say why the others have none."""
    s, used = _floor_figures(df)
    figures = df.loc[used]
    shown = {name: s[f"{column}_text"] for name, column in (("GB/s", "gbps"), ("floor GB/s", "floor_gbps"))
             if s[column].notna().any()}
    frame = pd.DataFrame({
        **_identity(s), **({"variant": s["variant"]} if "variant" in s else {}),
        "achieved": s["achieved_text"], "of": s["unit"].str.removeprefix("% of "), **shown, "N": s["n"],
    })
    data = _numbers(s, value=s["value"], unit=s["unit"], low=s["ci99_low"], high=s["ci99_high"],
                    gbps=s["gbps"], floor_gbps=s["floor_gbps"], gbps_result_id=s["gbps_result_id"],
                    floor_gbps_result_id=s["floor_gbps_result_id"])
    said = {"GB/s": "GB/s: the bandwidth achieved", "floor GB/s": "floor GB/s: the floor it was divided by"}
    notes = ["floor: measured in the same benchmark process (see the benchmark's docstring)"
             + (f"; {', '.join(said[c] for c in shown)}, from that process"
                + (" (achieved = 100 x GB/s / floor GB/s)" if len(shown) == 2 else "") if shown else "")]
    if (s["value"] > 100).any():  # a reader would take a floor for a ceiling and suspect the number
        notes.append(FLOOR_ABOVE_NOTE)
    notes += _figure_notes(s, df, shown)
    # the GB/s rows are sources too: their result IDs and the command that measures them again
    sources = pd.concat([s, figures]) if len(figures) else s
    return Table("Fraction of the physical floor", frame.reset_index(drop=True), sources, with_earlier_note(notes, s),
                 data)


# Why a value can pass 100 %: the committed CPU results put the flat-buffer Adam step at
# 105-113 % of the in-place add in four runs, and a device-resident table gathers at 670 % of
# the host->device copy.
FLOOR_ABOVE_NOTE = ("above 100 %: the floor is a reference timed in the same process, not a ceiling. A "
                    "device-resident table never crosses the host link it is set against; a step that streams "
                    "memory can beat the in-place adds its floor was timed from once before its rounds (a shared "
                    "machine's bandwidth varies over a run): read such a value as at the floor")
