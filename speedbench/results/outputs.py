"""The one rule for a path a user names for a command's output: `speedlib report -o`, `speedlib
publish --chart` and `--output`, `speedlib run --archive` and `speedlib slot --archive`, `speedlib
slurm --shared`. Each command checks its outputs here before it starts any work, and a refusal
is one line naming the option, the path and why (`OutputRefused`; the commands exit 2):

- Never among a results tree's files. A path at or under a results tree is refused: the trees
  the command reads or writes, and any directory holding asv's listing (benchmarks.json) or a
  machine directory (one holding machine.json) on the path's way up. Written there, an output
  replaces the listing, a result file or machine.json, or is read as a result (`publish --chart
  R/benchmarks.json` emptied the tree `report` then read).
- A file (`file_output`): a character device or a FIFO there (/dev/null, /dev/stdout, a pipe
  someone reads) is written in place, a regular file or nothing is written aside and renamed over
  (speedbench.results.atomic, `written`); anything else there (a directory, a block device, a
  socket) is refused. So is a FIFO where the command must end by a deadline: opening one waits
  for a reader for as long as it takes (a slot's archive waited 200 s past a three-second slot).
- A directory (`directory_output`): the command's files are built in a directory beside it and
  renamed into place whole (`built_whole`), so a full disk or a kill leaves the old directory or
  the new one, never part of one; an existing directory holding anything the command does not
  write there is refused, since replacing it would lose that. A directory the command only adds
  to (Slurm's shared directory) is checked the same way and then used as it is.
- Where it goes must be writable: the nearest existing directory above it a directory this user
  can write (the results tree's writable check), no name in it longer than the file system takes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from speedbench.results.atomic import sync_dir, written_whole
from speedbench.results.common import printable
from speedbench.results.lock import ResultsError, check_writable
from speedbench.results.tree import BENCHMARKS, MACHINE_FILE

__all__ = ["OutputRefused", "file_output", "directory_output", "written", "built_whole", "tree_holding"]


class OutputRefused(ResultsError):
    """A path named for an output cannot take it; the message is one line naming the path and why."""


def _shown(path) -> str:
    """`path` for a message: printable, and cut in the middle past 160 characters (a 300-character
    name filled two screen lines with the line that refused it)."""
    text = printable(str(path))
    return text if len(text) <= 160 else f"{text[:90]}...{text[-60:]}"


def _refused(option: str, path, why: str) -> OutputRefused:
    return OutputRefused(f"{option} {_shown(path)} {why}")


def _mode(path: Path, option: str) -> int | None:
    """The mode of what `path` names, through links (None: nothing there, a dangling link included);
    OutputRefused where it cannot be examined (a name too long, a file where a directory goes)."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ENOTDIR:
            return None  # a file on the way: the writable check names it
        if e.errno == errno.ELOOP:
            raise _refused(option, path, "cannot be used: it is a loop of symbolic links") from None
        raise _refused(option, path, f"cannot be used: {e.strerror or e}") from None


def tree_holding(path: Path, trees: Iterable[Path] = ()) -> str | None:
    """Which results tree `path` (where links lead) lies at or under, in words, or None: one of
    `trees`, or a directory on its way up that holds asv's listing or is a machine directory."""
    real = Path(os.path.realpath(path))
    for tree in trees:
        root = Path(os.path.realpath(tree))
        if real == root or root in real.parents:
            return f"the results tree {printable(str(tree))}"
    for directory in (real, *real.parents):
        for name, what in ((MACHINE_FILE, "the machine directory"), (BENCHMARKS, "the results tree")):
            try:
                found = stat.S_ISREG(os.stat(directory / name).st_mode)
            except OSError:
                found = False
            if found:
                return f"{what} {printable(str(directory))}"
    return None


def _not_in_a_tree(path: Path, option: str, trees: Iterable[Path]) -> None:
    where = tree_holding(path, trees)
    if where is not None:
        raise _refused(option, path, f"is inside {where}: an output there would replace or join its results; "
                                     "name a path outside it")


def _name_fits(path: Path, option: str) -> None:
    """Every name on `path` within the file system's limit (NAME_MAX, asked of the nearest existing
    directory): a name over it fails only when the file is made, after the work."""
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        limit = 255
    for name in path.parts:
        if len(os.fsencode(name)) > limit:
            raise _refused(option, path, f"cannot be used: a name in it is {len(os.fsencode(name))} bytes long, over "
                                         f"the {limit} this file system takes")


def _writable_parent(path: Path, option: str) -> None:
    try:
        check_writable(path.parent, f"{option} {_shown(path)}", "name a path in a directory you can write to")
    except ResultsError as e:
        raise OutputRefused(str(e)) from None


def file_output(path, option: str, trees: Iterable[Path] = (), deadline: str | None = None) -> Path:
    """`path`, checked as a file the command will write (`written`): OutputRefused else. With
    `deadline` (why the command must end in time), a FIFO is refused too: opening it waits for a reader."""
    path = Path(path)
    _name_fits(path, option)
    mode = _mode(path, option)
    _not_in_a_tree(path, option, trees)
    if mode is not None:
        if stat.S_ISDIR(mode):
            raise _refused(option, path, "is a directory: name the file to write")
        if stat.S_ISFIFO(mode) and deadline:
            raise _refused(option, path, f"is a FIFO: opening it waits until something reads it, and {deadline}; "
                                         "name a file")
        if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
            raise _refused(option, path, "is a block device or socket, not a file to write")
        if not stat.S_ISREG(mode):
            return path  # a device or a FIFO: written in place, in whatever directory it is
    elif os.path.islink(path):
        raise _refused(option, path, f"is a link to nothing ({printable(os.readlink(path))}): name the file itself")
    _writable_parent(path, option)
    return path


@contextlib.contextmanager
def written(path: Path) -> Iterator:
    """The binary file to write `path`'s new content into (speedbench.results.atomic.written_whole),
    its missing parent directories made first."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with written_whole(Path(path)) as f:
        yield f


def directory_output(path, option: str, trees: Iterable[Path] = (),
                     writes: Callable[[str, bool], bool] | None = None) -> Path:
    """`path`, checked as a directory the command writes: OutputRefused else. `writes(name, is_dir)`
    says whether the command writes that entry there; an existing directory holding any other entry
    is refused (`built_whole` would replace it). Without `writes`, the command only adds to it."""
    path = Path(path)
    _name_fits(path, option)
    mode = _mode(path, option)
    if mode is None and os.path.islink(path):
        raise _refused(option, path, f"is a link to nothing ({printable(os.readlink(path))}): name the directory "
                                     "itself")
    _not_in_a_tree(path, option, trees)
    if mode is not None and not stat.S_ISDIR(mode):
        kind = ("a file" if stat.S_ISREG(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a directory")
        raise _refused(option, path, f"is {kind}: name a directory (it is made if missing)")
    if mode is not None and writes is not None:
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError as e:
            raise _refused(option, path, f"cannot be read: {e.strerror or e}") from None
        foreign = [e.name for e in entries if not writes(e.name, e.is_dir(follow_symlinks=False))]
        if foreign:
            shown = ", ".join(printable(n) for n in foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise _refused(option, path, f"holds {len(foreign)} entr(y/ies) this command does not write ({shown}): "
                                         "it replaces the directory whole, and they would be lost; name a new or "
                                         "empty directory, or one it wrote before")
    # built beside it (built_whole) or added to in place: either way its parent is where files are made
    real = Path(os.path.realpath(path))
    if mode is None:
        _writable_parent(path, option)
    elif writes is not None:
        _writable_parent(real, option)
    else:
        try:
            check_writable(real, f"{option} {_shown(path)}", "name a directory you can write to")
        except ResultsError as e:
            raise OutputRefused(str(e)) from None
    return path


@contextlib.contextmanager
def built_whole(path: Path) -> Iterator[Path]:
    """A new, empty directory beside `path` (where a link at `path` leads) to build its new content
    in; on leaving the block it takes `path`'s place whole, and the old one is removed. An exception,
    a full disk or a kill before then leaves `path` as it was (and no part of the new one there)."""
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    new = Path(tempfile.mkdtemp(prefix=f".{_short(path.name)}.", suffix=".partial", dir=path.parent))
    try:
        yield new
        for entry in new.rglob("*"):  # mkdtemp's 0700 (and the pages' own) would hide them from a web server
            entry.chmod(0o755 if entry.is_dir() else 0o644)
        new.chmod(0o755)
        if os.path.lexists(path):
            old = Path(tempfile.mkdtemp(prefix=f".{_short(path.name)}.", suffix=".old", dir=path.parent))
            os.replace(path, old)  # an empty directory is replaced by a rename
            try:
                os.replace(new, path)
            except BaseException:
                os.replace(old, path)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(new, path)
        sync_dir(path.parent)
    finally:
        if new.exists():
            shutil.rmtree(new, ignore_errors=True)


def _short(name: str) -> str:
    """A name short enough to prefix a temporary directory's beside it."""
    return name if len(os.fsencode(name)) <= 100 else os.fsencode(name)[:100].decode("utf-8", "ignore")
