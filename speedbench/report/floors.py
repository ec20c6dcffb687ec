"""The floor table: results given as a fraction of a physical floor, each beside the GB/s it
achieved and the floor's GB/s from the same measurement (`floor_figures`, `floor_table`).
"""

from __future__ import annotations

import math

import pandas as pd

from speedbench.report.marks import _identity, _numbers, with_earlier_note
from speedbench.report.roofline import is_roofline
from speedbench.report.rows import Table

__all__ = ["floor_table", "floor_figures", "FLOOR_FIGURES", "FLOOR_ONLY", "FLOOR_ABOVE_NOTE", "NOT_RECORDED",
           "NOT_A_BANDWIDTH"]


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
    # the roofline's % are a grid of points, tabled on their own (speedbench.report.roofline)
    s = df[(df["kind"] == "fraction of floor") & ~is_roofline(df)].sort_values(
        ["technique", "machine", "commit_date", "benchmark"], kind="stable")
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
