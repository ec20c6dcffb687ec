"""Reading the results tree safely: only regular files inside it, each up to MAX_FILE_BYTES,
never blocking, a file that two links reach loaded once.

The part of speedbench.results.load that touches the filesystem below the walk itself: where a
path really leads (`_inside`), reading one file (`_read`, `_read_identified`), listing a
directory (`_children`), whether to descend into one (`_subdirectory`), and the checks on
names and links met on the way (`_utf8_name`, `_first_visit`). Apart from the loader because
what it guards against (FIFOs, devices, links that loop or leave the tree, files that grow
while read) is a subject of its own, and the environment records are read through it too
(speedbench.results.environment). speedbench.results.load re-exports MAX_FILE_BYTES.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from speedbench.results.common import Problem

# The largest file read (result file, benchmarks.json, environment records). asv's files for
# this suite are well under 1 MiB; the limit only keeps a stray huge file, or a link to an
# endless one, from filling memory.
MAX_FILE_BYTES = 64 * 2**20


class _Unreadable(OSError):
    """A path the loader will not read: not a regular file, outside the tree, too large."""


class _NotJson(ValueError):
    """A file that is not UTF-8 JSON a Python process can hold; the message says why."""


def _parse_json(raw: bytes):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _NotJson(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise _NotJson("nested too deeply to read") from None
    except ValueError as e:  # JSONDecodeError, and integers too long for Python to convert
        raise _NotJson(f"not valid JSON, truncated? ({e})") from None


# --- reading the tree: only regular files inside it, never blocking -------------------------

def _inside(path: Path, root_real: Path, parent_real: Path | None = None) -> Path:
    """The real path of `path`; _Unreadable when it loops or leaves the results tree.
    `parent_real`: the real path of `path`'s directory, already checked to be inside the
    tree. Then an entry that is no symlink is known without resolving every component of
    its path again (thousands of files share one directory)."""
    if parent_real is not None:
        try:
            if not stat.S_ISLNK(os.lstat(path).st_mode):
                return parent_real / path.name
        except OSError:
            pass  # resolved below, which names the reason
    try:
        real = path.resolve(strict=True)
    except RuntimeError:  # Python < 3.13 reports a symlink loop so
        raise _Unreadable("a symlink loop") from None
    except OSError as e:
        why = "a symlink loop" if e.errno == errno.ELOOP else f"cannot be resolved ({e.strerror})"
        raise _Unreadable(why) from None
    if real != root_real and root_real not in real.parents:
        raise _Unreadable(f"a symlink out of the results tree (to {real})")
    return real


def _real_dir(directory: Path, root_real: Path) -> Path | None:
    """The real path of a directory `_subdirectory` accepted, for `_inside`'s shortcut; None
    (every file resolved in full) should it have changed since."""
    try:
        return _inside(directory, root_real)
    except _Unreadable:
        return None


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _read(path: Path, root_real: Path, parent_real: Path | None = None) -> bytes:
    """The bytes of a regular file inside the tree, at most MAX_FILE_BYTES; _Unreadable
    otherwise. Anything else is refused before it is opened: opening a FIFO could block or
    release a writer waiting on it, reading a device could never end."""
    return _read_identified(path, root_real, parent_real)[0]


def _read_identified(path: Path, root_real: Path, parent_real: Path | None = None) -> tuple[bytes, tuple[int, int]]:
    """`_read`, and the (st_dev, st_ino) of the file it read: which file that was, whichever
    link led there."""
    real = _inside(path, root_real, parent_real)
    try:
        st = os.stat(real)
        if not stat.S_ISREG(st.st_mode):
            raise _Unreadable(f"{_kind_of(st.st_mode)}, not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise _Unreadable(f"{st.st_size} bytes, over the limit of {MAX_FILE_BYTES} bytes for one file")
        # O_NONBLOCK and O_NOFOLLOW: should the path have been swapped for a FIFO or a link
        # since the checks above, the open neither waits nor follows it.
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except _Unreadable:
        raise
    except OSError as e:
        raise _Unreadable(e.strerror or str(e)) from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            raise _Unreadable("not a regular file")
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_FILE_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_FILE_BYTES:  # it grew while being read
            raise _Unreadable(f"over the limit of {MAX_FILE_BYTES} bytes for one file")
        return b"".join(chunks), (opened.st_dev, opened.st_ino)
    except _Unreadable:
        raise
    except OSError as e:
        raise _Unreadable(e.strerror or str(e)) from None
    finally:
        os.close(fd)


def _children(directory: Path, problems: list[Problem]) -> list[Path]:
    """The entries of `directory`, sorted by name; an unreadable directory is reported."""
    try:
        with os.scandir(directory) as it:
            names = sorted(entry.name for entry in it)
    except OSError as e:
        problems.append(Problem(str(directory), f"unreadable directory ({e.strerror or e}), skipped"))
        return []
    return [directory / n for n in names]


def _subdirectory(path: Path, root_real: Path, problems: list[Problem]) -> bool:
    """Whether `path` is a directory inside the tree to descend into. Links that loop, dangle
    or leave the tree, and entries that cannot be examined, are reported; files are not."""
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno != errno.ENOENT or os.path.islink(path):
            problems.append(Problem(str(path), f"cannot be examined ({e.strerror or e}), skipped"))
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    try:
        _inside(path, root_real)
    except _Unreadable as e:
        problems.append(Problem(str(path), f"{e}, skipped"))
        return False
    return True


def _utf8_name(path: Path, what: str, problems: list[Problem]) -> bool:
    """Whether the name of `path` (`what`: a machine directory, the machine column of its
    rows, or a result file, their file column) is text. Python keeps undecodable bytes of a
    file name as lone surrogates, which no page or export can encode (nor pandas store)."""
    try:
        path.name.encode("utf-8")
    except UnicodeEncodeError:
        problems.append(Problem(str(path), f"{what} name is not UTF-8, skipped; rename it"))
        return False
    return True


def _first_visit(path: Path, identity: tuple[int, int], seen: dict[tuple[int, int], Path], what: str,
                 problems: list[Problem]) -> bool:
    """Whether `path` is the first way to the file or directory `identity` (st_dev, st_ino)
    names. A symlink inside the tree or a hard link is a second way: its results would be
    counted twice, so they are read once, from the first, and the second reported."""
    first = seen.setdefault(identity, path)
    if first != path:
        problems.append(Problem(str(path), f"the same {what} as {first} (a link): its results are loaded once, "
                                           "from there"))
        return False
    return True
