"""The one output rule (speedbench.results.outputs, issue 54): a path a user names for an output is
checked before any work, never among a results tree's files, a device or FIFO written in place (a
FIFO refused where a deadline could pass while it waits), a directory built aside and renamed in
whole; each refusal one line naming the path and why."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from speedbench.results import outputs
from speedbench.results.tree import BENCHMARKS, MACHINE_FILE


def tree(root: Path) -> Path:
    """A results tree: the listing, a machine directory with its machine file and a result file."""
    (root / "m" / "gpu-tests").mkdir(parents=True)
    (root / BENCHMARKS).write_text("{}")
    (root / "m" / MACHINE_FILE).write_text('{"machine": "m"}')
    (root / "m" / "0123abcd-existing.json").write_text("{}")
    return root


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(outputs.OutputRefused) as e:
        call(*args, **kwargs)
    text = str(e.value)
    assert "\n" not in text and len(text) < 400, text
    return text


@pytest.mark.parametrize("rel", [BENCHMARKS, f"m/{MACHINE_FILE}", "m/0123abcd-existing.json", "m/gpu-tests/x.json",
                                 "m/new.json", "new-file.md"])
def test_a_file_among_a_results_trees_files_is_refused(tmp_path, rel):
    root = tree(tmp_path / "R")
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    text = refused(outputs.file_output, root / rel, "--chart")
    assert text.startswith(f"--chart {root / rel} is inside the ") and "name a path outside it" in text
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_the_tree_a_command_reads_is_refused_before_it_holds_a_listing(tmp_path):
    empty = tmp_path / "fresh"
    empty.mkdir()
    assert refused(outputs.file_output, empty / "a.tar.gz", "--archive", [empty]).startswith(
        f"--archive {empty / 'a.tar.gz'} is inside the results tree {empty}")
    assert outputs.file_output(tmp_path / "a.tar.gz", "--archive", [empty]) == tmp_path / "a.tar.gz"


def test_a_link_into_a_tree_is_refused_where_it_leads(tmp_path):
    root = tree(tmp_path / "R")
    (tmp_path / "chart.svg").symlink_to(root / BENCHMARKS)
    assert "is inside the results tree" in refused(outputs.file_output, tmp_path / "chart.svg", "--chart")


def test_a_character_device_is_written_in_place(tmp_path, null_device):
    assert outputs.file_output(null_device, "-o", [tmp_path / "R"]) == null_device
    with outputs.written(null_device) as f:
        f.write(b"x")
    assert stat.S_ISCHR(os.stat(null_device).st_mode)


def test_a_fifo_is_written_in_place_unless_a_deadline_could_pass_while_it_waits(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert outputs.file_output(fifo, "-o") == fifo
    text = refused(outputs.file_output, fifo, "--archive", deadline="the slot must end within its minutes")
    assert text == (f"--archive {fifo} is a FIFO: opening it waits until something reads it, and the slot must end "
                    "within its minutes; name a file")


def test_what_a_file_cannot_be(tmp_path, unwritable):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    cases = {tmp_path / "dir": "is a directory: name the file to write",
             tmp_path / "file" / "x.svg": "is not a directory",
             tmp_path / "dangling": "is a link to nothing",
             tmp_path / ("n" * 300 + ".svg"): "a name in it is 304 bytes long, over the 255 this file system takes",
             unwritable / "x.svg": "cannot be written"}
    for path, why in cases.items():
        assert why in refused(outputs.file_output, path, "--chart"), path


def test_a_name_near_the_limit_is_written_whole(tmp_path):
    path = tmp_path / ("n" * 250)  # its temporary file's name used to be over 255 bytes: ENAMETOOLONG after the work
    with outputs.written(outputs.file_output(path, "-o")) as f:
        f.write(b"whole")
    assert path.read_bytes() == b"whole" and [p.name for p in tmp_path.iterdir()] == [path.name]


def site_names(name: str, is_dir: bool) -> bool:
    return name in ("index.html", "plotly.min.js") and not is_dir


def test_what_a_directory_output_cannot_be(tmp_path, unwritable, null_device):
    root = tree(tmp_path / "R")
    (tmp_path / "file").write_text("")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "README.md").write_text("mine")
    (tmp_path / "old-site" / "index.html").mkdir(parents=True)
    (tmp_path / "R2").mkdir()
    (tmp_path / "R2" / MACHINE_FILE).write_text("{}")  # a machine directory on its own, named by no option
    cases = {tmp_path / "file": "is a file: name a directory",
             null_device: "is a device: name a directory",
             tmp_path / "fifo": "is a FIFO: name a directory",
             tmp_path / "dangling": "is a link to nothing",
             tmp_path / "file" / "site": "is not a directory",
             tmp_path / ("d" * 300): "a name in it is 300 bytes long",
             unwritable / "site": "cannot be written",
             root: "is inside the results tree",
             root / "m": "is inside the results tree",
             tmp_path / "R2": "is inside the machine directory",
             tmp_path: "holds 8 entr(y/ies) this command does not write (R, R2, dangling, ...)",
             tmp_path / "docs": "holds 1 entr(y/ies) this command does not write (README.md)",
             tmp_path / "old-site": "holds 1 entr(y/ies) this command does not write (index.html)"}
    for path, why in cases.items():
        assert why in refused(outputs.directory_output, path, "--output", [root], site_names), path
    assert (tmp_path / "docs" / "README.md").read_text() == "mine"


def test_a_directory_is_built_aside_and_replaces_the_old_one_whole(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("old")
    assert outputs.directory_output(site, "--output", writes=site_names) == site
    with outputs.built_whole(site) as new:
        (new / "index.html").write_text("new")
        (new / "plotly.min.js").write_text("js")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]
    assert (site / "index.html").read_text() == "new" and stat.S_IMODE(site.stat().st_mode) == 0o755


def test_a_full_disk_leaves_the_old_directory_and_nothing_half_built(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("old")
    with pytest.raises(OSError) as e, outputs.built_whole(site) as new:
        for i in range(14):
            if i == 3:
                raise OSError(errno.ENOSPC, "No space left on device")
            (new / f"page{i}.html").write_text("x")
    assert e.value.errno == errno.ENOSPC
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]
    assert [p.name for p in site.iterdir()] == ["index.html"] and (site / "index.html").read_text() == "old"


def test_a_directory_a_command_only_adds_to_is_checked_the_same_way(tmp_path):
    root = tree(tmp_path / "R")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "anything").write_text("")
    assert outputs.directory_output(shared, "--shared", [root]) == shared
    assert "is inside the results tree" in refused(outputs.directory_output, root / "shared", "--shared")
