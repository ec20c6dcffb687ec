"""History: one benchmark across commits, with significant changes flagged."""

import pandas as pd
import streamlit as st
from _tables import caption, table
from _view import page_data, pick, pick_many

from speedbench import report, words
from speedbench.report import history_chart
from speedbench.report.chart_rows import sample_scale
from speedbench.results.environment import NoGpuModel
from speedbench.stats import contention

st.title("History across commits")
df = page_data()


def trusted(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """(benchmark, machine) of the timed series in `rows`, the one to open on first: measured at
    two or more commits (one commit has no history), on a GPU before a CPU (the shared 2-core
    VMs drift between runs: the page once opened on a +283 % "regression" of CPU noise), most
    measured on a quiet machine, longest."""
    timed = rows[rows["kind"] == "time"]
    if timed.empty:
        return []
    quiet = timed["contention"].eq(contention.CLEAN) if "contention" in timed else pd.Series(False, timed.index)
    series = timed.assign(_quiet=quiet, _cpu=timed["gpu"].eq(NoGpuModel.CPU_ONLY)).groupby(
        ["benchmark", "machine"]).agg(commits=("commit", "nunique"), quiet=("_quiet", "mean"), cpu=("_cpu", "all"))
    return sorted(series.index, key=lambda k: (series.loc[k, "commits"] < 2, bool(series.loc[k, "cpu"]),
                                               -series.loc[k, "quiet"], -series.loc[k, "commits"], k))


opening = trusted(df)
benchmark = pick("Benchmark", sorted(df["benchmark"].unique()), key="benchmark",
                 default=opening[0][0] if opening else None, words=words.benchmark)
rows = df[df["benchmark"] == benchmark]
c1, c2 = st.columns(2)
# One machine unless asked: a CPU's and a GPU's lines on one axis sit orders of magnitude
# apart, and a history is read along one machine: the most trusted (`trusted`).
first = [m for _, m in trusted(rows)][:1]
with c1:
    machines = pick_many("Machines", sorted(rows["machine"].unique()), key="machine", default=first)
rows = rows[rows["machine"].isin(machines)]
with c2:  # the parameters the chosen machines measured (fp16 runs on GPUs only)
    params = pick_many("Parameters", sorted(rows["params"].unique()), key="params")
rows = rows[rows["params"].isin(params)]
history = report.history_table(rows, benchmark)
h = history.sources  # the rows with their change and flag
if h["commit"].nunique() < 2:
    st.info("Only one commit is measured for this selection: a history needs two or more "
            "(`speedlib run --commits A..B` measures a range).")

scale, unit = sample_scale(h)
st.vega_lite_chart(None, history_chart.spec(h, scale, unit), width="stretch")
# A log axis has no 0 (a variant that retains no bytes): such a line is in the legend but not
# drawn, which reads as missing data unless said.
off_axis = sorted(set(h.loc[h["value"] <= 0, "machine"] + ": " + h.loc[h["value"] <= 0, "params"]))
if off_axis:
    caption(f"Not drawn on the log scale, which has no 0 or below: {'; '.join(off_axis)} (values of 0 or less "
            "at some commits; the table below lists every value).")
st.caption(f"x: significant change against the previous commit (beyond {report.SIGNIFICANCE_FACTOR:.2f}x, and "
           f"Mann-Whitney U p < {report.P_THRESHOLD} on the stored samples, else disjoint 99 % confidence intervals: "
           "asv compare's rule; and the two 99 % intervals apart, so a median that jumps inside them, run-to-run "
           "drift, is no flag). Diamonds: first commit of a sustained step (a new level over at least "
           f"{report.MIN_SEGMENT} commits); squares: both. Error bars: asv's 99 % confidence interval."
           + (" One line per environment: where the CPU, GPU or torch/CUDA build changed, a new line starts and no "
              "change or step is computed across it (the table's flag says 'not compared')."
              if (history_chart.environments(h) > 1).any() else ""))
table(history)
