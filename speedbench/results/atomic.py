"""Files written whole or not at all: a full disk, an exception or a kill leaves the old
content or the new, never part of it. Everything speedbench writes under a results tree goes
through here (speedbench.results.tree, safekeep, merge, the run's records).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

__all__ = ["disk_full", "written_whole", "write_whole", "append_line", "sync_dir"]


def disk_full(e: OSError) -> str:
    """': the disk is full' where that is why `e` happened, else ''; for one-line errors."""
    return ": the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""


def sync_dir(directory: Path) -> None:
    """Make a rename in `directory` survive a power cut (where the system allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # not supported for directories here: the rename is still atomic
    finally:
        os.close(fd)


def _target(path: Path) -> int | None:
    """The mode of what `path` names (through a link), None where nothing is there yet."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def written_whole(path: Path, streams: bool = True):
    """A binary file to write `path`'s new content into: on leaving the block it is flushed
    and renamed over `path`, so `path` ends up whole or as it was (an exception, a kill or a
    full disk leave no partial file behind). A character device or a FIFO there (/dev/null,
    /dev/stdout, a pipe someone reads) is written in place: renaming over it would replace it
    with a file. Anything else that is not a regular file (a directory, a block device, a
    socket) is refused with an OSError, before anything is written; so is a device or FIFO
    with `streams=False`, for a file of a results tree (one planted there would hold the run)."""
    mode = _target(path)
    if streams and mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        with open(path, "wb") as f:
            yield f
        return
    if mode is not None and not stat.S_ISREG(mode):
        why = "not a regular file, character device or FIFO" if streams else "not a regular file"
        raise OSError(errno.EINVAL, f"{why}: refused", str(path))
    tmp = path.with_name(_temporary_name(path.name))
    try:
        with tmp.open("wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_dir(path.parent)


def _temporary_name(name: str) -> str:
    """The name `written_whole` writes `name`'s new content under: hidden, this process's, and
    within the file system's 255 bytes however long `name` is (then cut: a name near the limit
    fitted, its temporary file did not)."""
    cut = os.fsencode(name)[:200].decode("utf-8", "ignore")
    return f".{cut}.{os.getpid()}.partial"


def write_whole(path: Path, data: bytes) -> None:
    """`path`, a file of a results tree, holds `data`, or is as it was."""
    with written_whole(path, streams=False) as f:
        f.write(data)


def append_line(path: Path, line: str) -> None:
    """Add `line` to `path` (made if missing), or raise OSError and leave it as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = _target(path)
    if mode is not None and not stat.S_ISREG(mode):  # a FIFO would wait for a writer, and the run with it
        raise OSError(errno.EINVAL, "not a regular file: refused", str(path))
    old = path.read_bytes() if mode is not None else b""
    if old and not old.endswith(b"\n"):
        old += b"\n"  # a line torn by a killed run stays a line of its own, skipped by readers
    write_whole(path, old + line.encode("utf-8") + b"\n")
