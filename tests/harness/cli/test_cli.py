"""`speedlib` command and `speedlib run`: asv driven end to end in a scratch repository.

The end-to-end tests run real asv on one small benchmark, so they take tens of seconds.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import webbrowser
from pathlib import Path

import pandas as pd
import pytest
from project_bits import ROOT, commit_all, copy_project, git, registered_machine, run_cli

from speedbench.cli import dashboard as dashboard_cli
from speedbench.cli import parser as cli
from speedbench.results import load as results
from speedbench.results import synthetic
from speedbench.results.load import load_results
from speedbench.results.tree import ResultsTree
from speedbench.run import errors, suite

ONE_BENCH = r"AdamStep.track_seconds\('mlp', '(speedlib|fused)'\)"












@pytest.fixture(scope="module")
def scratch_repo(tmp_path_factory) -> Path:
    """A two-commit copy of this project, so runs never touch the real results/."""
    repo = tmp_path_factory.mktemp("repo")
    copy_project(repo)
    commit_all(repo, "first")
    (repo / "speedlib" / "NOTE.txt").write_text("second commit\n")
    commit_all(repo, "second")
    return repo


# Fails at a commit whose library has no speedlib/NOTE.txt: the benchmarks come from the
# checkout, the library from each commit (ASV_PYTHONPATH). track_harness is 1 only where
# the harness (speedbench) is the checkout's, not the commit's. track_* run in seconds.
PLANTED = '''
from pathlib import Path

import speedbench
import speedlib


class Planted:
    def track_ok(self):
        return 1

    def track_note(self):
        return len((Path(speedlib.__file__).parent / "NOTE.txt").read_text())

    def track_harness(self):
        checkout = Path(__file__).resolve().parents[1]
        return int(Path(speedbench.__file__).resolve().parents[1] == checkout)
'''


@pytest.fixture(scope="module")
def failing_repo(tmp_path_factory) -> Path:
    """This project plus bench_planted.py, in three commits; the middle one lacks NOTE.txt."""
    repo = tmp_path_factory.mktemp("failing")
    copy_project(repo)
    (repo / "benchmarks" / "bench_planted.py").write_text(PLANTED)
    (repo / "speedlib" / "NOTE.txt").write_text("note\n")
    commit_all(repo, "first")
    (repo / "speedlib" / "NOTE.txt").unlink()
    commit_all(repo, "no note: track_note fails")
    (repo / "speedlib" / "NOTE.txt").write_text("note\n")
    commit_all(repo, "note again")
    return repo


def test_help_and_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and "speedlib" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    out = capsys.readouterr().out
    assert "--quick" in out and "exit status:" in out and "  3  some benchmarks failed" in out


def test_every_command_that_reads_results_says_its_exit_statuses_and_defaults(capsys):
    """Issue 51: `speedlib --help` did not name `publish`; `report`, `dashboard` and `publish`
    said no exit status; `publish --output` had no word on its default; `report --results` read
    the current directory's results/ while `dashboard` read the checkout's."""
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "`publish` them as a static site" in capsys.readouterr().out
    defaults = {}
    for command in ("report", "dashboard", "publish"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        out = capsys.readouterr().out
        assert "exit status:\n  0  " in out and "\n  2  refused" in out, command
        assert "this checkout's results/" in out, command
        parser = cli.build_parser()
        defaults[command] = parser.parse_args([command, *(["--output", "x"] if command == "publish" else [])]).results
    assert len(set(defaults.values())) == 1 and Path(defaults["report"]).is_absolute(), defaults
    with pytest.raises(SystemExit):
        cli.main(["publish", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert "no default: publish writes only what --output and --chart name" in said  # --output's default


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
    said = capsys.readouterr()
    table = pd.read_csv(io.StringIO(said.out))  # plain data: its provenance goes to stderr
    assert set(table["machine"]) == {"synthetic-h100", "synthetic-h200"} and len(table) == 8  # latest commit only
    assert "\nReproduce: git checkout " in said.err and "Reproduce" not in said.out
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
    table = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert len(table) == 6 and table["run to run"].str.endswith(" %").all()  # 2 time benchmarks x 3 variants
    assert cli.main(["report", "--results", str(first), "--table", "noise"]) == 2
    assert "needs --against DIR" in capsys.readouterr().err


def test_report_prints_the_problems_of_against_and_escapes_names(tmp_path, capsys):
    first, second = tmp_path / "a", tmp_path / "b"
    synthetic.write_results(first, commits=1, machines=1, seed=0)
    synthetic.write_results(second, commits=1, machines=1, seed=1)
    (second / "synthetic-h100" / "broken\x1b[2J.json").write_text("{")
    assert cli.main(["report", "--results", str(first), "--table", "noise", "--against", str(second),
                     "--format", "csv"]) == 0
    err = capsys.readouterr().err
    assert f"problem: {second}/synthetic-h100/broken\\x1b[2J.json: not valid JSON" in err and "\x1b" not in err
    assert f"speedlib report: --against {second}: 1 problem(s) with damaged or incomplete results" in err
    (first / "synthetic-h100").rename(first / "evil\x1b]0;x\x07")
    assert cli.main(["report", "--results", str(first)]) == 0
    out = capsys.readouterr().out
    assert "evil\\x1b]0;x\\x07" in out and "\x1b" not in out and "\x07" not in out


def _history_and_damage(tree: Path) -> Path:
    """Results whose files hold the ordinary traces of history (a result set aside, one kept
    and flagged, one of a removed benchmark) and one damaged file."""
    synthetic.write_results(tree, commits=2, machines=2)
    time_bench = "bench_contiguous.OptimizerStep.time_adam_step"
    older, newer = sorted((tree / "synthetic-h100").glob("*-existing-*.json"))
    for path, version, started in ((older, "1" * 64, 1_780_000_000_000), (newer, "2" * 64, 1_790_000_000_000)):
        data = json.loads(path.read_text())
        data["results"][time_bench][2:4] = [version, started]
        path.write_text(json.dumps(data))
    other = sorted((tree / "synthetic-h200").glob("*-existing-*.json"))[0]
    data = json.loads(other.read_text())
    data["results"]["bench_gone.Old.time_x"] = data["results"][time_bench]
    other.write_text(json.dumps(data))
    broken = tree / "synthetic-h200" / "torn.json"
    broken.write_text('{"version": 2, "results": {')
    return broken


def test_report_counts_older_results_in_one_line_and_always_lists_damage(tmp_path, capsys):
    broken = _history_and_damage(tmp_path)
    assert cli.main(["report", "--results", str(tmp_path), "--table", "paired"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0].startswith(f"problem: {broken}: not valid JSON")
    assert err[1] == ("speedlib report: 1 problem(s) with damaged or incomplete results; 3 result file(s) hold older "
                      "results (files per kind, one file may hold several: 1 set aside: older benchmark version; "
                      "1 skipped: benchmark removed; 1 kept, flagged †: "
                      "the machine's newest); --verbose lists them")
    assert not any(line.startswith("skipped ") for line in err)


def test_report_verbose_lists_each_file_by_what_happened(tmp_path, capsys):
    _history_and_damage(tmp_path)
    assert cli.main(["report", "--results", str(tmp_path), "--table", "paired", "--verbose"]) == 0
    err = capsys.readouterr().err.splitlines()
    listed = err[:-1]
    assert sorted(line.split(": ", 1)[0] for line in listed) == ["kept, flagged †", "problem", "set aside", "skipped"]
    kept = next(line for line in listed if line.startswith("kept"))
    assert "kept, the newest this machine has" in kept and "set aside" not in kept and "skipped" not in kept
    assert err[-1].startswith("speedlib report: 1 problem(s)") and "--verbose" not in err[-1]


def test_the_table_at_the_end_of_a_run_counts_older_results_in_one_line(tmp_path, capsys):
    broken = _history_and_damage(tmp_path)
    suite._print_table(tmp_path, "synthetic-h200")
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith(f"problem: {broken}: not valid JSON")
    assert out[-1].startswith("1 problem(s) with damaged or incomplete results; 3 result file(s) hold older results")
    assert out[-1].endswith(f"speedlib report --results {tmp_path} --verbose lists them")


def test_report_on_results_without_problems_prints_nothing_on_stderr(tmp_path, capsys):
    synthetic.write_results(tmp_path, commits=1, machines=1)
    assert cli.main(["report", "--results", str(tmp_path), "--table", "paired"]) == 0
    assert capsys.readouterr().err == ""


def test_dashboard_refuses_a_missing_results_directory(tmp_path, capsys):
    assert cli.main(["dashboard", "--results", str(tmp_path / "nope")]) == 2
    assert "no results directory" in capsys.readouterr().err


def test_dashboard_says_first_that_the_port_is_taken(tmp_path, capsys, monkeypatch):
    pytest.importorskip("streamlit")
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("Streamlit was started"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["dashboard", "--results", str(tmp_path), "--port", str(port), "--no-browser"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1
    assert f"cannot listen on 127.0.0.1:{port} (Address already in use)" in out.err


def test_ctrl_c_in_report_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(results, "load_results", interrupted)
    assert cli.main(["report", "--results", str(tmp_path)]) == 130
    assert capsys.readouterr().err == "speedlib report: stopped by Ctrl+C\n"


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
    machine = registered_machine(out)
    assert "results/benchmarks.json" in names and f"results/{machine}/machine.json" in names
    assert f"results/{machine}/environment/{shas[0][:8]}.jsonl" in names
    assert [n for n in names if n.endswith(".json") and shas[0][:8] in n] and not [n for n in names if shas[1][:8] in n]

    machine_dir = scratch_repo / "results" / machine
    result_files = [p for p in machine_dir.glob("*.json") if p.name != "machine.json"]
    assert {json.loads(p.read_text())["commit_hash"] for p in result_files} == set(shas)
    for sha in shas:
        env_file = ResultsTree(scratch_repo / "results").machine(machine_dir.name).environment_record(sha)
        lines = env_file.read_text().splitlines()
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
    assert "AdamStep.track_seconds" in cmp.stdout and "'speedlib'" in cmp.stdout

    report = run_cli("report", "--results", "results", cwd=scratch_repo, home=tmp_path)
    assert report.returncode == 0 and "variant=fused" in report.stdout


@pytest.mark.slow
def test_a_failing_benchmark_keeps_the_rest_of_the_run(failing_repo, tmp_path):
    archive = tmp_path / "run.tar.gz"
    out = run_cli("run", "--commits", "HEAD~2..HEAD", "--bench", "Planted", "--archive", str(archive),
                  cwd=failing_repo, home=tmp_path)
    assert out.returncode == errors.BENCHMARKS_FAILED, out.stdout + out.stderr
    broken, fixed = git(failing_repo, "rev-parse", "HEAD~1"), git(failing_repo, "rev-parse", "HEAD")
    assert "[2/2]" in out.stdout  # the failure at the first commit did not stop the walk
    # Named once, at the commit where it failed.
    failures = [line for line in out.stderr.splitlines() if line.startswith("  FAILED ")]
    assert failures == [f"  FAILED {broken[:8]} bench_planted.Planted.track_note"], out.stderr

    machine = registered_machine(out)
    results = failing_repo / "results"
    loaded = load_results(results)
    measured = loaded.measured[loaded.measured["machine"] == machine]
    assert sorted(zip(measured["commit"], measured["benchmark"], strict=True)) == sorted([
        (broken, "bench_planted.Planted.track_ok"), (fixed, "bench_planted.Planted.track_note"),
        (fixed, "bench_planted.Planted.track_ok"),
        (broken, "bench_planted.Planted.track_harness"), (fixed, "bench_planted.Planted.track_harness")])
    # Each commit's library, but the checkout's harness at every commit.
    assert list(measured.loc[measured["benchmark"].str.endswith("track_harness"), "value"]) == [1, 1]
    failed = loaded.not_measured[loaded.not_measured["status"] == "failed"]
    assert list(zip(failed["commit"], failed["benchmark"], strict=True)) == \
        [(broken, "bench_planted.Planted.track_note")]
    assert not loaded.problems  # every result file has its environment record
    for sha in (broken, fixed):
        assert ResultsTree(results).machine(machine).environment_record(sha).is_file()
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"results/benchmarks.json", f"results/{machine}/machine.json",
            f"results/{machine}/environment/{broken[:8]}.jsonl"} <= names
    assert [n for n in names if re.fullmatch(rf"results/{re.escape(machine)}/{broken[:8]}-.*\.json", n)]
    assert "packed" in out.stdout and "bench_planted.Planted.track_ok" in out.stdout  # the table


def test_asv_status_2_without_a_recorded_failure_is_an_error(scratch_repo, tmp_path, monkeypatch):
    # asv also exits 2 on a bad argument, having saved nothing: that must not pass for a benchmark failure.
    monkeypatch.setattr(suite, "_asv", lambda args, failures_ok=False, **kw: 2 if failures_ok else 0)
    with pytest.raises(suite.SuiteError, match="recorded no failed benchmark"):
        suite.run(suite.RunOptions(results_dir=tmp_path / "results"), root=scratch_repo)
    assert not (tmp_path / "results").exists()


def test_pack_results_refuses_an_empty_run_and_quick_archives(tmp_path):
    with pytest.raises(suite.SuiteError, match="nothing to pack"):
        suite.pack_results(tmp_path, "cpu-2core-intel-xeon", ["a" * 40], tmp_path / "x.tar.gz")
    (tmp_path / "cpu-2core-intel-xeon").mkdir()
    (tmp_path / "benchmarks.json").write_text("{}")
    (tmp_path / "cpu-2core-intel-xeon" / "machine.json").write_text("{}")
    with pytest.raises(suite.SuiteError, match="result files"):
        suite.pack_results(tmp_path, "cpu-2core-intel-xeon", ["a" * 40], tmp_path / "x.tar.gz")
    with pytest.raises(suite.SuiteError, match="a --quick run saves none"):
        suite.run(suite.RunOptions(quick=True, archive=tmp_path / "x.tar.gz"), root=ROOT)


# The rehearsal's suite: one real benchmark and the planted ones, in two chunks. track_ok's
# second parameter runs in the second chunk, so its result file must merge the two runs.
REHEARSAL_CHUNKS = r'''
CHUNKS = (
    ("headline", "one real comparison and a planted benchmark", (
        r"bench_contiguous\.AdamStep\.track_seconds\('mlp', 'speedlib'\)",
        r"bench_planted\.Offline\.track_ok\(1\)",
    )),
    ("rest", "everything else", (r"bench_planted\.",)),
)
'''
OFFLINE_PLANTED = '''
class Offline:
    params = [1, 2]

    def track_ok(self, n):
        return n

    def track_broken(self, n):
        raise RuntimeError("planted failure")
'''


@pytest.mark.slow
def test_offline_chunked_run_from_a_bundle_rehearses_a_gpu_slot(tmp_path):
    """What a GPU slot does, on CPU sizes: the source tree arrives without .git, git comes
    back from a bundle, the suite runs as `python3 -m speedlib` in chunks under a budget, a
    planted failure does not stop it, and the merged archive is read by report and asv."""
    source = tmp_path / "source"
    source.mkdir()
    copy_project(source)
    (source / "benchmarks" / "chunks.py").write_text(REHEARSAL_CHUNKS)
    (source / "benchmarks" / "bench_planted.py").write_text(OFFLINE_PLANTED)
    commit_all(source, "rehearsal")
    sha = git(source, "rev-parse", "HEAD")
    bundle = tmp_path / "speedlib.bundle"
    git(source, "bundle", "create", str(bundle), "main")

    # The slot's copy: files only, then git restored from the bundle.
    host = tmp_path / "host"
    shutil.copytree(source, host, ignore=shutil.ignore_patterns(".git"))
    assert not (host / ".git").exists()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(host)}
    refused = subprocess.run([sys.executable, "-m", "speedlib", "run", "--quick"], cwd=host, env=env,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "git fetch -q BUNDLE main" in refused.stderr, refused.stderr
    git(host, "init", "-q", "-b", "main")
    git(host, "fetch", "-q", str(bundle), "main")
    git(host, "reset", "-q", "FETCH_HEAD")

    archive = tmp_path / "out" / "results.tar.gz"
    out = subprocess.run([sys.executable, "-m", "speedlib", "run", "--chunk", "all", "--budget-minutes", "30",
                          "--archive", str(archive)], cwd=host, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == errors.BENCHMARKS_FAILED, out.stdout + out.stderr
    assert out.stdout.count("packed into") == 2  # each chunk archived as it finished
    failures = [line for line in out.stderr.splitlines() if line.startswith("  FAILED ")]
    assert failures == [f"  FAILED {sha[:8]} bench_planted.Offline.track_broken for 2 of 2 parameter sets: (1); (2)"]

    unpacked = tmp_path / "checkout"
    shutil.copytree(source, unpacked)
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    machine = registered_machine(out)
    files = [p for p in (unpacked / "results" / machine).glob("*.json") if p.name != "machine.json"]
    assert len(files) == 1  # both chunks in the commit's one result file
    results = json.loads(files[0].read_text())["results"]
    assert results["bench_planted.Offline.track_ok"][0] == [1, 2]  # the later chunk kept the earlier value
    loaded = load_results(unpacked / "results")
    measured = set(loaded.measured["benchmark"])
    assert {"bench_contiguous.AdamStep.track_seconds", "bench_planted.Offline.track_ok"} <= measured
    assert not loaded.problems

    report = run_cli("report", "--results", "results", cwd=unpacked, home=tmp_path)
    assert report.returncode == 0 and "track_ok" in report.stdout and "AdamStep" in report.stdout
    pub = subprocess.run([sys.executable, "-m", "asv", "publish"], cwd=unpacked,
                         env={**os.environ, "HOME": str(tmp_path)}, capture_output=True, text=True)
    assert pub.returncode == 0, pub.stdout + pub.stderr
    assert (unpacked / ".asv" / "html" / "index.html").is_file()


SLOW = '''
import os
import time
from pathlib import Path


class Slow:
    timeout = 600

    def track_wait(self):
        # asv forks benchmarks from its forkserver, so their command line names no benchmark:
        # the test finds this process by the pid it leaves
        Path({pidfile!r}).write_text(str(os.getpid()))
        time.sleep(300)
        return 1
'''


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has stopped; its parent just has not reaped it yet


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue  # gone meanwhile, or not ours to read
    return pids


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds leftover processes through Linux's /proc")
def test_sigterm_stops_asv_and_its_benchmarks(tmp_path):
    """A time limit's SIGTERM to speedlib alone must not leave asv benchmarking on."""
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_project(repo)
    pidfile = tmp_path / "benchmark.pid"
    (repo / "benchmarks" / "bench_slow.py").write_text(SLOW.format(pidfile=str(pidfile)))
    commit_all(repo, "slow")
    proc = subprocess.Popen([sys.executable, "-m", "speedlib", "run", "--bench", "Slow"], cwd=repo,
                            env={**os.environ, "HOME": str(tmp_path)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not pidfile.is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert pidfile.is_file(), "the benchmark process never started"
    time.sleep(1)  # well inside the benchmark's 300 s sleep
    benchmark = int(pidfile.read_text())
    assert _alive(benchmark)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    # Neither the benchmark nor asv's forkserver (whose command line names the benchmarks
    # directory) may outlive speedlib; signalled processes take a moment to exit and be reaped.
    deadline = time.monotonic() + 20
    while (_alive(benchmark) or _processes_mentioning(str(repo))) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(benchmark)
    assert _processes_mentioning(str(repo)) == []


def test_dashboard_reports_a_streamlit_that_exits_before_serving(tmp_path, capsys, monkeypatch):
    pytest.importorskip("streamlit")
    real_popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen",
                        lambda cmd, **kw: real_popen([sys.executable, "-c", "raise SystemExit(3)"]))
    with socket.socket() as s:  # a free port (0 is refused: the URL could not name the port)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["dashboard", "--results", str(tmp_path), "--port", str(port), "--no-browser"]) == 2
    out = capsys.readouterr()
    assert "serving" not in out.out
    assert f"Streamlit exited with status 3 before serving http://127.0.0.1:{port}" in out.err


@pytest.mark.parametrize("platform, env, opened", [
    ("linux", {}, False),  # ssh, a container, CI: nothing to show a window on
    ("linux", {"DISPLAY": ":0"}, True),
    ("linux", {"WAYLAND_DISPLAY": "wayland-0"}, True),
    ("darwin", {}, True),
])
def test_dashboard_opens_a_browser_only_where_a_display_exists(platform, env, opened, monkeypatch):
    calls = []
    monkeypatch.setattr(webbrowser, "open", lambda url: calls.append(url))
    monkeypatch.setattr(sys, "platform", platform)
    for name in ("DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    dashboard_cli._open_browser("http://127.0.0.1:8501")
    assert calls == (["http://127.0.0.1:8501"] if opened else [])


@pytest.mark.parametrize("command", [["run"], ["env"]])
def test_measuring_without_torch_says_so_in_one_line(command, capsys, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real_find_spec(name, *a))
    monkeypatch.setattr(suite, "run", lambda *a, **k: pytest.fail("the run started without torch"))
    assert cli.main(command) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "PyTorch is not installed" in err and '.[bench]' in err
