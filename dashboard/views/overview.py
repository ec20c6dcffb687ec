"""Overview: the headline speedup of every technique per GPU, and the sources' claims beside them."""

import streamlit as st
from _view import (
    caption,
    comparison_index,
    note_missing_gpu,
    on_screen,
    page_data,
    pick_many,
    ratio_chart,
    say_names,
    table,
)

from speedbench import report, words
from speedbench.report import comparisons, headline

st.title("speedlib: which PyTorch speed tricks pay off")
st.caption("Headline speedups are paired: the variants took turns in one process, and each number is the "
           "Hodges-Lehmann estimate of the per-round ratios against a baseline, brackets its 99 % Wilcoxon "
           "interval. Every baseline is plain PyTorch, written with torch alone in the benchmark, never a speedlib "
           "code path. A cell with several baselines names each, PyTorch's default on that machine first; the notes "
           "under the table say which baseline every row uses. A technique without a paired comparison shows the "
           "ratio of its separately timed medians, which the machine's drift between processes can move. Every "
           "page's filters live in the URL.")
df = page_data()
note_missing_gpu(df)

c1, c2, c3 = st.columns(3)
c1.metric("Machines", df["machine"].nunique())
c2.metric("Commits", df["commit"].nunique())
c3.metric("Measured values", len(df))

machines = pick_many("Machines", sorted(df["machine"].unique()), key="machine")
last = report.latest(df[df["machine"].isin(machines)])
st.subheader("At a glance: each technique's main comparison")
# all commits: where a machine's latest result was contended, the grid cites its newest clean one
glance = headline.grid(df[df["machine"].isin(machines)])
if report.earlier_version(glance.sources).any():
    # Above the grid, not among its notes: every H100 cell carries the dagger, and its meaning sat
    # below the fold, where a reader who stops at the first screen never saw it.
    caption(report.EARLIER_NOTE)
st.table(glance.frame.set_index("technique"))  # a static table: every cell whole, wrapped, no scrolling
# Why an interval is wide, one note per cell: a dozen of them pushed every other comparison a
# screen further down, so they fold away under a line that says how many there are.
wide = [n for n in glance.notes if headline.WIDE_NOTE in n]
for n in glance.notes:
    if n != report.EARLIER_NOTE and n not in wide:
        caption(n)
if wide:
    with st.expander(f"Why {len(wide)} of these intervals are wider than {report.PAIRED_WIDTH_TARGET:.2f}x"):
        for n in wide:
            caption(n)
st.subheader("Every paired comparison (latest commit per machine)")
every = comparisons.every_comparison(df[df["machine"].isin(machines)])
if every.frame.empty:
    st.info("None of the selected machines has a paired comparison yet.")
else:
    st.markdown(comparison_index(every))
    for n in every.notes:
        caption(n)
st.subheader("Each technique's main comparison, in charts (latest commit per machine)")
shown = False
for h in headline.HEADLINES:
    name, technique = h.technique, report.TECHNIQUES[h.technique]
    mine = last[last["technique"] == name]
    # The paired comparison where one was measured (its times name the baseline), else the
    # headline's own class, values of the headline metric's kind (a DDP step against a
    # DataParallel one; gather and write-back as % of their copy floor): never another class's
    # switch (NoSync's "on vs off") under the technique's main question.
    speedup = report.paired_table(mine[mine["suite"] == technique.suite]) if technique.suite else None
    what = f"{technique.suite}, variants taking turns"
    if speedup is None or speedup.sources.empty:
        own = mine[mine["suite"] == h.suite]
        kind = own.loc[own["metric"] == h.metric, "kind"] if h.metric else own["kind"]
        if kind.empty:
            continue
        speedup = report.speedup_table(own[own["kind"] == kind.iloc[0]], kind.iloc[0])
        n = speedup.sources["n"]
        what = (f"{h.suite}, not paired (N={n.min():g}" + (f"-{n.max():g}" if n.max() != n.min() else "")
                + " per variant: the variants did not take turns)")
    s = speedup.sources  # the ratios behind the table, without the baseline's own rows
    if s.empty:
        continue
    shown = True
    against = ", ".join(f"`{b}`" for b in technique.baselines if b in set(s["baseline"]))  # fallbacks where the baseline did not run
    st.markdown(f"**{technique.title}**: {what}, against {against} (plain PyTorch, written in the benchmark)")
    # The baseline is in the label: a fallback baseline (single process where DataParallel
    # cannot run) must not share a bar label with the real one.
    # Two metrics of one class (gather and write-back) would share "cupy vs torch_pinned": name them.
    metric = s["metric"].map(words.metric) + ": " if s["metric"].nunique() > 1 else ""
    s = s.assign(label=s["machine"] + " (" + s["gpu"] + ")",
                 case=metric + report.case_label(s) + " vs " + s["baseline"].astype(str))
    st.plotly_chart(ratio_chart(s, "case", "label", "x faster than the baseline"))
    # each machine's GPU: in the chart's legend and the grid's header; the technique: above
    table(speedup, hide=("GPU", "technique"))
    if h.memory_suite:  # checkpointing is about memory: its GPU result belongs beside the time it costs
        memory = report.memory_table(mine[mine["suite"] == h.memory_suite], technique.baseline)
        m = memory.sources
        if not m.empty:
            m = m.assign(label=m["machine"] + " (" + m["gpu"] + ")",
                         case=m["metric"].map(words.metric) + ": " + report.case_label(m) + " vs "
                         + m["baseline"].astype(str))
            st.plotly_chart(ratio_chart(m, "case", "label", f"memory against the baseline ({h.memory_suite}, exact)",
                                        axis="memory, variant / baseline (below 1x: less)", exact=True))
            table(memory, hide=("GPU", "technique"))
    knobs = s["knob"].dropna() if "knob" in s else ()
    say_names(words.glossary(name, [*s["variant"].dropna(), *s["baseline"].dropna()], knobs))
if not shown:
    st.info("None of the selected machines has a headline result yet.")
st.subheader("Claims of the sources versus measured")
# A static table: every cell whole and wrapped (in a grid the comparability and the machine
# sat past the right edge, so a CPU figure stood beside a GPU claim with no warning in view).
claims = report.claims_table(df[df["machine"].isin(machines)])
st.table(on_screen(claims.frame, hide=("measured as",)))  # how it was measured: in the exports
for n in claims.notes:
    caption(n)
