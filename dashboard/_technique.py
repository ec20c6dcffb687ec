"""The page every technique gets, one template for every record in TECHNIQUES: time, memory and
floor tables for one machine and commit, charts that show every sample, and what was not measured.
`page(name)` is technique `name`'s page, served at /<name>."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import streamlit as st
from _glance import glance_chart
from _roofline import roofline_tab
from _tables import caption, md_text, show, table
from _view import cached, pick, pick_many, results, say_names, show_problems, suite_listing, tabs

from speedbench import chunks, report, words
from speedbench.report import headline, roofline
from speedbench.report.chart_rows import FLOOR_HOVER, config_label
from speedbench.report.vega import bars_spec, ratio_spec, spread_spec
from speedbench.results.environment import NoGpuModel

# The line above the tabs names the machine and its GPU, the title the technique, and the page
# shows one of each: in every table they would only push the numbers past the right edge.
STATED = ("machine", "GPU", "technique")


@dataclass(frozen=True)
class OwnTab:
    """A tab a technique's page adds after the others, for classes it draws its own way:
    `title`; `owns(rows)`, the rows it takes (left out of the other tabs); `show(rows, machine,
    commit, where, hide)` with the page's rows on its machine at every commit, that machine, the
    commit picked, the machine in a chart's words, and the columns the page states above the tabs."""

    title: str
    owns: Callable[[pd.DataFrame], pd.Series]
    show: Callable[[pd.DataFrame, str, str, str, tuple[str, ...]], None]


# The tabs a technique's page adds for classes it draws its own way, by technique (dashboard-only:
# the record is harness data and knows no Streamlit); tests/dashboard/test_dashboard.py holds the keys to TECHNIQUES.
OWN_TABS = {"transfer": OwnTab("Roofline", roofline.is_roofline, roofline_tab)}


def page(name: str) -> st.Page:
    """Technique `name`'s page at /<name> (the address its own file views/<name>.py once gave it).
    Streamlit knows a page by its url_path, so a page built here again (a link, a click) is the
    one app.py registered."""
    return st.Page(functools.partial(technique_page, name), title=report.TECHNIQUES[name].title, url_path=name)


def technique_page(name: str) -> None:
    technique = report.TECHNIQUES[name]
    own = OWN_TABS.get(name)
    st.title(technique.title)
    data = results()
    show_problems(data)
    df = data["measured"]
    rows = df[df["technique"] == name]
    if rows.empty:
        st.info(f"No measured results for this technique yet. They come from benchmarks/bench_{name}.py: "
                f"`speedlib run --bench bench_{name}` on a machine, then commit results/.")
        _not_measured(data, name)
        return
    # The page opens with its chart: this technique's rows on every machine, as the overview draws them.
    glance_chart(cached(data, "headline", lambda: headline.grid(df), *sorted(df["machine"].unique()), rows=df), name,
                 page, technique=name)
    c1, c2, c3, c4, c5 = st.columns(5)
    with c1:
        machine = pick("Machine", sorted(rows["machine"].unique()), key="machine", default=report.opening_machine(rows))
    rows = rows[rows["machine"] == machine]
    commits = list(rows.sort_values("commit_date", ascending=False)["commit"].str[:8].unique())
    with c2:
        commit = pick("Commit (newest first)", commits, key="commit")
    on_machine = rows
    rows = report.newest_runs(rows[rows["commit"].str[:8] == commit])  # a commit run twice: its latest run
    first = rows.iloc[0]  # the run's environment, whichever tab its results are in
    if own is not None:  # the own tab's rows stay out of the others' tables and charts
        rows = rows[~own.owns(rows)]
    with c3:
        workloads = pick_many("Workloads", sorted(rows["workload"].dropna().unique()), key="workload")
    rows = rows[rows["workload"].isin(workloads) | rows["workload"].isna()]
    with c4:  # the benchmark class: what a cell of the chart times (its scope)
        classes = pick_many("Classes", sorted(rows["suite"].dropna().unique()), key="suite")
    rows = rows[rows["suite"].isin(classes) | rows["suite"].isna()]
    with c5:
        variants = sorted(rows["variant"].dropna().unique())
        baseline = pick("Baseline", variants, key="baseline",
                        default=report.opening_baseline(technique, variants, rows["gpu"].iloc[0] if len(rows) else ""))
    # Any variant may be picked to compare with, but only plain PyTorch is a baseline: say so.
    against = "" if baseline in technique.plain else (
        ", which is not plain PyTorch: a ratio against it moves with that variant's own code")
    # A result file may carry no date (asv leaves it out for a commit it could not date).
    date = "date unknown" if pd.isna(first["commit_date"]) else f"{first['commit_date']:%Y-%m-%d}"
    st.text(f"{machine}: {first['gpu']} | CPU {first['cpu_model']} | commit {first['commit']} ({date}) | "
            f"torch {first['torch']} | CUDA {first['cuda']} (torch build) | "
            f"driver {'n/a' if pd.isna(first['driver']) or not first['driver'] else first['driver']}")
    # Charts name the machine too: a screenshot of one loses the line above.
    where = f"{machine} ({first['gpu']})"
    _one_device(name, rows, machine)
    view = (name, machine, commit, *workloads, "|", *classes, "|", baseline)  # what `rows` and the tables follow

    def keep(label: str, compute, *more):  # a table of this view, computed once for every reader of it
        return cached(data, f"{name} {label}", compute, *view, *more)

    names = ["Time", "Memory", "Bandwidth and floor", "Not measured", *([own.title] if own else [])]
    has = [not rows[rows["kind"] == "time"].empty, not rows[rows["kind"] == "memory"].empty,
           not rows[rows["kind"].isin(["fraction of floor", "bandwidth"])].empty]
    # A page opens on its first tab with results (an H100 run of transfer's headline chunk
    # measured bandwidth only, and its Time tab was empty).
    if own is not None:  # a commit whose run measured only the own tab's classes opens on it
        mine = on_machine[own.owns(on_machine)]
        has += [False, not mine[mine["commit"].str[:8] == commit].empty]
    time_tab, memory_tab, floor_tab, missing_tab, *own_tab = tabs(
        names, default=names[has.index(True)] if any(has) else names[0])
    glossary = words.glossary(name, rows["variant"].dropna(), rows["knob"].dropna() if "knob" in rows else (),
                              rows["suite"].dropna())
    with time_tab:
        if _open(time_tab):
            timed = rows[rows["kind"] == "time"]
            if timed.empty:
                st.info(f"No timing results for this technique from {md_text(machine)} at commit "
                        f"{md_text(commit)}: its run did not "
                        f"include them. `{_command(name)}` measures its main comparison.")
            else:
                _paired(rows, where, baseline, keep)
                metrics = sorted(timed["metric"].unique())
                # The paired classes' per-variant times are "seconds"; older benchmarks' the headline.
                metric = pick("Timed metric", metrics, key="metric",
                              default="seconds" if "seconds" in metrics else technique.headline, words=words.metric)
                timed = timed[timed["metric"] == metric]
                speedup = keep("speedup", lambda: report.speedup_table(timed, "time", baseline), metric)
                # names from result files: escaped, and in code spans that no backtick of theirs can close
                said = f"{report.md_escape(words.metric(metric))} ({report.md_code(metric)})"
                st.markdown(f"**Separately timed**: {said}, medians against {report.md_code(baseline)}{against} "
                            "(worst-case bounds)")
                table(speedup, hide=STATED)
                # a chart too is the same for every reader of the view: built once
                st.vega_lite_chart(None, keep("spread", lambda: spread_spec(
                    timed, f"{words.metric(metric)}: every sample, {where}"), metric), width="stretch")
                s = speedup.sources
                s = s.assign(case=config_label(s) + " / " + s["variant"].astype(str), where=where)
                st.vega_lite_chart(None, keep("ratios", lambda: ratio_spec(
                    s, "case", "where", f"{words.metric(metric)}: speedup over {baseline}"), metric), width="stretch")
            say_names(glossary)
    with memory_tab:
        if _open(memory_tab):
            memory = rows[rows["kind"] == "memory"]
            if memory.empty:
                if first["gpu"] == NoGpuModel.CPU_ONLY:
                    st.info("No memory results here: peak GPU memory is measured on GPU machines only.")
                else:
                    st.info(f"No memory results for this technique from {md_text(machine)} at commit "
                            f"{md_text(commit)}: its run did "
                            "not include them (`speedlib run --plan` lists what each chunk measures).")
            else:
                table(keep("memory", lambda: report.memory_table(memory, baseline)), hide=STATED)
                # one chart per metric (peak, activations), built once for every reader of the view
                for chart in keep("memory charts", lambda: [bars_spec(same, "bytes", where)
                                                            for _, same in memory.groupby("metric", sort=True)]):
                    st.vega_lite_chart(None, chart, width="stretch")
                say_names(glossary)
    with floor_tab:
        if _open(floor_tab):
            floors = rows[rows["kind"] == "fraction of floor"]
            # The GB/s a % was computed from (FractionOfFloor's gather_bandwidth, h2d_floor, ...)
            # stand beside it in the floor table only: as variant / baseline speedups they would
            # repeat it confusingly (report.FLOOR_ONLY says why), so the table below leaves them out.
            bandwidth = rows[(rows["kind"] == "bandwidth") & ~rows["metric"].isin(report.FLOOR_ONLY)]
            if floors.empty and bandwidth.empty:
                st.info("No bandwidth or floor results here.")
            if not floors.empty:
                # every kind: the table finds each %'s GB/s among the bandwidth rows of its run
                floor = keep("floor", lambda: report.floor_table(rows))
                table(floor, hide=STATED)
                # One chart per reference: gather is a % of the host->device copy, write-back of
                # device->host; one axis named after the first mislabelled the other.
                for chart in keep("floor charts", lambda: _floor_charts(rows, floor, where)):
                    st.vega_lite_chart(None, chart, width="stretch")
                say_names(glossary)
            if not bandwidth.empty:
                table(keep("bandwidth", lambda: report.speedup_table(bandwidth, "bandwidth", baseline)), hide=STATED)
    with missing_tab:
        if _open(missing_tab):
            _not_measured(data, name, machine)
    if own is not None:
        with own_tab[0]:
            if _open(own_tab[0]):
                own.show(on_machine[own.owns(on_machine)], machine, commit, where, STATED)


def _open(tab) -> bool:
    """Whether to draw `tab`'s content: the open tab alone (`tabs` reruns on a switch), so a page
    draws one tab's tables and charts, not four; every tab where Streamlit tracks no state."""
    return getattr(tab, "open", None) is not False


def _paired(rows: pd.DataFrame, where: str, baseline: str, keep) -> None:
    """The comparisons measured with the variants taking turns: the numbers to cite. Those
    against the baseline picked above, else (a variant picked to compare with) all of them.
    `keep(label, compute)`: the page's cache of what its view computes."""
    paired = keep("paired", lambda: report.paired_table(rows, baseline))
    s = paired.sources  # speedups only: the baseline has times but no speedup of its own
    if s.empty:
        return
    picked = bool((s["baseline"] == baseline).all())
    which = (f"against {report.md_code(baseline)}, the baseline picked above" if picked else
             "each class's own baseline, and the headline variant against every baseline the overview shows it "
             "against")
    st.markdown("**Paired speedups** (the variants took turns in one process; Hodges-Lehmann estimate "
                f"of the per-round ratios, brackets its 99 % Wilcoxon interval; {which})")
    if not picked:
        caption(f"None was paired against {baseline}: every paired speedup is shown, each against its own baseline.")
    table(paired, hide=STATED)
    s = s.assign(case=config_label(s) + " / " + s["variant"].astype(str) + " vs " + s["baseline"].astype(str),
                 where=where)
    st.vega_lite_chart(None, keep("paired chart", lambda: ratio_spec(
        s, "case", "where", "paired speedup: x faster than the baseline")), width="stretch")


def _floor_charts(rows: pd.DataFrame, floor: report.Table, where: str) -> list:
    """The floor tab's charts, gather's first as the table orders them, each bar's hover the
    table's own words for it (the %, and the GB/s columns `floor` shows)."""
    shown = report.floor_figures(rows)
    hover = tuple(h for h in FLOOR_HOVER if h[0] in floor.frame.columns)
    return [bars_spec(same, str(unit), where, hover=hover)
            for unit, same in shown.sort_values("benchmark", kind="stable").groupby("unit", sort=False)]


def _command(name: str) -> str:
    """The `speedlib run` that measures the technique's timed comparison: its paired class,
    else its headline's (transfer's headline chunk measures % of floor, not times)."""
    technique = report.TECHNIQUES[name]
    suite = technique.suite or technique.comparison.suite
    return chunks.how_to_measure(f"bench_{name}.{suite}.")


def _one_device(name: str, rows: pd.DataFrame, machine: str) -> None:
    """Say it where a comparison about several devices ran on one (the H100's DDP against
    DataParallel at world=1): the overview's grid says so, and the page must not show the
    same 0.94x without it."""
    h = report.TECHNIQUES[name].comparison
    if h is not None and machine in headline.single_device(rows, h):
        st.info(md_text(headline.single_device_note(h, machine)))  # the machine's name: text


def _not_measured(data: dict, name: str, machine: str | None = None) -> None:
    # what each benchmark's newest run left without a number: an outdated result measured again since is not missing
    rows = report.still_missing(data["not_measured"], data["measured"])
    rows = rows[(rows["technique"] == name) & ~report.is_own_baseline(rows)]
    if machine is not None:
        rows = rows[rows["machine"] == machine]
        # Benchmarks with no row at all on this machine: its runs never selected them.
        seen = pd.concat([data["measured"], data["not_measured"]])
        missing = report.never_run(suite_listing(), seen[seen["technique"] == name], name, machine)
        if not missing.empty:
            st.markdown(f"**Never run on {md_text(machine)}**: no chunk that measures these has run there yet")
            missing = missing.assign(benchmark=missing["benchmark"].str.replace(r"^bench_\w+\.", "", regex=True))
            show(missing)
    if rows.empty:
        st.caption("Nothing that ran was skipped or failed.")
        return
    st.caption("Each row says why it has no number at its newest run: skipped (the benchmark does not apply on "
               "this machine), failed (it raised), outdated (measured with an earlier version of the benchmark, "
               "and not since).")
    # The machine is the page's (stated above the tabs) unless none was chosen (no results at all).
    frame = rows.assign(commit=rows["commit"].str[:8], why=report.why_not_measured(rows),
                        benchmark=rows["benchmark"].str.replace(r"^bench_\w+\.", "", regex=True))[
        [*(["machine"] if machine is None else []), "benchmark", "params", "status", "why", "commit"]]
    show(frame)
