"""speedlib.report: ratios and their intervals, history flags, claims, and golden exports.

Golden files live in tests/golden/; after a deliberate format change, regenerate them with
`SPEEDLIB_UPDATE_GOLDEN=1 python3 -m pytest tests/test_report.py` and review the diff.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from speedlib import report, synthetic
from speedlib.results import load_results

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"
TIME = "bench_contiguous.OptimizerStep.time_adam_step"


@pytest.fixture(scope="module")
def df(tmp_path_factory) -> pd.DataFrame:
    tree = tmp_path_factory.mktemp("results")
    synthetic.write_results(tree, commits=2, machines=3)
    return load_results(tree).measured


def one(frame: pd.DataFrame, **where) -> pd.Series:
    for k, v in where.items():
        frame = frame[frame[k] == v]
    assert len(frame) == 1, where
    return frame.iloc[0]


def test_speedup_and_its_interval_for_time(df):
    s = report.speedups(df)
    r = one(s, machine="synthetic-h100", benchmark=TIME, workload="mlp", variant="speedlib", commit=df["commit"].iloc[0])
    b = one(df, machine="synthetic-h100", benchmark=TIME, workload="mlp", variant="forloop", commit=r["commit"])
    assert r["baseline"] == "forloop" and r["ratio"] == pytest.approx(b["value"] / r["value"])
    assert r["ratio_low"] == pytest.approx(b["ci99_low"] / r["ci99_high"])
    assert r["ratio_high"] == pytest.approx(b["ci99_high"] / r["ci99_low"])
    assert r["interval"] == "99% CI" and r["ratio_low"] < r["ratio"] < r["ratio_high"]


def test_higher_is_better_metrics_invert_the_ratio(df):
    s = report.speedups(df[df["kind"] == "fraction of floor"])
    r = one(s, machine="synthetic-h200", workload="resnet50", variant="speedlib", commit=df["commit"].iloc[0])
    assert r["ratio"] == pytest.approx(r["value"] / r["baseline_value"]) and r["ratio"] > 1
    assert r["interval"] == "none" and pd.isna(r["ratio_low"])  # a track_* value has no interval


def test_iqr_is_the_fallback_interval(df):
    rows = df[df["benchmark"] == TIME].assign(ci99_low=float("nan"), ci99_high=float("nan"))
    r = one(report.speedups(rows), machine="synthetic-cpu", workload="mlp", variant="fused", commit=df["commit"].iloc[0])
    b = one(rows, machine="synthetic-cpu", workload="mlp", variant="forloop", commit=r["commit"])
    assert r["interval"] == "IQR" and r["ratio_low"] == pytest.approx(b["q25"] / r["q75"])


def test_baseline_can_be_chosen(df):
    s = report.speedups(df[df["benchmark"] == TIME], baseline="fused")
    assert set(s["baseline"]) == {"fused"}
    assert (s[s["variant"] == "fused"]["ratio"] == 1).all()


def test_a_missing_baseline_falls_back_in_order():
    """parallel compares with DataParallel, else one process (DataParallel needs GPUs),
    else an option's "off"; each (machine, commit, benchmark, parameters) group separately."""
    def row(variant, value, world="1", benchmark="bench_parallel.Step.track_step", machine="m"):
        return {"machine": machine, "commit": "c" * 40, "benchmark": benchmark, "technique": "parallel", "kind": "time",
                "unit": "seconds", "variant": variant, "workload": None, "world": world, "value": value,
                "ci99_low": value, "ci99_high": value, "q25": value, "q75": value, "n": 1}

    rows = pd.DataFrame([row("single", 2.0), row("ddp", 1.0), row("single", 2.0, machine="gpu"),
                         row("dataparallel", 4.0, machine="gpu"), row("ddp", 1.0, machine="gpu"),
                         row("off", 3.0, None, "bench_parallel.NoSync.track_step"),
                         row("on", 1.5, None, "bench_parallel.NoSync.track_step")])
    s = report.speedups(rows).set_index(["machine", "benchmark", "variant"])
    assert s.loc[("m", "bench_parallel.Step.track_step", "ddp"), ["baseline", "ratio"]].tolist() == ["single", 2.0]
    assert s.loc[("gpu", "bench_parallel.Step.track_step", "ddp"), ["baseline", "ratio"]].tolist() == ["dataparallel", 4.0]
    assert s.loc[("m", "bench_parallel.NoSync.track_step", "on"), ["baseline", "ratio"]].tolist() == ["off", 2.0]
    assert len(s) == 7, "every row has exactly one baseline"


def test_case_labels_tell_rows_apart():
    rows = pd.DataFrame({"params": ["workload=mlp, variant=speedlib", "knob=conv_bias, variant=on", "batch=8", "world=2, variant=ddp"],
                         "workload": ["mlp", None, None, None], "variant": ["speedlib", "on", None, "ddp"]})
    assert report.case_label(rows).tolist() == ["mlp / speedlib", "knob=conv_bias / on", "batch=8", "world=2 / ddp"]


def test_noise_compares_the_same_commit_across_two_runs():
    def run(values, iqr):
        return pd.DataFrame({"machine": "m", "commit": "c" * 40, "benchmark": ["b.S.time_x", "b.S.time_y", "b.S.track_z"],
                             "params": "", "kind": ["time", "time", "memory"], "unit": ["seconds", "seconds", "bytes"],
                             "value": values, "iqr": iqr})

    n = report.noise(run([1.0, 2.0, 5.0], [0.01, 0.2, 0.0]), run([1.02, 2.2, 9.0], [0.03, 0.1, 0.0]))
    assert list(n["benchmark"]) == ["b.S.time_y", "b.S.time_x"], "time benchmarks only, noisiest first"
    assert n["run_to_run"].tolist() == pytest.approx([0.1, 0.02])
    assert n["spread"].tolist() == pytest.approx([0.1, 0.03 / 1.02])
    assert n["within_target"].tolist() == [False, True]
    t = report.noise_table(run([1.0, 2.0, 5.0], [0.01, 0.2, 0.0]), run([1.02, 2.2, 9.0], [0.03, 0.1, 0.0]))
    assert t.frame["within 3 %"].tolist() == ["NO", "yes"] and "1 of 2 time benchmarks" in t.notes[0]


def test_tables_leave_out_the_baseline_row(df):
    t = report.speedup_table(df)
    assert "forloop" not in set(t.frame["variant"]) and t.frame["speedup"].str.endswith("]").all()
    m = report.memory_table(df)
    assert m.frame["change"].str.endswith("%").all() and m.frame["peak"].str.endswith("MiB").all()
    f = report.floor_table(df)
    assert set(f.frame["of"]) == {"memory bandwidth"}
    assert set(f.frame["variant"]) == {"forloop", "fused", "speedlib"}  # rows tell their variant apart


def _history_rows(values, ci_halfwidth):
    rows = []
    for i, v in enumerate(values):
        rows.append({"machine": "m", "benchmark": "bench_x.S.time_y", "params": "", "kind": "time", "unit": "seconds",
                     "commit": f"{i:040d}", "commit_date": pd.Timestamp(f"2026-01-0{i + 1}", tz="UTC"),
                     "run_date": pd.Timestamp(f"2026-01-0{i + 1}", tz="UTC"), "value": v,
                     "ci99_low": v - ci_halfwidth, "ci99_high": v + ci_halfwidth, "n": 10})
    return pd.DataFrame(rows)


def test_history_flags_only_large_changes_outside_the_interval():
    h = report.history(_history_rows([1.0, 1.05, 1.30, 1.31], 0.01))
    assert list(h["significant"]) == [False, False, True, False]
    assert list(h["direction"]) == ["", "", "regression", ""]
    wide = report.history(_history_rows([1.0, 1.30], 0.2))  # 30 % slower but the CIs overlap
    assert not wide["significant"].any()
    faster = report.history(_history_rows([1.0, 0.5], 0.01))
    assert list(faster["direction"]) == ["", "improvement"]


def test_machine_comparison(df):
    m = report.compare_machines(df, "synthetic-h100", "synthetic-h200")
    r = one(m, benchmark=TIME, params="workload=resnet50, variant=fused")
    assert r["machine"] == "synthetic-h200" and r["machine_base"] == "synthetic-h100"
    assert r["ratio"] == pytest.approx(r["value_base"] / r["value"]) and r["ratio"] > 1  # the H200 rows are faster
    t = report.machine_comparison(df, "synthetic-h100", "synthetic-h200")
    assert len(t.frame) == 18 and set(t.sources["machine"]) == {"synthetic-h100", "synthetic-h200"}


def test_claims_table(df):
    t = report.claims_table(df)
    frame = t.frame
    assert len(frame[frame["technique"] == "contiguous"]) == 3 * 2  # 3 machines x 2 workloads
    assert (frame[frame["technique"] != "contiguous"]["measured"] == "not measured yet").all()
    assert set(frame["technique"]) == {"contiguous", "transfer", "checkpoint", "amp", "parallel"}
    expected = report.speedups(report.latest(df))
    r = one(expected, machine="synthetic-cpu", benchmark=TIME, workload="mlp", variant="speedlib")
    row = frame[(frame["machine"].str.startswith("synthetic-cpu")) & (frame["workload"] == "mlp")].iloc[0]
    assert row["measured"].startswith(f"{r['ratio']:.3g}x")


def test_provenance_names_everything_needed_to_rerun(df):
    t = report.speedup_table(report.latest(df[df["machine"] == "synthetic-h100"]))
    (entry,) = report.provenance(t.sources)
    assert set(entry) == {"result", "commit", "commit date", "machine", "GPU", "driver", "CUDA", "torch",
                          "statistic", "measured", "command"}
    assert entry["driver"] == "550.54.15" and "N = 10" in entry["statistic"] and len(entry["commit"]) == 40
    pattern = re.search(r"--bench '(.*)'$", entry["command"]).group(1)
    assert re.search(pattern, TIME) and not re.search(pattern, "bench_contiguous.OptimizerStep.time_step")
    cpu = report.provenance(report.latest(df[df["machine"] == "synthetic-cpu"]))[0]
    assert cpu["GPU"] == "none (CPU: synthetic CPU)" and cpu["driver"] == "n/a"


def test_csv_export_reads_back(df):
    t = report.speedup_table(report.latest(df))
    text = report.to_csv(t)
    back = pd.read_csv(io.StringIO(text), comment="#", dtype=str, keep_default_na=False)
    pd.testing.assert_frame_equal(back, t.frame.astype(str), check_dtype=False)
    footer = [line for line in text.splitlines() if line.startswith("# ")]
    assert any(line.startswith("# Reproduce: git checkout ") for line in footer)


def test_latex_escapes_special_characters(df):
    t = report.Table("50% of 100_x & #1", pd.DataFrame({"a_b": ["x^2 ~ {y} \\z $"]}), df.iloc[0:0])
    tex = report.to_latex(t)
    assert r"50\% of 100\_x \& \#1" in tex and r"a\_b" in tex
    assert r"x\textasciicircum{}2 \textasciitilde{} \{y\} \textbackslash{}z \$" in tex


def test_markdown_escapes_pipes(df):
    t = report.Table("t", pd.DataFrame({"a": ["x|y"]}), df.iloc[0:0])
    assert "| x\\|y |" in report.to_markdown(t)


def test_bibtex_from_citation_cff():
    bib = report.bibtex((ROOT / "CITATION.cff").read_text())
    assert bib.startswith("@software{speedlib2026,") and "author = {{speedlib developers}}" in bib
    assert "version = {0.1.0}" in bib and bib.rstrip().endswith("}")


EXPORTS = {
    "speedup": lambda d: report.speedup_table(report.latest(d)),
    "memory": lambda d: report.memory_table(report.latest(d[d["machine"] != "synthetic-cpu"])),
    "claims": report.claims_table,
    "history": lambda d: report.history_table(d[d["machine"] == "synthetic-h200"], TIME),
}
FORMATS = {"md": report.to_markdown, "csv": report.to_csv, "tex": report.to_latex}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", EXPORTS)
def test_golden_exports(df, name, fmt):
    text = FORMATS[fmt](EXPORTS[name](df))
    golden = GOLDEN / f"{name}.{fmt}"
    if os.environ.get("SPEEDLIB_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden} differs; see this module's docstring"


def test_golden_files_come_from_synthetic_results_only():
    for golden in GOLDEN.iterdir():
        machines = set(re.findall(r"machine (\S+?),", golden.read_text()))
        assert machines and all(m.startswith("synthetic-") for m in machines), golden
    assert json.loads(json.dumps(synthetic.BENCHMARKS))  # the fixture's benchmarks are plain data


def test_claims_keep_to_the_claims_model_and_show_the_batch(df):
    """The checkpoint claims are DenseNet-BC figures: other models get no row, and each
    batch size gets its own row saying which it is."""
    rows = df[(df["machine"] == "synthetic-h100") & (df["benchmark"] == TIME)
              & df["variant"].isin(["forloop", "speedlib"])].copy()
    rows["technique"], rows["metric"] = "checkpoint", "step"
    rows["variant"] = rows["variant"].replace({"forloop": "none"})
    rows["workload"] = rows["workload"].replace({"mlp": "densenet_bc"})  # resnet50 stays: not the claim's model
    rows = pd.concat([rows.assign(batch="64"), rows.assign(batch="256")])
    frame = report.claims_table(rows).frame
    hit = frame[(frame["technique"] == "checkpoint") & frame["claim"].str.contains("step time")]
    assert sorted(hit["workload"]) == ["densenet_bc (batch=256)", "densenet_bc (batch=64)"]
    memory = frame[(frame["technique"] == "checkpoint") & frame["claim"].str.contains("memory")]
    assert list(memory["measured"]) == ["not measured yet"]
