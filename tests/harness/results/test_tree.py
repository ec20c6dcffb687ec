"""speedbench.results.tree: the one owner of the paths under a results root, its lock, the
writable check, the chunk times, the markers a stopped run or merge leaves, and archives."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from speedbench.cli import parser as cli
from speedbench.results import safekeep, synthetic
from speedbench.results.load import load_results
from speedbench.results.tree import ResultsError, ResultsTree, TreeBusy, archive_path, check_writable

ROOT = Path(__file__).resolve().parents[3]
SHA = "0123456789abcdef" * 2 + "01234567"


def _synthetic(root: Path) -> tuple[ResultsTree, str, str]:
    """A synthetic tree; with one of its machines and one of its commits."""
    files = synthetic.write_results(root, commits=2, machines=2)
    data = json.loads(files[0].read_text())
    return ResultsTree(root), files[0].parent.name, data["commit_hash"]


def test_the_paths_the_tree_names_are_where_a_tree_keeps_its_files(tmp_path):
    """What the loader reads (the listing, machine file, result files, environment records) is
    where the tree says, and the result files of one commit are that commit's only."""
    tree, machine, sha = _synthetic(tmp_path)
    m = tree.machine(machine)
    assert tree.benchmarks.is_file() and m.machine_file.is_file()
    assert m.environment_record(sha).is_file() and m.environment_record(sha) in m.environment_records()
    assert [json.loads(f.read_text())["commit_hash"] for f in m.result_files(sha)] == [sha]
    assert m.result_files("f" * 40) == []
    loaded = load_results(tmp_path)
    assert not loaded.problems and set(loaded.measured["machine"]) >= {machine}
    # speedlib's own files never read as asv results: not *.json in the machine directory
    for path in (m.chunk_times, m.displaced, m.environment_record(sha), m.verdict(sha)):
        assert path.suffix != ".json" or path.parent != m.path
    assert m.verdict(sha).parent == m.gpu_tests_dir and m.verdict(sha).stem == sha[:8]


def test_a_checkout_or_an_unpacked_archive_is_found_by_its_results_directory(tmp_path):
    assert ResultsTree.found_in(tmp_path).root == tmp_path  # no results/ in it: taken as a tree
    (tmp_path / "results").mkdir()
    assert ResultsTree.found_in(tmp_path) == ResultsTree.in_checkout(tmp_path) == ResultsTree(tmp_path / "results")
    (tmp_path / "results" / "benchmarks.json").write_text("{}")
    assert ResultsTree.found_in(tmp_path / "results").root == tmp_path / "results"  # a tree itself
    # a tree that holds a machine named `results` is no checkout
    (tmp_path / "benchmarks.json").write_text("{}")
    assert ResultsTree.found_in(tmp_path).root == tmp_path


def test_an_archive_unpacks_to_the_paths_it_was_packed_from(tmp_path):
    tree, machine, sha = _synthetic(tmp_path / "tree")
    m = tree.machine(machine)
    m.record_chunk_time({"chunk": "c", "commit": sha, "seconds": 1.0})
    dest = m.pack_run([sha], tmp_path / "out" / "run.tar.gz")
    with tarfile.open(dest) as tar:
        names = [member.name for member in tar]
    packed = sorted(archive_path(n) for n in names)
    expected = [tree.benchmarks, m.machine_file, m.chunk_times, m.environment_record(sha), *m.result_files(sha)]
    assert packed == sorted(str(p.relative_to(tree.root)) for p in expected)
    assert archive_path("results") == archive_path(".") == "" and archive_path("elsewhere/x.json") is None


def test_nothing_to_pack_is_one_line_that_names_what_is_missing(tmp_path):
    with pytest.raises(ResultsError, match="nothing to pack for m in .*: missing") as refused:
        ResultsTree(tmp_path).machine("m").pack_run([SHA], tmp_path / "x.tar.gz")
    assert "\n" not in str(refused.value) and not (tmp_path / "x.tar.gz").exists()


_HOLD = ("import sys; from pathlib import Path; from speedbench.results.tree import ResultsTree; "
         "lock = ResultsTree(Path(sys.argv[1])).lock().__enter__(); print('locked', flush=True); sys.stdin.read()")


def _holder(results: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(results)], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert holder.stdout.readline().strip() == "locked"
    return holder


@pytest.mark.skipif(sys.platform == "win32", reason="the lock is flock, POSIX only")
def test_the_lock_refuses_a_second_holder_in_another_process_and_is_released_with_it(tmp_path):
    results = tmp_path / "results"
    holder = _holder(results)
    try:
        with pytest.raises(TreeBusy, match=f"another speedlib run is writing to {results}: wait for it"):
            with ResultsTree(results).lock():
                pytest.fail("locked twice")
    finally:
        holder.communicate("", timeout=30)
    with ResultsTree(results).lock():  # released when its holder exited
        pass
    assert results.is_dir()  # there before this lock: kept
    fresh = tmp_path / "fresh"
    with ResultsTree(fresh).lock():
        assert fresh.is_dir()
    assert not fresh.exists()  # made only to be locked, and left empty


@pytest.mark.skipif(sys.platform == "win32", reason="the lock is flock, POSIX only")
def test_a_merge_into_a_tree_another_process_holds_is_refused_with_exit_2(tmp_path, capsys):
    """The merge takes the same lock as `speedlib run`, and says so in one line."""
    _synthetic(tmp_path / "source")
    into = tmp_path / "into"
    into.mkdir()
    holder = _holder(into)
    try:
        assert cli.main(["merge", str(tmp_path / "source"), "--into", str(into)]) == 2
    finally:
        holder.communicate("", timeout=30)
    err = capsys.readouterr().err
    assert err == (f"speedlib merge: another speedlib run is writing to {into}: wait for it to finish, or give this "
                   "one its own --results-dir\n")
    assert list(into.iterdir()) == []
    assert cli.main(["merge", str(tmp_path / "source"), "--into", str(into)]) == 0


def test_the_writable_check_names_what_is_in_the_way(tmp_path):
    check_writable(tmp_path / "new" / "deeper", "the results directory", "give another")
    assert not (tmp_path / "new").exists()  # checked, not made
    (tmp_path / "file").write_text("")
    with pytest.raises(ResultsError) as refused:
        ResultsTree(tmp_path / "file" / "results").check_writable("--results-dir x", "give the run another")
    assert str(refused.value) == (f"--results-dir x cannot be written: {tmp_path / 'file'} is not a directory; "
                                  "give the run another")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]  # the probe file is gone


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a directory whatever its mode")
def test_the_writable_check_refuses_a_read_only_directory(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(ResultsError, match=f"x cannot be written: {ro} is read-only for this user; instead"):
            check_writable(ro / "results", "x", "instead")
    finally:
        ro.chmod(0o755)


def _access_as_owner(path, mode, **kwargs) -> bool:
    """os.access as the owner of `path` is answered, by its mode bits: root's answer ignores them."""
    bits = os.stat(path).st_mode
    return all(bits & b for m, b in ((os.R_OK, stat.S_IRUSR), (os.W_OK, stat.S_IWUSR), (os.X_OK, stat.S_IXUSR))
               if mode & m)


@pytest.mark.parametrize("mode, why", [
    (0o555, "is read-only for this user"),
    (0o666, "cannot be entered (no execute permission) by this user"),
    (0o000, "cannot be entered or written (no execute or write permission) by this user"),
])
@pytest.mark.parametrize("below", ["", "results/deeper"])
def test_the_writable_check_names_the_permission_that_is_missing(tmp_path, monkeypatch, mode, why, below):
    """A directory without x was once called read-only: it cannot even be entered. Asked for a
    path below it, the check once stopped with a traceback (stat refuses what lies inside)."""
    locked = tmp_path / "locked"
    if os.geteuid() == 0:  # root passes every mode check: a user's answers stand in for its own
        real_stat = os.stat

        def stat_as_owner(path, *args, **kwargs):
            inside = isinstance(path, (str, os.PathLike)) and locked in Path(path).parents
            if inside and not real_stat(locked).st_mode & 0o100:
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real_stat(path, *args, **kwargs)

        monkeypatch.setattr(os, "access", _access_as_owner)
        monkeypatch.setattr(os, "stat", stat_as_owner)
    locked.mkdir()
    locked.chmod(mode)
    try:
        with pytest.raises(ResultsError) as refused:
            check_writable(locked / below, "x", "instead")
    finally:
        locked.chmod(0o755)
    assert str(refused.value) == f"x cannot be written: {locked} {why}; instead"


def test_chunk_times_round_trip_a_line_at_a_time(tmp_path):
    m = ResultsTree(tmp_path).machine("m")
    assert m.chunk_time_lines() == []
    m.chunk_times.parent.mkdir(parents=True)
    m.chunk_times.write_bytes(b'{"chunk": "a", "seco\n\n')  # torn by a killed run, then a blank line
    entries = [{"chunk": "b", "commit": SHA, "seconds": 1.5}, {"chunk": "c", "commit": SHA, "seconds": 2.0}]
    for entry in entries:
        m.record_chunk_time(entry)
    lines = m.chunk_time_lines()
    assert lines[0] == b'{"chunk": "a", "seco' and [json.loads(line) for line in lines[1:]] == entries


def test_a_killed_runs_snapshot_is_a_marker_until_it_is_settled(tmp_path):
    tree, machine, sha = _synthetic(tmp_path)
    assert tree.left_by_killed_run() is None
    snapshot = safekeep.take(tmp_path, machine, sha)
    assert tree.left_by_killed_run() == tree.snapshot == snapshot.directory
    assert any("a speedlib run was killed" in p.reason for p in load_results(tmp_path).problems)
    safekeep.settle(snapshot, failed=False)
    assert tree.left_by_killed_run() is None and not tree.snapshot.exists()


def test_staged_files_are_a_marker_until_their_renames_are_finished(tmp_path):
    tree = ResultsTree(tmp_path)
    assert tree.finish_staged() is None and tree.left_by_stopped_merge() is None
    tree.stage([("m/a.jsonl", b"a\n"), ("benchmarks.json", b"{}")])
    assert tree.left_by_stopped_merge() == tree.merge_staging
    assert not (tmp_path / "m").exists()  # nothing in place before the renames
    assert tree.finish_staged() == 2
    assert (tmp_path / "m" / "a.jsonl").read_bytes() == b"a\n" and tree.benchmarks.read_bytes() == b"{}"
    assert tree.left_by_stopped_merge() is None and not tree.merge_staging.exists()


def test_files_staged_before_the_journal_are_dropped_not_renamed(tmp_path):
    tree = ResultsTree(tmp_path)
    tree.merge_staging.mkdir()
    (tree.merge_staging / "0.new").write_bytes(b"half a merge")
    assert tree.left_by_stopped_merge() is None  # no journal: the tree was never touched
    assert tree.finish_staged() is None
    assert list(tmp_path.iterdir()) == []


def test_a_stage_that_fails_leaves_no_staging(tmp_path, monkeypatch):
    tree = ResultsTree(tmp_path)

    def full(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        tree.stage([("benchmarks.json", b"{}")])
    assert list(tmp_path.iterdir()) == []


def test_the_parser_loads_neither_pandas_nor_torch():
    """`speedlib --help` builds `speedlib merge`'s and `speedlib slurm`'s parsers, which import
    the tree: it stays stdlib only."""
    code = ("import sys; from speedbench.cli import parser; parser.build_parser(); "
            "print(sorted(m for m in ('pandas', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
