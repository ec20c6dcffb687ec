"""The page every technique gets: time, memory and floor tables for one machine and commit,
charts that show every sample, and what was not measured."""

from __future__ import annotations

import html

import pandas as pd
import plotly.colors
import plotly.graph_objects as go
import streamlit as st

from _view import config_label, log_axis, pick, pick_many, ratio_chart, results, show_problems, spread_chart, table, tabs
from speedbench import report


# The line above the tabs names the machine and its GPU, and the page shows one machine: in
# every table they would only push the numbers past the right edge.
STATED = ("machine", "GPU")


def technique_page(name: str) -> None:
    technique = report.TECHNIQUES[name]
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
    c1, c2, c3, c4 = st.columns(4)
    with c1:
        machine = pick("Machine", sorted(rows["machine"].unique()), key="machine")
    rows = rows[rows["machine"] == machine]
    commits = list(rows.sort_values("commit_date", ascending=False)["commit"].str[:8].unique())
    with c2:
        commit = pick("Commit (newest first)", commits, key="commit")
    rows = rows[rows["commit"].str[:8] == commit]
    with c3:
        workloads = pick_many("Workloads", sorted(rows["workload"].dropna().unique()), key="workload")
    rows = rows[rows["workload"].isin(workloads) | rows["workload"].isna()]
    with c4:
        variants = sorted(rows["variant"].dropna().unique())
        # The technique's baseline, else its fallback that ran here (a single process where
        # DataParallel cannot run), never just the first name in the list.
        default = next((b for b in technique.baselines if b in variants), technique.baseline)
        baseline = pick("Baseline", variants, key="baseline", default=default)
    first = rows.iloc[0]
    # A result file may carry no date (asv leaves it out for a commit it could not date).
    date = "date unknown" if pd.isna(first["commit_date"]) else f"{first['commit_date']:%Y-%m-%d}"
    st.text(f"{machine}: {first['gpu']} | commit {first['commit']} ({date}) | "
            f"torch {first['torch']} | CUDA {first['cuda']} (torch build) | "
            f"driver {'n/a' if pd.isna(first['driver']) or not first['driver'] else first['driver']}")

    names = ["Time", "Memory", "Bandwidth and floor", "Not measured"]
    has = [not rows[rows["kind"] == "time"].empty, not rows[rows["kind"] == "memory"].empty,
           not rows[rows["kind"].isin(["fraction of floor", "bandwidth"])].empty]
    # A page opens on its first tab with results (an H100 run of transfer's headline chunk
    # measured bandwidth only, and its Time tab was empty).
    time_tab, memory_tab, floor_tab, missing_tab = tabs(names, default=names[has.index(True)] if any(has) else names[0])
    with time_tab:
        timed = rows[rows["kind"] == "time"]
        if timed.empty:
            st.info(f"No timing results for this technique from {machine} at commit {commit}: its run did not "
                    "include them.")
        else:
            _paired(rows)
            metrics = sorted(timed["metric"].unique())
            # The paired classes' per-variant times are "seconds"; older benchmarks' the headline.
            metric = pick("Timed metric", metrics, key="metric",
                          default="seconds" if "seconds" in metrics else technique.headline)
            timed = timed[timed["metric"] == metric]
            speedup = report.speedup_table(timed, "time", baseline)
            st.markdown(f"**Separately timed**: `{metric}` medians against `{baseline}` (worst-case bounds)")
            table(speedup, hide=STATED)
            st.plotly_chart(spread_chart(timed, f"{metric}: every sample"))
            s = speedup.sources
            s = s.assign(case=config_label(s) + " / " + s["variant"].astype(str))
            st.plotly_chart(ratio_chart(s, "case", "suite", f"{metric}: speedup over {baseline}"))
    with memory_tab:
        memory = rows[rows["kind"] == "memory"]
        if memory.empty:
            if first["gpu"] == "CPU only":
                st.info("No memory results here: peak GPU memory is measured on GPU machines only.")
            else:
                st.info(f"No memory results for this technique from {machine} at commit {commit}: its run did "
                        "not include them (`speedlib run --plan` lists what each chunk measures).")
        else:
            table(report.memory_table(memory, baseline), hide=STATED)
            st.plotly_chart(_bars(memory, 2**-20, "peak memory (MiB)"))
    with floor_tab:
        floors = rows[rows["kind"] == "fraction of floor"]
        bandwidth = rows[rows["kind"] == "bandwidth"]
        if floors.empty and bandwidth.empty:
            st.info("No bandwidth or floor results here.")
        if not floors.empty:
            table(report.floor_table(floors), hide=STATED)
            # One chart per reference: gather is a % of the host->device copy, write-back of
            # device->host; one axis named after the first mislabelled the other.
            for unit, same in floors.groupby("unit", sort=True):
                st.plotly_chart(_bars(same, 1.0, str(unit)))
        if not bandwidth.empty:
            table(report.speedup_table(bandwidth, "bandwidth", baseline), hide=STATED)
    with missing_tab:
        _not_measured(data, name, machine)


def _paired(rows: pd.DataFrame) -> None:
    """The comparisons measured with the variants taking turns: the numbers to cite."""
    paired = report.paired_table(rows)
    s = paired.sources  # speedups only: the baseline has times but no speedup of its own
    if s.empty:
        return
    st.markdown("**Paired speedups** (the variants took turns in one process; Hodges-Lehmann estimate "
                "of the per-round ratios, brackets its 99 % Wilcoxon interval; each class's own baseline)")
    table(paired, hide=STATED)
    s = s.assign(case=config_label(s) + " / " + s["variant"].astype(str) + " vs " + s["baseline"].astype(str))
    st.plotly_chart(ratio_chart(s, "case", "suite", "paired speedup: x faster than the baseline"))


def _bars(rows, scale: float, title: str) -> go.Figure:
    """One trace per metric and configuration (peak and activation memory, each batch size),
    one bar per variant: never two configurations in one bar."""
    fig = go.Figure()
    rows = rows.assign(_config=rows["metric"].astype(str) + " " + config_label(rows))
    # plotly's default palette has ten colours, and checkpointing draws twelve traces (two
    # metrics x three workloads x two batches): a repeated colour reads as one configuration.
    palette = plotly.colors.qualitative.Dark24
    for i, (config, g) in enumerate(rows.groupby("_config", sort=True)):
        fig.add_trace(go.Bar(x=[html.escape(str(v)) for v in g["variant"]], y=g["value"] * scale,
                             name=html.escape(str(config)), marker_color=palette[i % len(palette)]))
    # Log y: configurations differ by orders of magnitude (DenseNet-121 at batch 256 against a
    # transformer at 64; a device-resident table at 669 % of the copy floor beside CuPy at 39 %),
    # and on a linear axis the small ones vanish.
    fig.update_layout(barmode="group", height=380, margin={"t": 30},
                      yaxis=log_axis(list(rows["value"] * scale), f"{title} (log scale)"))
    return fig


def _not_measured(data: dict, name: str, machine: str | None = None) -> None:
    rows = data["not_measured"]
    rows = rows[rows["technique"] == name]
    if machine is not None:
        rows = rows[rows["machine"] == machine]
    if rows.empty:
        st.caption("Nothing was skipped or failed.")
        return
    st.caption("skipped: the benchmark does not apply here (no GPU, package missing); failed: it raised; "
               "outdated: measured with an older version of the benchmark, so not comparable.")
    st.dataframe(rows.assign(commit=rows["commit"].str[:8])[["machine", "commit", "benchmark", "params", "status"]],
                 hide_index=True)
