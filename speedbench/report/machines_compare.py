"""The Machine comparison page's tables (dashboard and static site): every machine and its
environment, the GPU tests per commit, the pair it opens on, and one machine's results beside
another's."""

from __future__ import annotations

import pandas as pd

from speedbench.report.marks import (
    CONTENDED,
    EARLIER,
    GPU_TESTS_FAILED,
    contended,
    earlier_version,
    gpu_tests_failed,
    with_earlier_note,
)
from speedbench.report.paired_speedups import _comparison, paired
from speedbench.report.ratios import _with_ratio
from speedbench.report.rows import Table, fmt_ratio, fmt_value, latest
from speedbench.results.environment import NoGpuModel
from speedbench.results.gpu_tests import GpuTests
from speedbench.techniques import TECHNIQUES


def _described(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with its environment columns in words where a run did not record them."""
    rows = df.assign(driver=df["driver"].replace("", None).fillna(
                         df["gpu"].map(lambda g: "n/a (no GPU)" if g == NoGpuModel.CPU_ONLY else "unknown")),
                     cuda=df["cuda"].replace("", None).fillna("n/a"), torch=df["torch"].fillna("unknown"),
                     cpu_model=df["cpu_model"].fillna("unknown"))
    # The GPU tests' verdict at the latest commit (speedlib slot): a GPU run without one says "not recorded".
    return rows.assign(gpu_tests_note=rows["gpu_tests_note"].fillna(GpuTests.NOT_RECORDED))


def machines_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per machine: a machine name stands for one kind of hardware, but a torch/CUDA build
    can change under it (cpu-2core-amd-epyc ran torch 2.15 and then 2.14). The row describes its
    newest environment; the others are named in one column, each with its commits and results,
    rather than repeating the machine in a row of its own."""
    env = ["machine", "gpu", "driver", "cuda", "torch", "cpu_model"]
    rows = _described(df)
    # which environment the row describes: the one of the newest technique results, not of the
    # viewer's own timing runs (cpu-2core-amd-epyc's newest commit timed only the dashboard)
    rows = rows.assign(_measured=rows["commit_date"].where(rows["technique"].isin(TECHNIQUES)))
    environments = rows.sort_values("commit_date").groupby(env, sort=True, dropna=False).agg(
        commits=("commit", "nunique"), results=("commit", "size"), latest=("commit", lambda c: c.iloc[-1][:8]),
        newest=("_measured", "max"), gpu_tests=("gpu_tests_note", lambda v: v.iloc[-1])).reset_index()
    environments = environments.sort_values(["machine", "newest", "results"], kind="stable", na_position="first")
    newest = environments.drop_duplicates("machine", keep="last")
    others = {m: "; ".join(f"torch {e.torch}, CUDA {e.cuda}, {e.cpu_model}: {e.commits} commit(s), {e.results} "
                           "results" for e in g.iloc[:-1].itertuples())
              for m, g in environments.groupby("machine", sort=True)}
    return newest.assign(other=newest["machine"].map(others).fillna("")).drop(columns="newest").rename(
        columns={"gpu": "GPU", "cuda": "CUDA (torch build)", "cpu_model": "CPU", "latest": "latest commit",
                 "gpu_tests": "GPU tests at the latest commit", "other": "other environments"}).reset_index(drop=True)


def gpu_tests_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every GPU machine's commits with their GPU tests' verdict, § where they failed."""
    rows = _described(df)
    verdicts = rows[rows["gpu_tests"].ne(GpuTests.NOT_APPLICABLE)].drop_duplicates(["machine", "commit"])
    mark = gpu_tests_failed(verdicts).map({True: f" {GPU_TESTS_FAILED}", False: ""})
    per_commit = verdicts.assign(commit=verdicts["commit"].str[:8] + mark).sort_values(["machine", "commit_date"])
    return per_commit[["machine", "gpu", "commit", "gpu_tests_note"]].rename(
        columns={"gpu": "GPU", "gpu_tests_note": "GPU tests"}).reset_index(drop=True)


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
    cpu = df.drop_duplicates("machine").set_index("machine")["gpu"].eq(NoGpuModel.CPU_ONLY)
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
        machine_a: [fmt_value(v, u) for v, u in zip(m["value_base"], m["unit"], strict=True)],
        machine_b: [fmt_value(v, u) for v, u in zip(m["value"], m["unit"], strict=True)],
        f"{machine_b} vs {machine_a}": [
            fmt_ratio(r, lo, hi) + (f" {CONTENDED}" if busy else "")
            for r, lo, hi, busy in zip(m["ratio"], m["ratio_low"], m["ratio_high"], contended(m), strict=True)],
        "commits": m["commit_base"].str[:8] + " / " + m["commit"].str[:8],
    })
    last = latest(df[df["machine"].isin([machine_a, machine_b])])
    used = last.set_index(["benchmark", "params"]).index.isin(m.set_index(["benchmark", "params"]).index)
    return Table(f"{machine_b} versus {machine_a}", frame, last[used],
                 with_earlier_note([f">1: {machine_b} is better; each machine at its latest commit",
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
        return [fmt_ratio(r, lo, hi) + f" N={n}" + (f" {EARLIER}" if e else "") + (f" {CONTENDED}" if c else "")
                for r, lo, hi, n, e, c in zip(m[f"ratio_{side}"], m[f"ratio_low_{side}"], m[f"ratio_high_{side}"],
                                              m[f"n_{side}"], earlier_version(own), contended(own), strict=True)]

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
                 with_earlier_note(notes, used))

