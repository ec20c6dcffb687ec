"""`speedlib merge` keeps or refuses what it does not know, and says which (issue 54): an archive
member no run or slot writes (under gpu-tests/ or elsewhere) and a file in a source tree's own
directories are refused in one line; a tree's other files are left out with a line naming them;
a GPU tests' verdict the loader would refuse, and a result file that records another machine than
its directory, are refused. Nothing is written by a refused merge."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from speedbench.cli import parser as cli
from speedbench.results import synthetic

MACHINE = "synthetic-h100"
SHA = "c" * 40


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _source(root: Path) -> Path:
    synthetic.write_results(root, commits=1, machines=1)
    return root


def _members(root: Path) -> list[tuple[str, bytes]]:
    return [(f"results/{p.relative_to(root)}", p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()]


def _verdict(**change) -> bytes:
    verdict = {"commit": SHA, "machine": MACHINE, "started_at": 1, "duration_s": 1.0, "passed": 1, "failed": 0,
               "skipped": 0, "errors": 0, "failures": [], "command": "python3 -m pytest -m gpu", "torch": "2.14.1",
               "gpu": "NVIDIA H100", "rehearsal": False, "exit_status": 0, "finished": True}
    return json.dumps({**verdict, **change}).encode()


def _merge(capsys, *args) -> tuple[int, list[str], list[str]]:
    capsys.readouterr()
    status = cli.main(["merge", *map(str, args)])
    out = capsys.readouterr()
    return status, out.out.strip().splitlines(), out.err.strip().splitlines()


@pytest.mark.parametrize("member", [f"results/{MACHINE}/gpu-tests/notes.txt", f"results/{MACHINE}/gpu-tests/sub/x.json",
                                    f"results/{MACHINE}/README.md", "results/README.md",
                                    f"results/{MACHINE}/environment/x.txt"])
def test_an_archive_member_no_run_writes_is_refused_not_dropped(tmp_path, capsys, member):
    archive = _tar(tmp_path / "a.tar.gz", [(f"results/{MACHINE}/gpu-tests/{SHA[:8]}.json", _verdict()),
                                           (member, b"planted")])
    status, out, err = _merge(capsys, archive, "--into", tmp_path / "into")
    assert status == 2 and len(err) == 1 and not (tmp_path / "into").exists(), err
    assert f"{member} is not a file speedlib run or speedlib slot writes" in err[0] and "nothing was written" in err[0]


def test_an_unknown_file_in_a_source_trees_gpu_tests_is_refused(tmp_path, capsys):
    source = _source(tmp_path / "src")
    (source / MACHINE / "gpu-tests").mkdir()
    (source / MACHINE / "gpu-tests" / "notes.txt").write_text("planted")
    status, out, err = _merge(capsys, source, "--into", tmp_path / "into")
    assert status == 2 and len(err) == 1 and "gpu-tests/notes.txt is not a file speedlib run" in err[0]
    assert not (tmp_path / "into").exists()


def test_a_source_trees_other_files_are_left_out_with_a_line(tmp_path, capsys):
    source = _source(tmp_path / "src")
    (source / "README.md").write_text("about")
    (source / MACHINE / "html").mkdir()
    status, out, err = _merge(capsys, source, "--into", tmp_path / "into")
    assert status == 0, err
    assert any(line.startswith("speedlib merge: left out of ") and "2 file(s) or directorie(s) no merge takes "
               f"(README.md, {MACHINE}/html)" in line for line in out), out
    status, out, err = _merge(capsys, source, "--into", tmp_path / "into")
    assert status == 0 and "left out of" in out[0] and "already holds everything" in out[-1]


@pytest.mark.parametrize("change, why", [({"machine": "other"}, "holds machine 'other'"),
                                         ({"commit": "d" * 40}, "filed under 'cccccccc' but holds commit dddddddd"),
                                         ({"passed": "many"}, "")])
def test_a_verdict_the_loader_would_refuse_is_refused(tmp_path, capsys, change, why):
    archive = _tar(tmp_path / "a.tar.gz", [(f"results/{MACHINE}/gpu-tests/{SHA[:8]}.json", _verdict(**change))])
    status, out, err = _merge(capsys, archive, "--into", tmp_path / "into")
    assert status == 2 and len(err) == 1 and "is not a GPU tests' verdict speedlib slot writes" in err[0], err
    assert why in err[0] and not (tmp_path / "into").exists()


def test_a_result_recording_another_machine_is_refused(tmp_path, capsys):
    source = _source(tmp_path / "src")
    result = next((source / MACHINE).glob("*-*.json"))
    data = json.loads(result.read_text())
    data["params"]["machine"] = "synthetic-h200"
    result.write_text(json.dumps(data))
    for given in (source, _tar(tmp_path / "a.tar.gz", _members(source))):
        status, out, err = _merge(capsys, given, "--into", tmp_path / "into")
        assert status == 2 and len(err) == 1, err
        assert "records the machine synthetic-h200 (its params), not synthetic-h100 whose directory holds it" in err[0]
    assert not (tmp_path / "into").exists()
