"""Machine comparison: the environment of every machine, and one GPU against another."""

import streamlit as st
from _charts import config_label, ratio_chart
from _tables import caption, md_text, show, table
from _view import page_data, pick

from speedbench import report
from speedbench.results.environment import NoGpuModel
from speedbench.results.gpu_tests import GpuTests

st.title("Machine comparison")
df = page_data()
st.subheader("Machines")
# One row per machine and environment: a machine name stands for one kind of hardware, but a
# torch/CUDA build can change under it (cpu-2core-amd-epyc ran torch 2.15 and then 2.14), and
# the newest commit alone once described a machine by a dashboard-timing run's CPU and torch.
env = ["machine", "gpu", "driver", "cuda", "torch", "cpu_model"]
rows = df.assign(driver=df["driver"].replace("", None).fillna(
                     df["gpu"].map(lambda g: "n/a (no GPU)" if g == NoGpuModel.CPU_ONLY else "unknown")),
                 cuda=df["cuda"].replace("", None).fillna("n/a"), torch=df["torch"].fillna("unknown"),
                 cpu_model=df["cpu_model"].fillna("unknown"))
# The GPU tests' verdict at the latest commit (speedlib slot): a GPU run without one says "not recorded".
rows = rows.assign(gpu_tests_note=rows["gpu_tests_note"].fillna(GpuTests.NOT_RECORDED))
machines_table = rows.sort_values("commit_date").groupby(env, sort=True).agg(
    commits=("commit", "nunique"), results=("commit", "size"), latest=("commit", lambda c: c.iloc[-1][:8]),
    gpu_tests=("gpu_tests_note", lambda v: v.iloc[-1]),
).reset_index().rename(columns={"gpu": "GPU", "cuda": "CUDA (torch build)", "cpu_model": "CPU",
                                "latest": "latest commit", "gpu_tests": "GPU tests at the latest commit"})
show(machines_table)
# Every GPU machine's commits with their verdicts: where they failed, its figures carry the section mark.
verdicts = rows[rows["gpu_tests"].ne(GpuTests.NOT_APPLICABLE)].drop_duplicates(["machine", "commit"])
if not verdicts.empty:
    st.subheader("GPU tests per commit")
    mark = report.gpu_tests_failed(verdicts).map({True: f" {report.GPU_TESTS_FAILED}", False: ""})
    per_commit = verdicts.assign(commit=verdicts["commit"].str[:8] + mark).sort_values(["machine", "commit_date"])
    show(per_commit[["machine", "gpu", "commit", "gpu_tests_note"]].rename(columns={"gpu": "GPU",
                                                                                   "gpu_tests_note": "GPU tests"})
         .reset_index(drop=True))  # the loader's row numbers mean nothing here
    caption("The GPU-only tests (`pytest -m gpu`) run at the start of every `speedlib slot`, which keeps their verdict "
            "beside the machine's results; CI has no GPU, so this is where GPU correctness is seen. "
            f"{report.GPU_TESTS_FAILED} marks a commit whose GPU tests failed on that machine: every figure from it "
            "carries the mark on every page.")
several = machines_table["machine"].value_counts()
for m in several[several > 1].index:
    caption(f"{m} has results from {several[m]} environments (rows above): times from different ones differ "
            "by the hardware or software, not only by the commit, so history, the regression gate and the "
            "noise table do not compare across them.")
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
if cpu_and_gpu:
    st.stop()
t = report.machine_comparison(df, a, b)
st.subheader(md_text(f"{b} against {a}, value by value"))  # names from the results: text, never Markdown
if t.frame.empty:
    st.info("These two machines share no benchmark.")
    st.stop()
table(t)
ratios = report.compare_machines(df, a, b)
# Times only: a speedup, a % of floor and a bandwidth compared across machines are answers to
# different questions, and one axis would mix them.
timed = ratios[ratios["kind"] == "time"]
if not timed.empty:
    # Benchmarks without variants (the dashboard's own timings) are labelled by their
    # configuration alone: two CPU machines both ran them, and "nan" labels collided.
    variant = timed["variant"].map(lambda v: f" / {v}" if isinstance(v, str) and v else "")
    st.plotly_chart(ratio_chart(timed.assign(case=config_label(timed) + variant
                                             + " (" + timed["metric"].astype(str) + ")", pair=f"{b} vs {a}"),
                                "case", "pair", f"times: {b} against {a} (above 1: {b} is faster)"))
