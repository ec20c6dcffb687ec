"""Machine comparison: every machine and its environment, and one GPU against another; about three
screens at 1440 px with the long tables folded under a line that counts them."""

import streamlit as st
from _tables import caption, md_text, show, table
from _view import cached, older_results, page, pick

from speedbench import report
from speedbench.report.chart_rows import config_label
from speedbench.report.vega import ratio_spec

st.title("Machine comparison")
data = page()
df = data["measured"]
st.subheader("Machines")
machines_table = report.machines_table(df)
show(machines_table)
if (machines_table["other environments"] != "").any():
    caption("Other environments: results of the same machine under another torch/CUDA build or CPU; times from "
            "different ones differ by the hardware or software, not only by the commit, so history, the regression "
            "gate and the noise table do not compare across them.")
# Every GPU machine's commits with their verdicts: where they failed, its figures carry the section mark.
verdicts = report.gpu_tests_table(df)
if not verdicts.empty:
    with st.expander(f"GPU tests per commit ({len(verdicts)} commits of GPU machines)"):
        show(verdicts)
        # constant text: Markdown code spans, not escaped backticks
        st.caption("The GPU-only tests (`pytest -m gpu`) run at the start of every `speedlib slot`, which keeps their "
                   "verdict beside the machine's results; CI has no GPU, so this is where GPU correctness is seen. "
                   f"{report.GPU_TESTS_FAILED} marks a commit whose GPU tests failed on that machine: every figure "
                   "from it carries the mark on every page.")
machines = sorted(df["machine"].unique())
if len(machines) < 2:
    st.info("Only one machine has results (listed above): a comparison needs a second machine "
            "(the H100 and H200 runs come from `speedlib run` on those GPUs).")
    older_results(data)
    st.stop()


first_a, first_b = report.opening_pair(df)
c1, c2 = st.columns(2)
with c1:
    a = pick("Machine A", machines, key="a", default=first_a)
with c2:
    b = pick("Machine B", [m for m in machines if m != a], key="b", default=first_b)
cpu_and_gpu = not report.same_work(df, a, b)
if cpu_and_gpu:
    # benchmarks/common.py picks sizes per profile: a CPU runs small workloads so the suite
    # ends in minutes (ResNet-50 at batch 2 on 64 x 64 images against batch 64 on 224 x 224).
    st.info("One of these machines is a CPU and the other a GPU: the suite runs smaller workloads on CPUs "
            "(ResNet-50 at batch 2 on 64 x 64 images, against batch 64 on 224 x 224 on GPUs), so their times "
            "and memory measure different work and are not compared here. Their speedups, each against its own "
            "baseline, are.")
st.subheader("Speedups on each machine")
speedups = cached(data, "speedup_comparison", lambda: report.speedup_comparison(df, a, b), a, b)
if speedups.frame.empty:
    st.info("These two machines share no paired comparison.")
else:
    with st.expander(f"{len(speedups.frame)} paired speedups measured on both, each against its own baseline"):
        table(speedups)
if not cpu_and_gpu:
    t = cached(data, "machine_comparison", lambda: report.machine_comparison(df, a, b), a, b)
    st.subheader(md_text(f"{b} against {a}, value by value"))  # names from the results: text, never Markdown
    if t.frame.empty:
        st.info("These two machines share no benchmark.")
    else:
        ratios = cached(data, "compare_machines", lambda: report.compare_machines(df, a, b), a, b)
        # Times only: a speedup, a % of floor and a bandwidth compared across machines are answers to
        # different questions, and one axis would mix them.
        timed = ratios[ratios["kind"] == "time"]
        if not timed.empty:
            # Benchmarks without variants (the dashboard's own timings) are labelled by their
            # configuration alone: two CPU machines both ran them, and "nan" labels collided.
            variant = timed["variant"].map(lambda v: f" / {v}" if isinstance(v, str) and v else "")
            st.vega_lite_chart(None, ratio_spec(timed.assign(case=config_label(timed) + variant + " ("
                                                             + timed["metric"].astype(str) + ")", pair=f"{b} vs {a}"),
                                                "case", "pair", f"times: {b} against {a} (above 1: {b} is faster)"),
                               width="stretch")
        with st.expander(f"{len(t.frame)} values measured on both (times, memory, bandwidth)"):
            table(t)
older_results(data)  # a maintainer's detail, at the foot of the page
