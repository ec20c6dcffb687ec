"""speedbench.results.atomic: output written by renaming over the path given (`speedlib report
-o`, `speedlib run --archive`, `speedlib slot --archive`) never replaces what is not a regular
file there (issue 42: `--archive /dev/full` replaced the device, `report -o /dev/null` left a
regular file). A character device or a FIFO is written in place; a socket or a directory is
refused before anything is written.

The devices are reached through a link in the test's own directory: a regression then
replaces the link, never the device itself.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import select
import socket
import stat
import tarfile
import threading
from pathlib import Path

import pytest

from speedbench.cli import parser as cli
from speedbench.results import synthetic
from speedbench.results.atomic import append_line, write_whole, written_whole
from speedbench.run import slot, suite


@contextlib.contextmanager
def _read_from(fifo: Path):
    """What is written into `fifo` while the block runs (the bytearray yielded, complete after
    it): a reader is there from the start, so a writer never waits, and one that never comes
    is no hang."""
    r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    w = os.open(fifo, os.O_WRONLY)  # ours: until it closes, a read waits for data instead of ending
    got = bytearray()

    def drain() -> None:
        while True:
            select.select([r], [], [], 0.1)
            try:
                chunk = os.read(r, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:  # every writer has closed it
                return
            got.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        yield got
    finally:
        os.close(w)
        reader.join(30)
        os.close(r)


def _link(tmp_path: Path, device: str) -> Path:
    link = tmp_path / Path(device).name
    link.symlink_to(device)
    return link


def _is_char_device(path: Path) -> bool:
    return path.is_symlink() and stat.S_ISCHR(os.stat(path).st_mode)


def test_a_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with _read_from(fifo) as got:
        with written_whole(fifo) as f:
            f.write(b"x" * 200_000)  # more than a pipe holds: the reader takes it as it comes
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and bytes(got) == b"x" * 200_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no partial file beside it


def test_dev_null_is_written_in_place(tmp_path):
    null = _link(tmp_path, "/dev/null")
    with written_whole(null) as f:
        f.write(b"gone")
    assert _is_char_device(null) and sorted(p.name for p in tmp_path.iterdir()) == ["null"]


def test_dev_null_itself_stays_a_device():
    if os.access("/dev", os.W_OK):
        pytest.skip("this user can write in /dev (root): a regression would replace /dev/null itself; "
                    "test_dev_null_is_written_in_place reaches it through a link")
    with written_whole(Path("/dev/null")) as f:
        f.write(b"gone")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_dev_full_says_it_is_full_and_stays_a_device(tmp_path):
    full = _link(tmp_path, "/dev/full")
    with pytest.raises(OSError) as raised:
        with written_whole(full) as f:
            f.write(b"x" * 100_000)
    assert raised.value.errno == errno.ENOSPC and _is_char_device(full)


def test_a_socket_or_a_directory_is_refused_before_anything_is_written(tmp_path):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    (tmp_path / "dir").mkdir()
    try:
        for target in (tmp_path / "sock", tmp_path / "dir"):
            with pytest.raises(OSError) as raised:
                with written_whole(target) as f:
                    f.write(b"never")
            assert raised.value.strerror == "not a regular file, character device or FIFO: refused"
        assert stat.S_ISSOCK(os.lstat(tmp_path / "sock").st_mode) and list((tmp_path / "dir").iterdir()) == []
        assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "sock"]
    finally:
        sock.close()


def test_a_regular_file_is_still_replaced_whole(tmp_path):
    path = tmp_path / "out"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), written_whole(path) as f:
        f.write(b"half")
        raise RuntimeError("stopped")
    assert path.read_bytes() == b"old"
    with written_whole(path) as f:
        f.write(b"new")
    assert path.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _refused_without_waiting(write, fifo: Path) -> OSError:
    """The OSError `write()` refuses the FIFO `fifo` with; a failure if it waits on it instead."""
    raised: list[OSError | None] = []

    def attempt() -> None:
        try:
            write()
            raised.append(None)
        except OSError as e:
            raised.append(e)

    writing = threading.Thread(target=attempt, daemon=True)
    writing.start()
    writing.join(10)
    if writing.is_alive():  # let it go before failing: a reader, or a writer, that comes and goes at once
        for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, flags))
        writing.join(10)
        pytest.fail("it waited on the FIFO")
    assert isinstance(raised[0], OSError), "the FIFO was not refused"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    return raised[0]


def test_a_line_is_never_appended_to_a_fifo(tmp_path):
    """A FIFO planted where an environment record goes would make the run wait for a writer."""
    fifo = tmp_path / "record.jsonl"
    os.mkfifo(fifo)
    assert _refused_without_waiting(lambda: append_line(fifo, "{}"), fifo).strerror == "not a regular file: refused"


def test_a_file_of_a_results_tree_is_never_written_into_a_fifo(tmp_path):
    """A tree's own files (a copy asv's files are kept in, a GPU tests' verdict) are regular
    files: a FIFO planted at one is refused, not waited on."""
    fifo = tmp_path / "synthetic-h200" / "gpu-tests" / "1a2b3c4d.json"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    assert _refused_without_waiting(lambda: write_whole(fifo, b"{}"), fifo).strerror == "not a regular file: refused"
    verdict = {"commit": "1a2b3c4d" * 5, "machine": "synthetic-h200", "started_at": 1_795_000_000_000,
               "duration_s": 43.3, "passed": 145, "failed": 0, "skipped": 0, "errors": 0, "failures": [],
               "command": "python3 -m pytest -m gpu", "torch": "2.11.0+cu130", "gpu": "NVIDIA H200", "exit_status": 0,
               "finished": True}

    def write_verdict() -> None:
        try:
            slot.write_verdict(fifo, verdict)
        except suite.SuiteError as e:  # the slot's one line, from the OSError
            raise OSError(str(e)) from None

    assert "not a regular file: refused" in str(_refused_without_waiting(write_verdict, fifo))


# --- the commands that write there -----------------------------------------------------------

@pytest.fixture
def results(tmp_path) -> Path:
    synthetic.write_results(tmp_path / "results", commits=1, machines=1)
    return tmp_path / "results"


def _report(results: Path, output: Path) -> int:
    return cli.main(["report", "--results", str(results), "--table", "speedup", "--output", str(output)])


def test_report_output_to_dev_null_or_a_fifo_leaves_them_as_they_were(results, tmp_path, capsys):
    null = _link(tmp_path, "/dev/null")
    assert _report(results, null) == 0 and _is_char_device(null)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with _read_from(fifo) as got:
        assert _report(results, fifo) == 0
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and b"synthetic-h100" in got
    capsys.readouterr()
    full = _link(tmp_path, "/dev/full")
    assert _report(results, full) == 2 and _is_char_device(full)
    assert capsys.readouterr().err == (f"speedlib report: cannot write {full}: No space left on device: "
                                       "the disk is full\n")


def test_an_archive_goes_into_a_fifo_in_place(results, tmp_path):
    """What `speedlib run --archive` and `speedlib slot --archive` pack (pack_results, the tree's pack)."""
    sha = synthetic._sha("commit 0")
    fifo = tmp_path / "archive.tar.gz"
    os.mkfifo(fifo)
    with _read_from(fifo) as got:
        suite.pack_results(results, "synthetic-h100", [sha], fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with tarfile.open(fileobj=io.BytesIO(bytes(got)), mode="r:gz") as tar:
        assert f"results/synthetic-h100/{sha[:8]}-existing-py_usr_bin_python3.json" in tar.getnames()
    null = _link(tmp_path, "/dev/null")
    suite.pack_results(results, "synthetic-h100", [sha], null)
    assert _is_char_device(null)
    full = _link(tmp_path, "/dev/full")
    with pytest.raises(suite.SuiteError, match="No space left on device"):
        suite.pack_results(results, "synthetic-h100", [sha], full)
    assert _is_char_device(full)
