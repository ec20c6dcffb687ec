"""Every paired comparison of every technique, one line each: the overview's index.

The headline grid shows one comparison per technique; the suite measures about thirty
(seven more Tuning Guide knobs, the flat buffer's optimizer step and whole iteration, the
embedding's training step...). A reader of the first page should see that they exist and
roughly what they found, then follow a link to the technique's page for the details. So a
line is one benchmark class's variant against its baseline (a knob's on against off), and a
machine's cell holds that line's ratios over the class's other parameters (workloads, batch
sizes): each case by name where there are few, else their range and count.
"""

from __future__ import annotations

import pandas as pd

from speedbench import report

__all__ = ["every_comparison", "MAX_CASES_NAMED"]

# Cases named one by one in a cell; past this a cell gives the range and the count, which keeps
# each line one line at 1440 px (checkpointing has six workload-batch cases per variant).
MAX_CASES_NAMED = 3
# what `_cell` and the marks it keeps read of a paired row
_CELL_COLUMNS = ("config", "ratio", "ratio_low", "ratio_high", "n", "contention", "contention_base", "earlier_version")


def _case(config: str, knob) -> str:
    """The parameters that tell a line's cases apart: its config without the knob (which the
    line names) and without names where the value says it ("resnet50", "batch=16")."""
    parts = [p for p in str(config or "").split(", ") if p and not (isinstance(knob, str) and p == f"knob={knob}")]
    return ", ".join(p.split("=", 1)[1] if p.startswith("workload=") else p for p in parts)


def _cell(rows: pd.DataFrame) -> str:
    """One machine's ratios of one line: "2.51x [2.4, 2.6] N=15", "mlp: 2.22x; resnet50: 1.23x",
    or "0.39x to 0.75x over 6 cases"; each figure's marks (contended, earlier version) kept."""
    rows = rows.sort_values("config", kind="stable")
    marks = [("" if not busy else f" {report.CONTENDED}") for busy in report.contended(rows)]
    earlier = " " + report.EARLIER if report.earlier_version(rows).any() else ""
    if len(rows) == 1:
        r = rows.iloc[0]
        case = _case(r["config"], r.get("knob"))
        return (f"{case}: " if case else "") + f"{report.fmt_ratio(r.ratio, r.ratio_low, r.ratio_high)}" \
            + f"{marks[0]} N={r.n}{earlier}"
    if len(rows) <= MAX_CASES_NAMED:
        return "; ".join(f"{_case(r.config, getattr(r, 'knob', None))}: {report.fmt_ratio(r.ratio, None, None)}{m}"
                         for r, m in zip(rows.itertuples(), marks, strict=True)) + earlier
    low, high = rows["ratio"].min(), rows["ratio"].max()
    busy = f" ({sum(bool(m) for m in marks)} {report.CONTENDED})" if any(marks) else ""
    return f"{report.fmt_ratio(low, None, None)} to {report.fmt_ratio(high, None, None)} over {len(rows)} " \
           f"cases{busy}{earlier}"


def every_comparison(df: pd.DataFrame) -> report.Table:
    """One row per technique, benchmark class, knob, variant and baseline, one column per
    machine (its latest commit, as the technique pages open on). Columns: technique (its
    title), page (the technique's name, its dashboard page), comparison, then
    "<machine> (<GPU>)" per machine; an empty cell: not measured there."""
    last = report.latest(df[df["technique"].isin(report.TECHNIQUES)]) if not df.empty else df
    s = report.paired(last) if not last.empty else last
    if s.empty:
        return report.Table("Every paired comparison", pd.DataFrame(columns=["technique", "page", "comparison"]),
                            s, [])
    s = s.assign(knob=s["knob"] if "knob" in s else None)
    machines = sorted(s["machine"].unique())
    gpus = dict(zip(s["machine"], s["gpu"].astype(str), strict=True))
    columns = {m: f"{m} ({gpus[m]})" for m in machines}
    order = {name: i for i, name in enumerate(report.TECHNIQUES)}
    keys = ["technique", "suite", "knob", "variant", "baseline"]
    # the columns a cell reads: each per-machine cut of the wide frame copied all of them (1.4 s
    # of the Overview's cold view)
    cells = s[keys + ["machine", *(c for c in _CELL_COLUMNS if c in s)]]
    lines = []
    for (technique, suite, knob, variant, baseline), rows in sorted(
            cells.groupby(keys, dropna=False, sort=False),
            key=lambda kv: (order[kv[0][0]], str(kv[0][1]), str(kv[0][2]), str(kv[0][3]))):
        what = f"{suite}" + (f" ({knob})" if isinstance(knob, str) and knob else "") + f": {variant} vs {baseline}"
        line = {"technique": report.TECHNIQUES[technique].title, "page": technique, "comparison": what}
        mine = dict(tuple(rows.groupby("machine", sort=False)))
        for m in machines:
            line[columns[m]] = _cell(mine[m]) if m in mine else ""
        lines.append(line)
    notes = [f"x faster than the baseline, paired (the variants took turns in one process); latest commit per "
             f"machine; a cell with one case gives its 99 % interval and N, with up to {MAX_CASES_NAMED} cases "
             "each case's estimate, with more the range over them; each technique's page has every case with "
             "its interval and chart"]
    notes = report.with_earlier_note(notes, s)
    return report.Table("Every paired comparison", pd.DataFrame(lines), s, notes)
