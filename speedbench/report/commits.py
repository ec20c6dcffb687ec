"""Results across commits: each benchmark's history, and the changes between two commits.

Significance (history, `speedlib report --fail-on-regression`) follows asv compare 0.6: the
rule and the step detection are in speedbench.stats.significance (`differ`, `_steps`); this module
applies them to the tidy results, comparing like with like (one environment, uncontended
results) and writes the tables.
"""

from __future__ import annotations

import itertools
import math
import re

import pandas as pd

from speedbench.report.marks import CONTENDED, _commit_label, contended, with_earlier_note
from speedbench.report.reruns import NOT_COMPARED
from speedbench.report.rows import Table, fmt_value
from speedbench.results import machines
from speedbench.results.load import is_commit
from speedbench.stats import contention
from speedbench.stats.significance import (
    EXACT_MAX,
    MIN_SEGMENT,
    P_THRESHOLD,
    SIGNIFICANCE_FACTOR,
    _direction,
    _steps,
    _verdict,
)

__all__ = ["history", "history_table", "resolve_commit", "compare_commits", "change_table"]


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
    Only like with like: where the environment (CPU, GPU, torch/CUDA build: speedbench.results.machines)
    differs from the previous row's, that row gets no change but environment_change ('torch
    2.15.0+cu132 -> 2.14.1+cu130'), and steps are sought within each stretch of one environment.
    A contended result (speedbench.stats.contention) is left out (`left_out`): it gets no change, is
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
        for before, i in itertools.pairwise(quiet):
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
              "approximation with tie correction) and disjoint 99 % confidence intervals, else disjoint intervals "
              "alone, else (no statistics) by the ratio alone; asv compare's rule, with the intervals' condition "
              "added (a jump of the median inside overlapping intervals is run-to-run drift)")


def history_table(df: pd.DataFrame, benchmark: str) -> Table:
    h = history(df, benchmark)
    frame = pd.DataFrame({
        "machine": h["machine"], "commit": _commit_label(h) if not h.empty else h["commit"],
        "commit date": h["commit_date"].dt.strftime("%Y-%m-%d"), "params": h["params"],
        "value": [fmt_value(v, u) for v, u in zip(h["value"], h["unit"], strict=True)],
        "change": [_fmt_change(c) for c in h["change"]],
        "test": [_fmt_test(t, p) for t, p in zip(h["test"], h["p_value"], strict=True)],
        "flag": [_flag(d, s, e, x) for d, s, e, x in zip(h["direction"], h["step_direction"], h["environment_change"],
                                                         h["left_out"], strict=True)],
        "N": h["n"],
    })
    contended_notes = [f"'{CONTENDED} contended: {NOT_COMPARED}': measured on a busy machine; the next commit is "
                       "compared with the last one measured on a quiet one", *with_earlier_note([], h[h["left_out"]])] \
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
    (CPU, GPU, torch/CUDA build: speedbench.results.machines), or on a contended machine
    (speedbench.stats.contention), whose difference no verdict could tell from the code's."""
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
        where = sorted({f"{r['machine']} at "
                        f"{r['commit'][:8] if r.get('contention') == contention.CONTENDED else r['commit_base'][:8]}"
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
        a8: [fmt_value(v, u) for v, u in zip(s["value_base"], s["unit"], strict=True)],
        b8: [fmt_value(v, u) for v, u in zip(s["value"], s["unit"], strict=True)],
        "change": [_fmt_change(c) for c in s["change"]],
        "test": [_fmt_test(t, p) for t, p in zip(s["test"], s["p_value"], strict=True)], "verdict": s["direction"],
        "N": [f"{na} / {nb}" for na, nb in zip(s["n_base"], s["n"], strict=True)],
    })
    counts = s["direction"].value_counts()
    compared = pd.concat([_latest_run(df, c) for c in (m["commit_base"].iloc[0], m["commit"].iloc[0])])
    compared = compared[compared.set_index(_CASE).index.isin(m.set_index(_CASE).index)]
    notes = [f"{len(m)} results compared ({', '.join(sorted(m['machine'].unique()))}): "
             f"{counts.get('regression', 0)} significant regression(s), {counts.get('improvement', 0)} improvement(s)",
             f"change = {b8} / {a8} - 1; listed where {_RULE_NOTE}"]
    return Table(f"Significant changes from {a8} to {b8}", frame.reset_index(drop=True), compared, notes)

