"""`speedlib merge` and benchmarks.json, and the per-commit gpu-tests side file.

The listing follows the newest run merged, as asv rewrites it on every run; results of other
versions stay and are marked by the loader. Trees are speedbench.results.synthetic's: an "old" run of
commit 0 on two machines, and a "new" run of commit 1 a day later whose listing changed one
benchmark's version, dropped one and added one.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from speedbench.cli import parser as cli
from speedbench.results import merge, synthetic
from speedbench.results.load import load_results

CHANGED, REMOVED, KEPT = synthetic.BENCHMARKS
ADDED = "bench_contiguous.AdamBandwidth.track_new_thing"
NEW_VERSION = "b" * 64
MACHINE, OTHER = "synthetic-h100", "synthetic-h200"
VERDICT = "gpu-tests/1a2b3c4d.json"


def _rows(root: Path):
    """(result file path, its object) of every result file under `root`."""
    for path in sorted(root.glob("*/*-existing-*.json")):
        yield path, json.loads(path.read_text())


def _column(obj: dict, name: str) -> int:
    return obj["result_columns"].index(name)


def _old(root: Path) -> Path:
    synthetic.write_results(root, commits=1, machines=2)
    return root


def _new(root: Path) -> Path:
    """Commit 1 on MACHINE, run with benchmarks whose listing changed since the old run."""
    synthetic.write_results(root, commits=2, machines=1)
    first = synthetic._sha("commit 0")[:8]
    for path in [*root.glob(f"*/{first}-*.json"), *root.glob(f"*/environment/{first}.jsonl")]:
        path.unlink()
    listing = json.loads((root / "benchmarks.json").read_text())
    listing[CHANGED] = dict(listing[CHANGED], version=NEW_VERSION)
    listing[ADDED] = dict(listing[KEPT], name=ADDED)
    del listing[REMOVED]
    (root / "benchmarks.json").write_text(json.dumps(listing, indent=2, sort_keys=True))
    for path, obj in _rows(root):
        obj["results"][CHANGED][_column(obj, "version")] = NEW_VERSION
        obj["results"][ADDED] = obj["results"].pop(REMOVED)
        path.write_text(json.dumps(obj))
    return root


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _run(*args) -> int:
    return cli.main(["merge", *map(str, args)])


def _listing(root: Path) -> dict:
    return json.loads((root / "benchmarks.json").read_text())


def _refused(first: Path, second: Path, into: Path, capsys) -> str:
    """Merge `first` into `into`, then `second`: refused with one conflict, nothing written; its line."""
    assert _run(first, "--into", into) == 0
    before = _snapshot(into)
    capsys.readouterr()
    assert _run(second, "--into", into) == merge.CONFLICTS
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "conflict:" in x]
    assert _snapshot(into) == before
    return line


def test_a_newer_runs_listing_merges_without_conflict_and_wins(tmp_path, capsys):
    old, new = _old(tmp_path / "old"), _new(tmp_path / "new")
    old_listing, new_listing = _listing(old), _listing(new)
    into = tmp_path / "results"
    assert _run(old, "--into", into) == 0
    capsys.readouterr()
    assert _run(new, "--into", into) == 0
    out = capsys.readouterr().out
    assert f"benchmarks.json follows the newer listing of {new}" in out
    assert "1 entr(y/ies) replaced, 1 added, 1 kept from the older listing only" in out
    listing = _listing(into)
    assert listing[CHANGED] == new_listing[CHANGED] and listing[ADDED] == new_listing[ADDED]
    assert listing[REMOVED] == old_listing[REMOVED]  # only in the old listing: kept for its results
    assert not (into / merge.DISPLACED).exists()  # a replaced listing entry is no loss
    loaded = load_results(into)
    assert not [p for p in loaded.problems if p.kind == "removed"]
    rows = loaded.measured
    # the old results of the changed benchmark stay, marked as today: set aside where the
    # machine has the new version, kept and flagged where it has nothing newer
    old_changed = loaded.not_measured[(loaded.not_measured["benchmark"] == CHANGED)]
    assert set(old_changed["machine"]) == {MACHINE} and set(old_changed["status"]) == {"outdated"}
    other = rows[(rows["machine"] == OTHER) & (rows["benchmark"] == CHANGED)]
    assert len(other) and other["earlier_version"].all()
    mine = rows[(rows["machine"] == MACHINE) & (rows["benchmark"] == CHANGED)]
    assert len(mine) and not mine["earlier_version"].any() and set(mine["version"]) == {NEW_VERSION}
    assert set(rows[rows["benchmark"] == REMOVED]["machine"]) == {MACHINE, OTHER}


def test_an_older_runs_listing_merged_after_a_newer_one_does_not_replace_it(tmp_path, capsys):
    old, new = _old(tmp_path / "old"), _new(tmp_path / "new")
    first, second = tmp_path / "old-then-new", tmp_path / "new-then-old"
    assert _run(old, new, "--into", first) == 0
    assert _run(new, "--into", second) == 0
    capsys.readouterr()
    assert _run(old, "--into", second) == 0
    out = capsys.readouterr().out
    assert f"benchmarks.json: 1 entr(y/ies) added from the older listing of {old}" in out
    assert _listing(second)[CHANGED]["version"] == NEW_VERSION
    assert _listing(second)[REMOVED] == _listing(old)[REMOVED]
    assert _snapshot(second)["benchmarks.json"] == _snapshot(first)["benchmarks.json"]  # the order does not matter


def test_a_listing_whose_results_ran_at_the_same_time_leaves_the_one_there(tmp_path):
    new = _new(tmp_path / "new")
    into = tmp_path / "results"
    assert _run(new, "--into", into) == 0
    listing = json.loads((new / "benchmarks.json").read_text())
    listing[KEPT] = dict(listing[KEPT], unit="other")  # the same run's listing, told otherwise
    (new / "benchmarks.json").write_text(json.dumps(listing))
    before = _snapshot(into)
    assert _run(new, "--into", into) == 0  # a tie: the listing already there stays
    assert _snapshot(into) == before


def test_one_benchmark_version_commit_and_environment_with_other_values_is_still_a_conflict(tmp_path, capsys):
    new = _new(tmp_path / "new")
    again = _new(tmp_path / "again")
    (path, obj), = _rows(again)
    row = obj["results"][CHANGED]
    row[0] = [v * 2 for v in row[0]]
    row[_column(obj, "started_at")] += 60_000
    path.write_text(json.dumps(obj))
    line = _refused(new, again, tmp_path / "results", capsys)
    assert CHANGED in line and f"version {NEW_VERSION[:12]}" in line


def test_two_versions_of_a_benchmark_in_one_result_file_keep_the_later_run(tmp_path, capsys):
    """Commit 0 measured again after the benchmark's code changed: not a double measurement.
    asv's file holds one row per benchmark: the later run's stays, the other is displaced."""
    old = _old(tmp_path / "old")
    rerun = _old(tmp_path / "rerun")
    for path, obj in _rows(rerun):
        row = obj["results"][CHANGED]
        row[_column(obj, "version")] = NEW_VERSION
        row[_column(obj, "started_at")] += 86_400_000
        path.write_text(json.dumps(obj))
    into = tmp_path / "results"
    assert _run(old, "--into", into) == 0
    first_row = next(obj for path, obj in _rows(into) if path.parent.name == MACHINE)["results"][CHANGED]
    capsys.readouterr()
    assert _run(rerun, "--into", into) == 0  # no --prefer needed
    out = capsys.readouterr().out
    assert f"{CHANGED} from {into}" in out and "of another version of the benchmark" in out
    merged = next(obj for path, obj in _rows(into) if path.parent.name == MACHINE)
    assert merged["results"][CHANGED][_column(merged, "version")] == NEW_VERSION
    side = [json.loads(x) for x in (into / MACHINE / merge.DISPLACED).read_text().splitlines()]
    assert [s["row"] for s in side if s["benchmark"] == CHANGED] == [first_row]
    before = _snapshot(into)
    assert _run(old, rerun, "--into", into) == 0  # displaced again: no new line
    assert _snapshot(into) == before


# --- gpu-tests/<commit8>.json ------------------------------------------------------------------

def _verdict(root: Path, started_at: int, failed: list[str]) -> dict:
    # the slot's own format (speedbench/run/slot.py), which the loader checks
    verdict = {"commit": "1a2b3c4d" * 5, "machine": MACHINE, "started_at": started_at, "duration_s": 43.0,
               "passed": 140, "failed": len(failed), "skipped": 3, "errors": 0, "failures": failed,
               "command": "pytest -m gpu", "exit_status": 1 if failed else 0, "finished": True,
               "torch": "2.11.0+cu130", "gpu": "NVIDIA H200"}
    path = root / MACHINE / VERDICT
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(verdict, indent=1))
    return verdict


def _pack(tree: Path, dest: Path, extra: tarfile.TarInfo | None = None, data: bytes = b"") -> Path:
    """`tree` as an archive laid out as `speedlib run --archive` writes it, with `extra` added."""
    with tarfile.open(dest, "w:gz") as tar:
        for path in sorted(tree.rglob("*")):
            tar.add(path, arcname=f"results/{path.relative_to(tree)}", recursive=False)
        if extra is not None:
            extra.size = len(data)
            tar.addfile(extra, io.BytesIO(data))
    return dest


def test_a_gpu_tests_file_is_added_whole_and_an_identical_one_changes_nothing(tmp_path, capsys):
    tree = _old(tmp_path / "old")
    _verdict(tree, 1_790_000_000_000, [])
    archive = _pack(tree, tmp_path / "old.tar.gz")
    into = tmp_path / "results"
    assert _run(archive, "--into", into) == 0
    assert f"added {MACHINE}/{VERDICT} from {archive}" in capsys.readouterr().out
    assert (into / MACHINE / VERDICT).read_bytes() == (tree / MACHINE / VERDICT).read_bytes()
    assert not [p for p in load_results(into).problems if "gpu-tests" in p.path]
    before = _snapshot(into)
    assert _run(archive, tree, into, "--into", into) == 0
    assert _snapshot(into) == before
    assert "nothing changed" in capsys.readouterr().out


def test_a_slot_archive_holding_only_its_verdict_merges(tmp_path, capsys):
    """Issue 50: a slot whose chunks all failed or ran out of time still archived its GPU tests;
    merge refused it ("holds no asv result file") and the verdict was lost."""
    alone = tmp_path / "alone"
    verdict = _verdict(alone, 1_790_000_000_000, ["tests/test_x.py::test_gpu"])
    archive = _pack(alone, tmp_path / "slot.tar.gz")
    into = _old(tmp_path / "results")
    assert _run(archive, "--into", into) == 0, capsys.readouterr().err
    assert f"added {MACHINE}/{VERDICT} from {archive}" in capsys.readouterr().out
    assert json.loads((into / MACHINE / VERDICT).read_text()) == verdict
    assert not [p for p in load_results(into).problems if "gpu-tests" in p.path]
    (tmp_path / "empty").mkdir()
    assert _run(tmp_path / "empty", "--into", into) == merge.BAD_INPUT
    assert "holds no asv result file (<machine>/<commit>-<env>.json) and no GPU test verdict" in capsys.readouterr().err


def test_a_slot_rehearsed_without_a_gpu_merges_only_when_asked(tmp_path, capsys):
    """Issue 50: the rehearsal of a GPU slot on a CPU host added a result file to a committed CPU
    machine and replaced its listing. Its verdict says it was a rehearsal (`rehearsal`, or, from
    before that was written, no GPU named): refused, nothing written, unless --rehearsal."""
    tree = _old(tmp_path / "old")
    verdict = _verdict(tree, 1_790_000_000_000, [])
    into = _old(tmp_path / "results")
    before = _snapshot(into)
    for flag in ({"rehearsal": True}, {"gpu": None}):
        (tree / MACHINE / VERDICT).write_text(json.dumps({**verdict, **flag}))
        archive = _pack(tree, tmp_path / "rehearsal.tar.gz")
        assert _run(archive, "--into", into) == merge.BAD_INPUT
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"is a slot rehearsed without a GPU ({MACHINE}/{VERDICT} says so)" in line and "--rehearsal" in line
        assert _snapshot(into) == before
    (tree / MACHINE / VERDICT).write_text(json.dumps({**verdict, "rehearsal": False}))  # a GPU host's own word
    assert _run(_pack(tree, tmp_path / "real.tar.gz"), "--into", tmp_path / "other") == 0
    (tree / MACHINE / VERDICT).write_text(json.dumps({**verdict, "rehearsal": True}))
    assert _run(_pack(tree, tmp_path / "kept.tar.gz"), "--into", into, "--rehearsal") == 0
    assert json.loads((into / MACHINE / VERDICT).read_text())["rehearsal"] is True
    (tree / MACHINE / VERDICT).write_text(json.dumps({**verdict, "rehearsal": "yes"}))
    assert _run(tree, "--into", tmp_path / "third") == merge.BAD_INPUT  # not a verdict the loader takes


def test_a_gpu_tests_file_with_other_contents_is_a_conflict_then_the_later_wins(tmp_path, capsys):
    first, second = _old(tmp_path / "first"), _old(tmp_path / "second")
    older = _verdict(first, 1_790_000_000_000, [])
    _verdict(second, 1_790_000_600_000, ["tests/test_amp.py::test_x[device]"])
    into = tmp_path / "results"
    line = _refused(first, second, into, capsys)
    assert f"{MACHINE}/{VERDICT}" in line and line.count("started 2026") == 2

    assert _run(second, "--into", into, "--prefer", "newer") == 0
    assert f"displaced {MACHINE}/{VERDICT} from {into}" in capsys.readouterr().out
    assert (into / MACHINE / VERDICT).read_bytes() == (second / MACHINE / VERDICT).read_bytes()
    side = [json.loads(x) for x in (into / MACHINE / merge.DISPLACED).read_text().splitlines()]
    assert side == [{"file": VERDICT, "entry": older, "source": "results"}]
    after = _snapshot(into)
    assert _run(first, "--into", into, "--prefer", "newer") == 0  # the older loses again, written once
    assert _snapshot(into) == after


def test_prefer_newer_keeps_a_later_gpu_tests_file_already_there(tmp_path, capsys):
    first, second = _old(tmp_path / "first"), _old(tmp_path / "second")
    _verdict(first, 1_790_000_600_000, [])
    earlier = _verdict(second, 1_790_000_000_000, ["tests/test_amp.py::test_x[device]"])
    into = tmp_path / "results"
    assert _run(first, "--into", into) == 0
    assert _run(second, "--into", into, "--prefer", "newer") == 0
    assert (into / MACHINE / VERDICT).read_bytes() == (first / MACHINE / VERDICT).read_bytes()
    side = [json.loads(x) for x in (into / MACHINE / merge.DISPLACED).read_text().splitlines()]
    assert side == [{"file": VERDICT, "entry": earlier, "source": "second"}]


@pytest.mark.parametrize("kind", ["dotdot", "symlink", "not-an-object"])
def test_unsafe_or_bad_gpu_tests_members_are_refused(tmp_path, capsys, kind):
    tree = _old(tmp_path / "tree")
    name = "../../../evil.json" if kind == "dotdot" else "1a2b3c4d.json"
    member = tarfile.TarInfo(f"results/{MACHINE}/gpu-tests/{name}")
    if kind == "symlink":
        member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
    bad = _pack(tree, tmp_path / "bad.tar.gz", member, b"[1, 2]" if kind == "not-an-object" else b"")
    into = tmp_path / "results"
    assert _run(bad, "--into", into) == merge.BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing was written" in err[0]
    assert {"dotdot": "climbs out", "symlink": "is a link", "not-an-object": "is not a JSON object"}[kind] in err[0]
    assert not into.exists() and not (tmp_path / "evil.json").exists()


def test_a_linked_gpu_tests_file_in_a_tree_is_refused(tmp_path, capsys):
    tree = _old(tmp_path / "tree")
    (tmp_path / "elsewhere.json").write_text("{}")
    (tree / MACHINE / "gpu-tests").mkdir()
    os.symlink(tmp_path / "elsewhere.json", tree / MACHINE / VERDICT)
    into = tmp_path / "results"
    assert _run(tree, "--into", into) == merge.BAD_INPUT
    assert "is a link: refused" in capsys.readouterr().err
    assert not into.exists()


def test_merging_everything_twice_changes_nothing(tmp_path, capsys):
    old, new = _old(tmp_path / "old"), _new(tmp_path / "new")
    _verdict(new, 1_790_000_000_000, [])
    archive = _pack(new, tmp_path / "new.tar.gz")
    into = tmp_path / "results"
    assert _run(old, archive, "--into", into) == 0
    before = _snapshot(into)
    capsys.readouterr()
    assert _run(archive, old, "--into", into) == 0
    assert _run(old, archive, "--into", into, "--prefer", "newer") == 0
    assert _snapshot(into) == before
    assert capsys.readouterr().out.count("nothing changed") == 2
