"""Paired speedups: the variants that took turns in one process, each against its class's baseline
and the headline's other baselines (`paired`, `against`, `paired_table`).

Paired speedups (`paired`, `paired_table`, the headline): a comparison whose variants took
turns in one process stores one ratio per round (benchmarks/common.py); the speedup is the
Hodges-Lehmann estimate of those ratios with the 99 % interval of the Wilcoxon signed-rank
test (speedbench.stats.paired says why), and N is the number of rounds. The cross-process
speedups (speedbench.report.ratios) remain for benchmarks measured one variant per process.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from speedbench.report.marks import (
    CONTENDED,
    _commit_label,
    _numbers,
    contended,
    earlier_version,
    machine_state,
    with_earlier_note,
)
from speedbench.report.ratios import BASELINE_NOTE, _ratio_numbers
from speedbench.report.rows import Table, fmt_ratio, shared_config
from speedbench.stats import contention
from speedbench.stats.paired import paired_ratio, ratio_estimate
from speedbench.techniques import TECHNIQUES

__all__ = ["paired", "paired_table", "against", "other_baselines", "headline_rows", "why_wide",
           "PAIRED_NOISE_TARGET", "PAIRED_WIDTH_TARGET"]


# Targets for paired ratios on a shared 2-core machine: two runs of one commit agree within
# 5 %, and a ratio's 99 % interval spans less than 1.10x (high / low).
PAIRED_NOISE_TARGET = 0.05
PAIRED_WIDTH_TARGET = 1.10


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

    def baseline(machine, commit, benchmark, technique, config, unrated) -> str:
        key = (machine, commit, benchmark.rsplit(".", 1)[0], config)
        chain = TECHNIQUES[technique].baselines if technique in TECHNIQUES else ()
        # the variants timed, and those whose ratio the entry left empty (the baseline's never
        # is stored): a selection that measured the ratios alone (--bench ...track_speedup) has
        # its baseline there
        found = variants.get(key, set()) | set(unrated if isinstance(unrated, (list, tuple)) else ())
        return next((b for b in chain if b in found), "")

    unrated = s["unrated"] if "unrated" in s else [()] * len(s)  # frames built by hand may hold none
    s["baseline"] = [baseline(*k) for k in zip(s["machine"], s["commit"], s["benchmark"], s["technique"], s["config"],
                                               unrated, strict=True)]
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
    present = set(zip(df["technique"], df["suite"], strict=True))  # a frame of one class: its comparisons alone
    out = []
    for t in TECHNIQUES.values():
        for h in (t.comparison, t.comparison.whole if t.comparison else None):
            if h is None or not h.paired or (h.technique, h.suite) not in present:
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


def paired_table(df: pd.DataFrame, baseline: str | None = None) -> Table:
    """Paired speedups: the headline of every comparison measured with variants taking turns;
    with `baseline`, only those against it where there are any (else every one)."""
    s = paired(df)
    if baseline is not None and (s["baseline"] == baseline).any():
        s = s[s["baseline"] == baseline]  # the notes below count and mark these rows only
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
