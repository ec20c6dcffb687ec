"""A results tree that is not what `speedlib run` left (issue 42): a file asv rewrites replaced
by a link out of the tree, a machine directory that is a file, a root this user cannot read.
`speedlib run`, `report` and `merge` each say so in one line, before anything is written.
(A merge into such a tree: tests/harness/results/test_merge_hostile.py.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from speedbench.cli import parser as cli
from speedbench.results import safekeep, synthetic
from speedbench.results.load import load_results
from speedbench.results.tree import ResultsTree
from speedbench.run import suite

ROOT = Path(__file__).resolve().parents[3]
MACHINE = "synthetic-h100"


def _tree(root: Path) -> tuple[Path, str, Path]:
    """A synthetic tree of one machine and commit: (root, the commit, its result file)."""
    result = synthetic.write_results(root, commits=1, machines=1)[0]
    return root, json.loads(result.read_text())["commit_hash"], result


# --- a link where asv writes ----------------------------------------------------------------

@pytest.mark.parametrize("which", ["benchmarks.json", "machine.json", "result file", "environment record",
                                   "environment directory", "chunk times", "machine directory"])
def test_a_link_where_the_run_writes_refuses_it_before_asv(tmp_path, monkeypatch, which):
    """asv truncates its listing, machine file and a commit's result file and writes them in
    place: through a link (a tree copied from another host) it rewrote a file outside the tree.
    The run's own files beside them are refused as links too."""
    root, sha, result = _tree(tmp_path / "results")
    machine = ResultsTree(root).machine(MACHINE)
    machine.record_chunk_time({"chunk": "x", "commit": sha, "seconds": 1.0})
    victim = {"benchmarks.json": root / "benchmarks.json", "machine.json": machine.machine_file,
              "result file": result, "environment record": machine.environment_record(sha),
              "environment directory": machine.environment_dir, "chunk times": machine.chunk_times,
              "machine directory": machine.path}[which]
    outside = tmp_path / "outside"
    victim.rename(outside)
    victim.symlink_to(outside)
    asv_ran = []

    def asv_writes_in_place(args, **kw):  # as asv 0.6 does: open("w") follows the link
        asv_ran.append(args)
        for path in (root / "benchmarks.json", root / MACHINE / "machine.json", result):
            with open(path, "w") as f:
                f.write("{}")
        return 0

    monkeypatch.setattr(suite, "_asv", asv_writes_in_place)
    before = {p: p.read_bytes() for p in [outside, *outside.rglob("*")] if p.is_file()}
    with pytest.raises(suite.SuiteError) as refused:
        suite._asv_keeping_results(["run"], {}, ROOT, root, MACHINE, sha)
    assert str(refused.value) == (f"{victim} is a link (to {outside}), and the run would write through it: put what "
                                  "it links to there instead, or remove the link; nothing was run or changed")
    assert asv_ran == [] and victim.is_symlink()
    assert before == {p: p.read_bytes() for p in [outside, *outside.rglob("*")] if p.is_file()}
    assert not ResultsTree(root).snapshot.exists()


# --- a machine directory that is a file -----------------------------------------------------

def test_a_machine_directory_that_is_a_file_is_one_line_for_run_and_report(tmp_path, capsys):
    root, _, _ = _tree(tmp_path / "results")
    (root / "cpu-2core").write_text("not a directory")
    here = {"machine": "cpu-2core", "cpu_model": "Intel(R) Xeon(R) Processor", "gpu_model": None, "gpu_count": 0,
            "torch": "2.14.1+cu130", "cuda": "13.0"}
    with pytest.raises(suite.SuiteError) as refused:  # before the pre-flight check and asv (asv's traceback)
        suite._check_machine(suite.RunOptions(machine="cpu-2core", results_dir=root), ROOT, here)
    assert str(refused.value) == (f"{root}/cpu-2core is a file, not a machine directory: move it away, or run with "
                                  "--machine NEWNAME")
    capsys.readouterr()
    assert cli.main(["report", "--results", str(root), "--machine", "cpu-2core"]) == 1
    assert capsys.readouterr().err == ("speedlib report: no measured results for machine cpu-2core; the results hold "
                                       f"{MACHINE}\n")


# --- a root this user cannot read -----------------------------------------------------------

@pytest.fixture
def unreadable(tmp_path):
    root, _, _ = _tree(tmp_path / "results")
    root.chmod(0)
    try:
        try:
            os.listdir(root)
        except PermissionError:
            yield root
        else:
            pytest.skip("this user reads a directory of mode 000 (root, or CAP_DAC_OVERRIDE): run as another user, "
                        "or under `setpriv --bounding-set=-dac_override,-dac_read_search`")
    finally:
        root.chmod(0o755)


def test_an_unreadable_results_root_is_one_line_for_report_merge_and_run(unreadable, tmp_path, capsys):
    capsys.readouterr()
    assert cli.main(["report", "--results", str(unreadable)]) == 1  # was a PermissionError on the snapshot journal
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"problem: {unreadable}/benchmarks.json: unreadable (Permission denied), so no result file "
                      "was read; check the results directory's permissions"), err
    assert cli.main(["merge", str(unreadable), "--into", str(tmp_path / "into")]) == 2
    assert capsys.readouterr().err == (f"speedlib merge: cannot read {unreadable} (Permission denied); "
                                       "nothing was written\n")
    source, _, _ = _tree(tmp_path / "source")
    assert cli.main(["merge", str(source), "--into", str(unreadable)]) == 2
    assert capsys.readouterr().err == (f"speedlib merge: cannot use {unreadable} for results (Permission denied): "
                                       "give the run another with --results-dir\n")
    assert cli.main(["run", "--plan", "--results-dir", str(unreadable), "--machine", "m"]) == 2
    assert capsys.readouterr().err == (f"speedlib run: {unreadable}/benchmarks.json cannot be examined (Permission "
                                       f"denied): check the permissions of {unreadable}\n")


def test_a_tree_that_cannot_be_examined_shows_no_stopped_run_and_loads_without_a_traceback(tmp_path, monkeypatch):
    """What the unreadable root above gives, for a user (root) whom the mode does not stop: the
    markers of a stopped run or merge are looked for under the root first thing."""
    root, _, _ = _tree(tmp_path / "results")
    real = Path.is_file

    def denied(self):
        if ResultsTree(root).snapshot in (self, *self.parents) or ResultsTree(root).merge_staging in self.parents:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "is_file", denied)
    tree = ResultsTree(root)
    assert tree.left_by_killed_run() is None and tree.left_by_stopped_merge() is None
    assert not load_results(root).problems


def test_a_machine_directory_linked_elsewhere_in_the_tree_is_still_run(tmp_path):
    """The loader reads such a link as another name for the directory: nothing leaves the tree."""
    root, sha, _ = _tree(tmp_path / "results")
    (root / "alias").symlink_to(MACHINE)
    snapshot = safekeep.take(root, "alias", sha)
    assert set(snapshot.before) == {"benchmarks.json", "alias/machine.json",
                                    f"alias/{sha[:8]}-existing-py_usr_bin_python3.json"}
    safekeep.settle(snapshot, failed=False)


def test_a_planted_snapshot_journal_that_reaches_out_through_a_link_is_refused(tmp_path):
    """The copy a killed run leaves puts back or removes what its journal names: through a
    machine directory linked out of the tree, that was a file anywhere."""
    root, sha, _ = _tree(tmp_path / "results")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "torn.json").write_text("{")  # what a settle removes as torn, made by asv in the run
    (root / "m").symlink_to(outside)
    snapshot = ResultsTree(root).snapshot
    snapshot.mkdir()
    (snapshot / "journal").write_text(json.dumps({"commit": sha, "patterns": ["m/*.json"], "before": {}}))
    with pytest.raises(suite.SuiteError) as refused:
        suite._recover(root)  # what `speedlib run` does first, under the lock
    assert str(refused.value) == (f"{snapshot} holds a copy of asv's files whose journal cannot be read: compare "
                                  f"{root} with it, then remove it")
    assert (outside / "torn.json").read_text() == "{"
