"""`speedlib merge` against hostile inputs (issue 42): a planted journal, a target tree with a
file where a directory goes, archives whose members contradict each other or their names, a
damaged gzip stream, and archives of large members. Each is refused with one line and
nothing written anywhere (inside the tree or out of it); `speedlib run`, which finishes a
stopped merge first, refuses the same journal with the same line.

Trees are speedbench.results.synthetic's; archives are packed by the results tree, or by hand
where a member must be planted.
"""

from __future__ import annotations

import gzip
import importlib
import io
import json
import os
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from speedbench.cli import parser as cli
from speedbench.results import merge, synthetic
from speedbench.results.load import load_results
from speedbench.results.tree import JOURNAL, ResultsTree
from speedbench.run import suite

MACHINE = "synthetic-h100"


def _source(root: Path, commits: int = 1) -> tuple[Path, list[Path]]:
    """A synthetic results tree of one machine; with its result files."""
    return root, synthetic.write_results(root, commits=commits, machines=1)


def _members(root: Path) -> list[tuple[str, bytes]]:
    """Every file under `root` as an archive member of `speedlib run --archive`: (name, bytes)."""
    return [(f"results/{p.relative_to(root)}", p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()]


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _files(root: Path) -> dict[str, bytes | str]:
    """Everything under `root` (dot-files, links and directories too), to compare before and after."""
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = (f"link to {os.readlink(p)}" if p.is_symlink() else "directory" if p.is_dir()
                    else p.read_bytes() if p.is_file() else "special")
    return out


def _merge(capsys, *args) -> tuple[int, list[str]]:
    capsys.readouterr()
    status = cli.main(["merge", *map(str, args)])
    return status, capsys.readouterr().err.strip().splitlines()


# --- a planted journal --------------------------------------------------------------------

JOURNALS = {
    "absolute path": lambda t: [["0.new", str(t / "outside" / "planted.json")]],
    "dotdot": lambda t: [["0.new", "../outside/planted.json"]],
    "dotdot inside": lambda t: [["0.new", f"{MACHINE}/../../outside/planted.json"]],
    "hidden name": lambda t: [["0.new", ".speedlib-snapshot/journal"]],
    "link leading out": lambda t: [["0.new", "linked/planted.json"]],
    "staged file climbs out": lambda t: [["../../outside/secret", f"{MACHINE}/x.json"]],
    "staged file is a link": lambda t: [["1.new", f"{MACHINE}/x.json"]],
    "not a pair": lambda t: [["0.new"]],
    "three strings": lambda t: [["0.new", "a.json", "b.json"]],
    "numbers": lambda t: [[0, 1]],
    "a string": lambda t: ["0.new"],
    "an object": lambda t: [{"0.new": "a.json"}],
    "null": lambda t: [None],
    "not JSON": lambda t: "[\"0.new\", ",
}


def _planted(tmp_path: Path, case: str) -> tuple[Path, Path, Path]:
    """A merged tree with the journal of JOURNALS[case] planted in its staging: (tree, source, staging)."""
    into = tmp_path / "into"
    source, _ = _source(tmp_path / "source")
    assert cli.main(["merge", str(source), "--into", str(into)]) == 0
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("not for the tree")
    (into / "linked").symlink_to(tmp_path / "outside")
    stage = into / merge.STAGING
    stage.mkdir()
    (stage / "0.new").write_text("planted")
    (stage / "1.new").symlink_to(tmp_path / "outside" / "secret")
    entries = JOURNALS[case](tmp_path)
    text = entries if isinstance(entries, str) else "".join(json.dumps(e) + "\n" for e in entries)
    (stage / JOURNAL).write_text(text)
    return into, source, stage


@pytest.mark.parametrize("case", list(JOURNALS))
def test_a_planted_journal_that_names_what_no_merge_writes_is_refused_and_nothing_moves(tmp_path, capsys, case):
    """A journal copied in with a tree is read like one a stopped merge left: it may name only
    files a merge stages and paths inside its own tree, every one checked before any rename."""
    into, source, stage = _planted(tmp_path, case)
    before, outside = _files(into), _files(tmp_path / "outside")

    status, err = _merge(capsys, source, "--into", into)
    assert status == merge.BAD_INPUT and len(err) == 1, err
    assert err[0].startswith(f"speedlib merge: cannot settle what a stopped run left in {into}: {stage / JOURNAL} "
                             "cannot be finished: line 1 "), err
    assert err[0].endswith(f"; nothing was moved: look at {stage}, then remove it"), err
    assert _files(into) == before and _files(tmp_path / "outside") == outside
    assert not (tmp_path / "planted.json").exists()

    # `speedlib run` finishes a stopped merge before it measures: the same line, exit 2, nothing moved
    with pytest.raises(suite.SuiteError) as refused:
        suite._recover(into)
    assert str(refused.value) == err[0].removeprefix("speedlib merge: ")
    assert _files(into) == before and _files(tmp_path / "outside") == outside


# What the loader says of a planted journal, before the merge's own line
REFUSED = ("a speedlib merge was stopped while renaming its files, so some are merged and some not yet; its journal "
           "is one a merge refuses, so the next speedlib merge or speedlib run stops with: ")


@pytest.mark.parametrize("case", list(JOURNALS))
def test_the_loader_says_a_planted_journal_is_refused_with_the_merges_line(tmp_path, capsys, case):
    """The loader once said the next merge finishes what it in fact refuses: it now says the
    refusal, in the merge's own words (with what to do), and moves nothing itself."""
    into, source, stage = _planted(tmp_path, case)
    before, outside = _files(into), _files(tmp_path / "outside")
    said = [p.reason for p in load_results(into).problems if p.path == str(stage)]
    assert _files(into) == before and _files(tmp_path / "outside") == outside
    status, err = _merge(capsys, source, "--into", into)
    assert status == merge.BAD_INPUT and len(err) == 1, err
    merges_line = err[0].removeprefix(f"speedlib merge: cannot settle what a stopped run left in {into}: ")
    assert merges_line.endswith("then remove it") and merges_line != err[0], err
    assert said == [REFUSED + merges_line]


def test_the_loader_says_a_linked_journal_is_refused_with_the_merges_line(tmp_path, capsys):
    into, source, stage = _planted(tmp_path, "absolute path")
    (tmp_path / "outside" / "journal").write_text(json.dumps(["0.new", f"{MACHINE}/x.json"]) + "\n")
    (stage / JOURNAL).unlink()
    (stage / JOURNAL).symlink_to(tmp_path / "outside" / "journal")  # a journal a merge would take, through a link
    said = [p.reason for p in load_results(into).problems if p.path == str(stage)]
    status, err = _merge(capsys, source, "--into", into)
    assert status == merge.BAD_INPUT and "line 1 is in a link or special file" in err[0], err
    assert said == [REFUSED + err[0].removeprefix(f"speedlib merge: cannot settle what a stopped run left in {into}: ")]


def test_a_journal_a_merge_wrote_is_still_finished(tmp_path, capsys):
    """The checks refuse only what a merge never writes: a journal staged by the tree goes through."""
    into = tmp_path / "into"
    source, _ = _source(tmp_path / "source")
    assert cli.main(["merge", str(source), "--into", str(into)]) == 0
    tree = ResultsTree(into)
    with tree.staging([f"{MACHINE}/chunk-times.jsonl", f"{MACHINE}/gpu-tests/1234abcd.json"]) as staged:
        for rel in (f"{MACHINE}/chunk-times.jsonl", f"{MACHINE}/gpu-tests/1234abcd.json"):
            with staged(rel) as f:
                f.write(b"{}\n")
    assert [p.reason for p in load_results(into).problems if p.path == str(tree.merge_staging)] == [
        "a speedlib merge was stopped while renaming its files, so some are merged and some not yet; the next "
        "speedlib merge or speedlib run finishes it"]
    assert merge.recover(into) == ["finished a merge that was stopped while renaming its files (2 file(s))"]
    assert (into / MACHINE / "gpu-tests" / "1234abcd.json").read_bytes() == b"{}\n"
    assert not (into / merge.STAGING).exists()


# --- the target tree ------------------------------------------------------------------------

def _machine_is_a_file(into: Path) -> str:
    for p in sorted((into / MACHINE).rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    (into / MACHINE).rmdir()
    (into / MACHINE).write_text("in the way")
    return str(into / MACHINE)


def _environment_is_a_file(into: Path) -> str:
    for p in (into / MACHINE / "environment").iterdir():
        p.unlink()
    (into / MACHINE / "environment").rmdir()
    (into / MACHINE / "environment").write_text("in the way")
    return str(into / MACHINE / "environment")


TARGETS = {"machine directory is a file": _machine_is_a_file, "environment is a file": _environment_is_a_file}


@pytest.mark.parametrize("case", list(TARGETS))
def test_a_file_where_a_directory_goes_refuses_the_merge_before_its_journal(tmp_path, capsys, case):
    """The merge once stopped part way (2 of 4 files renamed) and then refused every rerun: now
    every target is checked first, and the tree is left as it was, with no journal."""
    old, _ = _source(tmp_path / "old")
    into = tmp_path / "into"
    assert cli.main(["merge", str(old), "--into", str(into)]) == 0
    where = TARGETS[case](into)
    new = tmp_path / "new"
    synthetic.write_results(new, commits=2, machines=1)  # a second commit: new files under the machine
    before = _files(into)
    for _ in range(2):  # and again: a rerun says the same
        status, err = _merge(capsys, new, "--into", into)
        assert status == merge.BAD_INPUT and len(err) == 1, err
        assert err[0] == (f"speedlib merge: cannot merge into {into}: {where} is a file where a directory goes; "
                          "nothing was written")
        assert _files(into) == before and not (into / merge.STAGING).exists()
    suite._recover(into)  # what `speedlib run` does first: nothing to finish, no traceback
    assert _files(into) == before


def test_a_linked_listing_in_the_target_is_refused_and_its_target_untouched(tmp_path, capsys):
    source, _ = _source(tmp_path / "source")
    into = tmp_path / "into"
    assert cli.main(["merge", str(source), "--into", str(into)]) == 0
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes((into / "benchmarks.json").read_bytes())
    (into / "benchmarks.json").unlink()
    (into / "benchmarks.json").symlink_to(outside)
    new = tmp_path / "new"
    synthetic.write_results(new, commits=2, machines=2)
    before = outside.read_bytes()
    status, err = _merge(capsys, new, "--into", into)
    assert status == merge.BAD_INPUT and len(err) == 1, err
    assert err[0] == f"speedlib merge: {into}/benchmarks.json is a link: refused; nothing was written"
    assert outside.read_bytes() == before and (into / "benchmarks.json").is_symlink()


# --- the inputs -----------------------------------------------------------------------------

def _twice(members, root, sha):
    name, data = next((n, d) for n, d in members if n.endswith(".json") and sha[:8] in n)
    return [*members, (name, data.replace(b'"python"', b'"python" ', 1))]


def _other_machine(members, root, sha):
    return [(n, b'{"machine": "synthetic-h200", "version": 1}' if n.endswith("/machine.json") else d)
            for n, d in members]


def _other_commit(members, root, sha):
    return [(n.replace(f"/{sha[:8]}-", "/0badc0de-") if n.endswith(".json") else n, d) for n, d in members]


def _two_gpus(members, root, sha):
    out = []
    for n, d in members:
        if "/environment/" in n:
            record = json.loads(d.splitlines()[0])
            d += json.dumps(dict(record, gpu_model="NVIDIA H100 PCIe")).encode() + b"\n"
        out.append((n, d))
    return out


def _renamed(name):
    def rename(members, root, sha):
        out = []
        for n, d in members:
            n = n.replace(f"results/{MACHINE}/", f"results/{name}/")
            out.append((n, d.replace(MACHINE.encode(), name.encode()) if n.endswith("machine.json") else d))
        return out
    return rename


INPUTS = {
    "a member twice": (_twice, "results/{machine}/{sha8}-existing-py_usr_bin_python3.json is in the archive twice: "
                               "refused"),
    "machine.json names another machine": (_other_machine, "results/{machine}/machine.json names the machine "
                                                           "synthetic-h200, not {machine} whose directory holds it"),
    "result file of another commit": (_other_commit, "results/{machine}/0badc0de-existing-py_usr_bin_python3.json is "
                                                     "named for commit 0badc0de and holds results of commit {sha8}"),
    "two GPUs under one name": (_two_gpus, "machine {machine} recorded GPU NVIDIA H100 80GB HBM3 (synthetic) and "
                                           "GPU NVIDIA H100 PCIe: a machine name stands for one kind of hardware"),
    "a machine name with a space": (_renamed("h100 node"), "the machine name 'h100 node' is not a plain name"),
    "a machine name like an option": (_renamed("-h100"), "the machine name '-h100' is not a plain name"),
    "a 150-character machine name": (_renamed("h" * 150), "the machine name is 150 characters long: a machine name "
                                                          "names a directory, at most 100 characters"),
}


@pytest.mark.parametrize("case", list(INPUTS))
def test_an_archive_that_contradicts_itself_is_refused_with_one_line(tmp_path, capsys, case):
    root, files = _source(tmp_path / "tree")
    sha = json.loads(files[0].read_text())["commit_hash"]
    change, said = INPUTS[case]
    archive = _tar(tmp_path / "a.tar.gz", change(_members(root), root, sha))
    into = tmp_path / "into"
    status, err = _merge(capsys, archive, "--into", into)
    assert status == merge.BAD_INPUT and len(err) == 1, err
    assert said.format(machine=MACHINE, sha8=sha[:8]) in err[0] and err[0].endswith("nothing was written"), err
    assert "Traceback" not in err[0] and not into.exists()


def test_an_archive_whose_gzip_checksum_fails_is_refused(tmp_path, capsys):
    """tarfile stops at the archive's end marker, before the gzip trailer: the checksum was never read."""
    root, _ = _source(tmp_path / "tree")
    archive = _tar(tmp_path / "a.tar.gz", _members(root))
    data = bytearray(archive.read_bytes())
    data[-8] ^= 0xFF  # the CRC32 of the trailer
    archive.write_bytes(bytes(data))
    with pytest.raises(gzip.BadGzipFile):
        gzip.decompress(bytes(data))  # the damage is the checksum's alone
    into = tmp_path / "into"
    status, err = _merge(capsys, archive, "--into", into)
    assert status == merge.BAD_INPUT and len(err) == 1, err
    assert err[0].startswith(f"speedlib merge: {archive} is damaged (CRC check failed"), err
    assert err[0].endswith("; nothing was written"), err
    assert not into.exists()


def test_an_archive_of_large_members_is_merged_one_member_at_a_time(tmp_path):
    """An archive of a few MB held 40 members of 60 MiB, all read into memory at once
    (MemoryError). Members padded with JSON whitespace: the merge must hold about one at a time
    (reading one and parsing it takes about three times its size), not all of them."""
    root, files = _source(tmp_path / "tree", commits=10)
    size = 4 << 20
    for f in files:
        f.write_bytes(f.read_bytes() + b" " * (size - f.stat().st_size))
    archive = ResultsTree(root).machine(MACHINE).pack_run(
        [json.loads(f.read_text())["commit_hash"] for f in files], tmp_path / "big.tar.gz")
    assert archive.stat().st_size < size  # highly compressible
    into = tmp_path / "into"
    importlib.import_module("speedbench.results.machines")  # pandas, loaded by the merge's hardware check: not measured
    tracemalloc.start()
    try:
        merge.merge([archive], into)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(files) * size / 2, f"peak {peak >> 20} MiB for {len(files)} members of {size >> 20} MiB"
    assert {f.name: f.read_bytes() for f in files} == {f.name: (into / MACHINE / f.name).read_bytes() for f in files}


def test_a_source_that_changes_while_it_is_merged_is_refused(tmp_path, capsys, monkeypatch):
    """A file added whole is copied from its source when written: if it changed since it was
    read and checked, nothing is written."""
    root, files = _source(tmp_path / "tree")
    into = tmp_path / "into"
    real = merge._merge_locked

    def tamper(*args, **kw):
        files[0].write_bytes(files[0].read_bytes().replace(b"synthetic", b"SYNTHETIC"))
        return real(*args, **kw)

    monkeypatch.setattr(merge, "_merge_locked", tamper)
    status, err = _merge(capsys, root, "--into", into)
    assert status == merge.BAD_INPUT and len(err) == 1, err
    assert err[0] == (f"speedlib merge: {root}/{MACHINE}/{files[0].name} has changed since it was read; "
                      "nothing was written")
    assert not into.exists() or not any(into.iterdir())
