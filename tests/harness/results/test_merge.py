"""`speedlib merge`: archives of one commit from several hosts end up in one results tree.

The archives are packed with `speedbench.run.suite.pack_results` from small trees written here,
each a copy of the H100 result file in results/ cut down to a few benchmarks: no asv run.
"""

from __future__ import annotations

import errno
import io
import json
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from speedbench.cli import parser as cli
from speedbench.results import merge
from speedbench.results import tree as results_tree
from speedbench.results.load import load_results
from speedbench.run import suite

ROOT = Path(__file__).resolve().parents[3]
REAL = ROOT / "results" / "h100-sxm-80gb"
SHA = "bdb0cb6dd5f8cec580cb5a8cfcd26521924e8024"
FILE = "bdb0cb6d-existing-py_opt_torch_.venv_bin_python3.json"
TEMPLATE = json.loads((REAL / FILE).read_text())
BENCHES = list(TEMPLATE["results"])
ENV = json.loads((REAL / "environment" / "bdb0cb6d.jsonl").read_text().splitlines()[0])
START = TEMPLATE["result_columns"].index("started_at")


def _tree(root: Path, machine: str, benches: list[str], *, shift_ms: int = 0, gpu: str | None = None,
          chunk: str = "headline-amp") -> Path:
    """A results tree holding `benches` of the template for `machine`, started `shift_ms` later."""
    mdir = root / machine
    (mdir / "environment").mkdir(parents=True)
    (root / "benchmarks.json").write_bytes((ROOT / "results" / "benchmarks.json").read_bytes())
    (mdir / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}, indent=4))
    data = dict(TEMPLATE, params=dict(TEMPLATE["params"], machine=machine), date=TEMPLATE["date"] + shift_ms)
    data["results"] = {}
    for b in benches:
        row = list(TEMPLATE["results"][b])
        row[START] += shift_ms
        data["results"][b] = row
    (mdir / FILE).write_text(json.dumps(data))
    env = dict(ENV, machine=machine, gpu_model=gpu or ENV["gpu_model"],
               recorded_at=f"2026-11-23T06:{32 + shift_ms // 60_000:02d}:00")
    (mdir / "environment" / "bdb0cb6d.jsonl").write_text(json.dumps(env, sort_keys=True) + "\n")
    (mdir / "chunk-times.jsonl").write_text(json.dumps({"chunk": chunk, "commit": SHA, "seconds": 10.0}) + "\n")
    return root


def _archive(tmp_path: Path, name: str, machine: str, benches: list[str], **kw) -> Path:
    tree = _tree(tmp_path / f"{name}-tree", machine, benches, **kw)
    return suite.pack_results(tree, machine, [SHA], tmp_path / f"{name}.tar.gz")


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _run(*args) -> int:
    return cli.main(["merge", *map(str, args)])


def _benchmarks(root: Path, machine: str) -> set[str]:
    loaded = load_results(root)
    rows = pd.concat([loaded.measured, loaded.not_measured])
    return set(rows[rows["machine"] == machine]["benchmark"])


def test_two_hosts_of_one_commit_end_up_side_by_side(tmp_path, capsys):
    a = _archive(tmp_path, "a", "h100-node-a", BENCHES[:3])
    b = _archive(tmp_path, "b", "h100-node-b", BENCHES[3:6])
    into = tmp_path / "results"
    assert _run(a, b, "--into", into) == 0
    assert (into / "h100-node-a" / FILE).is_file() and (into / "h100-node-b" / FILE).is_file()
    assert _benchmarks(into, "h100-node-a") == set(BENCHES[:3])
    assert _benchmarks(into, "h100-node-b") == set(BENCHES[3:6])
    assert "file(s) written" in capsys.readouterr().out


def test_two_chunks_of_one_machine_and_commit_merge_into_one_result_file(tmp_path, capsys):
    a = _archive(tmp_path, "a", "h100", BENCHES[:4], chunk="headline-amp")
    b = _archive(tmp_path, "b", "h100", BENCHES[4:8], shift_ms=60_000, chunk="headline-transfer")
    into = tmp_path / "results"
    assert _run(a, b, "--into", into) == 0
    merged = json.loads((into / "h100" / FILE).read_text())
    assert set(merged["results"]) == set(BENCHES[:8])
    assert merged["result_columns"] == TEMPLATE["result_columns"]
    assert merged["date"] == TEMPLATE["date"] + 60_000  # the newest
    assert merged["durations"] == TEMPLATE["durations"]
    assert _benchmarks(into, "h100") == set(BENCHES[:8])  # speedlib's own loader reads every row
    assert len((into / "h100" / "environment" / "bdb0cb6d.jsonl").read_text().splitlines()) == 2
    chunks = [json.loads(x)["chunk"] for x in (into / "h100" / "chunk-times.jsonl").read_text().splitlines()]
    assert chunks == ["headline-amp", "headline-transfer"]
    out = capsys.readouterr().out
    assert "h100 commit bdb0cb6d: 4 benchmark(s) added" in out


def test_asv_reads_the_merged_file(tmp_path):
    asv_results = pytest.importorskip("asv.results")
    a = _archive(tmp_path, "a", "h100", BENCHES[:4])
    b = _archive(tmp_path, "b", "h100", BENCHES[4:8], shift_ms=60_000)
    into = tmp_path / "results"
    assert _run(a, b, "--into", into) == 0
    loaded = asv_results.Results.load(str(into / "h100" / FILE), machine_name="h100")
    version = TEMPLATE["result_columns"].index("version")  # the template's rows predate today's listing
    listing = {b: {"version": TEMPLATE["results"][b][version]} for b in BENCHES}
    assert loaded.get_result_keys(listing) == set(BENCHES[:8])
    assert loaded.get_result_value(BENCHES[5], TEMPLATE["results"][BENCHES[5]][1]) == TEMPLATE["results"][BENCHES[5]][0]


def test_merging_the_same_archive_twice_changes_nothing(tmp_path, capsys):
    a = _archive(tmp_path, "a", "h100", BENCHES[:4])
    b = _archive(tmp_path, "b", "h100", BENCHES[4:8], shift_ms=60_000)
    into = tmp_path / "results"
    assert _run(a, b, "--into", into) == 0
    before = _snapshot(into)
    capsys.readouterr()
    assert _run(b, a, "--into", into) == 0
    assert _snapshot(into) == before
    assert "nothing changed" in capsys.readouterr().out
    assert _run(into, "--into", into) == 0  # a tree into itself
    assert _snapshot(into) == before


def test_a_benchmark_measured_twice_is_refused_then_the_newer_is_kept(tmp_path, capsys):
    old = _archive(tmp_path, "old", "h100", BENCHES[:3])
    new = _archive(tmp_path, "new", "h100", BENCHES[2:4], shift_ms=120_000)
    into = tmp_path / "results"
    assert _run(old, "--into", into) == 0
    before = _snapshot(into)
    capsys.readouterr()
    assert _run(new, "--into", into) == merge.CONFLICTS
    err = capsys.readouterr().err
    conflict = [x for x in err.splitlines() if "conflict:" in x]
    assert len(conflict) == 1 and BENCHES[2] in conflict[0] and "bdb0cb6d" in conflict[0] and "h100" in conflict[0]
    assert conflict[0].count("started 2026") == 2 and str(into) in conflict[0] and "new.tar.gz" in conflict[0]
    assert _snapshot(into) == before  # nothing written

    assert _run(new, "--into", into, "--prefer", "newer") == 0
    out = capsys.readouterr().out
    assert f"displaced h100 bdb0cb6d {BENCHES[2]}" in out
    merged = json.loads((into / "h100" / FILE).read_text())
    assert merged["results"][BENCHES[2]][START] == TEMPLATE["results"][BENCHES[2]][START] + 120_000
    side = [json.loads(x) for x in (into / "h100" / merge.DISPLACED).read_text().splitlines()]
    assert len(side) == 1 and side[0]["benchmark"] == BENCHES[2]
    assert side[0]["row"] == json.loads(json.dumps(TEMPLATE["results"][BENCHES[2]]))  # whole, the older one
    again = _snapshot(into)
    assert _run(old, new, "--into", into, "--prefer", "newer") == 0  # the older again: displaced again, no new line
    assert _snapshot(into) == again


def test_hardware_that_differs_under_one_machine_name_is_refused(tmp_path, capsys):
    a = _archive(tmp_path, "a", "h100", BENCHES[:3])
    b = _archive(tmp_path, "b", "h100", BENCHES[3:6], gpu="NVIDIA H100 PCIe")
    into = tmp_path / "results"
    assert _run(a, b, "--into", into, "--prefer", "newer") == merge.CONFLICTS
    err = capsys.readouterr().err
    assert "hardware differs" in err and "NVIDIA H100 PCIe" in err and "--machine" in err
    assert not into.exists()


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "symlink", "device", "outside"])
def test_unsafe_archive_members_are_refused(tmp_path, capsys, kind):
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        member = tarfile.TarInfo({"absolute": "/etc/evil.json", "dotdot": "results/../../evil.json",
                                  "symlink": "results/h100/machine.json", "device": "results/h100/x.json",
                                  "outside": "elsewhere/x.json"}[kind])
        if kind == "symlink":
            member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(member)
        elif kind == "device":
            member.type = tarfile.CHRTYPE
            tar.addfile(member)
        else:
            member.size = 2
            tar.addfile(member, io.BytesIO(b"{}"))
    into = tmp_path / "results"
    assert _run(bad, "--into", into) == merge.BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing was written" in err[0]
    assert not into.exists() and not (tmp_path / "evil.json").exists()


def test_bad_inputs_are_one_line_and_exit_2(tmp_path, capsys):
    into = tmp_path / "results"
    (tmp_path / "notes.txt").write_text("hello")
    torn = _tree(tmp_path / "torn", "h100", BENCHES[:2])
    (torn / "h100" / FILE).write_text((torn / "h100" / FILE).read_text()[:100])
    (tmp_path / "empty").mkdir()
    machine_dir = _tree(tmp_path / "tree", "h100", BENCHES[:2]) / "h100"  # not the tree: one machine of it
    for source in (tmp_path / "missing.tar.gz", tmp_path / "notes.txt", torn, tmp_path / "empty", machine_dir):
        assert _run(source, "--into", into) == merge.BAD_INPUT, source
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert "\\n" not in err[0] and "ReadError" not in err[0]  # no library internals
    assert not into.exists()
    # a source that reads as nothing is never "nothing changed", exit 0: a cluster's merge job
    # pointed at the wrong directory would pass with every result left out
    assert _run(tmp_path / "empty", "--into", into) == merge.BAD_INPUT
    assert "holds no asv result file" in capsys.readouterr().err


def _stopped_merge(tmp_path, monkeypatch) -> tuple[Path, Path, Path, dict]:
    """A tree holding archive a, then a merge of archive b killed after its first rename; with
    the tree a clean merge of both gives, and the tree before the stopped merge."""
    a = _archive(tmp_path, "a", "h100", BENCHES[:4])
    b = _archive(tmp_path, "b", "h100", BENCHES[4:8], shift_ms=60_000, chunk="headline-transfer")
    reference = tmp_path / "reference"
    assert _run(a, b, "--into", reference) == 0
    into = tmp_path / "results"
    assert _run(a, "--into", into) == 0
    before = _snapshot(into)
    renamed = []
    real = results_tree._rename

    def one_then_die(tmp, final):
        if renamed:
            raise KeyboardInterrupt  # the process killed after the first rename
        renamed.append(final)
        real(tmp, final)

    monkeypatch.setattr(results_tree, "_rename", one_then_die)
    with pytest.raises(KeyboardInterrupt):
        merge.merge([b], into)
    assert len(renamed) == 1 and (into / merge.STAGING / "journal").is_file()
    monkeypatch.setattr(results_tree, "_rename", real)
    return b, into, reference, before


def test_a_merge_stopped_between_renames_is_rolled_forward(tmp_path, monkeypatch, capsys):
    b, into, reference, before = _stopped_merge(tmp_path, monkeypatch)
    assert _run(b, "--into", into) == 0
    assert "finished a merge that was stopped" in capsys.readouterr().out
    assert _snapshot(into) == _snapshot(reference)
    assert before != _snapshot(into)


def test_a_merge_stopped_before_its_journal_leaves_the_tree_as_it_was(tmp_path, monkeypatch, capsys):
    a = _archive(tmp_path, "a", "h100", BENCHES[:4])
    b = _archive(tmp_path, "b", "h100", BENCHES[4:8], shift_ms=60_000)
    into = tmp_path / "results"
    assert _run(a, "--into", into) == 0
    before = _snapshot(into)

    def full(*args, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results_tree.os, "fsync", full)
    capsys.readouterr()
    assert _run(b, "--into", into) == merge.BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the disk is full" in err[0]
    assert _snapshot(into) == before and not (into / merge.STAGING).exists()


def test_a_stopped_merge_is_reported_by_the_loader_and_finished_by_the_next_run(tmp_path, monkeypatch, capsys):
    """Between a stopped merge and the next command the tree is half merged: the dashboard and
    `speedlib report` say so, and `speedlib run` (under the same lock) finishes it first."""
    _, into, reference, _ = _stopped_merge(tmp_path, monkeypatch)
    assert any("a speedlib merge was stopped" in p.reason for p in load_results(into).problems)
    capsys.readouterr()
    suite._recover(into)  # what `speedlib run` calls under the results lock before it measures
    assert "finished a merge that was stopped" in capsys.readouterr().out
    assert _snapshot(into) == _snapshot(reference)
    assert not any("merge" in p.reason for p in load_results(into).problems)
