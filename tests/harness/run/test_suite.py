"""speedbench.run.suite.failed_benchmarks: which benchmarks of this run asv recorded as failed."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import speedlib
from benchmarks import common
from speedbench.chunks import Chunk, how_to_measure, load_chunks
from speedbench.cli import parser as cli
from speedbench.results.listing import combinations
from speedbench.results.tree import ResultsTree
from speedbench.run import plan, suite
from speedbench.techniques import TECHNIQUES

ROOT = Path(__file__).resolve().parents[3]
SHA = "0123456789abcdef" * 2 + "01234567"
COLUMNS = ["result", "params", "version", "started_at", "duration"]


def write(tmp_path, results: dict, sha: str = SHA) -> None:
    machine = tmp_path / "m"
    machine.mkdir(exist_ok=True)
    data = {"commit_hash": sha, "result_columns": COLUMNS, "results": results, "version": 2}
    (machine / f"{sha[:8]}-existing-py.json").write_text(json.dumps(data))


def test_failed_benchmarks_of_this_run_only(tmp_path):
    write(tmp_path, {
        "b.S.track_ok": [[1.0], [], "v", 2000, 0.1],
        "b.S.track_broken": [None, [], "v", 2000, 0.1],  # null, not a list: failed before any value
        "b.S.track_some": [[1.0, None, float("nan")], [["1", "2", "3"]], "v", 2000, 0.1],  # NaN is a skip
        "b.S.track_earlier": [None, [], "v", 999, 0.1],  # failed in an earlier run of this commit
    })
    assert suite.failed_benchmarks(tmp_path, "m", SHA, since_ms=1000) == [
        f"{SHA[:8]} b.S.track_broken",
        f"{SHA[:8]} b.S.track_some for 1 of 3 parameter sets: (2)",
    ]
    assert f"{SHA[:8]} b.S.track_earlier" in suite.failed_benchmarks(tmp_path, "m", SHA)
    assert suite.failed_benchmarks(tmp_path, "m", "f" * 40) == []
    assert suite.failed_benchmarks(tmp_path, "m", SHA[:8] + "f" * 32) == []  # same prefix, other commit


def test_failed_benchmark_names_are_escaped(tmp_path):
    # Benchmark code chooses names and parameter reprs: they must not restyle the terminal or add lines.
    write(tmp_path, {"b.S.track_\x1b[2J": [[None], [["'a\nb'"]], "v", 1, 0.1]})
    (line,) = suite.failed_benchmarks(tmp_path, "m", SHA)
    assert line == f"{SHA[:8]} b.S.track_\\x1b[2J for 1 of 1 parameter sets: ('a\\nb')"
    assert line.isprintable()


def test_python_dash_m_runs_the_cli_without_a_console_script(tmp_path):
    """An offline GPU host may have the source tree on PYTHONPATH and no installed script."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "speedlib", "--version"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert speedlib.__version__ in out.stdout


def test_every_benchmark_combination_is_in_exactly_one_chunk():
    """The chunks split the suite: nothing run twice, nothing left out, and the headline
    chunk holds a comparison of every technique."""
    chunks = load_chunks(ROOT)
    names = combinations(ROOT / "results" / "benchmarks.json")
    assert chunks[-1].name == "rest"
    for combos in names.values():
        for combo in combos:
            owners = [c.name for c in chunks if re.search(c.regex, combo)]
            assert len(owners) == 1, (combo, owners)
    headline = plan.select_chunks(chunks, ["headline"])
    assert chunks[:len(headline)] == headline  # the headline group comes first
    # The benchmarks as the code defines them now (the committed listing may predate a rename).
    # (Class names only: Paired classes inherit their track_ methods.)
    defined = [f"{path.stem}.{cls.name}.track_" for path in sorted((ROOT / "benchmarks").glob("bench_*.py"))
               for cls in ast.parse(path.read_text()).body
               if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_")]
    covered = {c.split(".")[0] for c in defined if any(re.search(h.regex, c) for h in headline)}
    assert covered == {f"bench_{t}" for t in TECHNIQUES}


def test_every_measuring_class_defines_its_own_setup_cache():
    """asv keys a setup_cache's result by where it is written: a class that inherits
    common.Measured's measuring without writing `def setup_cache` itself gets no cache at all,
    and every track_* of it fails on a real run (a unit test calling measure_all() would not
    notice)."""


    classes = []
    for path in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        module = importlib.import_module(f"benchmarks.{path.stem}")
        classes += [(path.stem, name) for name, cls in vars(module).items()
                    if inspect.isclass(cls) and cls.__module__ == module.__name__ and not name.startswith("_")
                    and issubclass(cls, common.Measured) and "setup_cache" not in cls.__dict__]
    assert classes == []


def test_chunk_estimate_counts_one_measuring_process_per_class():
    """A class's methods share one measuring process: a Paired class's track_seconds and
    track_speedup over the same two combinations are two combinations, not four."""
    chunk = Chunk("c", "", r"^(?:a\.B\.|c\.D\.track_y)")
    names = {"a.B.track_seconds": ["a.B.track_seconds(1)", "a.B.track_seconds(2)"],
             "a.B.track_speedup": ["a.B.track_speedup(1)", "a.B.track_speedup(2)"],
             "c.D.track_y": ["c.D.track_y"], "c.D.track_z": ["c.D.track_z"], "e.F.g": ["e.F.g"]}
    seconds, combos, reports = plan.estimate_seconds(chunk, names)
    # asv then starts a reporting process per method and combination: 2 + 2 + 1
    assert (combos, reports) == (3, 5)
    assert seconds == 2 * plan.SECONDS_PER_CLASS + 3 * plan.SECONDS_PER_COMBINATION + 5 * plan.SECONDS_PER_REPORT


def test_work_per_combination_comes_from_the_chunks_this_machine_measured(tmp_path):
    """What measured chunks spent beyond class starts and reporting processes, per combination,
    prices the chunks not yet measured there; with none measured, the default."""
    chunks = [Chunk("a", "", r"^(?:a\.B\.)"), Chunk("c", "", r"^(?:c\.D\.)")]
    names = {"a.B.track_seconds": [f"a.B.track_seconds({i})" for i in range(4)],
             "a.B.track_speedup": [f"a.B.track_speedup({i})" for i in range(4)],
             "c.D.track_y": ["c.D.track_y(1)", "c.D.track_y(2)"]}
    assert plan.seconds_per_combination(chunks, names, tmp_path, "m") == (plan.SECONDS_PER_COMBINATION, "default")
    plan.record_chunk_time(tmp_path, "m", "a", SHA, 50.0)
    per, basis = plan.seconds_per_combination(chunks, names, tmp_path, "m")
    assert per == pytest.approx((50.0 - plan.SECONDS_PER_CLASS - 8 * plan.SECONDS_PER_REPORT) / 4) and "m's" in basis
    seconds, source = plan.chunk_cost(chunks[1], names, tmp_path, "m", per)
    worst = max(per, plan.SECONDS_PER_COMBINATION)  # never priced below the default's work per combination
    assert seconds == pytest.approx((plan.SECONDS_PER_CLASS + 2 * worst + 2 * plan.SECONDS_PER_REPORT) * plan.HEADROOM)
    assert "never measured here" in source and "2 combinations" in source and "2 reporting processes" in source


def test_a_chunk_name_selects_that_chunk_and_a_prefix_its_group():
    chunks = [Chunk(n, "", "x") for n in ("head-a", "head-a-memory", "head-b", "rest")]

    def pick(*names):
        return [c.name for c in plan.select_chunks(chunks, list(names))]

    assert pick("head-a") == ["head-a"]
    assert pick("head") == ["head-a", "head-a-memory", "head-b"]
    assert pick("rest", "head-b") == ["head-b", "rest"]  # suite order, not the order asked
    with pytest.raises(plan.PlanError, match="unknown chunk 'hea'"):
        pick("hea")


def test_what_is_not_measured_names_the_chunk_that_measures_it(tmp_path):
    """Pages that say "not measured yet" give the command: the first chunk whose patterns
    take the class, as `speedlib run --chunk` selects it; a checkout without chunks gets a
    --bench selection of the class instead."""
    assert how_to_measure("bench_checkpoint.PeakMemory.") == "speedlib run --chunk headline-checkpoint-memory"
    assert how_to_measure("bench_checkpoint.ActivationMemory.") == "speedlib run --chunk checkpoint"
    assert how_to_measure("bench_transfer.Footprint.track_host_footprint") == \
        "speedlib run --chunk transfer-parallel"
    assert how_to_measure("bench_new.Thing.", root=tmp_path) == "speedlib run --bench '^bench_new\\.Thing\\.'"


def _fake_run(monkeypatch, costs: dict[str, float]) -> list[str]:
    """suite.run with asv and the machine registration stood in: which chunks would run."""
    ran = []
    monkeypatch.setattr(suite, "_register_machine", lambda *a, **k: None)
    monkeypatch.setattr(suite, "_chunk_seconds", lambda chunk, *a: (costs[chunk.name], "a test's price"))
    monkeypatch.setattr(suite, "_run_commit", lambda options, root, conf, results, machine, env, argv, sha, counter,
                        bench: ran.append(bench[0]) or [])
    monkeypatch.setattr(suite, "_print_table", lambda *a, **k: None)
    return ran


def test_a_budget_skips_a_chunk_that_does_not_fit_and_runs_a_cheaper_later_one(monkeypatch, capsys):
    chunks = {c.name: c for c in load_chunks(ROOT)}
    costs = {name: 60.0 for name in chunks}
    costs["contiguous-amp"] = 3600.0
    ran = _fake_run(monkeypatch, costs)
    result = suite.run(suite.RunOptions(quick=True, chunks=["all"], budget_minutes=10), root=ROOT)
    assert ran == [chunks[n].regex for n in chunks if n != "contiguous-amp"]
    assert result.not_run == ["contiguous-amp"]
    assert "left for a later command: --chunk contiguous-amp" in capsys.readouterr().out


def test_chunk_options_are_checked_before_any_work(monkeypatch):
    ran = _fake_run(monkeypatch, {})
    for options, message in [
        (suite.RunOptions(quick=True, chunks=["nope"]), "unknown chunk 'nope'"),
        (suite.RunOptions(quick=True, chunks=["all"], bench=["x"]), "use one of them"),
        (suite.RunOptions(quick=True, budget_minutes=5), "name them with --chunk"),
    ]:
        with pytest.raises(suite.SuiteError, match=message):
            suite.run(options, root=ROOT)
    assert ran == []


def test_each_commits_record_reads_the_gpu_state_when_it_is_written(tmp_path, monkeypatch):
    """Clocks and temperature drift during a run: the record made after a commit's
    benchmarks must hold the state then, not the snapshot taken when the run started."""
    from speedbench.measure import hardware  # noqa: PLC0415 - torch: only the tests that run a commit load it

    monkeypatch.setattr(suite, "_asv", lambda *a, **k: 0)
    monkeypatch.setattr(hardware, "gpu_state", lambda: [{"index": 0, "temperature_c": 71}])
    head = suite.resolve_commits(ROOT, None)[0]
    suite._run_commit(suite.RunOptions(), ROOT, tmp_path / "asv.conf.json", tmp_path, "m",
                      {"gpu_state": [{"index": 0, "temperature_c": 30}]}, [], head, "[1/1]", [])
    record = json.loads(ResultsTree(tmp_path).machine("m").environment_record(head).read_text())
    assert record["gpu_state"] == [{"index": 0, "temperature_c": 71}] and record["commit"] == head


def test_a_measured_chunk_time_replaces_the_estimate(tmp_path):
    chunk = Chunk("c", "", r"^(?:a\.B\.time_x)")
    names = {"a.B.time_x": ["a.B.time_x(1)", "a.B.time_x(2)"]}
    guessed, source = plan.chunk_cost(chunk, names, tmp_path, "m")
    assert guessed == plan.estimate_seconds(chunk, names)[0] * plan.HEADROOM and source.startswith("never measured")
    plan.record_chunk_time(tmp_path, "m", "c", SHA, 42.0)
    plan.record_chunk_time(tmp_path, "m", "c", SHA, 30.0)
    with ResultsTree(tmp_path).machine("m").chunk_times.open("a") as f:
        f.write('{"chunk": "c", "seco')  # a line torn by a killed run
    assert plan.chunk_cost(chunk, names, tmp_path, "m") == (42.0, "the longest measured run here")


def test_the_budget_counts_every_commit_of_the_range(monkeypatch):
    """A chunk costs its time once per commit: 100 s over two commits does not fit 3 min."""
    chunks = [c.name for c in load_chunks(ROOT)]
    ran = _fake_run(monkeypatch, {name: 100.0 for name in chunks})
    result = suite.run(suite.RunOptions(quick=True, commits="HEAD~2..HEAD", chunks=["all"], budget_minutes=3),
                       root=ROOT)
    assert ran == [] and result.not_run == chunks


def test_a_copy_without_git_inside_another_repository_is_refused(tmp_path):
    outer = tmp_path / "outer"
    (outer / "host").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    with pytest.raises(suite.SuiteError, match="not a git checkout"):
        suite.resolve_commits(outer / "host", None)


@pytest.mark.parametrize("failed, not_run, status", [([], [], 0), (["x"], ["c"], 3), ([], ["c"], 4)])
def test_run_exit_status_says_what_a_slot_script_needs(monkeypatch, tmp_path, failed, not_run, status):
    """0: all ran; 3: failures (they matter more than leftovers); 4: chunks left for later."""

    monkeypatch.setattr(suite, "run", lambda options, argv=(): suite.RunResult(tmp_path, "m", failed, not_run))
    assert cli.main(["run", "--chunk", "all"]) == status


def test_an_interrupted_run_exits_with_the_signal_and_one_line(monkeypatch, capsys):

    def stopped(options, argv=()):
        raise KeyboardInterrupt

    monkeypatch.setattr(suite, "run", stopped)
    assert cli.main(["run"]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stopped by SIGINT" in err


SIGTERM_WHILE_LOADING = """
import os, signal, sys
from speedbench.cli import parser as cli

signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a batch system leaves it, whatever started this


class TermWhileLoading:
    \"\"\"A time limit's SIGTERM as `speedlib run` imports the suite (pandas, then torch: seconds).\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name == "speedbench.run.suite":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGTERM)
        return None


sys.meta_path.insert(0, TermWhileLoading())
sys.argv = ["speedlib", "run", "--results-dir", sys.argv[1]]
sys.exit(cli.main())
"""


def test_a_sigterm_before_the_suite_has_loaded_stops_the_run_with_its_line_and_status(tmp_path):
    """Issue 42: the handler was set only once the suite had loaded and checked its options, so a
    SIGTERM in the first seconds killed the run without a word or its status."""
    proc = subprocess.run([sys.executable, "-c", SIGTERM_WHILE_LOADING, str(tmp_path / "results")], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, proc.stderr)
    assert proc.stderr == f"speedlib run: {suite.Interrupted(signal.SIGTERM)}\n"
    assert not (tmp_path / "results").exists()


def test_a_quick_setting_left_in_the_environment_is_refused_by_a_real_run(monkeypatch, capsys):
    """Issue 42: SPEEDLIB_QUICK=1 left in the shell made a real run measure one round per
    comparison and file it as a normal result, exit 0, with nothing in its records to say so."""

    monkeypatch.setattr(suite, "run", lambda *a, **k: pytest.fail("the run started"))
    monkeypatch.setenv("SPEEDLIB_QUICK", "1")
    assert cli.main(["run"]) == 2
    err = capsys.readouterr().err
    assert err == ("speedlib run: $SPEEDLIB_QUICK is set (SPEEDLIB_QUICK=1): the benchmarks would measure one round "
                   "per comparison and this run would file those as results; unset it (unset SPEEDLIB_QUICK), or "
                   "use --quick for a smoke run that saves nothing\n")
    with pytest.raises(suite.SuiteError, match="SPEEDLIB_QUICK is set"):  # callers of suite.run too
        suite.check_options(suite.RunOptions())
    suite.check_options(suite.RunOptions(quick=True))  # --quick sets it itself, and files nothing


@pytest.mark.parametrize("quick, setting, passed", [(False, "", None), (True, "", "1"), (True, "0", "1")])
def test_only_quick_makes_the_benchmarks_quick(tmp_path, monkeypatch, quick, setting, passed):
    """What the benchmark processes get: SPEEDLIB_QUICK=1 from --quick alone, never a blank or
    other value from the shell."""
    from speedbench.measure import hardware  # noqa: PLC0415 - torch: only the tests that run a commit load it

    seen = []
    monkeypatch.setenv("SPEEDLIB_QUICK", setting)
    monkeypatch.setattr(suite, "_asv", lambda args, env=None, **k: seen.append(env) or 0)
    monkeypatch.setattr(hardware, "gpu_state", lambda: [])
    head = suite.resolve_commits(ROOT, None)[0]
    suite._run_commit(suite.RunOptions(quick=quick), ROOT, tmp_path / "asv.conf.json", tmp_path, "m", {}, [], head,
                      "[1/1]", [])
    assert [env.get("SPEEDLIB_QUICK") for env in seen] == [passed]


@pytest.mark.parametrize("args, message", [
    (["--machine", "../elsewhere"], "--machine '../elsewhere' is not a plain name"),
    (["--machine", "a/b"], "is not a plain name"),
    (["--machine", ".."], "is not a plain name"),
    (["--machine", ".hidden"], "is not a plain name"),
    (["--machine", "a\x1b[2Jb"], "--machine 'a\\x1b[2Jb' is not a plain name"),
    (["--bench", "time_(x"], "--bench 'time_(x' is not a regular expression: missing ), unterminated subpattern"),
    (["--commits=--all"], "--commits '--all' is not a revision or a range A..B"),
    (["--commits", "HEAD~1..--output=x"], "is not a revision or a range"),
    (["--commits="], "is not a revision or a range"),
])
def test_bad_run_options_are_refused_with_one_line_before_any_work(monkeypatch, capsys, args, message):

    monkeypatch.setattr(suite, "run", lambda *a, **k: pytest.fail("the run started"))
    assert cli.main(["run", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("speedlib run: ") and message in err


def test_an_archive_that_is_a_directory_and_a_results_dir_that_is_a_file_are_refused(monkeypatch, capsys, tmp_path):

    monkeypatch.setattr(suite, "run", lambda *a, **k: pytest.fail("the run started"))
    assert cli.main(["run", "--archive", str(tmp_path)]) == 2
    assert "is a directory: name the file to write" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert cli.main(["run", "--results-dir", str(tmp_path / "file")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_run_itself_checks_the_options_too(monkeypatch):
    """For callers of suite.run that do not come through the command line."""
    monkeypatch.setattr(suite, "_run", lambda *a, **k: pytest.fail("the run started"))
    with pytest.raises(suite.SuiteError, match="not a plain name"):
        suite.run(suite.RunOptions(machine="../x", allow_dirty=True), root=ROOT)


def test_a_second_run_on_the_same_results_directory_refuses_to_start(monkeypatch, tmp_path):
    """Two runs in one checkout: while one holds results/ (here a separate process), a second
    refuses before any work instead of both rewriting the same result files."""
    results = tmp_path / "results"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from speedbench.run import suite; "
                               "from speedbench.results.tree import ResultsTree; "
                               f"lock = ResultsTree(Path({str(results)!r})).lock().__enter__(); "
                               "print('locked', flush=True); "
                               "sys.stdin.read()"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        ran = []
        monkeypatch.setattr(suite, "_run", lambda *a, **k: ran.append(1) or "ran")
        options = suite.RunOptions(results_dir=results, allow_dirty=True)
        with pytest.raises(suite.SuiteError, match="another speedlib run is writing to .*: wait for it to finish"):
            suite.run(options, root=ROOT)
        assert ran == []
    finally:
        holder.communicate("", timeout=30)  # its stdin closes: it exits, and the lock goes with it
    assert suite.run(options, root=ROOT) == "ran" and ran == [1]
    assert suite.run(options, root=ROOT) == "ran"  # released after each run
    assert [p.name for p in results.iterdir()] == []  # the lock leaves no file behind


def test_a_directory_made_for_the_lock_goes_if_the_run_wrote_nothing(monkeypatch, tmp_path):
    def fails(*a, **k):
        raise suite.SuiteError("asv failed")

    monkeypatch.setattr(suite, "_run", fails)
    with pytest.raises(suite.SuiteError, match="asv failed"):
        suite.run(suite.RunOptions(results_dir=tmp_path / "new", allow_dirty=True), root=ROOT)
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(suite.SuiteError, match="asv failed"):
        suite.run(suite.RunOptions(results_dir=tmp_path / "kept", allow_dirty=True), root=ROOT)
    assert (tmp_path / "kept").is_dir()  # it was there before the run


def test_a_quick_run_takes_no_lock(monkeypatch, tmp_path):
    monkeypatch.setattr(suite, "_run", lambda *a, **k: "ran")
    monkeypatch.setattr(suite, "_locked", lambda d: pytest.fail("locked a results directory"))
    assert suite.run(suite.RunOptions(quick=True, results_dir=tmp_path / "r"), root=ROOT) == "ran"



def test_untracked_files_make_the_tree_dirty_and_commit_runs_check_the_harness(tiny_checkout, monkeypatch):
    monkeypatch.setattr(suite, "_run", lambda *a, **k: "ran")
    (tiny_checkout / "benchmarks" / "__pycache__").mkdir()
    (tiny_checkout / "benchmarks" / "__pycache__" / "bench_x.cpython-311.pyc").write_text("")  # not code
    assert suite.run(suite.RunOptions(), root=tiny_checkout) == "ran"
    (tiny_checkout / "benchmarks" / "bench_new.py").write_text("")  # untracked: it would run all the same
    for commits in (None, "HEAD"):  # --commits runs take the benchmarks from the checkout too
        untracked = r"uncommitted changes or untracked files .*\(benchmarks/bench_new.py\)"
        with pytest.raises(suite.SuiteError, match=untracked):
            suite.run(suite.RunOptions(commits=commits), root=tiny_checkout)
    (tiny_checkout / "benchmarks" / "bench_new.py").unlink()
    (tiny_checkout / "speedlib" / "extra.py").write_text("")
    with pytest.raises(suite.SuiteError, match="speedlib/extra.py"):
        suite.run(suite.RunOptions(), root=tiny_checkout)  # filed under HEAD, which lacks it
    assert suite.run(suite.RunOptions(commits="HEAD"), root=tiny_checkout) == "ran"  # the library comes from HEAD


def test_a_killed_runs_worktree_and_scratch_are_pruned_by_the_next_run(tiny_checkout, tmp_path, monkeypatch):
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid whose process has ended, as after a SIGKILL
    stale = scratch_root / "speedlib-0123abcd-x"
    stale.mkdir()
    subprocess.run(["git", "worktree", "add", "--detach", str(stale / "tree"), "HEAD"], cwd=tiny_checkout,
                   check=True, capture_output=True)
    (stale / "owner.pid").write_text(str(gone.pid))
    (scratch_root / "speedlib-run-stale").mkdir()
    (scratch_root / "speedlib-run-stale" / "owner.pid").write_text(str(gone.pid))
    live = scratch_root / "speedlib-run-live"  # a run still going
    live.mkdir()
    (live / "owner.pid").write_text(str(os.getpid()))
    unknown = scratch_root / "speedlib-run-unknown"  # no owner: not known to be a run's
    unknown.mkdir()
    monkeypatch.setattr(suite, "_run", lambda *a, **k: "ran")
    assert suite.run(suite.RunOptions(), root=tiny_checkout) == "ran"
    assert sorted(p.name for p in scratch_root.iterdir()) == ["speedlib-run-live", "speedlib-run-unknown"]
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=tiny_checkout, capture_output=True, text=True).stdout
    assert "speedlib-0123abcd" not in worktrees


@pytest.mark.parametrize("existed", [True, False])
def test_an_interrupted_asv_leaves_the_listing_as_it_was(tmp_path, monkeypatch, existed):
    """asv rewrites results/benchmarks.json first thing; stopped there, the run puts back the
    listing that the results already on disk were filed against (or none, if there was none)."""
    listing = tmp_path / "benchmarks.json"
    if existed:
        listing.write_text('{"version": 2, "bench_a.A.track_x": {}}')

    def interrupted_asv(*args, **kwargs):
        listing.write_text('{"version": 2, "bench_b.B.tr')  # torn mid-write
        raise suite.Interrupted(signal.SIGTERM)

    monkeypatch.setattr(suite, "_asv", interrupted_asv)
    head = suite.resolve_commits(ROOT, None)[0]
    with pytest.raises(suite.Interrupted):
        suite._run_commit(suite.RunOptions(), ROOT, tmp_path / "asv.conf.json", tmp_path, "m", {}, [], head,
                          "[1/1]", [])
    if existed:
        assert listing.read_text() == '{"version": 2, "bench_a.A.track_x": {}}'
    else:
        assert not listing.exists()
    assert not list(tmp_path.glob("*.restoring"))



def test_the_forkserver_imports_the_whole_suite_without_torch():
    """asv's forkserver imports every benchmark module once and forks each benchmark from
    that process; CUDA cannot be used in a child forked after it was initialised, so
    importing the suite must not import torch (it would also tax every forked child)."""
    script = """
import importlib, pkgutil, sys
import benchmarks
names = [m.name for m in pkgutil.iter_modules(benchmarks.__path__)]
for name in names:
    importlib.import_module(f"benchmarks.{name}")
assert "bench_amp" in names and "common" in names, names
print(sorted(m for m in ("torch", "speedlib", "pandas") if m in sys.modules))
"""
    env = {k: v for k, v in os.environ.items() if k != "SPEEDLIB_DEVICE"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch" not in done.stdout
    assert plan.LAUNCH_METHOD == "forkserver"


def test_a_chunk_is_priced_at_the_worst_known_never_cut_and_never_free(tmp_path):
    """Issue 50: the H100's spawn-era headline-amp (103 s) was cut for today's cheaper reporting
    processes, counted as they are now (more than then), to 40 s, and its headline-transfer to 0:
    a measured time is taken as it was measured, the longest of a chunk's runs here counts, and
    no price is ever below one class start."""
    chunk = Chunk("c", "", r"^(?:a\.B\.)")
    names = {"a.B.track_x": [f"a.B.track_x({i})" for i in range(300)]}
    path = ResultsTree(tmp_path).machine("m").chunk_times
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"chunk": "c", "commit": SHA, "seconds": 24.4}) + "\n")  # spawn, 300 processes
    seconds, source = plan.chunk_cost(chunk, names, tmp_path, "m")
    assert seconds == 24.4 and "under spawn" in source
    plan.record_chunk_time(tmp_path, "m", "c", SHA, 80.0)
    plan.record_chunk_time(tmp_path, "m", "c", SHA, 60.0)  # a faster run later: the slower one still bounds it
    assert json.loads(path.read_text().splitlines()[-1])["launch"] == plan.LAUNCH_METHOD
    assert plan.chunk_cost(chunk, names, tmp_path, "m") == (80.0, "the longest measured run here")
    plan.record_chunk_time(tmp_path, "m", "z", SHA, 0.0)
    assert plan.chunk_cost(Chunk("z", "", "^$"), names, tmp_path, "m")[0] == plan.SECONDS_PER_CLASS
    assert plan.chunk_cost(Chunk("new", "", "^nothing"), {}, tmp_path, "m")[0] == plan.SECONDS_PER_CLASS
