"""What guards a results tree: the lock that lets one run or merge write at a time, the check that a
directory can be written, and the errors they and the tree raise (speedbench.results.tree re-exports them)."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from speedbench.results.common import printable

try:
    import fcntl
except ImportError:  # not a POSIX system: runs are not locked against each other
    fcntl = None

__all__ = ["ResultsError", "TreeBusy", "ResultsLock", "check_writable"]


class ResultsError(RuntimeError):
    """A results tree (or a directory asked for) cannot be used; the message says how to fix it."""


class TreeBusy(ResultsError):
    """Another run or merge holds the results tree's lock."""


class ResultsLock:
    """Context manager: an exclusive lock on a results directory (the directory itself: no
    lock file to commit), held until the run or merge ends however it ends (the kernel drops it
    with the process). Two runs writing one directory would each rewrite a commit's result file,
    and the one finishing last would keep only its own benchmarks: the second one refuses
    (TreeBusy). A directory created only to be locked is removed again if it was left empty."""

    def __init__(self, root: Path):
        self.results_dir = Path(root)
        self.fd: int | None = None
        self.created = False

    def __enter__(self) -> ResultsLock:
        if fcntl is None:
            return self
        self.created = not self.results_dir.exists()
        try:
            self.results_dir.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.results_dir, os.O_RDONLY)
        except OSError as e:  # checked to be writable before; this is what changed since
            raise ResultsError(f"cannot use {printable(str(self.results_dir))} for results ({e.strerror or e}): "
                               "give the run another with --results-dir") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self.fd)
            self.fd = None
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ResultsError(f"cannot lock {printable(str(self.results_dir))} against other runs "
                                   f"({e.strerror or e}): give the run another --results-dir") from None
            raise TreeBusy(f"another speedlib run is writing to {printable(str(self.results_dir))}: wait for "
                           "it to finish, or give this one its own --results-dir") from None
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
        if self.created:
            try:
                self.results_dir.rmdir()  # only if empty: a failed first run leaves nothing behind
            except OSError:
                pass


def check_writable(directory: Path, what: str, instead: str) -> None:
    """ResultsError, one line ("`what` cannot be written: why; `instead`"), unless this user can
    write to `directory` or create it (its nearest existing ancestor is a writable directory).
    Asked before anything is measured: asv and an archive would find out only afterwards, and
    the results with nowhere to go."""
    existing = Path(directory)
    while not _exists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ResultsError(f"{what} cannot be written: {printable(str(existing))} is not a directory; {instead}")
    # Each permission said apart: a directory without x cannot be entered, whatever its w says.
    if not os.access(existing, os.X_OK):
        writable = os.access(existing, os.W_OK)
        why = ("cannot be entered (no execute permission)" if writable
               else "cannot be entered or written (no execute or write permission)")
        raise ResultsError(f"{what} cannot be written: {printable(str(existing))} {why} by this user; {instead}")
    if not os.access(existing, os.W_OK):  # a read-only mount too, for root as well
        raise ResultsError(f"{what} cannot be written: {printable(str(existing))} is read-only for this user; "
                           f"{instead}")
    # os.access says yes to root wherever the mode allows, and /proc or a full quota says no
    # only when a file is made: one is made, and removed at once.
    try:
        fd, probe = tempfile.mkstemp(prefix=".speedlib-probe-", dir=existing)
    except OSError as e:
        raise ResultsError(f"{what} cannot be written: no file can be made in {printable(str(existing))} "
                           f"({e.strerror or e}); {instead}") from None
    os.close(fd)
    os.unlink(probe)


def _exists(path: Path) -> bool:
    """path.exists(), False where a directory above it cannot be entered (stat says EACCES): the
    walk goes on up to that directory, and the check names the permission it lacks."""
    try:
        return path.exists()
    except OSError:
        return False
