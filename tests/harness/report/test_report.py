"""speedbench.report: ratios and their intervals, claims, and golden exports (history and
significance across commits: tests/harness/report/test_significance.py).

Golden files live in tests/golden/; after a deliberate format change, regenerate them with
`SPEEDLIB_UPDATE_GOLDEN=1 python3 -m pytest tests/harness/report/test_report.py` and review the diff.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from speedbench import report
from speedbench.cli import parser as cli
from speedbench.report import headline
from speedbench.results import synthetic
from speedbench.results.load import load_results
from speedbench.stats import paired

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = ROOT / "tests" / "golden"
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
    r = one(s, machine="synthetic-h100", benchmark=TIME, workload="mlp", variant="speedlib",
            commit=df["commit"].iloc[0])
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
    r = one(report.speedups(rows), machine="synthetic-cpu", workload="mlp", variant="fused",
            commit=df["commit"].iloc[0])
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
    assert s.loc[("gpu", "bench_parallel.Step.track_step", "ddp"), ["baseline", "ratio"]].tolist() == \
        ["dataparallel", 4.0]
    assert s.loc[("m", "bench_parallel.NoSync.track_step", "on"), ["baseline", "ratio"]].tolist() == ["off", 2.0]
    assert len(s) == 7, "every row has exactly one baseline"


def test_case_labels_tell_rows_apart():
    rows = pd.DataFrame({"params": ["workload=mlp, variant=speedlib", "knob=conv_bias, variant=on", "batch=8",
                                    "world=2, variant=ddp"],
                         "workload": ["mlp", None, None, None], "variant": ["speedlib", "on", None, "ddp"]})
    assert report.case_label(rows).tolist() == ["mlp / speedlib", "knob=conv_bias / on", "batch=8", "world=2 / ddp"]


def test_noise_compares_the_same_commit_across_two_runs():
    def run(values, iqr):
        return pd.DataFrame({"machine": "m", "commit": "c" * 40,
                             "benchmark": ["b.S.time_x", "b.S.time_y", "b.S.track_z"],
                             "params": "", "kind": ["time", "time", "memory"], "unit": ["seconds", "seconds", "bytes"],
                             "value": values, "iqr": iqr})

    n = report.noise(run([1.0, 2.0, 5.0], [0.01, 0.2, 0.0]), run([1.02, 2.2, 9.0], [0.03, 0.1, 0.0]))
    assert list(n["benchmark"]) == ["b.S.time_y", "b.S.time_x"], "time benchmarks only, noisiest first"
    assert n["run_to_run"].tolist() == pytest.approx([0.1, 0.02])
    assert n["spread"].tolist() == pytest.approx([0.1, 0.03 / 1.02])
    assert n["within_target"].tolist() == [False, True]
    t = report.noise_table(run([1.0, 2.0, 5.0], [0.01, 0.2, 0.0]), run([1.02, 2.2, 9.0], [0.03, 0.1, 0.0]))
    assert t.frame["within"].tolist() == ["NO", "yes"] and "1 of 2 times" in t.notes[0]


def _paired_run(ratios: dict[str, list[float]], gpu="") -> pd.DataFrame:
    """One amp comparison as the loader gives it: fp32's times and each variant's per-round ratios."""
    rows = [{"benchmark": "bench_amp.TrainingStep.track_seconds", "kind": "time", "variant": v,
             "params": f"workload=resnet50, variant={v}", "samples": [1.0] * 8}
            for v in ("fp32", *ratios)]
    rows += [{"benchmark": "bench_amp.TrainingStep.track_speedup", "kind": "paired speedup", "variant": v,
              "params": f"workload=resnet50, variant={v}", "samples": r} for v, r in ratios.items()]
    return pd.DataFrame(rows).assign(machine="m", commit="c" * 40, commit_date=pd.Timestamp(0, tz="UTC"),
                                     technique="amp", gpu=gpu, unit=None, value=1.0, iqr=0.0)


def test_paired_speedup_is_the_hodges_lehmann_estimate_of_the_rounds_ratios():
    steady = [2.0, 2.02, 1.98, 2.01, 1.99, 2.0, 2.03, 1.97, 2.0, 2.0]
    wild = [1.0, 3.0, 0.5, 2.0, 1.5, 0.8, 2.5, 1.1]
    p = report.paired(_paired_run({"bf16": steady, "tf32": wild, "fp16": [1.5, 1.6]}))
    bf16 = p[p["variant"] == "bf16"].iloc[0]
    expected = paired.ratio_estimate(steady)
    assert (bf16["ratio"], bf16["ratio_low"], bf16["ratio_high"], bf16["n"]) == (
        expected.ratio, expected.low, expected.high, 10)
    assert bf16["baseline"] == "fp32" and bf16["config"] == "workload=resnet50"
    assert bf16["ratio_low"] < 2.0 < bf16["ratio_high"] and bf16["width"] < report.PAIRED_WIDTH_TARGET
    assert math.isnan(p.loc[p["variant"] == "fp16", "ratio_low"].iloc[0])  # 2 rounds: no 99 % interval
    t = report.paired_table(_paired_run({"bf16": steady, "tf32": wild}))
    assert t.frame["comparison"].tolist() == ["TrainingStep resnet50"] * 2
    assert t.frame.loc[t.frame["variant"] == "bf16", "speedup"].iloc[0].startswith("2x [")
    assert "1 of 2 intervals wider than 1.10x" in t.notes[-1]


def test_a_wide_interval_says_why_from_its_own_rounds():
    """The report names the rounds and their spread wherever an interval is wider than the
    1.10x target, and says nothing where it is within it."""
    steady = [2.0, 2.02, 1.98, 2.01, 1.99, 2.0, 2.03, 1.97, 2.0, 2.0, 2.01, 1.99, 2.0, 2.02, 1.98]
    wild = [1.0, 3.0, 0.5, 2.0, 1.5, 0.8, 2.5, 1.1]
    t = report.paired_table(_paired_run({"bf16": steady, "tf32": wild}))
    why = t.frame.set_index("variant")["why wider than 1.10x"]
    assert why["bf16"] == ""
    q25, q75 = np.percentile(wild, [25, 75])
    assert why["tf32"] == (f"only 8 rounds, the middle half of 8 per-round ratios spans {q25:.3g}x-{q75:.3g}x "
                           f"({(q75 / q25 - 1) * 100:.0f} % apart)")
    assert why["tf32"].startswith("only 8 rounds, the middle half of 8 per-round ratios spans 0.95x-2.12x")


def test_noise_table_puts_paired_speedups_first_with_their_own_target():
    first = _paired_run({"bf16": [2.0] * 8, "tf32": [1.0] * 8})
    second = _paired_run({"bf16": [2.2] * 8, "tf32": [1.02] * 8})
    n = report.paired_noise(first, second)
    assert n["variant"].tolist() == ["bf16", "tf32"] and n["run_to_run"].tolist() == pytest.approx([0.1, 0.02])
    t = report.noise_table(first, second)
    assert t.frame["within"].tolist()[:2] == ["NO", "yes"] and t.frame["target"].tolist()[:2] == ["5%", "5%"]
    assert t.frame["benchmark"].tolist()[2:] == ["bench_amp.TrainingStep.track_seconds"] * 3  # then the times
    assert "1 of 2 paired speedups within 5% run to run (worst 10.0 %)" in t.notes[0]


def test_tables_leave_out_the_baseline_row(df):
    t = report.speedup_table(df)
    assert "forloop" not in set(t.frame["variant"]) and t.frame["speedup"].str.endswith("]").all()
    m = report.memory_table(df)
    assert m.frame["change"].str.endswith("%").all() and m.frame["bytes"].str.endswith(("MiB", "GiB")).all()
    f = report.floor_table(df)
    assert set(f.frame["of"]) == {"memory bandwidth"}
    assert set(f.frame["variant"]) == {"forloop", "fused", "speedlib"}  # rows tell their variant apart


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
    others = frame[frame["technique"] != "contiguous"]
    assert others["measured"].str.startswith("not measured yet: speedlib run --chunk ").all()
    assert set(frame["technique"]) == {"contiguous", "transfer", "checkpoint", "amp", "parallel"}
    expected = report.speedups(report.latest(df))
    r = one(expected, machine="synthetic-cpu", benchmark=TIME, workload="mlp", variant="speedlib")
    row = frame[(frame["machine"].str.startswith("synthetic-cpu")) & (frame["workload"] == "mlp")].iloc[0]
    assert row["measured"].startswith(f"{r['ratio']:.3g}x")


def test_provenance_names_everything_needed_to_rerun(df):
    t = report.speedup_table(report.latest(df[df["machine"] == "synthetic-h100"]))
    (entry,) = report.provenance(t.sources)
    assert set(entry) == {"results", "commit", "commit date", "machine", "GPU", "driver", "CUDA", "torch",
                          "statistic", "measured", "machine state", "GPU tests", "command"}
    # synthetic results carry no interference counters: the footer says so rather than "quiet"
    assert entry["machine state"].startswith("interference not recorded")
    # nor a GPU test verdict: a GPU run without one reads "not recorded", never as a pass
    assert entry["GPU tests"].startswith("not recorded")
    # every result the table shows is cited, and so is each baseline it was divided by
    rows = df[(df["machine"] == "synthetic-h100") & (df["commit"] == entry["commit"]) & (df["benchmark"] == TIME)]
    assert entry["results"].split() == sorted(rows["result_id"]) and len(rows) == 6
    assert entry["driver"] == "550.54.15" and "N = 10" in entry["statistic"] and len(entry["commit"]) == 40
    pattern = re.search(r"--bench '(.*)'$", entry["command"]).group(1)
    assert re.search(pattern, TIME) and not re.search(pattern, "bench_contiguous.OptimizerStep.time_step")
    cpu = report.provenance(report.latest(df[df["machine"] == "synthetic-cpu"]))[0]
    assert cpu["GPU"] == "none (CPU: synthetic CPU)" and cpu["driver"] == "n/a" and "GPU tests" not in cpu


def test_provenance_has_one_entry_per_run_of_a_file(tmp_path):
    """asv adds a later run's results to the commit's file: each run keeps its own environment."""
    synthetic.write_results(tmp_path, commits=1, machines=1)
    (result,) = (tmp_path / "synthetic-h100").glob("*-existing-*.json")
    data = json.loads(result.read_text())
    data["results"][TIME][3] += 86_400_000  # time_adam_step ran a day later...
    result.write_text(json.dumps(data))
    env = next((tmp_path / "synthetic-h100" / "environment").glob("*.jsonl"))
    record = json.loads(env.read_text())
    later = {**record, "recorded_at": "2026-09-22T18:00:00+00:00", "torch": "9.9.9"}  # ...with another torch
    env.write_text(env.read_text() + json.dumps(later) + "\n")
    entries = report.provenance(load_results(tmp_path).measured)
    assert [e["torch"] for e in entries] == ["2.11.0+cu128", "9.9.9"]
    assert [len(e["results"].split()) for e in entries] == [12, 6]  # 2 track benchmarks x 6, then time_adam_step


def test_csv_export_reads_back_as_numbers(df):
    """A script gets numbers, not "0.115x [0.1, 0.126]" or "1.247 s": the ratio and its
    bounds, the value in its unit, N and the result ID, equal to what the table was made of."""
    t = report.speedup_table(report.latest(df))
    text = report.to_csv(t)
    back = pd.read_csv(io.StringIO(text))
    for column in ("ratio", "low", "high", "value", "baseline_value", "N"):
        assert pd.api.types.is_numeric_dtype(back[column]), column
    s = t.sources.reset_index(drop=True)
    assert np.allclose(back["ratio"], s["ratio"]) and np.allclose(back["low"], s["ratio_low"], equal_nan=True)
    assert np.allclose(back["value"], s["value"]) and list(back["unit"]) == list(s["unit"])
    assert list(back["result_id"]) == list(s["result_id"]) and list(back["commit"]) == list(s["commit"])
    # The text table shows the same ratios, rounded.
    assert list(t.frame["speedup"]) == [report.fmt_ratio(r, lo, hi) for r, lo, hi in
                                        zip(back["ratio"], back["low"], back["high"], strict=True)]
    assert not any(line.startswith("#") for line in text.splitlines())  # the footer travels beside it
    assert any(line.startswith("Reproduce: git checkout ") for line in report.csv_provenance(t).splitlines())


NUMERIC = ("ratio", "low", "high", "value", "baseline_value", "width", "dropped", "N", "claimed_low", "claimed_high")
TABLES = {"paired": report.paired_table, "speedup": report.speedup_table, "memory": report.memory_table,
          "floor": report.floor_table, "claims": report.claims_table}


@pytest.fixture(scope="module")
def committed() -> pd.DataFrame:
    return load_results(ROOT / "results").measured


@pytest.mark.parametrize("name", TABLES)
def test_the_csv_export_is_plain_data_a_bare_read_csv_loads(committed, tmp_path, name):
    """What the cite page and `report --format csv` hand out opens as it is: pandas with no
    options (and a spreadsheet) reads a header and the table's rows, numbers as numbers."""
    t = TABLES[name](report.latest(committed))
    path = tmp_path / f"{name}.csv"
    path.write_text(report.to_csv(t), encoding="utf-8")
    back = pd.read_csv(path)
    assert len(back) == len(t.frame) > 0 and list(back.columns) == list(t.data.columns)
    numeric = [c for c in NUMERIC if c in back]
    assert {"ratio", "value"} & set(numeric) and "N" in numeric
    assert all(pd.api.types.is_numeric_dtype(back[c]) for c in numeric), back.dtypes[numeric]


def test_the_csv_provenance_names_the_commits_and_the_command_that_reruns_them(committed):
    t = report.speedup_table(report.latest(committed))
    lines = report.csv_provenance(t).splitlines()
    for commit in set(t.sources["commit"]):
        assert any(line.startswith(f"Reproduce: git checkout {commit} && ") for line in lines), commit
        assert any(line.startswith("Provenance: ") and f"commit {commit}," in line for line in lines), commit
    assert lines[-1].startswith("Exported by speedlib ") and not any(line.startswith("#") for line in lines)
    assert report.provenance_path("out/x.csv") == Path("out/x.provenance.txt")
    assert report.provenance_path("x.data") == Path("x.data.provenance.txt")


def test_the_csv_zip_holds_the_data_and_its_provenance(committed):
    t = report.claims_table(committed)
    bundle = report.csv_bundle(t, "speedlib-claims")
    assert bundle == report.csv_bundle(t, "speedlib-claims")  # the same table, the same bytes
    with zipfile.ZipFile(io.BytesIO(bundle)) as z:
        assert sorted(z.namelist()) == ["speedlib-claims.csv", "speedlib-claims.provenance.txt"]
        assert len(pd.read_csv(z.open("speedlib-claims.csv"))) == len(t.frame)
        assert z.read("speedlib-claims.provenance.txt").decode() == report.csv_provenance(t)


def test_report_csv_output_writes_the_provenance_beside_it(tmp_path, capsys):
    synthetic.write_results(tmp_path / "r", commits=2, machines=2)
    out = tmp_path / "speedups.csv"
    assert cli.main(["report", "--results", str(tmp_path / "r"), "--table", "speedup", "--format", "csv",
                     "--output", str(out)]) == 0
    said = capsys.readouterr()
    assert said.out == "" and f"wrote {out} and its provenance to {tmp_path / 'speedups.provenance.txt'}" in said.err
    back = pd.read_csv(out)
    assert len(back) == 8 and pd.api.types.is_float_dtype(back["ratio"])
    footer = (tmp_path / "speedups.provenance.txt").read_text()
    for commit in set(back["commit"]):
        assert f"Reproduce: git checkout {commit} && " in footer
    # Without --output: the data on stdout, its provenance on stderr.
    assert cli.main(["report", "--results", str(tmp_path / "r"), "--table", "speedup", "--format", "csv"]) == 0
    said = capsys.readouterr()
    assert said.out == out.read_text() and footer in said.err


@pytest.mark.parametrize("fmt", ["md", "csv", "tex"])
def test_report_table_headline_exports_the_grid_in_every_format(tmp_path, capsys, fmt):
    tree = ROOT / "results"  # the committed results: the synthetic tree has no headline class
    grid = headline.grid(load_results(tree).measured)
    assert len(grid.frame) == len(headline.QUESTIONS)  # one row per question
    assert cli.main(["report", "--results", str(tree), "--table", "headline", "--format", fmt]) == 0
    said = capsys.readouterr()
    assert said.out == {"md": report.to_markdown, "csv": report.to_csv, "tex": report.to_latex}[fmt](grid)
    assert cli.main(["report", "--results", str(tree), "--table", "headline", "--format", fmt,
                     "--output", str(tmp_path / f"grid.{fmt}")]) == 0
    assert (tmp_path / f"grid.{fmt}").read_text() == said.out
    if fmt == "csv":
        # tidy data (issue 44): one row per question and machine, the ratio a number; the marks
        # booleans and the count an integer named N, as in the other tables (issue 51)
        back = pd.read_csv(tmp_path / "grid.csv")
        assert len(back) == len(grid.data) == len(headline.QUESTIONS) * back["machine"].nunique()
        assert set(back["question"]) == {q.key for q in headline.QUESTIONS}
        assert pd.api.types.is_float_dtype(back["ratio"])
        for flag in ("paired", "contended", "earlier_version", "gpu_tests_failed"):
            assert pd.api.types.is_bool_dtype(back[flag]), flag
        written = [row[back.columns.get_loc("N")] for row in csv.reader(io.StringIO(said.out))][1:]
        assert "n" not in back and any(written) and all(n.isdigit() for n in written if n), written
        assert (tmp_path / "grid.provenance.txt").read_text() == report.csv_provenance(grid)
        assert report.csv_provenance(grid) in said.err and "Reproduce: git checkout " in said.err


@pytest.mark.parametrize("build", [report.paired_table, report.memory_table, report.floor_table, report.claims_table])
def test_every_exported_table_has_numeric_ratio_or_value_columns(build):
    t = build(report.latest(load_results(ROOT / "results").measured))  # the committed results
    back = pd.read_csv(io.StringIO(report.to_csv(t)))
    assert len(back) == len(t.frame) > 0
    numeric = [c for c in ("ratio", "low", "high", "value") if c in back]
    assert numeric and all(pd.api.types.is_numeric_dtype(back[c]) for c in numeric)


def test_markdown_and_latex_keep_only_columns_that_tell_rows_apart():
    frame = pd.DataFrame({"machine": ["m1", "m1"], "empty": ["", ""], "variant": ["a", "b"], "N": [30, 30]})
    t = report.Table("t", frame, pd.DataFrame())
    md, tex = report.to_markdown(t), report.to_latex(t)
    assert "| variant |" in md and "empty" not in md and "| machine |" not in md
    assert "- Note: all rows: machine m1, N 30" in md
    assert r"\begin{tabular}{l}" in tex and "all rows: machine m1, N 30" in tex
    one = report.Table("t", frame.head(1), pd.DataFrame())  # one row: every filled column stays
    assert "| machine | variant | N |" in report.to_markdown(one)


def test_a_shared_value_moved_to_the_footer_is_escaped_too():
    frame = pd.DataFrame({"machine": ["x|<b>y`", "x|<b>y`"], "variant": ["a", "b"]})
    md = report.to_markdown(report.Table("t", frame, pd.DataFrame()))
    assert "- Note: all rows: machine x\\|&lt;b&gt;y\\`" in md


def test_latex_of_one_machines_speedups_fits_a_page():
    """The committed H100 speedups: the identity columns every row shares go to the footer."""
    measured = load_results(ROOT / "results").measured
    t = report.speedup_table(report.latest(measured[measured["machine"] == "h100-sxm-80gb"]))
    tex = report.to_latex(t)
    header = next(line for line in tex.splitlines() if line.startswith(r"\begin{tabular}"))
    assert len(header) - len(r"\begin{tabular}{}") <= 11 < len(t.frame.columns)
    assert "all rows: machine h100-sxm-80gb, GPU NVIDIA H100 80GB HBM3, commit bdb0cb6d" in tex


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
FORMATS = {"md": report.to_markdown, "csv": report.to_csv, "provenance.txt": report.csv_provenance,
           "tex": report.to_latex}


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
        if golden.suffix == ".csv":  # plain data: the machines are a column
            machines = set(pd.read_csv(golden, keep_default_na=False)["machine"]) - {""}
        assert machines and all(m.startswith("synthetic-") for m in machines), golden
    assert json.loads(json.dumps(synthetic.BENCHMARKS))  # the fixture's benchmarks are plain data


@pytest.mark.parametrize("claim", report.CLAIMS, ids=lambda c: c.claim[:40])
def test_each_claims_figures_come_from_one_row_of_its_source(claim):
    """A claim that sets two of its source's figures side by side takes each from one row of
    the source's table (`Claim.rows`: the variant's row, the baseline's row): every figure its
    text quotes is that figure of one of those rows, and `claimed` is their ratio. The
    checkpoint memory claim once quoted 5.38 GB (the "Previous" row) beside the time of the
    "This" row; 5.38 is in neither of its rows."""
    quoted = [float(x) for x in re.findall(r"\d+\.\d+", claim.claim)]
    if claim.rows is None:  # a figure the source states as a ratio ("3.1x faster"), not two rows' figures
        assert len(quoted) < 2 and "->" not in claim.claim, f"{claim.claim}: quotes two figures, so give it rows"
        return
    variant, baseline = claim.rows
    assert variant != baseline
    figures = {variant.figure(claim.figure), baseline.figure(claim.figure)}
    assert len(quoted) == 2 and set(quoted) == figures, (claim.claim, variant, baseline)
    arrow = re.search(r"\((\d+\.\d+) -> (\d+\.\d+)", claim.claim)
    if arrow:  # "(baseline -> variant)"
        assert (float(arrow[1]), float(arrow[2])) == (baseline.figure(claim.figure), variant.figure(claim.figure))
    assert claim.claimed == pytest.approx(claim.from_rows) and claim.claimed_high is None


def test_claims_of_one_comparison_share_their_source_rows():
    """The memory and the time of one comparison come from the same two rows of the table."""
    by_comparison: dict = {}
    for c in report.CLAIMS:
        if c.rows is not None:
            by_comparison.setdefault((c.source, c.variant, c.baseline), set()).add(c.rows)
    assert all(len(rows) == 1 for rows in by_comparison.values()), by_comparison
    memory, time = (c for c in report.CLAIMS if c.technique == "checkpoint")
    assert [r.label for r in memory.rows] == ["This (1 GPU, batch 256)", "Naive (1 GPU, batch 256)"]
    assert (memory.from_rows, time.from_rows) == (pytest.approx(5.37 / 9.93), pytest.approx(0.42 / 0.50))


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
    assert list(memory["measured"]) == ["not measured yet: speedlib run --chunk headline-checkpoint-memory on a GPU"]


def test_claims_prefer_the_paired_speedup_to_a_ratio_of_separate_times():
    """The amp claim reads the comparison measured in turns (Hodges-Lehmann estimate and its
    Wilcoxon interval), not the ratio of the two variants' separate median times."""
    steady = [2.0, 2.02, 1.98, 2.01, 1.99, 2.0, 2.03, 1.97, 2.0, 2.0]
    rows = _paired_run({"bf16": steady, "bf16_channels_last": [3.1] * 8})
    rows["metric"] = rows["benchmark"].str.rsplit(".", n=1).str[1].str.split("_", n=1).str[1]
    rows = rows.assign(suite="TrainingStep", workload="resnet50", ci99_low=float("nan"), ci99_high=float("nan"),
                       q25=float("nan"), q75=float("nan"), n=8, result_id="r")
    frame = report.claims_table(rows).frame
    amp = frame[frame["technique"] == "amp"].set_index("measured as")
    expected = paired.ratio_estimate(steady)
    row = amp.loc["TrainingStep: bf16 vs fp32 (paired speedup)"]
    assert row["measured"] == f"{expected.ratio:.3g}x [{expected.low:.3g}, {expected.high:.3g}]"
    assert row["workload"] == "resnet50"
    assert amp.loc["TrainingStep: bf16_channels_last vs fp32 (paired speedup)", "measured"].startswith("3.1x")
    # A claim fixed at parameters the rows lack is not measured, not matched to something else.
    transfer = frame[frame["technique"] == "transfer"]
    assert (transfer["measured"].str.startswith("not measured yet: speedlib run --chunk ")).all()


@pytest.mark.parametrize("gpu, claim, expected", [
    ("CPU only", "SpeedTorch README (Tesla K80, 2-core CPU)",
     "no: a CPU result beside a claim measured on a Tesla K80"),
    ("NVIDIA H100 80GB HBM3", "SpeedTorch README (Tesla K80, 2-core CPU)",
     "other GPU: NVIDIA H100 80GB HBM3 beside a Tesla K80"),
    ("Tesla K80", "SpeedTorch README (Tesla K80, 2-core CPU)", "yes: the same GPU"),
    ("NVIDIA H100 80GB HBM3", "SpeedTorch README (Colab)", "yes: an exact count"),  # bytes of host memory
    # peak allocator memory is not an exact count: cuDNN's workspaces differ by GPU
    ("NVIDIA H100 80GB HBM3", "efficient DenseNet / pytorch-checkpoint (TITAN X, DenseNet-BC-100)", "roughly: "),
    ("CPU only", "efficient DenseNet / pytorch-checkpoint (TITAN X, DenseNet-BC-100)", "no: a CPU result"),
    ("NVIDIA H100 80GB HBM3", "PyTorch Performance Tuning Guide", "yes: a GPU result"),
])
def test_the_claims_table_says_when_the_hardware_is_not_comparable(gpu, claim, expected):
    c = next(c for c in report.CLAIMS if c.source == claim)  # the first claim of that source
    assert report.comparable(gpu, c).startswith(expected)


def test_every_row_without_a_number_says_why():
    """The H100 parallel tab listed "world=2 ... skipped" with no reason; a paired class's
    baseline has no speedup of its own by design and is not listed as missing at all."""
    rows = pd.DataFrame([
        {"status": "skipped", "gpu_count": 1, "world": "2", "metric": "step", "variant": "ddp", "workload": None},
        {"status": "skipped", "gpu_count": 1, "world": "1", "metric": "scaling_efficiency", "variant": "single",
         "workload": None},
        {"status": "skipped", "gpu_count": 0, "world": "1", "metric": "step", "variant": "dataparallel",
         "workload": None},
        {"status": "skipped", "gpu_count": 1, "world": None, "metric": "seconds", "variant": "fp16_channels_last",
         "workload": "transformer"},
        {"status": "skipped", "gpu_count": 0, "world": None, "metric": "peak_memory", "variant": "fp32",
         "workload": "resnet50"},
        {"status": "failed", "gpu_count": 0, "world": None, "metric": "seconds", "variant": "x", "workload": None},
        {"status": "outdated", "gpu_count": 1, "world": None, "metric": "seconds", "variant": "x", "workload": None},
    ])
    assert list(report.why_not_measured(rows)) == [
        "needs 2 GPUs; this machine has 1", "scaling is measured from 2 devices up",
        "needs a GPU (DataParallel needs CUDA)", "channels_last applies to convolutional networks only",
        "needs a GPU", "raised an error in its run (the output of `speedlib run` shows it)",
        "measured with an earlier version of the benchmark, not comparable with the current one"]
    own = pd.DataFrame({"benchmark": ["bench_amp.TrainingStep.track_speedup", "bench_amp.TrainingStep.track_speedup",
                                      "bench_amp.TrainingStep.track_seconds"],
                        "technique": ["amp"] * 3, "variant": ["fp32", "bf16", "fp32"]})
    assert list(report.is_own_baseline(own)) == [True, False, False]


def test_the_memory_table_and_its_csv_state_memory_as_variant_over_baseline(df):
    """The grid and the claims say "peak memory 0.373x"; the memory CSV once gave 2.68 for the
    same row (baseline / variant), so merged exports contradicted each other."""
    t = report.memory_table(report.latest(df))
    data = t.data
    assert len(data) and np.allclose(data["ratio"], data["value"] / data["baseline_value"])
    assert (data["change_percent"].round(6) == ((data["ratio"] - 1) * 100).round(6)).all()
    assert list(t.frame["memory ratio"]) == [f"{r:.3g}x" for r in data["ratio"]]
    assert report.MEMORY_NOTE in t.notes


def test_an_export_footer_names_the_statistic_of_a_paired_table():
    """A paired table's footer said "single value per run (asv track)" of Hodges-Lehmann estimates."""
    last = report.latest(load_results(ROOT / "results").measured)
    footer = report.to_markdown(report.paired_table(last[last["technique"] == "amp"]))
    assert "statistic Hodges-Lehmann estimate of per-round ratios" in footer
    assert "single value per run" not in footer


def test_a_claim_about_several_gpus_is_not_compared_with_one():
    """The committed H100 DDP result is world=1: it measures no splitting of work at all."""
    c = next(c for c in report.CLAIMS if c.technique == "parallel")
    assert report.comparable("NVIDIA H100 80GB HBM3", c, "1").startswith("no: world=1, a single device")
    assert not report.comparable("NVIDIA H100 80GB HBM3", c, "2").startswith("no:")


def test_every_claims_row_with_a_figure_says_whether_it_compares():
    t = report.claims_table(load_results(ROOT / "results").measured)
    measured = t.frame[~t.frame["measured"].str.startswith("not measured yet")]
    assert len(measured) and measured["comparable"].str.match(r"(yes|no|roughly|other GPU):").all()
    cpu = measured[measured["machine"].str.contains("CPU only")]
    assert (cpu["comparable"].str.startswith("no:") | cpu["comparable"].str.contains("exact count")).all()


def test_a_floor_table_says_why_a_value_passes_100_percent():
    last = report.latest(load_results(ROOT / "results").measured)
    floors = last[last["kind"] == "fraction of floor"]
    assert (floors["value"] > 100).any()  # the committed results hold such values (device table, CPU Adam)
    assert report.FLOOR_ABOVE_NOTE in report.floor_table(floors).notes
    below = floors[floors["value"] <= 100]
    assert len(below) and report.FLOOR_ABOVE_NOTE not in report.floor_table(below).notes


def _floor_fractions(values: dict[tuple[str, str], float]) -> pd.DataFrame:
    """FractionOfFloor rows ((op, variant) -> % of the pinned copy) of one GPU run."""
    rows = [{"machine": "box-gpu", "gpu": "Some GPU 80GB", "technique": "transfer", "suite": "FractionOfFloor",
             "benchmark": f"bench_transfer.FractionOfFloor.track_{op}_fraction_of_floor",
             "metric": f"{op}_fraction_of_floor", "kind": "fraction of floor", "unit": "%", "variant": v,
             "params": f"variant={v}", "workload": "", "value": x, "ci99_low": None, "ci99_high": None, "q25": None,
             "q75": None, "n": 1, "result_id": f"{op}-{v}"} for (op, v), x in values.items()]
    return pd.DataFrame(rows).assign(commit="c" * 40, commit_date=pd.Timestamp(0, tz="UTC"))


def test_transfer_claims_read_the_floor_ratio_where_no_timed_comparison_ran():
    """A run of transfer's headline chunk measures each variant as a % of the pinned copy
    only: the claims table once said "not measured yet" beside a headline that showed a ratio.
    SpeedTorch's "PyTorch pinned" is plain PyTorch: cupy is compared with torch_pinned."""
    pct = {("gather", "torch_pinned"): 42.4, ("gather", "pinned"): 40.0, ("gather", "cupy"): 38.8,
           ("scatter", "torch_pinned"): 45.0, ("scatter", "pinned"): 44.0, ("scatter", "cupy"): 53.6}
    frame = report.claims_table(_floor_fractions(pct)).frame
    for op, claim in (("gather", "gather 3.1x"), ("scatter", "write-back 410x")):
        (row,) = frame[frame["claim"].str.contains(claim)].to_dict("records")
        assert row["measured"].split()[0] == f"{pct[op, 'cupy'] / pct[op, 'torch_pinned']:.3g}x"
        assert row["machine"].startswith("box-gpu") and row["comparable"].startswith("other GPU")
        assert row["measured as"].startswith(f"{op}_fraction_of_floor: cupy vs torch_pinned (bandwidth ratio")


def test_transfer_claims_are_not_read_against_speedlibs_old_pinned_baseline():
    """The committed H100 run (bdb0cb6d) compared cupy with speedlib's own pinned backend, then
    the benchmark's baseline: a speedlib code path, so no claim is set beside it. The H200 run
    of d93fd5c1 measured cupy against plain PyTorch's pinned path, taking turns: the claims read
    that paired estimate."""
    last = report.latest(load_results(ROOT / "results").measured)
    floor = last[(last["machine"] == "h100-sxm-80gb") & (last["suite"] == "FractionOfFloor")]
    assert {"pinned", "cupy"} <= set(floor["variant"]) and "torch_pinned" not in set(floor["variant"])
    paired = report.paired(last[(last["suite"] == "Transfer") & (last["technique"] == "transfer")])
    frame = report.claims_table(last).frame
    for op, claim in (("gather", "gather 3.1x"), ("scatter", "write-back 410x")):
        (row,) = frame[frame["claim"].str.contains(claim)].to_dict("records")
        (r,) = paired[(paired["op"] == op) & (paired["indices"] == "random") & (paired["variant"] == "cupy")
                      & (paired["baseline"] == "torch_pinned")].to_dict("records")
        assert r["machine"] == "h200-141gb" and row["machine"].startswith("h200-141gb")
        assert row["measured"].startswith(f"{r['ratio']:.3g}x [{r['ratio_low']:.3g}, {r['ratio_high']:.3g}]")
        assert row["measured as"] == f"Transfer: cupy vs torch_pinned (paired speedup, op={op}, indices=random)"


def test_rows_from_an_earlier_benchmark_version_carry_the_dagger_in_every_table(tmp_path):
    """The loader keeps a machine's newest results when its benchmark changed since (flagged):
    a table that showed them unmarked would pass old code's numbers off as current."""
    measured = load_results(ROOT / "results").measured
    last = report.latest(measured)
    flagged = last.assign(earlier_version=last["machine"] == "h100-sxm-80gb")
    for build in (report.paired_table, report.speedup_table, report.memory_table, report.floor_table):
        t = build(flagged)
        if t.frame.empty:
            continue
        on_h100 = t.frame["machine"] == "h100-sxm-80gb"
        assert t.frame.loc[on_h100, "commit"].str.endswith(f" {report.EARLIER}").all(), build.__name__
        assert not t.frame.loc[~on_h100, "commit"].str.contains(report.EARLIER).any(), build.__name__
        assert (report.EARLIER_NOTE in t.notes) == bool(on_h100.any()), build.__name__
    claims = report.claims_table(flagged).frame
    on_h100 = claims["machine"].str.startswith("h100-sxm-80gb")
    assert on_h100.any() and claims.loc[on_h100, "measured"].str.endswith(f" {report.EARLIER}").all()
    assert not claims.loc[~on_h100, "measured"].str.contains(report.EARLIER).any()
    plain = report.paired_table(last.assign(earlier_version=False))
    assert report.EARLIER_NOTE not in plain.notes and not plain.frame["commit"].str.contains(report.EARLIER).any()


@pytest.mark.parametrize("nbytes, text", [(900 * 2**20, "900 MiB"), (3845 * 2**20, "3.755 GiB"),
                                          (15350 * 2**20, "14.99 GiB"), (2**30, "1 GiB"), (512 * 2**10, "0.5 MiB")])
def test_memory_reads_in_mib_or_gib_never_in_exponents(nbytes, text):
    assert report.fmt_value(nbytes, "bytes") == text


def test_columns_paired_adds_are_never_taken_for_parameters():
    """The claims table once labelled a workload "mlp (wide_because=the middle half ...)"."""
    measured = load_results(ROOT / "results").measured
    s = report.paired(report.latest(measured))
    assert {"config", "width", "wide_because"}.isdisjoint(report.param_columns(s))
    claims = report.claims_table(report.latest(measured))
    assert not claims.frame.astype(str).apply(lambda c: c.str.contains("wide_because")).any().any()


def test_a_ratio_value_reads_like_every_other_ratio():
    assert report.fmt_value(1.0444, "x") == "1.04x" and report.fmt_value(0.99451, "x") == "0.995x"


# --- the GB/s beside a % of the floor ----------------------------------------------------------

_FLOOR_CLASS = "bench_transfer.FractionOfFloor"
_FLOOR_UNITS = {"gather_fraction_of_floor": "% of pinned host->device bandwidth",
                "scatter_fraction_of_floor": "% of pinned device->host bandwidth"}


def _floor_rows(machine: str, commit: str, variant: str, figures: dict,
                started: str = "2026-11-23 06:33") -> list[dict]:
    """One FractionOfFloor run's rows of `variant`: metric -> value (a % or GB/s), as the loader
    gives them (one result file per machine and commit)."""
    when = pd.Timestamp(started, tz="UTC")
    rows = []
    for i, (metric, value) in enumerate(figures.items()):
        unit = _FLOOR_UNITS.get(metric, "GB/s")
        rows.append({"machine": machine, "gpu": "NVIDIA H100 80GB HBM3", "commit": commit, "commit_date": when,
                     "run_date": when + pd.Timedelta(seconds=3 * i), "benchmark": f"{_FLOOR_CLASS}.track_{metric}",
                     "technique": "transfer", "suite": "FractionOfFloor", "metric": metric,
                     "kind": "fraction of floor" if metric in _FLOOR_UNITS else "bandwidth",
                     "params": f"variant={variant}", "workload": None, "variant": variant, "value": value,
                     "unit": unit, "q25": math.nan, "q75": math.nan, "iqr": math.nan, "ci99_low": math.nan,
                     "ci99_high": math.nan, "n": 1, "samples": [], "status": "measured",
                     "file": f"results/{machine}/{commit[:8]}-existing.json", "recorded_at": f"{started} UTC",
                     "result_id": f"{machine}/{commit[:8]}/{metric}/{variant}@{started}"})
    return rows


def _cell(t, column: str, **where) -> str:
    frame = t.frame.assign(_metric=t.frame["benchmark"].str.rsplit(".", n=1).str[-1])
    return one(frame, **where)[column]


def test_the_floor_table_shows_the_gbps_the_percent_was_computed_from():
    """12.5 GB/s over a 25 GB/s floor is 50.0 %: all three side by side, from the same run."""
    a, b = "a" * 40, "b" * 40
    rows = pd.DataFrame(
        _floor_rows("gpu-box", a, "cupy", {"gather_fraction_of_floor": 50.0, "scatter_fraction_of_floor": 25.0,
                                           "gather_bandwidth": 12.5, "scatter_bandwidth": 5.0,
                                           "h2d_floor": 25.0, "d2h_floor": 20.0})
        # a run that recorded the % only (as the committed H100 run at bdb0cb6d did)
        + _floor_rows("old-box", b, "cupy", {"gather_fraction_of_floor": 38.8}))
    t = report.floor_table(rows)
    gather = dict(machine="gpu-box", _metric="track_gather_fraction_of_floor")
    assert (_cell(t, "achieved", **gather), _cell(t, "GB/s", **gather), _cell(t, "floor GB/s", **gather)) == \
        ("50.0 %", "12.5 GB/s", "25.0 GB/s")
    scatter = dict(machine="gpu-box", _metric="track_scatter_fraction_of_floor")  # write-back: device->host
    assert (_cell(t, "achieved", **scatter), _cell(t, "GB/s", **scatter), _cell(t, "floor GB/s", **scatter)) == \
        ("25.0 %", "5.0 GB/s", "20.0 GB/s")
    old = dict(machine="old-box", _metric="track_gather_fraction_of_floor")
    assert (_cell(t, "achieved", **old), _cell(t, "GB/s", **old), _cell(t, "floor GB/s", **old)) == \
        ("38.8 %", report.NOT_RECORDED, report.NOT_RECORDED)
    (note,) = [n for n in t.notes if n.startswith(f"{report.NOT_RECORDED}:")]
    assert f"no GB/s result exists for old-box {b[:8]} FractionOfFloor: the benchmark had no GB/s tracks" in note
    assert "gpu-box" not in note and "(achieved = 100 x GB/s / floor GB/s)" in t.notes[0]
    # one machine's table (a dashboard page names it above): the run is its commit, the note names
    # no machine; and where no row has a GB/s, no GB/s column is drawn, only the note
    alone = report.floor_table(rows[rows["machine"] == "old-box"])
    (said,) = [n for n in alone.notes if n.startswith(f"{report.NOT_RECORDED}:")]
    assert f"no GB/s result exists for {b[:8]} FractionOfFloor:" in said and "old-box" not in said
    assert "GB/s" not in alone.frame and "floor GB/s" not in alone.frame and "GB/s" not in alone.notes[0]
    # only the % rows are rows of the table; the GB/s rows are its sources (provenance, Reproduce)
    assert len(t.frame) == 3 and len(t.sources) == 7
    data = t.data.set_index(["machine", "benchmark"])
    assert data.loc[("gpu-box", f"{_FLOOR_CLASS}.track_gather_fraction_of_floor"), ["value", "gbps", "floor_gbps"]
                    ].tolist() == [50.0, 12.5, 25.0]
    assert math.isnan(data.loc[("old-box", f"{_FLOOR_CLASS}.track_gather_fraction_of_floor"), "gbps"])
    back = pd.read_csv(io.StringIO(report.to_csv(t)))
    assert back["gbps"].tolist()[0] == 12.5 and pd.api.types.is_numeric_dtype(back["floor_gbps"])
    assert "12.5 GB/s" in report.to_markdown(t) and report.NOT_RECORDED in report.to_latex(t)


def test_a_gbps_from_another_run_variant_or_machine_is_never_shown():
    """Each figure is its own measurement's: another variant's, another machine's, another
    commit's or a GB/s left from an earlier run of the same commit would be another number."""
    a, b = "a" * 40, "b" * 40
    rows = pd.DataFrame(
        _floor_rows("gpu-box", a, "cupy", {"gather_fraction_of_floor": 50.0})
        + _floor_rows("gpu-box", a, "pinned", {"gather_bandwidth": 10.0, "h2d_floor": 25.0})
        + _floor_rows("other-box", a, "cupy", {"gather_bandwidth": 11.0, "h2d_floor": 24.0})
        + _floor_rows("gpu-box", b, "cupy", {"gather_bandwidth": 12.0, "h2d_floor": 23.0})
        + _floor_rows("gpu-box", a, "cupy", {"scatter_bandwidth": 9.0, "d2h_floor": 21.0}))  # write-back's
    t = report.floor_table(rows)
    assert "GB/s" not in t.frame and "floor GB/s" not in t.frame  # nothing to show for the one row
    assert any("recorded GB/s, but not in the run that measured the %" in n for n in t.notes)
    # the same commit's GB/s from a run a day before the % (asv keeps each benchmark's newest entry)
    earlier = pd.DataFrame(_floor_rows("gpu-box", a, "cupy", {"gather_bandwidth": 12.5, "h2d_floor": 25.0},
                                       started="2026-11-22 06:33"))
    t = report.floor_table(pd.concat([rows.head(1), earlier], ignore_index=True))
    assert "GB/s" not in t.frame and math.isnan(t.data["gbps"].iloc[0])
    # ... or from the same run, but not the two figures the % was computed from (48 %, not 50 %)
    other = pd.DataFrame(_floor_rows("gpu-box", a, "cupy", {"gather_fraction_of_floor": 50.0,
                                                            "gather_bandwidth": 12.0, "h2d_floor": 25.0}))
    assert math.isnan(report.floor_table(other).data["gbps"].iloc[0])
    # ... or a run without start times: nothing then says the figures are the %'s run
    undated = pd.DataFrame(_floor_rows("gpu-box", a, "cupy", {"gather_fraction_of_floor": 50.0,
                                                              "gather_bandwidth": 12.5, "h2d_floor": 25.0}))
    assert report.floor_table(undated).data["gbps"].iloc[0] == 12.5  # dated, the pair is shown ...
    undated = undated.assign(run_date=pd.NaT)  # ... undated, it is not
    assert math.isnan(report.floor_table(undated).data["gbps"].iloc[0])
    # ... or one term of the % without the other (a lone figure cannot be checked against it)
    lone = pd.DataFrame(_floor_rows("gpu-box", a, "cupy", {"gather_fraction_of_floor": 50.0,
                                                           "gather_bandwidth": 12.5}))
    assert math.isnan(report.floor_table(lone).data["gbps"].iloc[0])
    same_run = pd.DataFrame(_floor_rows("gpu-box", a, "cupy", {"gather_fraction_of_floor": 50.0,
                                                               "gather_bandwidth": 12.5, "h2d_floor": 25.0}))
    assert report.floor_table(pd.concat([same_run, earlier], ignore_index=True)).frame[
        ["GB/s", "floor GB/s"]].values.tolist() == [["12.5 GB/s", "25.0 GB/s"]]


def test_adam_shows_its_step_bandwidth_and_says_its_floor_is_not_recorded():
    """AdamStep reports its step's GB/s (the numerator, from the same rounds) but not the
    streaming bandwidth it divides by; a % of linear scaling has no GB/s at all."""
    last = report.latest(load_results(ROOT / "results").measured)
    t = report.floor_table(last)
    adam = t.frame[(t.frame["machine"] == "h100-sxm-80gb") & t.frame["benchmark"].str.contains("AdamStep")
                   & (t.frame["workload"] == "resnet50") & (t.frame["variant"] == "speedlib")]
    step = one(last, machine="h100-sxm-80gb", metric="step_bandwidth", workload="resnet50", variant="speedlib")
    assert adam[["achieved", "GB/s"]].values.tolist() == [["86.0 %", f"{step['value']:.1f} GB/s"]]
    assert step["value"] == pytest.approx(2464.2, abs=0.05)
    every_adam = t.frame[t.frame["benchmark"].str.contains("AdamStep")]
    assert len(every_adam) and (every_adam["floor GB/s"] == report.NOT_RECORDED).all()
    assert any(n.startswith(f"floor GB/s {report.NOT_RECORDED} for bench_contiguous.AdamStep") for n in t.notes)
    scaling = t.frame[t.frame["benchmark"].str.endswith("track_scaling_efficiency")]
    assert len(scaling) and (scaling["GB/s"] == report.NOT_A_BANDWIDTH).all()
    # the committed H100 transfer run predates FractionOfFloor's GB/s: said, never made up
    transfer = t.frame[t.frame["benchmark"].str.startswith(_FLOOR_CLASS)]
    h100 = transfer[transfer["machine"] == "h100-sxm-80gb"]
    assert len(h100) == 10 and (h100[["GB/s", "floor GB/s"]] == report.NOT_RECORDED).all().all()
    # the H200 run of d93fd5c1 records both terms of each %, for its eight variants: shown as measured
    h200 = transfer[transfer["machine"] == "h200-141gb"]
    cupy = one(last, machine="h200-141gb", metric="h2d_floor", variant="cupy")
    assert set(h200["commit"].str[:8]) == {"d93fd5c1"} and len(h200) == 2 * 8
    assert not (h200[["GB/s", "floor GB/s"]] == report.NOT_RECORDED).any().any()
    assert h200[(h200["variant"] == "cupy") & h200["benchmark"].str.contains("gather")]["floor GB/s"].tolist() == \
        [f"{cupy['value']:.1f} GB/s"]
    (note,) = [n for n in t.notes if n.startswith(f"{report.NOT_RECORDED}:")]
    assert "no GB/s result exists for h100-sxm-80gb bdb0cb6d FractionOfFloor" in note and "AdamStep" not in note


def test_floor_only_gbps_stay_out_of_the_bandwidth_speedups():
    """A floor's cupy / pinned ratio compares two timings of the same copy: the GB/s a % was
    made of are read beside it, not as speedups; AdamStep's step bandwidth stays a speedup."""
    a = "a" * 40
    rows = pd.DataFrame([r for v, gbps in (("pinned", 10.0), ("cupy", 12.5)) for r in _floor_rows(
        "gpu-box", a, v, {"gather_fraction_of_floor": 4 * gbps, "gather_bandwidth": gbps, "h2d_floor": 25.0})])
    assert report.speedup_table(rows, "bandwidth").frame.empty
    assert report.floor_table(rows).frame["GB/s"].tolist() == ["10.0 GB/s", "12.5 GB/s"]
    last = report.latest(load_results(ROOT / "results").measured)
    kept = report.speedup_table(last, "bandwidth").frame["benchmark"]
    assert kept.str.endswith("AdamStep.track_step_bandwidth").any()
    assert not kept.str.rsplit(".", n=1).str[-1].str.removeprefix("track_").isin(report.FLOOR_ONLY).any()
