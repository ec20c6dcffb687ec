"""A machine name stands for one kind of hardware (speedbench.results.machines): `speedlib run` refuses
to file a run under a directory that recorded other hardware or another torch/CUDA build, and
history, the regression gate and the noise table compare only results of one environment."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from speedbench import report
from speedbench.cli import parser as cli
from speedbench.results import machines, synthetic
from speedbench.results.load import load_results
from speedbench.run import suite

ROOT = Path(__file__).resolve().parents[3]
SHA = "0123456789abcdef" * 2 + "01234567"
AMD = {"commit": SHA, "recorded_at": "2026-11-23T09:29:55+00:00", "cpu_model": "AMD EPYC", "gpu_model": None,
       "gpu_count": 0, "torch": "2.15.0+cu132", "cuda": "13.2"}
INTEL = {**AMD, "recorded_at": "2026-11-24T10:54:48+00:00", "cpu_model": "Intel(R) Xeon(R) Processor"}
# This run, as measure.identity() describes it: Intel, with an older torch build.
HERE = {"machine": "cpu-2core-intel-xeon", "cpu_model": "Intel(R) Xeon(R) Processor", "gpu_model": None,
        "gpu_count": 0, "torch": "2.14.1+cu130", "cuda": "13.0"}
H100 = {**AMD, "cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "gpu_model": "NVIDIA H100 80GB HBM3", "gpu_count": 1,
        "torch": "2.11.0+cu130", "cuda": "13.0"}


def records(results_dir: Path, machine: str, *recs: dict, extra: bytes = b"") -> None:
    env = results_dir / machine / "environment"
    env.mkdir(parents=True, exist_ok=True)
    with (env / f"{SHA[:8]}.jsonl").open("ab") as f:
        f.write(b"".join(json.dumps(r).encode() + b"\n" for r in recs) + extra)


# --- speedlib run against the directory it would write to ------------------------------------

def test_other_hardware_is_refused_with_the_name_this_hardware_gives(tmp_path):
    records(tmp_path, "cpu-2core", AMD)
    with pytest.raises(machines.MachineMismatch) as e:
        machines.check_directory(tmp_path, "cpu-2core", HERE)
    text = str(e.value)
    assert "holds runs on CPU AMD EPYC" in text and "this run is on CPU Intel(R) Xeon(R) Processor" in text
    assert "--machine cpu-2core-intel-xeon (the name this hardware gives)" in text and "\n" not in text
    with pytest.raises(machines.MachineMismatch):  # --new-build is for builds, never for hardware
        machines.check_directory(tmp_path, "cpu-2core", HERE, new_build=True)


def test_a_directory_that_mixes_hardware_takes_no_more_runs(tmp_path):
    """The old cpu-2core: an Intel run last, AMD runs before it; another Intel run is refused too."""
    records(tmp_path, "cpu-2core", AMD, {**INTEL, "torch": HERE["torch"], "cuda": HERE["cuda"]})
    with pytest.raises(machines.MachineMismatch, match="holds runs on CPU AMD EPYC"):
        machines.check_directory(tmp_path, "cpu-2core", HERE)


def test_a_gpu_directory_refuses_another_gpu_model_or_count_and_a_cpu(tmp_path):
    records(tmp_path, "h100-sxm-80gb", H100)
    gpu_here = {**H100, "machine": "h100-sxm-80gb"}
    assert machines.check_directory(tmp_path, "h100-sxm-80gb", gpu_here) is None
    # the host CPU does not name a GPU machine's hardware
    assert machines.check_directory(tmp_path, "h100-sxm-80gb", {**gpu_here, "cpu_model": "AMD EPYC 9654"}) is None
    for other, said in (({"gpu_model": "NVIDIA H200", "machine": "h200-141gb"}, "GPU NVIDIA H200"),
                        ({"gpu_count": 8, "machine": "8xh100-sxm-80gb"}, "GPU NVIDIA H100 80GB HBM3, GPUs 8"),
                        (HERE, "CPU Intel(R) Xeon(R) Processor")):
        with pytest.raises(machines.MachineMismatch, match=re.escape(f"this run is on {said}")):
            machines.check_directory(tmp_path, "h100-sxm-80gb", {**gpu_here, **other})


def test_a_short_name_two_cpu_models_share_asks_for_a_new_name(tmp_path):
    """'Intel Xeon CPU @ 2.20GHz' and 'Intel Xeon Processor' both read intel-xeon."""
    records(tmp_path, "cpu-2core-intel-xeon", {**INTEL, "cpu_model": "Intel(R) Xeon(R) CPU @ 2.20GHz"})
    with pytest.raises(machines.MachineMismatch, match=r"--machine NEWNAME \(e\.g\. cpu-2core-intel-xeon-2"):
        machines.check_directory(tmp_path, "cpu-2core-intel-xeon", HERE)


def test_a_build_change_is_refused_unless_accepted_knowingly(tmp_path):
    records(tmp_path, "cpu-2core-intel-xeon", INTEL)
    with pytest.raises(machines.MachineMismatch) as e:
        machines.check_directory(tmp_path, "cpu-2core-intel-xeon", HERE)
    text = str(e.value)
    assert "last measured with torch 2.15.0+cu132, CUDA 13.2 and this run has torch 2.14.1+cu130, CUDA 13.0" in text
    assert "--new-build" in text and "--machine cpu-2core-intel-xeon-torch-2.14.1-cu130" in text
    note = machines.check_directory(tmp_path, "cpu-2core-intel-xeon", HERE, new_build=True)
    assert note.startswith("--new-build:") and "starts a new environment" in note
    # the same build as the newest record: nothing to say, with or without the flag
    records(tmp_path, "cpu-2core-intel-xeon", {**INTEL, "recorded_at": "2026-12-01T00:00:00+00:00",
                                               "torch": HERE["torch"], "cuda": HERE["cuda"]})
    assert machines.check_directory(tmp_path, "cpu-2core-intel-xeon", HERE) is None
    assert machines.check_directory(tmp_path, "cpu-2core-intel-xeon", HERE, new_build=True) is None


def test_unknown_fields_and_torn_lines_refuse_nothing(tmp_path):
    assert machines.check_directory(tmp_path, "new", HERE) is None  # no directory yet
    old = {"commit": SHA, "recorded_at": "2026-01-01T00:00:00+00:00", "python": "3.11.7"}  # names no hardware
    records(tmp_path, "cpu-2core-intel-xeon", old, extra=b'{"commit": "torn li')
    assert machines.check_directory(tmp_path, "cpu-2core-intel-xeon", HERE) is None


def test_speedlib_run_refuses_before_the_preflight_or_asv(tmp_path, monkeypatch):
    from speedbench.measure import hardware  # noqa: PLC0415 - imports torch: only this test needs it

    records(tmp_path, "cpu-2core", AMD)
    monkeypatch.setattr(hardware, "identity", lambda: dict(HERE))
    for step in ("_preflight", "_register_machine", "_run_commit"):
        monkeypatch.setattr(suite, step, lambda *a, **k: pytest.fail("the run went past the machine check"),
                            raising=False)
    monkeypatch.setattr(hardware, "environment", lambda *a, **k: pytest.fail("the environment was recorded"))
    options = suite.RunOptions(machine="cpu-2core", results_dir=tmp_path)
    with pytest.raises(suite.SuiteError, match="a machine name stands for one kind of hardware"):
        suite._run(options, ROOT, [], [SHA], [(None, [])])
    # a quick run files nothing, so it is not checked
    suite._check_machine(suite.RunOptions(quick=True, machine="cpu-2core", results_dir=tmp_path), ROOT, HERE)


def test_new_build_reaches_the_run_and_is_said(tmp_path, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(suite, "run",
                        lambda options, argv=(): seen.append(options) or suite.RunResult(tmp_path, "m", []))
    assert cli.main(["run", "--new-build"]) == 0 and seen[-1].new_build
    assert cli.main(["run"]) == 0 and not seen[-1].new_build
    records(tmp_path, "cpu-2core-intel-xeon", INTEL)
    options = suite.RunOptions(results_dir=tmp_path, new_build=True)
    suite._check_machine(options, ROOT, HERE)
    assert "speedlib run: --new-build: " in capsys.readouterr().out
    with pytest.raises(suite.SuiteError, match="Pass --new-build"):
        suite._check_machine(suite.RunOptions(results_dir=tmp_path), ROOT, HERE)


# --- environments of rows already filed ---------------------------------------------------

def test_environment_keys_compare_what_the_records_say():
    df = pd.DataFrame({"cpu_model": ["A", "A", "A", None, None], "gpu_count": [0.0, 0, 0, math.nan, math.nan],
                       "torch": ["1", "1", "2", None, None]})
    keys = machines.environment_keys(df)
    assert keys[0] == keys[1] != keys[2] and keys[3] == keys[4] != keys[0]  # 0 and 0.0 alike; unknown alike
    assert machines.environment_keys(pd.DataFrame({"x": [1, 2]})).nunique() == 1  # hand-built: one environment
    merged = df.add_suffix("_base")
    assert (machines.environment_keys(merged, "_base") == keys).all()
    assert machines.describe_change(df.iloc[1], df.iloc[2]) == "torch 1 -> 2"
    assert machines.describe_change(df.iloc[0], df.iloc[3]) == "CPU A -> unknown, GPUs 0 -> unknown, torch 1 -> unknown"
    assert machines.describe(INTEL) == "CPU Intel(R) Xeon(R) Processor, torch 2.15.0+cu132, CUDA 13.2"


def _history(values, torch, cpu=None):
    """One case across commits a day apart, 10 samples with 2 % noise each, with the torch
    build (and CPU) each commit's environment record named."""
    rng = np.random.default_rng(0)
    rows = []
    for i, (level, build) in enumerate(zip(values, torch, strict=True)):
        day = pd.Timestamp("2026-01-01", tz="UTC") + pd.Timedelta(days=i)
        samples = list(level * (1 + 0.02 * rng.standard_normal(10)))
        v = float(np.median(samples))
        rows.append({"machine": "m", "benchmark": "bench_x.S.time_y", "params": "", "kind": "time",
                     "unit": "seconds", "commit": f"{i:040d}", "commit_date": day, "run_date": day, "value": v,
                     "ci99_low": min(samples), "ci99_high": max(samples), "n": 10, "repeat": 10, "samples": samples,
                     "cpu_model": cpu[i] if cpu else "Intel(R) Xeon(R) Processor", "gpu_model": None,
                     "gpu_count": 0, "torch": build, "cuda": "13.2"})
    return pd.DataFrame(rows)


def test_history_shows_an_environment_change_and_computes_nothing_across_it():
    same = _history([1.0] * 4 + [1.5] * 4, ["2.15.0+cu132"] * 8)
    h = report.history(same)
    assert h["significant"].iloc[4] and h["step"].iloc[4]  # one environment: a change and a step
    moved = _history([1.0] * 4 + [1.5] * 4, ["2.15.0+cu132"] * 4 + ["2.14.1+cu130"] * 4)
    h = report.history(moved)
    assert math.isnan(h["change"].iloc[4]) and not h["significant"].any() and not h["step"].any()
    assert list(h["environment_change"]) == [""] * 4 + ["torch 2.15.0+cu132 -> 2.14.1+cu130"] + [""] * 3
    table = report.history_table(moved, "bench_x.S.time_y")
    assert table.frame["flag"].iloc[4] == "torch 2.15.0+cu132 -> 2.14.1+cu130: not compared"
    assert any("'not compared'" in n for n in table.notes)
    assert not any("'not compared'" in n for n in report.history_table(same, "bench_x.S.time_y").notes)
    # changes within each environment are still flagged, steps still found within one stretch
    jump = _history([1.0] * 4 + [1.5, 1.5, 3.0, 3.0, 3.0], ["a"] * 4 + ["b"] * 5)
    h = report.history(jump)
    assert h["significant"].tolist() == [False] * 6 + [True, False, False] and not h["step"].iloc[4]


def test_history_compares_across_a_cpu_change_no_more_than_a_build_change():
    cpus = ["AMD EPYC"] * 4 + ["Intel(R) Xeon(R) Processor"] * 4
    h = report.history(_history([1.0] * 4 + [1.5] * 4, ["2.15.0+cu132"] * 8, cpu=cpus))
    assert h["environment_change"].iloc[4] == "CPU AMD EPYC -> Intel(R) Xeon(R) Processor"
    assert not h["step"].any() and not h["significant"].any()


def test_a_change_of_torch_threads_is_another_environment_too():
    """$SPEEDLIB_THREADS=1 on a machine measured at 2 threads: a new series, not a regression."""
    h = _history([1.0] * 4 + [1.5] * 4, ["2.15.0+cu132"] * 8).assign(torch_threads=[2] * 4 + [1] * 4)
    h = report.history(h)
    assert h["environment_change"].iloc[4] == "torch threads 2 -> 1" and not h["significant"].any()


@pytest.fixture
def two_commits(tmp_path) -> tuple[Path, str, str]:
    synthetic.write_results(tmp_path, commits=2, machines=2)
    commits = load_results(tmp_path).measured.sort_values("commit_date")["commit"].unique()
    return tmp_path, commits[0], commits[1]


def _rebuild(tree: Path, machine: str, commit: str, torch: str) -> None:
    """Say in the commit's environment record that it ran with another torch build."""
    path = tree / machine / "environment" / f"{commit[:8]}.jsonl"
    path.write_text("".join(json.dumps({**json.loads(line), "torch": torch}) + "\n"
                            for line in path.read_text().splitlines()))


def gate(tree: Path, a: str, b: str, *options: str) -> int:
    return cli.main(["report", "--results", str(tree), "--format", "csv", *options, "--fail-on-regression", a, b])


def test_the_gate_refuses_commits_measured_in_different_environments(two_commits, capsys):
    tree, a, b = two_commits
    assert gate(tree, a[:8], b[:8]) == 0
    _rebuild(tree, "synthetic-h100", b, "2.12.0+cu130")
    capsys.readouterr()
    assert gate(tree, a[:8], b[:8]) == 2
    (refusal,) = [line for line in capsys.readouterr().err.splitlines() if "different environments" in line]
    assert refusal.startswith(f"speedlib report: {a[:8]} and {b[:8]} were measured in different environments")
    assert "(on synthetic-h100: torch 2.11.0+cu128 -> 2.12.0+cu130): not compared" in refusal
    assert "synthetic-h200" not in refusal
    assert gate(tree, a[:8], b[:8], "--machine", "synthetic-h200") == 0  # measured alike there
    with pytest.raises(ValueError, match="different environments"):
        report.compare_commits(load_results(tree).measured, a[:8], b[:8])


def _paired(ratios, cpu: str) -> pd.DataFrame:
    """One amp comparison as the loader gives it, measured on `cpu`."""
    rows = [{"benchmark": "bench_amp.TrainingStep.track_seconds", "kind": "time", "variant": "fp32",
             "params": "workload=resnet50, variant=fp32", "samples": [1.0] * 8, "value": 1.0},
            {"benchmark": "bench_amp.TrainingStep.track_speedup", "kind": "paired speedup", "variant": "bf16",
             "params": "workload=resnet50, variant=bf16", "samples": ratios, "value": 2.0}]
    return pd.DataFrame(rows).assign(machine="m", commit="c" * 40, commit_date=pd.Timestamp(0, tz="UTC"),
                                     technique="amp", gpu="CPU only", unit=None, iqr=0.0, cpu_model=cpu,
                                     gpu_model=None, gpu_count=0, torch="2.15.0+cu132", cuda="13.2")


def test_the_noise_table_pairs_only_runs_in_the_same_environment():
    first = _paired([2.0] * 8, "Intel(R) Xeon(R) Processor")
    again = _paired([2.2] * 8, "Intel(R) Xeon(R) Processor")
    assert report.paired_noise(first, again)["run_to_run"].tolist() == pytest.approx([0.1])
    assert len(report.noise(first, again)) == 1
    elsewhere = _paired([2.6] * 8, "AMD EPYC")
    assert report.paired_noise(first, elsewhere).empty and report.noise(first, elsewhere).empty
    t = report.noise_table(first, elsewhere)
    assert t.frame.empty
    assert ("2 result(s) measured in both runs but in different environments, not compared (the difference would "
            "be the environment's, not noise): m: CPU Intel(R) Xeon(R) Processor -> AMD EPYC") in t.notes[-1]
    assert not any("different environments" in n for n in report.noise_table(first, again).notes)


# --- the committed results, split by CPU model ----------------------------------------------

def test_each_committed_machine_directory_holds_one_kind_of_hardware():
    loaded = load_results(ROOT / "results")
    rows = pd.concat([loaded.measured, loaded.not_measured])
    for machine, g in rows.groupby("machine"):
        hardware = g["gpu_model"] if g["gpu_model"].notna().any() else g["cpu_model"]
        assert hardware.nunique(dropna=False) == 1, (machine, set(hardware))
    cpu = rows[rows["gpu"] == "CPU only"].drop_duplicates("machine").set_index("machine")["cpu_model"]
    assert dict(cpu) == {"cpu-2core-amd-epyc": "AMD EPYC", "cpu-2core-intel-xeon": "Intel(R) Xeon(R) Processor"}
    # 6931fd01 ran on both: each result file went with the record written when it finished
    both = rows[rows["commit"].str.startswith("6931fd01")].groupby("machine")["file"].unique()
    assert {m: [Path(f).name[-12:] for f in files] for m, files in both.items()} == {
        "cpu-2core-amd-epyc": ["_python.json"], "cpu-2core-intel-xeon": ["python3.json"]}
    for directory in [*(ROOT / "results").glob("cpu-*"), *(ROOT / "results-rerun").glob("cpu-*")]:
        assert json.loads((directory / "machine.json").read_text())["machine"] == directory.name
        for f in directory.glob("*-existing-*.json"):
            assert json.loads(f.read_text())["params"]["machine"] == directory.name  # asv publish groups by it


def test_committed_cpu_directories_are_named_as_their_hardware_names_itself():
    hardware = pytest.importorskip("speedbench.measure.hardware")  # needs torch
    for directory in (ROOT / "results").glob("cpu-*"):
        models = {r.get("cpu_model") for r in machines.directory_records(directory)}
        assert len(models) == 1
        assert directory.name == f"cpu-2core-{hardware.cpu_slug(models.pop())}"


def test_the_committed_history_and_rerun_compare_like_with_like():
    measured = load_results(ROOT / "results").measured
    # the Xeon's last run of this benchmark's version is its first under torch 2.14.1 (newer AMD
    # runs set that machine's older version aside)
    h = report.history(measured[measured["machine"] == "cpu-2core-intel-xeon"],
                       "bench_dashboard.FirstView.time_load_results")
    boundary = h[h["commit"].str.startswith("40eba557")]
    assert len(boundary) == 4 and boundary["change"].isna().all()
    assert set(boundary["environment_change"]) == {"torch 2.15.0+cu132 -> 2.14.1+cu130, CUDA 13.2 -> 13.0"}
    rerun = load_results(ROOT / "results-rerun").measured
    pairs = report.paired_noise(measured, rerun)
    assert len(pairs) > 50 and set(pairs["machine"]) == {"cpu-2core-intel-xeon"}
    table = report.noise_table(measured, rerun)
    assert not any("different environments" in n for n in table.notes)
    csv = report.to_csv(report.history_table(measured, "bench_dashboard.FirstView.time_load_results"))
    assert "not compared" in pd.read_csv(io.StringIO(csv))["flag"].fillna("").str.cat()
