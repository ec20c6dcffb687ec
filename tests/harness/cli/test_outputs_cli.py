"""Every command's named outputs under the one output rule (issue 54): `speedlib publish --chart`
and `--output`, `speedlib report -o`, checked before the results load; refused in one line (exit
2) among a results tree's files, where a site's directory cannot be one, or where a citation
cannot be read; a device written in place; a full disk leaves the old site whole."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("plotly")

from speedbench.cli.parser import main
from speedbench.report import site
from speedbench.results import synthetic
from speedbench.results.tree import BENCHMARKS, MACHINE_FILE


@pytest.fixture
def results(tmp_path) -> Path:
    root = tmp_path / "R"
    synthetic.write_results(root, commits=1, machines=1)
    return root


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def one_line(capsys, prefix: str) -> str:
    out = capsys.readouterr()
    assert out.err.count("\n") == 1 and out.err.startswith(prefix) and "Traceback" not in out.err, out.err
    return out.err


def tree_files(results: Path) -> list[Path]:
    machine = next(p for p in results.iterdir() if p.is_dir())
    return [results / BENCHMARKS, machine / MACHINE_FILE, next(machine.glob("*-*.json"))]


def test_publish_never_writes_a_results_trees_own_files(results, capsys):
    before = digest(results)
    for path in tree_files(results):
        assert main(["publish", "--results", str(results), "--chart", str(path)]) == 2
        assert "is inside the results tree" in one_line(capsys, f"speedlib publish: --chart {path} ")
        assert main(["publish", "--results", str(results), "--output", str(path.parent / "site")]) == 2
        assert "is inside the results tree" in one_line(capsys, "speedlib publish: --output ")
    assert digest(results) == before
    assert main(["report", "--results", str(results), "--table", "paired"]) == 0  # the listing is still there


def test_report_never_writes_a_results_trees_own_files(results, capsys):
    before = digest(results)
    for path in tree_files(results):
        for fmt in ("md", "csv"):
            assert main(["report", "--results", str(results), "--table", "speedup", "--format", fmt, "-o",
                         str(path)]) == 2
            assert "is inside the results tree" in one_line(capsys, f"speedlib report: --output {path} ")
    assert digest(results) == before


def test_publish_writes_a_chart_to_a_device_in_place(results, null_device, capsys):
    assert main(["publish", "--results", str(results), "--chart", str(null_device)]) == 0
    assert stat.S_ISCHR(os.stat(null_device).st_mode)  # a regular file took its place before (the system's too)


def test_report_sends_a_csvs_provenance_to_stderr_when_the_csv_goes_to_a_device(results, null_device, capsys):
    assert main(["report", "--results", str(results), "--table", "speedup", "--format", "csv", "-o",
                 str(null_device)]) == 0
    assert "Reproduce: " in capsys.readouterr().err and not null_device.with_name("null.provenance.txt").exists()


def bad_directories(tmp_path: Path, unwritable: Path, device: Path) -> dict[str, tuple[Path, str]]:
    """The directories `publish --output` ended in a traceback for (13 cases at efb4cf5)."""
    (tmp_path / "a-file").write_text("")
    os.mkfifo(tmp_path / "a-fifo")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "pages" / "index.html").mkdir(parents=True)
    (tmp_path / "holds-mine").mkdir()
    (tmp_path / "holds-mine" / "notes.txt").write_text("mine")
    (tmp_path / "link-to-file").symlink_to(tmp_path / "a-file")
    no_entry = tmp_path / "no-entry"
    no_entry.mkdir()
    return {"an existing file": (tmp_path / "a-file", "is a file"),
            "a device (/dev/null's numbers)": (device, "is a device"),
            "a FIFO": (tmp_path / "a-fifo", "is a FIFO"),
            "a dangling link": (tmp_path / "dangling", "is a link to nothing"),
            "a link to a file": (tmp_path / "link-to-file", "is a file"),
            "a parent that is a file": (tmp_path / "a-file" / "site", "is not a directory"),
            "a name too long": (tmp_path / ("s" * 300), "300 bytes long"),
            "a name too long below": (tmp_path / "x" / ("s" * 256) / "site", "256 bytes long"),
            "a read-only file system": (unwritable / "site", "cannot be written"),
            "no permission": (unwritable / "deeper" / "site", "cannot be written"),
            "index.html a directory": (tmp_path / "pages", "does not write (index.html)"),
            "a directory holding other files": (tmp_path / "holds-mine", "does not write (notes.txt)"),
            "the results tree itself": (tmp_path / "R", "is inside the results tree")}


def test_publish_refuses_every_bad_output_directory_in_one_line(results, tmp_path, unwritable, null_device, capsys):
    before = digest(tmp_path)
    for what, (path, why) in bad_directories(tmp_path, unwritable, null_device).items():
        assert main(["publish", "--results", str(results), "--output", str(path)]) == 2, what
        assert why in one_line(capsys, "speedlib publish: --output "), what
    assert all(k in digest(tmp_path) for k in before) and (tmp_path / "holds-mine" / "notes.txt").read_text() == "mine"


def test_publish_replaces_a_site_whole_and_a_full_disk_leaves_the_old_one(results, tmp_path, monkeypatch, capsys):
    out = tmp_path / "site"
    assert main(["publish", "--results", str(results), "--output", str(out)]) == 0
    old = digest(out)
    assert sorted(old) == sorted(site.names())
    assert main(["publish", "--results", str(results), "--output", str(out)]) == 0  # a site over a site
    assert sorted(digest(out)) == sorted(site.names()) and sorted(os.listdir(tmp_path)) == ["R", "site"]
    written = []
    real = Path.write_text

    def full(self, *args, **kwargs):
        if len(written) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    capsys.readouterr()
    assert main(["publish", "--results", str(results), "--output", str(out)]) == 2
    err = one_line(capsys, f"speedlib publish: could not write --output {out} ")
    assert "the disk is full" in err
    monkeypatch.undo()
    assert digest(out) == old and sorted(os.listdir(tmp_path)) == ["R", "site"]  # no half-built site beside it


def test_publish_refuses_a_citation_that_is_not_utf8_before_any_work(results, tmp_path, capsys):
    cff = tmp_path / "CITATION.cff"
    cff.write_bytes(b"cff-version: 1.2.0\ntitle: caf\xe9\n")
    assert main(["publish", "--results", str(results), "--output", str(tmp_path / "site"), "--citation",
                 str(cff)]) == 2
    assert "is not UTF-8 text (byte 29)" in one_line(capsys, f"speedlib publish: --citation {cff} ")
    assert main(["publish", "--results", str(results), "--output", str(tmp_path / "site"), "--citation",
                 str(tmp_path)]) == 2
    assert "cannot be read" in one_line(capsys, "speedlib publish: --citation ")
    assert not (tmp_path / "site").exists()
