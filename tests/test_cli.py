"""`speedlib` command and `speedlib run`: asv driven end to end in a scratch repository.

The end-to-end tests run real asv on one small benchmark, so they take tens of seconds.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from speedlib import cli, suite, synthetic

ROOT = Path(__file__).resolve().parents[1]
ONE_BENCH = r"OptimizerStep.time_step\('mlp', '(speedlib|fused)'\)"


def run_cli(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home)}  # asv keeps its machine file in $HOME
    return subprocess.run([sys.executable, "-m", "speedlib.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def scratch_repo(tmp_path_factory) -> Path:
    """A two-commit copy of this project, so runs never touch the real results/."""
    repo = tmp_path_factory.mktemp("repo")
    for name in ("speedlib", "benchmarks"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "asv.conf.json", repo)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    (repo / "speedlib" / "NOTE.txt").write_text("second commit\n")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "second")
    return repo


def test_help_and_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and "speedlib" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "--quick" in capsys.readouterr().out


def test_env_prints_the_record(capsys):
    assert cli.main(["env"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert {"machine", "torch", "cpu_model", "gpu_count"} <= set(record)


def test_resolve_commits(scratch_repo):
    head = git(scratch_repo, "rev-parse", "HEAD")
    first = git(scratch_repo, "rev-parse", "HEAD~1")
    assert suite.resolve_commits(scratch_repo, None) == [head]
    assert suite.resolve_commits(scratch_repo, "HEAD~1") == [first]
    root = git(scratch_repo, "rev-list", "--max-parents=0", "HEAD")
    assert suite.resolve_commits(scratch_repo, f"{root}..HEAD") == [head]
    with pytest.raises(suite.SuiteError, match="empty"):
        suite.resolve_commits(scratch_repo, "HEAD..HEAD")
    with pytest.raises(suite.SuiteError, match="failed"):
        suite.resolve_commits(scratch_repo, "no-such-rev")


def test_find_root_errors_outside_a_checkout(tmp_path):
    with pytest.raises(suite.SuiteError, match="no asv.conf.json"):
        suite.find_root(tmp_path)


def test_report_on_missing_directory(tmp_path, capsys):
    assert cli.main(["report", "--results", str(tmp_path / "nope")]) == 2
    assert "no results directory" in capsys.readouterr().err


def test_report_tables_and_formats(tmp_path, capsys):
    synthetic.write_results(tmp_path, commits=2, machines=2)
    assert cli.main(["report", "--results", str(tmp_path), "--table", "speedup", "--format", "csv"]) == 0
    out = capsys.readouterr().out
    table = pd.read_csv(io.StringIO(out), comment="#")
    assert set(table["machine"]) == {"synthetic-h100", "synthetic-h200"} and len(table) == 8  # latest commit only
    assert "# Reproduce: git checkout " in out
    assert cli.main(["report", "--results", str(tmp_path), "--table", "claims", "--format", "tex"]) == 0
    assert r"\begin{tabular}" in capsys.readouterr().out
    assert cli.main(["report", "--results", str(tmp_path), "--table", "history", "--benchmark", "nope"]) == 2
    assert "--benchmark must name one of" in capsys.readouterr().err


def test_report_noise_between_two_runs_of_one_commit(tmp_path, capsys):
    first, second = tmp_path / "a", tmp_path / "b"
    synthetic.write_results(first, commits=1, machines=1, seed=0)
    synthetic.write_results(second, commits=1, machines=1, seed=1)
    assert cli.main(["report", "--results", str(first), "--table", "noise", "--against", str(second),
                     "--format", "csv"]) == 0
    table = pd.read_csv(io.StringIO(capsys.readouterr().out), comment="#")
    assert len(table) == 6 and table["run to run"].str.endswith(" %").all()  # 2 time benchmarks x 3 variants
    assert cli.main(["report", "--results", str(first), "--table", "noise"]) == 2
    assert "needs --against DIR" in capsys.readouterr().err


def test_dashboard_refuses_a_missing_results_directory(tmp_path, capsys):
    assert cli.main(["dashboard", "--results", str(tmp_path / "nope")]) == 2
    assert "no results directory" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_run_never_writes_results(scratch_repo, tmp_path):
    out = run_cli("run", "--quick", "--bench", ONE_BENCH, cwd=scratch_repo, home=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "quick run, not saved" in out.stdout
    assert "workload=mlp, variant=speedlib" in out.stdout  # the printed table
    assert not (scratch_repo / "results").exists()


@pytest.mark.slow
def test_dirty_tree_is_refused(scratch_repo, tmp_path):
    bench = scratch_repo / "benchmarks" / "bench_contiguous.py"
    original = bench.read_text()
    bench.write_text(original + "\n# local edit\n")
    try:
        out = run_cli("run", "--bench", ONE_BENCH, cwd=scratch_repo, home=tmp_path)
    finally:
        bench.write_text(original)
    assert out.returncode == 2 and "uncommitted changes" in out.stderr


@pytest.mark.slow
def test_commit_range_results_are_read_by_asv_publish_and_compare(scratch_repo, tmp_path):
    out = run_cli("run", "--commits", "HEAD~1..HEAD", "--bench", ONE_BENCH,
                  cwd=scratch_repo, home=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    shas = [git(scratch_repo, "rev-parse", "HEAD")]
    assert "[1/1]" in out.stdout
    archive = tmp_path / "out" / "run.tar.gz"
    out = run_cli("run", "--commits", "HEAD~1", "--bench", ONE_BENCH, "--archive", str(archive),
                  cwd=scratch_repo, home=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    shas.insert(0, git(scratch_repo, "rev-parse", "HEAD~1"))
    with tarfile.open(archive) as tar:  # only this run's commit, laid out to unpack in a checkout
        names = tar.getnames()
    machine = next((scratch_repo / "results").glob("cpu-*core")).name
    assert "results/benchmarks.json" in names and f"results/{machine}/machine.json" in names
    assert f"results/{machine}/environment/{shas[0][:8]}.jsonl" in names
    assert [n for n in names if n.endswith(".json") and shas[0][:8] in n] and not [n for n in names if shas[1][:8] in n]

    machine_dir = next((scratch_repo / "results").glob("cpu-*core"))
    result_files = [p for p in machine_dir.glob("*.json") if p.name != "machine.json"]
    assert {json.loads(p.read_text())["commit_hash"] for p in result_files} == set(shas)
    for sha in shas:
        lines = suite.environment_record_path(scratch_repo / "results", machine_dir.name, sha).read_text().splitlines()
        record = json.loads(lines[-1])
        command = shlex.split(record["command"])  # the command as typed, each word once
        assert record["commit"] == sha and command[:3] == ["speedlib", "run", "--commits"]
        assert command[3].startswith("HEAD~1") and command[4:6] == ["--bench", ONE_BENCH]
        assert command[6:] == (["--archive", str(archive)] if sha == shas[0] else [])

    env = {**os.environ, "HOME": str(tmp_path)}
    asv = [sys.executable, "-m", "asv"]
    pub = subprocess.run([*asv, "publish"], cwd=scratch_repo, env=env, capture_output=True, text=True)
    assert pub.returncode == 0, pub.stdout + pub.stderr
    assert (scratch_repo / ".asv" / "html" / "index.html").is_file()
    cmp = subprocess.run([*asv, "compare", "--machine", machine_dir.name, *shas], cwd=scratch_repo, env=env,
                         capture_output=True, text=True)
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr
    assert "time_step" in cmp.stdout and "'speedlib'" in cmp.stdout

    report = run_cli("report", "--results", "results", cwd=scratch_repo, home=tmp_path)
    assert report.returncode == 0 and "variant=fused" in report.stdout


def test_pack_results_refuses_an_empty_run_and_quick_archives(tmp_path):
    with pytest.raises(suite.SuiteError, match="nothing to pack"):
        suite.pack_results(tmp_path, "cpu-2core", ["a" * 40], tmp_path / "x.tar.gz")
    (tmp_path / "cpu-2core").mkdir()
    (tmp_path / "benchmarks.json").write_text("{}")
    (tmp_path / "cpu-2core" / "machine.json").write_text("{}")
    with pytest.raises(suite.SuiteError, match="result files"):
        suite.pack_results(tmp_path, "cpu-2core", ["a" * 40], tmp_path / "x.tar.gz")
    with pytest.raises(suite.SuiteError, match="a --quick run saves none"):
        suite.run(suite.RunOptions(quick=True, archive=tmp_path / "x.tar.gz"), root=ROOT)
