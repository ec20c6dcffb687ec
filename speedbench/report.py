"""Tables from the tidy results: speedups, memory, floors, history, GPU vs GPU, claims.

Every table is a `Table`: the frame to show, plus the result rows it was computed from, so
each export carries a provenance footer (per run: the result IDs, commit, machine, GPU, driver,
CUDA, torch, statistic and N, date, and the command that reproduces the measurement). Exports go
to Markdown, CSV and LaTeX (`to_markdown`, `to_csv`, `to_latex`); names in them come from result
files, so each format escapes every cell, the title and the footer for its reader: control
characters as escapes everywhere, spreadsheet formulas neutralised in CSV, HTML and link syntax
in Markdown, every special character in LaTeX. No Streamlit import: the dashboard and the
`speedlib report` command share this module.

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
test (speedbench.paired says why), and N is the number of rounds. The cross-process
speedups above remain for benchmarks measured one variant per process.

Significance (history, `speedlib report --fail-on-regression`) follows asv compare 0.6: see
`differ` and `history`. The statistics are implemented here (numpy only), so that viewing
results needs neither asv nor scipy.
"""

from __future__ import annotations

import functools
import math
import re
import shlex
import urllib.parse
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd

import speedlib
from speedbench import contention, machines, plan
from speedbench.paired import ratio_estimate
from speedbench.results import COLUMNS, higher_is_better, printable

__all__ = ["Claim", "CLAIMS", "TECHNIQUES", "Table", "speedups", "speedup_table", "memory_table",
           "floor_table", "noise", "noise_table", "NOISE_TARGET", "case_label", "history", "history_table", "compare_machines", "machine_comparison", "same_work", "speedup_comparison", "is_own_baseline", "why_not_measured", "never_run", "bibtex", "claims_table", "latest",
           "newest_runs", "param_columns", "provenance", "reproduce_command", "is_commit", "to_markdown", "to_csv", "to_latex",
           "SIGNIFICANCE_FACTOR", "P_THRESHOLD", "MIN_SEGMENT", "MannWhitney", "mann_whitney_u", "differ",
           "resolve_commit", "compare_commits", "change_table", "paired", "paired_table", "paired_noise",
           "PAIRED_NOISE_TARGET", "PAIRED_WIDTH_TARGET", "citable", "contended", "machine_state", "CONTENDED",
           "CONTENDED_NOTE"]


@dataclass(frozen=True)
class Technique:
    title: str
    baseline: str  # the variant every other variant is compared with
    headline: str  # the metric the overview shows where no paired headline was measured
    # Baselines for benchmarks that have no `baseline` variant, in order of preference
    # (DataParallel does not run on CPUs; some benchmarks switch one option off and on).
    fallbacks: tuple[str, ...] = ()
    # The class whose paired speedups (variants taking turns in one process) are the headline.
    suite: str | None = None

    @property
    def baselines(self) -> tuple[str, ...]:
        return (self.baseline, *self.fallbacks)


# The baselines are what each technique's source write-up compared against.
TECHNIQUES = {
    "contiguous": Technique("Flat-buffer (contiguous) parameters", "forloop", "adam_step", suite="AdamStep"),
    # pinned is the GPU baseline; CPUs run only pageable tables (and the sparse_adam reference)
    "transfer": Technique("Host<->GPU transfer and CPU-hosted embeddings", "pinned", "gather", ("pageable",),
                          suite="Transfer"),
    "checkpoint": Technique("Activation checkpointing", "none", "step", suite="TrainingStep"),
    "amp": Technique("Mixed precision", "fp32", "step", suite="TrainingStep"),
    # DDP and DataParallel are separate launches, not pairable: the headline is their step times
    "parallel": Technique("DistributedDataParallel vs DataParallel", "dataparallel", "step", ("single", "off")),
    "tuning": Technique("Performance Tuning Guide knobs", "off", "step", suite="TrainingStep"),
}


@dataclass(frozen=True)
class Claim:
    """A source's published figure and where speedlib measures the same thing."""

    technique: str
    source: str
    claim: str
    claimed: float | None  # as a ratio in the direction of `measured_as`; None: no figure given
    claimed_high: float | None
    measured_as: str  # "speedup" (x faster) or "memory ratio" (variant / baseline)
    metric: str
    variant: str
    baseline: str
    workload: str | None = None  # the model the figure was measured on, where only that one compares
    # The class that measures it with variants taking turns (a paired speedup, preferred when
    # measured), and parameters the comparison is fixed at, e.g. (("op", "gather"),).
    suite: str | None = None
    where: tuple[tuple[str, str], ...] = ()
    # The device the source measured on; None where the figure is a count that does not
    # depend on it (bytes of memory). A CPU result beside a GPU claim is not comparable.
    hardware: str | None = "a GPU"
    # A metric that measures the same comparison another way, used where neither the paired
    # class nor `metric` ran: each transfer variant's bandwidth as a % of the pinned copy in
    # its own process, so the ratio of two variants' % is the ratio of their bandwidths.
    also: str | None = None
    # The class that measures `metric`, where it is not `suite`: a claim not measured yet
    # says which `speedlib run` would measure it (speedbench.plan.how_to_measure).
    measured_by: str | None = None
    # Devices the claim is about: DDP against DataParallel means nothing on one GPU.
    devices: int = 1

    @property
    def how_to_measure(self) -> str:
        on = f"a machine with {self.devices} or more GPUs" if self.devices > 1 else "a GPU"
        return f"{plan.how_to_measure(f'bench_{self.technique}.{self.measured_by or self.suite}.')} on {on}"


def comparable(gpu: str, claim: Claim, world=None) -> str:
    """Whether a result on `gpu` (with `world` devices, where the result says) can be set
    beside `claim`, in words."""
    if claim.devices > 1 and pd.notna(world) and str(world).isdigit() and int(world) < claim.devices:
        return (f"no: world={world}, a single device, where the claim is about splitting the work over "
                f"{claim.hardware}")
    if claim.hardware is None:
        return "yes: an exact count, the same on any device"
    if gpu in ("CPU only", "unknown", "") or gpu.startswith("none"):
        return f"no: a CPU result beside a claim measured on {claim.hardware}"
    if claim.measured_as == "memory ratio":  # peak allocator memory: cuDNN's workspaces differ by GPU
        return (f"roughly: a peak-memory ratio on a GPU beside one on {claim.hardware}; the allocator and "
                "cuDNN's workspace choices move it a little from GPU to GPU")
    if claim.hardware in _ANY_GPU:
        return f"yes: a GPU result, and the claim covers {claim.hardware}"
    if claim.hardware.lower().removeprefix("a ").removeprefix("an ") in gpu.lower():  # "a Tesla K80"
        return "yes: the same GPU"
    return f"other GPU: {gpu} beside {claim.hardware}"


# Claims that name no GPU model, or a range every current GPU falls in.
_ANY_GPU = ("a GPU", "Volta or newer GPUs")


CLAIMS = (
    Claim("contiguous", "contiguous_params README", "optimizer step 7x-100x faster", 7.0, 100.0,
          "speedup", "adam_step", "speedlib", "forloop", suite="AdamStep"),
    Claim("transfer", "SpeedTorch README (Tesla K80, 2-core CPU)", "CuPy pinned gather 3.1x faster than PyTorch pinned",
          3.1, None, "speedup", "gather", "cupy", "pinned", suite="Transfer", where=(("op", "gather"), ("indices", "random")),
          hardware="a Tesla K80", also="gather_fraction_of_floor"),
    Claim("transfer", "SpeedTorch README (Tesla K80, 2-core CPU)", "CuPy pinned write-back 410x faster than PyTorch pinned",
          410.0, None, "speedup", "scatter", "cupy", "pinned", suite="Transfer",
          where=(("op", "scatter"), ("indices", "random")), hardware="a Tesla K80", also="scatter_fraction_of_floor"),
    Claim("transfer", "SpeedTorch README (Colab)", "10M x 128 float32 table: CuPy pinned 9.93 GB of host memory, PyTorch pinned 6.59 GB",
          9.93 / 6.59, None, "memory ratio", "host_footprint", "cupy", "pinned", hardware=None, measured_by="Footprint"),
    Claim("checkpoint", "efficient DenseNet / pytorch-checkpoint (TITAN X, DenseNet-BC-100)",
          "about -46 % memory (9.93 -> 5.38 GB)", 5.38 / 9.93, None, "memory ratio", "peak_memory", "speedlib", "none",
          "densenet_bc", hardware="a TITAN X", measured_by="PeakMemory"),
    Claim("checkpoint", "efficient DenseNet / pytorch-checkpoint (TITAN X, DenseNet-BC-100)",
          "about +19 % step time (0.42 -> 0.50 s)", 0.42 / 0.50, None, "speedup", "step", "speedlib", "none",
          "densenet_bc", suite="TrainingStep", hardware="a TITAN X"),
    Claim("amp", "PyTorch Performance Tuning Guide", "mixed precision up to 3x faster", None, 3.0,
          "speedup", "step", "bf16", "fp32", suite="TrainingStep", hardware="Volta or newer GPUs"),
    Claim("amp", "PyTorch Performance Tuning Guide", "mixed precision up to 3x faster (with channels_last)", None, 3.0,
          "speedup", "step", "bf16_channels_last", "fp32", suite="TrainingStep", hardware="Volta or newer GPUs"),
    Claim("parallel", "PyTorch Tuning Guide; Lightning speed-up guide", "DistributedDataParallel much faster than DataParallel",
          None, None, "speedup", "step", "ddp", "dataparallel", hardware="several GPUs", measured_by="Step",
          devices=2),
)

# A change is only reported when the ratio is beyond this factor (asv compare's default) and the
# two results differ statistically (`differ`).
SIGNIFICANCE_FACTOR = 1.10
# asv compare's threshold for its Mann-Whitney U test (asv/_stats.py, is_different).
P_THRESHOLD = 0.002
# Exact null distribution of U up to this many samples a side, normal approximation beyond
# (where asv switches too).
EXACT_MAX = 20
# Step detection: each level spans at least this many commits, so one odd commit can never
# move a level's median beyond the other commits' values.
MIN_SEGMENT = 3


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
            "config", "width", "wide_because", "dropped"}  # paired(): the configuration without its variant, the
                                                # interval's width and why it is wider than the target,
                                                # and the disturbed rounds left out


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

    return pd.Series([label(p, w, v) for p, w, v in zip(df["params"], df["workload"], df["variant"])],
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
    rank = np.array([chains[t].index(v) if v in chains[t] else np.nan for t, v in zip(rows["technique"], rows["variant"])],
                    dtype=float)
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


def _fmt_ratio(ratio: float, low: float, high: float) -> str:
    if pd.isna(ratio):
        return ""
    if not math.isfinite(ratio):
        return UNDEFINED
    text = f"{ratio:.3g}x"
    return text if pd.isna(low) else f"{text} [{low:.3g}, {high:.3g}]"


def _fmt_value(value: float, unit: str | None) -> str:
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
    """Speedups of one metric kind without the baseline's own rows, in table order."""
    s = speedups(df[df["kind"] == kind], baseline)
    s = s[s["variant"] != s["baseline"]]
    return s.sort_values(["technique", "machine", "commit_date", "benchmark", *_shown(s), "variant"], kind="stable")


# Marks a row or cell measured with an earlier version of its benchmark (speedbench.results
# keeps a machine's newest results until it measures the current version).
EARLIER = "†"
EARLIER_NOTE = (f"{EARLIER}: measured with an earlier version of the benchmark, whose code has changed since "
                "(the machine's newest results; its next run of the benchmark replaces them)")


def earlier_version(s: pd.DataFrame) -> pd.Series:
    """Per row: measured with an earlier version of its benchmark (speedbench.results flags it)."""
    if "earlier_version" not in s:
        return pd.Series(False, index=s.index)
    return s["earlier_version"].fillna(False).astype(bool)


# Marks a row measured while something else kept the machine busy (speedbench.contention).
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


def _commit_label(s: pd.DataFrame) -> pd.Series:
    """The short commit, with the dagger where the row comes from an earlier benchmark version
    and the double dagger where the machine was contended while it was measured."""
    return (s["commit"].str[:8] + earlier_version(s).map({True: f" {EARLIER}", False: ""})
            + contended(s).map({True: f" {CONTENDED}", False: ""}))


def _with_earlier_note(notes: list[str], s: pd.DataFrame) -> list[str]:
    """`notes` and the notes of the marks that `s` carries: the dagger's, the double dagger's,
    and each contended result's counters."""
    out = notes + [EARLIER_NOTE] if earlier_version(s).any() else list(notes)
    busy = s[contended(s)]
    if not busy.empty:
        out.append(CONTENDED_NOTE)
        where = busy["benchmark"].str.rsplit(".", n=1).str[0] + busy["params"].map(
            lambda p: f" ({_config(p)})" if _config(p) else "")  # the configuration: which of a class's rounds
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
                      for state, note in zip(s["contention"].fillna(""), notes.fillna(""))], index=s.index, dtype=object)


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
        # the marks as columns, so a script can filter on them: † and ‡
        "earlier_version": earlier_version(s), "contended": contended(s),
        "contention": column("contention"), "result_id": column("result_id"),
    }).reset_index(drop=True)


def _ratio_numbers(s: pd.DataFrame) -> dict:
    return {"baseline": s["baseline"], "ratio": s["ratio"], "low": s["ratio_low"], "high": s["ratio_high"]}


def speedup_table(df: pd.DataFrame, kind: str = "time", baseline: str | None = None) -> Table:
    """Each variant against its baseline, per machine and commit, for one metric kind."""
    s = _against_baseline(df, kind, baseline)
    frame = pd.DataFrame({
        **_identity(s),
        "variant": s["variant"], "baseline": s["baseline"],
        "value": [_fmt_value(v, u) for v, u in zip(s["value"], s["unit"])],
        "baseline value": [_fmt_value(v, u) for v, u in zip(s["baseline_value"], s["unit"])],
        "speedup": [_fmt_ratio(r, lo, hi) for r, lo, hi in zip(s["ratio"], s["ratio_low"], s["ratio_high"])],
        "interval": s["interval"], "N": s["n"],
    })
    notes = ["speedup = baseline / variant for time, variant / baseline for bandwidth and % of floor; "
             ">1 means the variant is better", "[low, high]: from the two 99 % confidence intervals (worst case)"]
    data = _numbers(s, **_ratio_numbers(s), interval=s["interval"], value=s["value"],
                    baseline_value=s["baseline_value"], unit=s["unit"])
    return Table(f"Speedup ({kind})", frame.reset_index(drop=True), s, _with_earlier_note(notes, s), data)


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
        "bytes": [_fmt_value(v, "bytes") for v in s["value"]],
        "baseline bytes": [_fmt_value(v, "bytes") for v in s["baseline_value"]],
        "memory ratio": [_fmt_ratio(r, lo, hi) for r, lo, hi in zip(s["ratio"], s["ratio_low"], s["ratio_high"])],
        "change": [f"{c:+.1f} %" if math.isfinite(c) else UNDEFINED if pd.notna(c) else "" for c in change],
        "N": s["n"],
    })
    data = _numbers(s, **_ratio_numbers(s), value=s["value"], baseline_value=s["baseline_value"], unit=s["unit"],
                    change_percent=change)
    return Table("Memory (peak, saved activations, retained bytes)", frame.reset_index(drop=True), s,
                 _with_earlier_note([MEMORY_NOTE, "change = variant / baseline - 1"], s), data)


MEMORY_NOTE = ("memory ratio = variant bytes / baseline bytes (ratio in the CSV): below 1x the variant needs less "
               "memory")


# --- paired speedups ------------------------------------------------------------------------

# Targets for paired ratios on a shared 2-core machine: two runs of one commit agree within
# 5 %, and a ratio's 99 % interval spans less than 1.10x (high / low).
PAIRED_NOISE_TARGET = 0.05
PAIRED_WIDTH_TARGET = 1.10


def _config(params: str) -> str:
    """A row's parameters without its variant: the configuration its variants share."""
    return ", ".join(p for p in (params or "").split(", ") if p and not p.startswith("variant="))


def _why_wide(ratios, width: float) -> str:
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
    return [f"{b.split('.')[1]} {c.replace('workload=', '')}".strip() for b, c in zip(benchmarks, configs)]


def paired(df: pd.DataFrame) -> pd.DataFrame:
    """One row per paired speedup measured (kind "paired speedup", samples kept).

    Columns added: config (the parameters but the variant), baseline (the technique's
    baseline among the variants the class timed), ratio, ratio_low, ratio_high (Hodges-
    Lehmann, 99 % Wilcoxon interval; NaN below 8 rounds), n (rounds), width (high / low),
    wide_because (why the interval is wider than PAIRED_WIDTH_TARGET, else "") and dropped
    (disturbed rounds left out: speedbench.contention; `samples` and n are what remains).
    """
    s = df[(df["kind"] == "paired speedup") & (df["samples"].map(len) > 0)].copy() if "samples" in df else df.iloc[0:0]
    if s.empty:
        return s.assign(config=[], baseline=[], ratio=[], ratio_low=[], ratio_high=[], width=[], wide_because=[],
                        dropped=[])
    # Disturbed rounds are left out where the verdict says enough others remain (DROPPED).
    kept = [contention.keep(x, state, disturbed) if isinstance(disturbed, list) else list(x)
            for x, state, disturbed in zip(s["samples"], s.get("contention", [""] * len(s)),
                                           s.get("disturbed", [None] * len(s)))]
    s["dropped"] = [len(x) - len(k) for x, k in zip(s["samples"], kept)]
    s["samples"] = kept
    estimates = [ratio_estimate(x) for x in s["samples"]]
    s["ratio"] = [e.ratio for e in estimates]
    s["ratio_low"] = [e.low for e in estimates]
    s["ratio_high"] = [e.high for e in estimates]
    s["n"] = [e.n for e in estimates]
    s["width"] = s["ratio_high"] / s["ratio_low"]
    s["wide_because"] = [_why_wide(x, w) for x, w in zip(s["samples"], s["width"])]
    s["config"] = s["params"].map(_config)
    # The baseline: the variant of the same class and configuration that has times but, being
    # the reference, no speedup of its own; the technique's preference order breaks ties.
    timed = df[df["benchmark"].str.endswith(".track_seconds")]
    variants: dict[tuple, set] = {}
    for m, c, b, params, v in zip(timed["machine"], timed["commit"], timed["benchmark"], timed["params"],
                                  timed["variant"]):
        variants.setdefault((m, c, b.rsplit(".", 1)[0], _config(params)), set()).add(v)

    def baseline(machine, commit, benchmark, technique, config) -> str:
        key = (machine, commit, benchmark.rsplit(".", 1)[0], config)
        chain = TECHNIQUES[technique].baselines if technique in TECHNIQUES else ()
        found = variants.get(key, set())
        return next((b for b in chain if b in found), "")

    s["baseline"] = [baseline(*k) for k in zip(s["machine"], s["commit"], s["benchmark"], s["technique"], s["config"])]
    return s.sort_values(["technique", "machine", "commit_date", "benchmark", "config", "variant"], kind="stable")


def paired_table(df: pd.DataFrame) -> Table:
    """Paired speedups: the headline of every comparison measured with variants taking turns."""
    s = paired(df)
    frame = pd.DataFrame({
        "machine": s["machine"], "GPU": s["gpu"], "commit": _commit_label(s),
        # "TrainingStep workload=resnet50" is a class of amp, tuning and checkpoint alike
        "technique": s["technique"],
        "comparison": _comparison(s["benchmark"], s["config"]),
        "variant": s["variant"], "baseline": s["baseline"],
        "speedup": [_fmt_ratio(r, lo, hi) + (f" {CONTENDED}" if busy else "")
                    for r, lo, hi, busy in zip(s["ratio"], s["ratio_low"], s["ratio_high"], contended(s))],
        "N": s["n"],
        "machine state": machine_state(s),
        f"why wider than {PAIRED_WIDTH_TARGET:.2f}x": s["wide_because"],
    })
    wide = int((s["width"] > PAIRED_WIDTH_TARGET).sum())
    notes = ["speedup = baseline / variant per round, variants taking turns in one process; >1: the variant is faster",
             "estimate: Hodges-Lehmann of the per-round ratios; [low, high]: 99 % interval from the Wilcoxon "
             "signed-rank test (none below 8 rounds); N: rounds (disturbed rounds left out, see machine state)",
             f"{wide} of {len(s)} intervals wider than {PAIRED_WIDTH_TARGET:.2f}x (high / low)" if len(s) else
             "no paired comparison measured"]
    data = _numbers(s, config=s["config"], **_ratio_numbers(s), width=s["width"], dropped=s["dropped"],
                    interference=s["contention_note"] if "contention_note" in s else "")
    return Table("Paired speedup", frame.reset_index(drop=True), s, _with_earlier_note(notes, s), data)


# What a rerun is matched on: the same result, in the same environment (speedbench.machines).
# A second run on another CPU or torch build measures the environment's effect, not noise.
_RERUN = ["machine", "commit", "benchmark", "params"]
_ENVIRONMENT_KEY = "_environment"
# Said wherever two results are not set against each other because their environments differ
# (noise table, history, regression gate).
NOT_COMPARED = "not compared"


def _beside_rerun(a: pd.DataFrame, b: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """`a`'s rows with `b`'s `columns` (suffixed _second) where machine, commit, benchmark,
    parameters and environment agree."""
    keys = [*_RERUN, _ENVIRONMENT_KEY]
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
    m = _beside_rerun(paired(first), paired(second), ["ratio", "ratio_low", "ratio_high"])
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
        "first": [_fmt_ratio(r, lo, hi) for r, lo, hi in zip(pr["ratio"], pr["ratio_low"], pr["ratio_high"])],
        "second": [_fmt_ratio(r, lo, hi) for r, lo, hi in
                   zip(pr["ratio_second"], pr["ratio_low_second"], pr["ratio_high_second"])],
        "run to run": [f"{r * 100:.1f} %" for r in pr["run_to_run"]],
        "IQR / median": "", "target": f"{PAIRED_NOISE_TARGET:.0%}",
        "within": np.where(pr["within_target"], "yes", "NO"),
    }), pd.DataFrame({
        "machine": m["machine"], "commit": m["commit"].str[:8], "benchmark": m["benchmark"], "params": m["params"],
        "first": [_fmt_value(v, u) for v, u in zip(m["value"], m["unit"])],
        "second": [_fmt_value(v, u) for v, u in zip(m["value_second"], m["unit"])],
        "run to run": [f"{r * 100:.1f} %" for r in m["run_to_run"]],
        "IQR / median": [f"{x * 100:.1f} %" if pd.notna(x) else "" for x in m["spread"]],
        "target": f"{NOISE_TARGET:.0%}", "within": np.where(m["within_target"], "yes", "NO"),
    })], ignore_index=True)
    notes = []
    if len(pr):
        worst = pr["run_to_run"].max()
        notes.append(f"{int(pr['within_target'].sum())} of {len(pr)} paired speedups within "
                     f"{PAIRED_NOISE_TARGET:.0%} run to run (worst {worst * 100:.1f} %); run to run = larger / smaller - 1")
    notes += [f"{int(m['within_target'].sum())} of {len(m)} times within {NOISE_TARGET:.0%} run to run; "
              "run to run = |second - first| / min(first, second); IQR / median: the larger of the two runs'"]
    apart, how = _rerun_elsewhere(first, second)
    if apart:
        notes.append(f"{apart} result(s) measured in both runs but in different environments, {NOT_COMPARED} "
                     f"(the difference would be the environment's, not noise): {'; '.join(how)}")
    rows = pd.concat([pr, m], ignore_index=True)
    return Table("Run-to-run noise", frame, rows, notes)


def floor_table(df: pd.DataFrame) -> Table:
    """Benchmarks that report their result as a fraction of a physical floor."""
    s = df[df["kind"] == "fraction of floor"].sort_values(["technique", "machine", "commit_date", "benchmark"], kind="stable")
    frame = pd.DataFrame({
        **_identity(s), **({"variant": s["variant"]} if "variant" in s else {}),
        "achieved": [f"{v:.1f} %" for v in s["value"]], "of": s["unit"].str.removeprefix("% of "), "N": s["n"],
    })
    data = _numbers(s, value=s["value"], unit=s["unit"], low=s["ci99_low"], high=s["ci99_high"])
    notes = ["floor: measured in the same benchmark process (see the benchmark's docstring)"]
    if (s["value"] > 100).any():  # a reader would take a floor for a ceiling and suspect the number
        notes.append(FLOOR_ABOVE_NOTE)
    return Table("Fraction of the physical floor", frame.reset_index(drop=True), s, _with_earlier_note(notes, s), data)


# Why a value can pass 100 %: the committed CPU results put the flat-buffer Adam step at
# 105-113 % of the in-place add in four runs, and a device-resident table gathers at 670 % of
# the host->device copy.
FLOOR_ABOVE_NOTE = ("above 100 %: the floor is a reference timed in the same process, not a ceiling. A "
                    "device-resident table never crosses the host link it is set against; a step that streams "
                    "memory can beat the in-place adds its floor was timed from once before its rounds (a shared "
                    "machine's bandwidth varies over a run): read such a value as at the floor")


# --- significance: asv compare's rule, and steps across commits --------------------------

class MannWhitney(NamedTuple):
    u: float  # pairs (x, y) with x above y, a tie counting one half
    p: float  # two-sided
    z: float  # (U - mn/2) / its tie-corrected standard deviation: how far apart, and which way
    method: str  # "exact" or "normal"


@functools.lru_cache(maxsize=None)
def _u_counts(m: int, n: int) -> np.ndarray:
    """counts[u]: how many of the C(m+n, m) orders of m x's and n y's (no ties) give U = u.
    The largest value is an x, above all n y's, or a y, above nothing: that splits the count."""
    if m == 0 or n == 0:
        return np.ones(1, dtype=np.int64)
    counts = np.zeros(m * n + 1, dtype=np.int64)
    top_x, top_y = _u_counts(m - 1, n), _u_counts(m, n - 1)
    counts[n:n + len(top_x)] += top_x
    counts[:len(top_y)] += top_y
    return counts


def mann_whitney_u(x, y) -> MannWhitney:
    """Two-sided Mann-Whitney U test of x against y (NaN values left out).

    Up to EXACT_MAX values a side the p-value comes from the exact null distribution of U.
    That distribution assumes no ties, so ties are broken the way least favourable to
    significance (the attainable U nearest mn/2): a tie never makes p smaller. Beyond that,
    the normal approximation with the tie-corrected variance and a continuity correction.
    """
    x, y = (np.asarray(v, dtype=float) for v in (x, y))
    x, y = x[~np.isnan(x)], y[~np.isnan(y)]
    m, n = len(x), len(y)
    if not m or not n:
        raise ValueError("Mann-Whitney U needs at least one value on each side")
    values, where, tied = np.unique(np.concatenate([x, y]), return_inverse=True, return_counts=True)
    midrank = np.cumsum(tied) - (tied - 1) / 2
    u = float(midrank[where[:m]].sum() - m * (m + 1) / 2)
    total, half = m + n, m * n / 2
    var = m * n / 12 * ((total + 1) - float((tied ** 3 - tied).sum()) / (total * (total - 1)))
    sd = math.sqrt(var) if var > 0 else 0.0  # 0 only when every value is the same
    z = (u - half) / sd if sd else 0.0
    if max(m, n) <= EXACT_MAX:
        x_at = np.bincount(where[:m], minlength=len(values))
        y_at = np.bincount(where[m:], minlength=len(values))
        tied_pairs = int((x_at * y_at).sum())
        strictly = round(u - tied_pairs / 2)  # pairs with x strictly above y
        least = min(max(half, strictly), strictly + tied_pairs)
        tail = math.floor(min(least, m * n - least))
        p = min(1.0, 2 * int(_u_counts(m, n)[:tail + 1].sum()) / math.comb(total, m))
        return MannWhitney(u, p, z, "exact")
    p = math.erfc(max(abs(u - half) - 0.5, 0.0) / sd / math.sqrt(2)) if sd else 1.0
    return MannWhitney(u, p, z, "normal")


def _can_reject(m: int, n: int) -> bool:
    """asv runs its test only when the sample sizes let p get below the threshold (its
    bound, 1 / C(m+n, min(m, n)); at a few sizes the two-sided p still cannot)."""
    return m > 0 and n > 0 and 1 / math.comb(m + n, min(m, n)) < P_THRESHOLD


def _samples(r) -> list[float]:
    s = r.get("samples")
    return [v for v in s if not math.isnan(v)] if isinstance(s, list) else []


def _has_stats(r) -> bool:
    # asv compares results without statistics (track_* values) or from a single repeat by
    # their ratio alone.
    return pd.notna(r.get("ci99_low")) and pd.notna(r.get("ci99_high")) and r.get("repeat") != 1


def differ(a, b) -> tuple[bool, float, str]:
    """Whether results a and b (rows of the tidy frame, as dicts) differ by asv compare's rule:
    (different, p-value or NaN, which test). With samples kept on both sides, the two-sided
    Mann-Whitney U test at P_THRESHOLD; else whether the 99 % confidence intervals are
    disjoint; results without statistics count as different, leaving it to the ratio."""
    if not (_has_stats(a) and _has_stats(b)):
        return True, math.nan, "ratio only"
    sa, sb = _samples(a), _samples(b)
    if _can_reject(len(sa), len(sb)):
        p = mann_whitney_u(sa, sb).p
        return p < P_THRESHOLD, p, "Mann-Whitney U"
    overlap = a["ci99_low"] <= b["ci99_high"] and b["ci99_low"] <= a["ci99_high"]
    return not overlap, math.nan, "99% CI"


def _beyond(ratio: float) -> bool:
    return ratio > SIGNIFICANCE_FACTOR or ratio < 1 / SIGNIFICANCE_FACTOR


def _direction(ratio: float, kind: str) -> str:
    worse = ratio < 1 if higher_is_better(kind) else ratio > 1
    return "regression" if worse else "improvement"


def _change_ratio(new: float, old: float) -> float:
    """new / old, where a value of 0 (a benchmark that retains no bytes) divides nothing: the
    same value twice is no change (1), a move away from 0 has no ratio but a direction (inf,
    signed), as asv compare prints "n/a" and still flags it by its factor rule."""
    if old == 0:
        return 1.0 if new == 0 else math.copysign(math.inf, new)
    return new / old


def _verdict(old, new) -> dict:
    """`new` against `old`: the change, and whether it is significant by asv compare's rule
    (ratio beyond SIGNIFICANCE_FACTOR and the two results differ)."""
    ratio = _change_ratio(new["value"], old["value"])
    different, p, test = differ(old, new)
    significant = bool(different and _beyond(ratio))
    return {"change": ratio - 1, "test": test, "p_value": p, "significant": significant,
            "direction": _direction(ratio, new["kind"]) if significant else ""}


def _best_split(values: list[float], data: list[list[float]], lo: int, hi: int):
    """The most significant split of commits lo..hi-1 into two levels, or None: each side
    MIN_SEGMENT commits or more, the median of the commits' values moved beyond the factor,
    and the two sides' pooled data different by the Mann-Whitney test at P_THRESHOLD.
    'Most significant' is the largest |z|, which, unlike p, does not underflow to 0."""
    best = None
    for k in range(lo + MIN_SEGMENT, hi - MIN_SEGMENT + 1):
        ratio = _change_ratio(float(np.median(values[k:hi])), float(np.median(values[lo:k])))
        before, after = np.concatenate(data[lo:k]), np.concatenate(data[k:hi])
        if not _beyond(ratio) or not _can_reject(len(before), len(after)):
            continue
        test = mann_whitney_u(after, before)
        if test.p < P_THRESHOLD and (best is None or abs(test.z) > abs(best[2].z)):
            best = (k, ratio, test)
    return best


def _steps(rows: list[dict]) -> list[tuple[int, float, float]]:
    """Sustained level changes in one history (rows oldest first) by binary segmentation:
    split where `_best_split` says, then look for further steps on each side.
    Returns (index of the first commit of the new level, ratio of medians, p).

    Each commit contributes its stored samples when every commit kept them, else its one
    value (so a track_* history needs about seven commits a side before the test can
    reject at P_THRESHOLD). Pooling treats a level's runs as one population; run-to-run
    drift smaller than the factor is kept out by the ratio condition."""
    pooled = all(_has_stats(r) and _samples(r) for r in rows)
    data = [_samples(r) if pooled else [r["value"]] for r in rows]
    values = [r["value"] for r in rows]
    found, todo = [], [(0, len(rows))]
    while todo:
        lo, hi = todo.pop()
        best = _best_split(values, data, lo, hi)
        if best:
            k, ratio, test = best
            found.append((k, ratio, test.p))
            todo += [(lo, k), (k, hi)]
    return sorted(found)


_HISTORY_COLUMNS = {"change": math.nan, "test": "", "p_value": math.nan, "significant": False, "direction": "",
                    "step": False, "step_direction": "", "step_p": math.nan, "environment_change": "",
                    "left_out": False}


def history(df: pd.DataFrame, benchmark: str | None = None) -> pd.DataFrame:
    """Each (machine, benchmark, parameters) across commits, oldest first.

    Against the previous commit: change (ratio - 1), test ("Mann-Whitney U", "99% CI" or
    "ratio only", see `differ`), p_value, significant (asv compare's rule: ratio beyond
    SIGNIFICANCE_FACTOR and different) and direction ("regression" / "improvement").
    Across commits: step is True at the first commit of a sustained level change (`_steps`),
    with step_direction and step_p.
    Only like with like: where the environment (CPU, GPU, torch/CUDA build: speedbench.machines)
    differs from the previous row's, that row gets no change but environment_change ('torch
    2.15.0+cu132 -> 2.14.1+cu130'), and steps are sought within each stretch of one environment.
    A contended result (speedbench.contention) is left out (`left_out`): it gets no change, is
    no step, and the next result is compared with the last one measured on a quiet machine.
    """
    h = df if benchmark is None else df[df["benchmark"] == benchmark]
    if h.empty:
        return h.assign(**{c: [] for c in _HISTORY_COLUMNS})
    keys = ["machine", "benchmark", "params"]
    h = h.sort_values([*keys, "commit_date", "run_date"], kind="stable").reset_index(drop=True)
    records = h.to_dict("records")
    env = machines.environment_keys(h).tolist()
    busy = contended(h).tolist()
    out = {c: [default] * len(h) for c, default in _HISTORY_COLUMNS.items()}
    out["left_out"] = busy
    for idx in h.groupby(keys, sort=False, dropna=False).indices.values():
        quiet = [i for i in idx if not busy[i]]
        if not quiet:
            continue
        stretches = [[quiet[0]]]  # consecutive quiet rows of one environment
        for before, i in zip(quiet, quiet[1:]):
            if env[i] != env[before]:
                out["environment_change"][i] = machines.describe_change(records[before], records[i])
                stretches.append([i])
                continue
            stretches[-1].append(i)
            for c, v in _verdict(records[before], records[i]).items():
                out[c][i] = v
        for stretch in stretches:
            for k, ratio, p in _steps([records[i] for i in stretch]):
                i = stretch[k]
                out["step"][i], out["step_p"][i] = True, p
                out["step_direction"][i] = _direction(ratio, records[i]["kind"])
    return h.assign(**out)


def _fmt_change(change: float) -> str:
    """A change against the previous result; from a value of 0 it has no ratio (`_change_ratio`)."""
    if pd.isna(change):
        return ""
    return f"{change:+.1%}" if math.isfinite(change) else "n/a (from 0)"


def _fmt_test(test: str, p: float) -> str:
    return f"{test}, p = {p:.2g}" if pd.notna(p) else test


def _flag(direction: str, step: str, environment_change: str = "", left_out: bool = False) -> str:
    return "; ".join([*([f"{CONTENDED} contended: {NOT_COMPARED}"] if left_out else []),
                      *([f"{environment_change}: {NOT_COMPARED}"] if environment_change else []),
                      *([direction] if direction else []), *([f"step: {step}"] if step else [])])


_RULE_NOTE = (f"the ratio is beyond {SIGNIFICANCE_FACTOR:.2f}x and the two results differ: with samples kept on both "
              f"sides, two-sided Mann-Whitney U p < {P_THRESHOLD} (exact up to {EXACT_MAX} samples a side, else normal "
              "approximation with tie correction), else disjoint 99 % confidence intervals, else (no statistics) by "
              "the ratio alone; asv compare's rule")


def history_table(df: pd.DataFrame, benchmark: str) -> Table:
    h = history(df, benchmark)
    frame = pd.DataFrame({
        "machine": h["machine"], "commit": _commit_label(h) if not h.empty else h["commit"],
        "commit date": h["commit_date"].dt.strftime("%Y-%m-%d"), "params": h["params"],
        "value": [_fmt_value(v, u) for v, u in zip(h["value"], h["unit"])],
        "change": [_fmt_change(c) for c in h["change"]],
        "test": [_fmt_test(t, p) for t, p in zip(h["test"], h["p_value"])],
        "flag": [_flag(d, s, e, x) for d, s, e, x in zip(h["direction"], h["step_direction"], h["environment_change"],
                                                         h["left_out"])],
        "N": h["n"],
    })
    contended_notes = [f"'{CONTENDED} contended: {NOT_COMPARED}': measured on a busy machine; the next commit is "
                       "compared with the last one measured on a quiet one", *_with_earlier_note([], h[h["left_out"]])] \
        if h["left_out"].any() else []
    return Table(f"History of {benchmark}", frame, h,
                 [*contended_notes,
                  f"flag: regression or improvement against the previous commit where {_RULE_NOTE}",
                  f"step: the first commit of a sustained level change (binary segmentation; each level at least "
                  f"{MIN_SEGMENT} commits, its median beyond {SIGNIFICANCE_FACTOR:.2f}x of the previous level's, "
                  "the levels' pooled samples different by the same test)",
                  *([f"'{NOT_COMPARED}': the CPU, GPU or torch/CUDA build differs from the previous commit's, so "
                     "the change would mix the environment with the code; steps are sought within one environment"]
                    if h["environment_change"].any() else [])])


def resolve_commit(df: pd.DataFrame, rev: str) -> str:
    """The full hash of the one measured commit that starts with `rev`; ValueError otherwise."""
    # only hashes: a commit_hash that is not one must not reach the commands the errors suggest
    known = sorted(c for c in df["commit"].unique() if is_commit(c))
    if not re.fullmatch(r"[0-9a-fA-F]{4,40}", rev):
        raise ValueError(f"{rev!r} is not a commit hash prefix (4 to 40 hex digits, as in the results)")
    hits = [c for c in known if c.startswith(rev.lower())]
    if not hits:
        raise ValueError(f"no results for commit {rev}; measured: {', '.join(c[:8] for c in known) or 'none'}")
    if len(hits) > 1:
        raise ValueError(f"commit prefix {rev} is ambiguous: {', '.join(c[:12] for c in hits)}")
    return hits[0]


_CASE = ["machine", "benchmark", "params"]


def _latest_run(df: pd.DataFrame, commit: str) -> pd.DataFrame:
    """The commit's rows; where it was measured twice, its latest run."""
    rows = df[df["commit"] == commit].sort_values("run_date", kind="stable")
    return rows.drop_duplicates(_CASE, keep="last")


def compare_commits(df: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Every (machine, benchmark, parameters) measured at both commits (hash prefixes), B
    against A by `history`'s rule: the B rows with value_base (A's value), change, test,
    p_value, significant and direction. ValueError for an unknown, ambiguous or equal commit,
    when no machine measured both, or when a machine measured them in different environments
    (CPU, GPU, torch/CUDA build: speedbench.machines), or on a contended machine
    (speedbench.contention), whose difference no verdict could tell from the code's."""
    a, b = resolve_commit(df, a), resolve_commit(df, b)
    if a == b:
        raise ValueError(f"{a[:8]} given twice: compare two different commits")
    m = _latest_run(df, b).merge(_latest_run(df, a), on=_CASE, suffixes=("", "_base"))
    if m.empty:
        raise ValueError(f"no benchmark was measured at both {a[:8]} and {b[:8]} on the same machine")
    apart = m[machines.environment_keys(m) != machines.environment_keys(m, "_base")]
    if not apart.empty:
        where = sorted({f"on {r['machine']}: {machines.describe_change(r, r, '_base')}"
                        for r in apart.to_dict("records")})
        raise ValueError(f"{a[:8]} and {b[:8]} were measured in different environments, so a change between them "
                         f"is not the code's alone ({'; '.join(where)}): {NOT_COMPARED}. Measure both in one "
                         f"environment (speedlib run --commits {a[:8]}, then --commits {b[:8]}, on one machine and "
                         "build), or gate on a machine that measured both alike with --machine")
    busy = m[contended(m)]  # either side: `contended` reads contention_base too
    if not busy.empty:
        where = sorted({f"{r['machine']} at {r['commit'][:8] if r.get('contention') == contention.CONTENDED else r['commit_base'][:8]}"
                        for r in busy.to_dict("records")})
        raise ValueError(f"{len(busy)} of the results compared were measured on a contended machine "
                         f"({CONTENDED}: {'; '.join(where)}), so a change between {a[:8]} and {b[:8]} could be the "
                         f"machine's, not the code's: {NOT_COMPARED}. Measure again on a quiet machine "
                         "(speedlib run --require-quiet --commits ...)")
    rows = m.to_dict("records")
    verdicts = [_verdict({c: r.get(f"{c}_base") for c in ("value", "samples", "ci99_low", "ci99_high", "repeat")}, r)
                for r in rows]
    return m.assign(**{c: [v[c] for v in verdicts] for c in verdicts[0]}).sort_values(
        _CASE, kind="stable").reset_index(drop=True)


def change_table(df: pd.DataFrame, a: str, b: str) -> Table:
    """The significant changes from commit A to commit B on every machine that measured both
    (regressions first); its sources are every result compared, at both commits."""
    m = compare_commits(df, a, b)
    a8, b8 = m["commit_base"].iloc[0][:8], m["commit"].iloc[0][:8]
    s = pd.concat([m[m["direction"] == "regression"], m[m["direction"] == "improvement"]])
    frame = pd.DataFrame({
        "machine": s["machine"], "benchmark": s["benchmark"], "params": s["params"],
        a8: [_fmt_value(v, u) for v, u in zip(s["value_base"], s["unit"])],
        b8: [_fmt_value(v, u) for v, u in zip(s["value"], s["unit"])],
        "change": [_fmt_change(c) for c in s["change"]],
        "test": [_fmt_test(t, p) for t, p in zip(s["test"], s["p_value"])], "verdict": s["direction"],
        "N": [f"{na} / {nb}" for na, nb in zip(s["n_base"], s["n"])],
    })
    counts = s["direction"].value_counts()
    compared = pd.concat([_latest_run(df, c) for c in (m["commit_base"].iloc[0], m["commit"].iloc[0])])
    compared = compared[compared.set_index(_CASE).index.isin(m.set_index(_CASE).index)]
    notes = [f"{len(m)} results compared ({', '.join(sorted(m['machine'].unique()))}): "
             f"{counts.get('regression', 0)} significant regression(s), {counts.get('improvement', 0)} improvement(s)",
             f"change = {b8} / {a8} - 1; listed where {_RULE_NOTE}"]
    return Table(f"Significant changes from {a8} to {b8}", frame.reset_index(drop=True), compared, notes)


def compare_machines(df: pd.DataFrame, machine_a: str, machine_b: str) -> pd.DataFrame:
    """Each benchmark and parameter set on two machines, each at its latest commit, with
    ratio = how much better B is than A (and its interval, as for speedups)."""
    last = latest(df[df["machine"].isin([machine_a, machine_b])])
    keys = ["benchmark", "params"]
    a = last[last["machine"] == machine_a].drop_duplicates(keys, keep="last")
    b = last[last["machine"] == machine_b].drop_duplicates(keys, keep="last")
    m = b.merge(a, on=keys, suffixes=("", "_base"))  # A is the reference, like a baseline
    _with_ratio(m)
    return m


def same_work(df: pd.DataFrame, machine_a: str, machine_b: str) -> bool:
    """Whether the two machines ran the suite's workloads at the same size: a CPU runs small
    ones (benchmarks/common.py picks sizes per profile), so its values and a GPU's measure
    different work, and only each machine's speedups against its own baseline compare."""
    cpu = df.drop_duplicates("machine").set_index("machine")["gpu"].eq("CPU only")
    return bool(cpu.get(machine_a, False) == cpu.get(machine_b, False))


def machine_comparison(df: pd.DataFrame, machine_a: str, machine_b: str) -> Table:
    """`compare_machines` as a table: B / A as a speedup (>1: B is better), for the values a
    machine measures (times, memory, bandwidth): empty where the machines ran different work
    (`same_work`). Paired speedups are compared by `speedup_comparison` instead: a ratio of
    two machines' speedups answers no question, and their asv value is a median, not the
    estimate the other tables cite."""
    m = compare_machines(df, machine_a, machine_b)
    m = m[m["kind"] != "paired speedup"]
    if not same_work(df, machine_a, machine_b):
        m = m.iloc[0:0]
    frame = pd.DataFrame({
        "benchmark": m["benchmark"], "params": m["params"],
        machine_a: [_fmt_value(v, u) for v, u in zip(m["value_base"], m["unit"])],
        machine_b: [_fmt_value(v, u) for v, u in zip(m["value"], m["unit"])],
        f"{machine_b} vs {machine_a}": [_fmt_ratio(r, lo, hi) + (f" {CONTENDED}" if busy else "") for r, lo, hi, busy
                                         in zip(m["ratio"], m["ratio_low"], m["ratio_high"], contended(m))],
        "commits": m["commit_base"].str[:8] + " / " + m["commit"].str[:8],
    })
    last = latest(df[df["machine"].isin([machine_a, machine_b])])
    used = last.set_index(["benchmark", "params"]).index.isin(m.set_index(["benchmark", "params"]).index)
    return Table(f"{machine_b} versus {machine_a}", frame, last[used],
                 _with_earlier_note([f">1: {machine_b} is better; each machine at its latest commit",
                                     "[low, high]: worst-case bounds from each machine's own 99 % interval (or IQR): "
                                     "two separate runs, so the machines' drift between processes is inside them"],
                                    last[used]))


def speedup_comparison(df: pd.DataFrame, machine_a: str, machine_b: str) -> Table:
    """Each paired speedup measured on both machines (each at its latest commit), side by
    side: the comparison that holds between a CPU and a GPU too, each against its own baseline."""
    p = paired(latest(df[df["machine"].isin([machine_a, machine_b])]))
    keys = ["technique", "benchmark", "config", "variant", "baseline"]
    a = p[p["machine"] == machine_a].drop_duplicates(keys, keep="last")
    b = p[p["machine"] == machine_b].drop_duplicates(keys, keep="last")
    m = a.merge(b, on=keys, suffixes=("_a", "_b"))

    def cell(side: str) -> list[str]:
        own = m.rename(columns={f"earlier_version_{side}": "earlier_version", f"contention_{side}": "contention"})
        return [_fmt_ratio(r, lo, hi) + f" N={n}" + (f" {EARLIER}" if e else "") + (f" {CONTENDED}" if c else "")
                for r, lo, hi, n, e, c in zip(m[f"ratio_{side}"], m[f"ratio_low_{side}"], m[f"ratio_high_{side}"],
                                              m[f"n_{side}"], earlier_version(own), contended(own))]

    frame = pd.DataFrame({
        "technique": m["technique"],
        "comparison": _comparison(m["benchmark"], m["config"]),
        "variant": m["variant"], "baseline": m["baseline"], machine_a: cell("a"), machine_b: cell("b"),
    })
    used = pd.concat([p[(p["machine"] == side) & p.set_index(keys).index.isin(m.set_index(keys).index)]
                      for side in (machine_a, machine_b)])
    notes = ["paired speedups, each machine against its own baseline (variants taking turns in one process): "
             "Hodges-Lehmann estimate [99 % Wilcoxon interval], N rounds; each machine at its latest commit"]
    return Table(f"Paired speedups on {machine_a} and {machine_b}", frame.reset_index(drop=True), used,
                 _with_earlier_note(notes, used))


def _claim_rows(s: pd.DataFrame, c: Claim, by_suite: bool, metric: str | None = None) -> pd.DataFrame:
    """The rows of `s` that measure claim `c`: its class's paired speedups (`by_suite`), else
    the ratios of `metric` (its own by default); at its workload and fixed parameters where it
    names them (a metric that says its operation in its name has no `op` parameter)."""
    if s.empty:
        return s
    keep = (s["technique"] == c.technique) & (s["variant"] == c.variant) & (s["baseline"] == c.baseline)
    keep &= (s["suite"] == c.suite) if by_suite else (s["metric"] == (metric or c.metric))
    if c.workload:
        keep &= s["workload"] == c.workload
    for column, value in c.where if metric is None else ():
        keep &= (s[column] == value) if column in s else False
    return s[keep]


def is_own_baseline(rows: pd.DataFrame) -> pd.Series:
    """A paired class's baseline has seconds but no speedup of its own: asv records its
    `track_speedup` as skipped, by design, not as something left unmeasured."""
    chains = {t: TECHNIQUES[t].baselines for t in TECHNIQUES}
    return pd.Series([str(b).endswith(".track_speedup") and v in chains.get(t, ())
                      for b, t, v in zip(rows["benchmark"], rows["technique"], rows["variant"])],
                     index=rows.index, dtype=bool)


def never_run(suite: list[str], rows: pd.DataFrame, technique: str, machine: str) -> pd.DataFrame:
    """The technique's benchmarks (names from asv's listing, `suite`) that `machine` has no
    row of at all, measured or not (`rows`: both frames): they never ran there, so neither
    table lists them, and the page must not say "nothing was skipped". With the command
    that measures each (speedbench.plan.how_to_measure)."""
    ran = set(rows.loc[rows["machine"] == machine, "benchmark"])
    # the interference counters' tracks travel with the results they describe, not as rows
    counters = tuple(f".track_{m}" for m in contention.COUNTER_METRICS)
    missing = sorted(b for b in suite if b.startswith(f"bench_{technique}.") and b not in ran
                     and not b.endswith(counters))
    return pd.DataFrame({"benchmark": missing, "measured by": [plan.how_to_measure(b) for b in missing]})


def why_not_measured(rows: pd.DataFrame) -> pd.Series:
    """Per row of the loader's not-measured frame: why it has no value, in words. asv keeps
    only "skipped" (NaN), so the reason is read off the row: its status, its machine (GPU
    count) and its parameters, the same conditions the benchmarks skip on."""
    def why(r) -> str:
        if r.status == "outdated":
            return "measured with an earlier version of the benchmark, not comparable with the current one"
        if r.status == "failed":
            return "raised an error in its run (the output of `speedlib run` shows it)"
        gpus = int(r.gpu_count) if pd.notna(r.gpu_count) else 0
        world = str(r.world) if pd.notna(r.world) else ""
        if world.isdigit() and gpus and int(world) > gpus:
            return f"needs {world} GPUs; this machine has {gpus}"
        if r.metric == "scaling_efficiency" and world == "1":
            return "scaling is measured from 2 devices up"
        if "channels_last" in str(r.variant) and r.workload == "transformer":
            return "channels_last applies to convolutional networks only"
        if not gpus:
            return "needs a GPU" + (" (DataParallel needs CUDA)" if r.variant == "dataparallel" else "")
        return "skipped by the benchmark: a package or device it needs is missing here"

    return pd.Series([why(r) for r in rows.itertuples()], index=rows.index, dtype=object)


def claims_table(df: pd.DataFrame) -> Table:
    """Each source's published claim beside what speedlib measured (latest commit per machine,
    or the newest uncontended result where the latest was contended: `citable`)."""
    newest = citable(df)
    s, pairs = speedups(newest), paired(newest)
    rows, used, numbers = [], [], []
    for c in CLAIMS:
        hit = _claim_rows(pairs, c, by_suite=True) if c.suite else pairs.iloc[0:0]
        fixed = "".join(f", {k}={v}" for k, v in c.where)
        label = f"{c.suite}: {c.variant} vs {c.baseline} (paired speedup{fixed})"
        if hit.empty:  # not measured in turns on this commit: the ratio of separate measurements
            hit = _claim_rows(s, c, by_suite=False)
            label = f"{c.metric}: {c.variant} vs {c.baseline} ({c.measured_as})"
        if hit.empty and c.also and not _claim_rows(s, c, by_suite=False, metric=c.also).empty:
            hit = _claim_rows(s, c, by_suite=False, metric=c.also)
            label = f"{c.also}: {c.variant} vs {c.baseline} (bandwidth ratio: each as % of a pinned copy timed just before it)"
        fixed = {k for k, _ in c.where}
        others = [p for p in _shown(hit) if p != "workload" and p not in fixed]  # e.g. batch: one row per value
        if c.measured_as == "memory ratio":  # report variant / baseline, as the claim is stated
            hit = hit.assign(ratio=1 / hit["ratio"], ratio_low=1 / hit["ratio_high"], ratio_high=1 / hit["ratio_low"])
        claimed = "" if c.claimed is None and c.claimed_high is None else (
            f"{c.claimed:.3g}x" if c.claimed_high is None else
            f"up to {c.claimed_high:.3g}x" if c.claimed is None else f"{c.claimed:.3g}x-{c.claimed_high:.3g}x")
        claim_numbers = {"technique": c.technique, "source": c.source, "claimed_low": c.claimed,
                         "claimed_high": c.claimed_high, "measured_as": label}
        if hit.empty:
            rows.append({"technique": c.technique, "source": c.source, "claim": c.claim, "claimed": claimed,
                         "measured as": label, "machine": "", "workload": "",
                         "measured": f"not measured yet: {c.how_to_measure}", "comparable": ""})
            numbers.append(claim_numbers)
            continue
        used.append(hit)
        earlier, busy = earlier_version(hit), contended(hit)
        for _, r in hit.sort_values(["machine", "workload", *others], kind="stable").iterrows():
            setting = ", ".join(f"{p}={r[p]}" for p in others if r[p] != "")
            rows.append({"technique": c.technique, "source": c.source, "claim": c.claim, "claimed": claimed,
                         "measured as": label,
                         "machine": f"{r['machine']} ({r['gpu']})", "commit": r["commit"][:8],
                         "workload": f"{r['workload']} ({setting})" if setting else r["workload"],
                         "measured": _fmt_ratio(r["ratio"], r["ratio_low"], r["ratio_high"])
                         + (f" {EARLIER}" if earlier[r.name] else "") + (f" {CONTENDED}" if busy[r.name] else ""),
                         "comparable": comparable(str(r["gpu"]), c, r.get("world"))})
            numbers.append({**claim_numbers, "machine": r["machine"], "gpu": r["gpu"], "commit": r["commit"],
                            "workload": r["workload"], "setting": setting, "ratio": r["ratio"],
                            "low": r["ratio_low"], "high": r["ratio_high"], "N": r["n"],
                            "earlier_version": bool(earlier[r.name]), "contended": bool(busy[r.name]),
                            "contention": r.get("contention", ""),
                            "result_id": r.get("result_id", ""), "comparable": rows[-1]["comparable"]})
    sources = pd.concat(used) if used else df.iloc[0:0]
    # The figures beside the claim, then where they were measured and whether that compares;
    # the source's name and the measurement's name are long and go last.
    order = ["technique", "claim", "claimed", "measured", "machine", "commit", "workload", "comparable", "source",
             "measured as"]
    return Table("Claims versus measured", pd.DataFrame(rows, columns=order), sources,
                 _with_earlier_note(["measured: latest commit per machine, or its newest result measured on an "
                                     f"uncontended machine where the latest was contended ({CONTENDED} where none "
                                     "was); ratio [99 % CI bounds]",
                  "paired speedup: variants taking turns in one process; Hodges-Lehmann estimate of the per-round "
                  "ratios [99 % Wilcoxon interval]; otherwise the ratio of separate measurements [worst-case bounds]"],
                  sources),
                 pd.DataFrame(numbers))


# --- provenance and exports --------------------------------------------------------------

# A commit as git names it: the hash, abbreviated to no fewer than 7 hex digits (SHA-1 has
# 40, SHA-256 64). Anything else in a result file's commit_hash is not put in a command.
_COMMIT = re.compile(r"[0-9a-fA-F]{7,64}")
# The install step holds nothing from a file, so it stays as the docs and goldens spell it.
_INSTALL = 'python3 -m pip install -e ".[bench]"'


def is_commit(commit) -> bool:
    """Whether `commit` is a commit hash (7 to 64 hex digits), safe to check out by name."""
    return isinstance(commit, str) and bool(_COMMIT.fullmatch(commit))


def _not_a_commit(commit) -> str:
    """Why a run with `commit` gets no command that reruns it, in one line."""
    return (f"no Reproduce line for the run of commit '{printable(commit)}': it is not a commit hash (7 to 64 hex "
            "digits), so a command that checks it out could run something else; the result file's commit_hash "
            "needs fixing")


def reproduce_command(commit: str, benchmarks: list[str], quiet: bool = False) -> str:
    """The command that reruns these benchmarks with the library and suite of `commit`;
    `quiet`: they were measured on a contended machine, so the rerun waits for a quiet one.
    Names come from result files: every word is shell-quoted (shlex), so a pasted command
    runs git, pip and speedlib with exactly these arguments; ValueError for a commit that
    is not a hash."""
    if not is_commit(commit):
        raise ValueError(_not_a_commit(commit))
    if not benchmarks:  # '^()' would match every benchmark: a whole-suite rerun, not this one
        raise ValueError("a reproduce command needs the benchmarks it reruns; none were given")
    names = "|".join(re.escape(b) for b in sorted(set(benchmarks)))
    wait = ["--wait-quiet", "600", "--require-quiet"] if quiet else []
    return " && ".join([shlex.join(["git", "checkout", commit]), _INSTALL,
                        shlex.join(["speedlib", "run", *wait, "--bench", f"^({names})"])])


def _statistic(kinds: set[str], n: pd.Series) -> str:
    """How the rows' numbers were obtained, in words, and their N."""
    said = {"time": "median of timed samples (asv)",
            "paired speedup": "Hodges-Lehmann estimate of per-round ratios, variants taking turns in one process "
                              "(N: rounds)"}
    parts = [said[k] for k in ("paired speedup", "time") if k in kinds]
    if kinds - said.keys():
        parts.append("single value per run (asv track)")
    stat = "; ".join(parts)
    low, high = int(n.min()), int(n.max())
    return f"{stat}; N = {low}" if low == high else f"{stat}; N = {low}-{high}"


def provenance(sources: pd.DataFrame) -> list[dict[str, str]]:
    """One entry per run the table draws on (a result file, and the environment record of the
    `speedlib run` that measured its rows), naming the result IDs of its rows and of their
    baselines (`result_id_base`), with what it takes to rerun them. A file that runs added to
    at different times gives one entry per run, each with its own environment."""
    entries = []
    if sources.empty:
        return entries
    for _, rows in sources.groupby(["file", "recorded_at"], sort=False, dropna=False):
        r = rows.iloc[0].map(lambda v: None if not isinstance(v, list) and pd.isna(v) else v)
        gpu = r.get("gpu_model") or f"none (CPU: {r.get('cpu_model') or 'unknown'})"
        ids = pd.concat([rows[c] for c in ("result_id", "result_id_base") if c in rows]).dropna()
        entries.append({
            "results": " ".join(sorted(set(ids))),
            "commit": r["commit"],
            "commit date": r["commit_date"].strftime("%Y-%m-%d") if r["commit_date"] is not None else "unknown",
            "machine": r["machine"],
            "GPU": gpu,
            "driver": r.get("driver") or "n/a",
            "CUDA": f"{r['cuda']} (torch build)" if r.get("cuda") else "n/a",
            "torch": r.get("torch") or "unknown",
            **({"torch threads": f"{r['torch_threads']:g}"} if isinstance(r.get("torch_threads"), (int, float))
               else {}),
            "statistic": _statistic(set(rows["kind"]), rows["n"]),
            "measured": str(r.get("recorded_at") or (r["run_date"].isoformat() if r["run_date"] is not None else "unknown")),
            **({"benchmark code": "an earlier version, changed since (the command below reruns that version)"}
               if earlier_version(rows).any() else {}),
            "machine state": _run_state(rows),
            # None: the commit is no hash, and the footer says so instead (`_footer_lines`)
            "command": reproduce_command(r["commit"], list(rows["benchmark"]), quiet=bool(contended(rows).any()))
            if is_commit(r["commit"]) else None,
        })
    return sorted(entries, key=lambda e: (e["machine"], e["commit date"], e["commit"], e["measured"]))


def _run_state(rows: pd.DataFrame) -> str:
    """What the interference counters of one run's rows said, for its provenance line."""
    states = rows["contention"].fillna("").value_counts() if "contention" in rows else pd.Series(dtype=int)
    busy = int(states.get(contention.CONTENDED, 0))
    if busy:
        return f"{CONTENDED} contended in {busy} of {len(rows)} results (not clean figures: see the notes)"
    left_out = int(rows["dropped"].sum()) if "dropped" in rows else 0
    if states.get(contention.DROPPED, 0):
        return f"quiet but for disturbed rounds, left out ({left_out} in all)" if left_out else \
            "quiet but for a few disturbed rounds"
    if states.get(contention.CLEAN, 0) == len(rows):
        return "quiet (interference counters recorded, no round disturbed)"
    return "interference not recorded (measured before speedlib recorded it)" if not states.get(contention.CLEAN) \
        else "quiet where recorded"


def _footer_lines(table: Table, shared: list[str] = ()) -> list[str]:
    lines = [f"Note: {n}" for n in [*shared, *table.notes]]
    entries = provenance(table.sources)
    if not entries:
        lines.append("Provenance: no measured results in this table.")
    for e in entries:
        lines.append("Provenance: " + ", ".join(f"{k} {v}" for k, v in e.items() if k != "command"))
        lines.append(f"Reproduce: {e['command']}" if e["command"] else f"Note: {_not_a_commit(e['commit'])}")
    lines.append(f"Exported by speedlib {speedlib.__version__}; cite with CITATION.cff and the lines above.")
    return lines


def _informative(table: Table) -> tuple[pd.DataFrame, list[str]]:
    """The columns of `table.frame` that tell rows apart, and a footer line naming the values
    every row shares ("all rows: machine h100-sxm-80gb, commit bdb0cb6d"). Empty columns are
    dropped. This is what a reader of Markdown or LaTeX needs, and it keeps a table inside a
    page; the CSV keeps every column for scripts."""
    frame = table.frame
    if len(frame) < 2:
        return frame.loc[:, [c for c in frame.columns if frame[c].map(_filled).any()]], []
    keep, shared = [], []
    for column in frame.columns:
        values = frame[column]
        if not values.map(_filled).any():
            continue
        if values.map(_filled).all() and values.astype(str).nunique() == 1:
            shared.append(f"{column} {printable(values.iloc[0])}")
        else:
            keep.append(column)
    return frame.loc[:, keep], ([f"all rows: {', '.join(shared)}"] if shared else [])


def _filled(value) -> bool:
    return not (value is None or value == "" or (isinstance(value, float) and math.isnan(value)))


def _cells(frame: pd.DataFrame) -> list[list[str]]:
    """Header and rows as text, every control character written as its escape (`printable`):
    names come from result files, and a newline in one must not start a row, a footer line
    or a LaTeX paragraph of its own in any export."""
    return [[printable(c) for c in frame.columns]] + [["" if pd.isna(v) else printable(v) for v in row]
                                                     for row in frame.itertuples(index=False)]


# Markdown: backslash first (so the escapes added below cannot be cancelled by one from a
# file), the pipe that ends a cell, backticks that open code, the brackets of link, image
# and reference syntax; HTML's <, > and & as entities, so no tag, autolink or entity is
# read from a file.
_MARKDOWN = {"\\": "\\\\", "|": "\\|", "`": "\\`", "[": "\\[", "]": "\\]", "<": "&lt;", ">": "&gt;", "&": "&amp;", "*": "\\*"}
_MARKDOWN_RE = re.compile("|".join(re.escape(k) for k in _MARKDOWN))


def _md(text: str) -> str:
    return _MARKDOWN_RE.sub(lambda m: _MARKDOWN[m.group()], printable(text))


def _md_code(text: str) -> str:
    """`text` as one code span: its fence is longer than any run of backticks inside it, so
    a benchmark name cannot close the span early (nothing in a code span is Markdown or HTML)."""
    text = printable(text)
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# What an export of a table without rows says in place of the table.
NO_ROWS = "No rows: this table is empty."


def to_markdown(table: Table) -> str:
    """A GitHub-flavoured Markdown table under a `##` title, the footer as a list. Every cell,
    the title and each footer line are escaped (`_md`); the reproduce command is a code span."""
    frame, shared = _informative(table)
    rows = [[_md(c) for c in row] for row in _cells(frame)]
    out = [f"## {_md(table.title)}", ""]
    if frame.empty:  # no row (or no column): a header of no cells is no Markdown table
        out.append(NO_ROWS)
    else:
        out += ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
        out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    out.append("")
    for line in _footer_lines(table, shared):
        kind, _, text = line.partition(": ")
        out.append(f"- {kind}: {_md_code(text)}" if kind == "Reproduce" else f"- {_md(line)}")
    return "\n".join(out) + "\n"


# CSV injection (OWASP): a spreadsheet runs a cell that starts with one of these as a
# formula, so such a cell gets a leading single quote. A cell that is only a signed number,
# with or without a percent sign ("-0.6%", "+1.6 %", "-3.2"), is left as it is: it calls and
# references nothing, and quoting it would turn every negative change into text for the
# reader. Tab and carriage return, also on OWASP's list, never start a cell: `_cells`
# writes them as escapes.
_FORMULA_START = ("=", "+", "-", "@")
_SIGNED_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s?%?")


def _csv_cell(text: str) -> str:
    if text.startswith(_FORMULA_START) and not _SIGNED_NUMBER.fullmatch(text):
        return "'" + text
    return text


def _csv_field(text: str) -> str:
    """The csv module's minimal quoting, and also for a '#': read with comment='#', an
    unquoted one would drop the rest of its row (quoted, pandas keeps it)."""
    if any(c in text for c in ',"#\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def to_csv(table: Table) -> str:
    """The table's numbers (`Table.data`: ratio, low, high, value, unit, N, result ID, every
    column kept), then the footer as '#' comment lines (pandas: read_csv(comment='#')).
    Cells that a spreadsheet would run as formulas are neutralised (`_csv_cell`)."""
    frame = table.frame if table.data is None else table.data
    rows = [[_csv_field(_csv_cell(c)) for c in row] for row in _cells(frame)]
    body = "".join(",".join(row) + "\n" for row in rows)
    return body + "".join(f"# {printable(line)}\n" for line in _footer_lines(table))


# < > | print as other glyphs in LaTeX's default font encoding, so they are named.
_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
          "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
          "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}"}
_LATEX_RE = re.compile("|".join(re.escape(k) for k in _LATEX))


def _tex(text: str) -> str:
    """`text` as LaTeX that prints it: specials escaped, control characters (a newline, a
    blank line that would end the paragraph) as escapes. A leading `[` is braced: after the
    previous row's `\\` it would be read as that command's optional spacing argument."""
    text = _LATEX_RE.sub(lambda m: _LATEX[m.group()], printable(text))
    return "{}" + text if text.startswith("[") else text


def to_latex(table: Table) -> str:
    """A plain `table` environment (no package needed) with the footer in small print."""
    frame, shared = _informative(table)
    rows = _cells(frame)
    out = [f"% speedlib export: {printable(table.title)}", r"\begin{table}[ht]", r"\centering", r"\footnotesize"]
    if frame.empty:  # a tabular of no columns does not compile
        out.append(NO_ROWS + r"\par")
    else:
        out += [r"\begin{tabular}{" + "l" * len(rows[0]) + "}", r"\hline",
                " & ".join(_tex(c) for c in rows[0]) + r" \\", r"\hline"]
        out += [" & ".join(_tex(c) for c in r) + r" \\" for r in rows[1:]]
        out += [r"\hline", r"\end{tabular}"]
    out += [f"\\caption{{{_tex(table.title)}}}", r"\par\scriptsize"]
    out += [_tex(line) + r"\\" for line in _footer_lines(table, shared)]
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"


def bibtex(cff_text: str) -> str:
    """A BibTeX @software entry from the text of CITATION.cff (yaml.safe_load: no code runs).

    Every value is made literal (`_bib`, `_bib_url`): a title in the file cannot close its
    field, add a field or an entry, or run a TeX command. ValueError, in one line, for a file
    that is not a CITATION.cff (not YAML, tagged objects, a list where text belongs)."""
    meta = _citation(cff_text)

    def text(key: str) -> str:
        return _cff_text(meta.get(key), key)

    names = [_bib_author(a) for a in _cff_list(meta, "authors")]
    year = re.match(r"\d{4}", text("date-released"))
    # CFF allows one SPDX identifier or a list of them, any of which applies
    licenses = meta["license"] if isinstance(meta.get("license"), list) else [meta.get("license")]
    fields = {"author": " and ".join(names), "title": _bib(text("title")), "version": _bib(text("version")),
              "year": year.group() if year else "", "url": _bib_url(text("repository-code") or text("url")),
              "license": _bib(" or ".join(t for t in (_cff_text(x, "license") for x in licenses) if t)),
              "note": _bib(text("message"))}
    key = f"speedlib{fields['year']}"
    body = ",\n".join(f"  {k} = {{{v}}}" for k, v in fields.items() if v)
    return f"@software{{{key},\n{body}\n}}\n"


def _citation(cff_text: str) -> dict:
    """CITATION.cff's top-level mapping; ValueError in one line where it is none."""
    import yaml  # noqa: PLC0415 - only the dashboard needs it

    try:
        meta = yaml.safe_load(cff_text)
    except yaml.constructor.ConstructorError as e:  # !!python/object and the like: safe_load refuses them
        if "unhashable" in str(e.problem):  # `? [a, b]`: a list or mapping used as a field's name
            raise ValueError(f"CITATION.cff{_yaml_where(e)} uses a list or mapping as a field's name: fix the "
                             "file") from None
        raise ValueError(f"CITATION.cff{_yaml_where(e)} holds a YAML tag that is not plain data "
                         f"({printable(str(e.problem))[:120]}): remove it") from None
    except ValueError as e:  # a value YAML reads as a date that is none (date-released: 2026-13-45)
        raise ValueError(f"CITATION.cff holds a date that is no date ({printable(str(e))[:120]}): write it as "
                         "YYYY-MM-DD") from None
    except yaml.YAMLError as e:
        said = ", ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
        raise ValueError(f"CITATION.cff is not valid YAML{_yaml_where(e)}: {printable(said)[:120]}; fix the file") \
            from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ValueError("CITATION.cff nests too deeply to be read: it is not a citation file; fix it") from None
    if meta is None:  # an empty file would give an entry with no field at all
        raise ValueError("CITATION.cff is empty: it needs at least title: and authors:; fix the file")
    if not isinstance(meta, dict):
        raise ValueError(f"CITATION.cff holds {_yaml_kind(meta)}, not a mapping of fields (title:, authors:, ...): "
                         "fix the file")
    return meta


def _yaml_where(error) -> str:
    mark = getattr(error, "problem_mark", None)
    return f" (line {mark.line + 1})" if mark is not None else ""


def _yaml_kind(value) -> str:
    return {list: "a list", dict: "a mapping", str: "text", int: "a number", float: "a number",
            bool: "true or false"}.get(type(value), f"a {type(value).__name__}")


def _cff_text(value, key: str) -> str:
    """The value of field `key` as text ("" where absent): a date or a number is text too, a
    list or a mapping is a ValueError, in one line."""
    if value is None:
        return ""
    if isinstance(value, (list, dict)):
        raise ValueError(f"CITATION.cff: '{key}' is {_yaml_kind(value)}, where text belongs: fix the file")
    return str(value)


def _cff_list(meta: dict, key: str) -> list:
    value = meta.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"CITATION.cff: '{key}' is {_yaml_kind(value)}, where a list belongs: fix the file")
    return value


def _bib_author(author) -> str:
    """One author as BibTeX names them: an organisation braced whole (else BibTeX would split
    it into first and last names), a person as "family, given"."""
    if not isinstance(author, dict):
        raise ValueError(f"CITATION.cff: an author is {_yaml_kind(author)}, where a mapping (name: or family-names:, "
                         "given-names:) belongs: fix the file")
    if _cff_text(author.get("name"), "name"):
        return "{" + _bib(_cff_text(author["name"], "name")) + "}"
    parts = [_bib_name_part(_cff_text(author.get(k), k)) for k in ("family-names", "given-names")]
    return ", ".join(p for p in parts if p)


def _bib_name_part(text: str) -> str:
    """A family or given name, braced where BibTeX would otherwise split it: at a comma, or at
    the word 'and' (which separates authors)."""
    text = _bib(text)
    return "{" + text + "}" if re.search(r",|\band\b", text, re.IGNORECASE) else text


# LaTeX's specials, as for tables (`_tex`), but braces as commands: BibTeX matches every
# brace of a field, escaped or not, so a `\}` from a file would still close the field.
_BIBTEX = {**_LATEX, "{": r"\textbraceleft{}", "}": r"\textbraceright{}"}
_BIBTEX_RE = re.compile("|".join(re.escape(k) for k in _BIBTEX))


def _bib(text: str) -> str:
    """`text` as a BibTeX field value that prints it: control characters as escapes (a blank
    line would end the paragraph), every special character and brace as a command."""
    return _BIBTEX_RE.sub(lambda m: _BIBTEX[m.group()], printable(text))


def _bib_url(url: str) -> str:
    """A URL, read verbatim by biblatex: characters a URL cannot hold (braces, backslash,
    spaces, quotes, control characters) percent-encoded, so it neither closes its field nor
    reads as a command."""
    return urllib.parse.quote(url, safe=":/?#[]@!$&'()*+,;=%~-._")
