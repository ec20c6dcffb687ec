"""Machine comparison: the environment of every machine, and one GPU against another."""

import streamlit as st

from _view import config_label, page_data, pick, ratio_chart, table
from speedbench import report

st.title("Machine comparison")
df = page_data()
newest = df.sort_values("commit_date").groupby("machine").tail(1)
st.subheader("Machines")
# A CPU machine has no driver and its torch build may have no CUDA: say so, not "None".
st.dataframe(newest.assign(commits=newest["machine"].map(df.groupby("machine")["commit"].nunique()),
                           latest=newest["commit"].str[:8],
                           driver=newest["driver"].replace("", None).fillna(
                               newest["gpu"].map(lambda g: "n/a (no GPU)" if g == "CPU only" else "unknown")),
                           cuda=newest["cuda"].replace("", None).fillna("n/a"))[
    ["machine", "gpu", "driver", "cuda", "torch", "cpu_model", "commits", "latest"]].rename(
    columns={"gpu": "GPU", "cuda": "CUDA (torch build)", "cpu_model": "CPU", "latest": "latest commit"}),
    hide_index=True)
machines = sorted(df["machine"].unique())
if len(machines) < 2:
    st.info("Only one machine has results (listed above): a comparison needs a second machine "
            "(the H100 and H200 runs come from `speedlib run` on those GPUs).")
    st.stop()
c1, c2 = st.columns(2)
with c1:
    a = pick("Machine A", machines, key="a")
with c2:
    b = pick("Machine B", [m for m in machines if m != a], key="b")
cpu_and_gpu = not report.same_work(df, a, b)
if cpu_and_gpu:
    # benchmarks/common.py picks sizes per profile: a CPU runs small workloads so the suite
    # ends in minutes (ResNet-50 at batch 2 on 64 x 64 images against batch 64 on 224 x 224).
    st.info("One of these machines is a CPU and the other a GPU: the suite runs smaller workloads on CPUs "
            "(ResNet-50 at batch 2 on 64 x 64 images, against batch 64 on 224 x 224 on GPUs), so their times "
            "and memory measure different work and are not compared here. Their speedups, each against its own "
            "baseline, are.")
st.subheader("Speedups on each machine")
speedups = report.speedup_comparison(df, a, b)
if speedups.frame.empty:
    st.info("These two machines share no paired comparison.")
else:
    table(speedups)
t = report.machine_comparison(df, a, b)
if cpu_and_gpu:
    st.stop()
st.subheader(f"{b} against {a}, value by value")
if t.frame.empty:
    st.info("These two machines share no benchmark.")
    st.stop()
table(t)
ratios = report.compare_machines(df, a, b)
# Times only: a speedup, a % of floor and a bandwidth compared across machines are answers to
# different questions, and one axis would mix them.
timed = ratios[ratios["kind"] == "time"]
if not timed.empty:
    st.plotly_chart(ratio_chart(timed.assign(case=config_label(timed) + " / " + timed["variant"].astype(str)
                                             + " (" + timed["metric"].astype(str) + ")", pair=f"{b} vs {a}"),
                                "case", "pair", f"times: {b} against {a} (above 1: {b} is faster)"))
