"""Tables from the tidy results, and their exports: the one module callers import.

The dashboard, the `speedlib report` command, the headline and the tests use `report.X`;
the code lives in modules named for what they hold, and every name is re-exported here:

- speedbench.tables: `Table`, speedups, memory, paired speedups, noise and floor tables
  (how a ratio and its interval are computed is in its docstring);
- speedbench.history: each benchmark across commits, and the changes between two commits;
- speedbench.significance: asv compare's significance rule (`differ`, the Mann-Whitney U test)
  and step detection, in numpy only, so that viewing results needs neither asv nor scipy;
- speedbench.techniques: each technique's title, baseline and headline (`TECHNIQUES`);
- speedbench.claims: the sources' claims (`CLAIMS`) and the claims table;
- speedbench.exports: Markdown, CSV and LaTeX with their provenance footer, and BibTeX.

This module itself holds the GPU-vs-GPU tables: one machine's results beside another's.
No Streamlit import: the dashboard and the `speedlib report` command share these modules.
"""

from __future__ import annotations

import pandas as pd

# The modules the tables live in. Every name below is re-exported for callers (the dashboard,
# the CLI, the headline, the docs and the tests use `report.X`), private ones included, so
# that the split changed no caller.
from speedbench.claims import (CLAIMS, Claim, _claim_rows, claims_table, comparable, is_own_baseline, never_run,
                               why_not_measured)
from speedbench.exports import (NO_ROWS, _cells, _csv_cell, _csv_field, _footer_lines, _informative, _md,
                                _md_code, _not_a_commit, _run_state, _statistic, _tex, bibtex, is_commit,
                                csv_bundle, csv_provenance, provenance, provenance_path, reproduce_command, to_csv,
                                to_latex, to_markdown)
from speedbench.history import (_fmt_change, _fmt_test, change_table, compare_commits, history, history_table,
                                resolve_commit)
from speedbench.significance import (EXACT_MAX, MIN_SEGMENT, P_THRESHOLD, SIGNIFICANCE_FACTOR, MannWhitney,
                                   _best_split, _change_ratio, _steps, _verdict, differ, mann_whitney_u)
from speedbench.tables import (CONTENDED, CONTENDED_NOTE, EARLIER, EARLIER_NOTE, FLOOR_ABOVE_NOTE, FLOOR_FIGURES,
                               FLOOR_ONLY, MEMORY_NOTE, NOT_A_BANDWIDTH, NOT_RECORDED,
                               NOISE_TARGET, NOT_COMPARED, PAIRED_NOISE_TARGET, PAIRED_WIDTH_TARGET, UNDEFINED,
                               GPU_TESTS_FAILED, GPU_TESTS_NOTE, Table, _comparison, _config, _fmt_ratio, _fmt_value, _shown, _why_wide,
                               _with_earlier_note, _with_ratio, case_label, citable, contended, earlier_version, floor_figures,
                               gpu_tests_failed,
                               floor_table, latest,
                               machine_state, memory_table, newest_runs, noise, noise_table, paired, paired_noise,
                               paired_table, param_columns, speedup_table, speedups)
from speedbench.techniques import TECHNIQUES, Technique

__all__ = ["Claim", "CLAIMS", "TECHNIQUES", "Table", "speedups", "speedup_table", "memory_table",
           "floor_table", "floor_figures", "FLOOR_FIGURES", "FLOOR_ONLY", "NOT_RECORDED", "NOT_A_BANDWIDTH", "noise", "noise_table", "NOISE_TARGET", "case_label", "history", "history_table", "compare_machines", "machine_comparison", "same_work", "speedup_comparison", "is_own_baseline", "why_not_measured", "never_run", "bibtex", "claims_table", "latest",
           "newest_runs", "param_columns", "provenance", "reproduce_command", "is_commit", "to_markdown", "to_csv", "csv_provenance", "provenance_path", "csv_bundle", "to_latex",
           "SIGNIFICANCE_FACTOR", "P_THRESHOLD", "MIN_SEGMENT", "MannWhitney", "mann_whitney_u", "differ",
           "resolve_commit", "compare_commits", "change_table", "paired", "paired_table", "paired_noise",
           "PAIRED_NOISE_TARGET", "PAIRED_WIDTH_TARGET", "citable", "contended", "machine_state", "CONTENDED",
           "CONTENDED_NOTE", "gpu_tests_failed", "GPU_TESTS_FAILED", "GPU_TESTS_NOTE"]


# --- GPU vs GPU: one machine's results beside another's -----------------------------

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

