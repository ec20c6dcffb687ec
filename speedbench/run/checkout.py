"""The checkout a `speedlib run` measures: where it is, its commits, what is uncommitted in
it, and the scratch directories and commit worktrees a run makes beside it.

Apart from speedbench/run/suite.py (which re-exports these names) because it is git and the
file system only: which commits a --commits range names, whether results would be filed
under a commit that did not produce them, and `_library_at`, the worktree that gives a
commit walk each commit's `speedlib/`; `prune_stale` removes what killed runs left of them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from speedbench.results.common import printable
from speedbench.run.errors import SuiteError

CONFIG = "asv.conf.json"


def find_root(start: Path | None = None) -> Path:
    """The directory holding asv.conf.json, from `start` (default: cwd) upwards."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / CONFIG).is_file():
            return d
    raise SuiteError(f"no {CONFIG} in {here} or its parents: run speedlib from a speedlib checkout")


def _git(root: Path, *args: str, strip: bool = True) -> str:
    """git's output; `strip=False` keeps it byte for byte (porcelain output starts with a
    status column that may be a space). A failure is one printable line, git's first (the
    rest is advice or a usage screen): git echoes revisions as given, and --commits comes
    from the command line."""
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True)
    except subprocess.CalledProcessError as e:
        said = (e.stderr.strip().splitlines() or [""])[0]
        raise SuiteError(printable(f"git {' '.join(args)} failed: {said}")) from e
    return out.stdout.strip() if strip else out.stdout


# A source tree copied to an offline host (a batch node, a borrowed GPU) often arrives
# without .git; asv files results under commits, so git history has to come back first.
RESTORE_GIT = ("git init -q -b main && git fetch -q BUNDLE main && git reset -q FETCH_HEAD "
               "(BUNDLE made where the history is: git bundle create speedlib.bundle main)")


def resolve_commits(root: Path, spec: str | None) -> list[str]:
    """Full hashes, oldest first: HEAD, every commit of 'A..B', or one revision."""
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True)
    # A copy without .git inside some other repository would find that one's HEAD.
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != Path(root).resolve():
        raise SuiteError(f"{root} is not a git checkout, and results are filed under commits: restore its "
                         f"history from a bundle: {RESTORE_GIT}")
    if not spec:
        return [_git(root, "rev-parse", "HEAD")]
    if ".." in spec:
        shas = _git(root, "rev-list", "--reverse", spec).split()
        if not shas:
            raise SuiteError(f"commit range {spec!r} is empty")
        return shas
    return [_git(root, "rev-parse", "--verify", f"{spec}^{{commit}}")]


# What a run takes from the checkout: everything for a plain run (filed under HEAD); with
# --commits the library comes from each commit, the benchmarks, harness and config still
# from the checkout.
_CHECKOUT_PARTS = ("speedlib", "speedbench", "benchmarks", CONFIG)
_HARNESS_PARTS = ("speedbench", "benchmarks", CONFIG)
# Python's caches appear beside any module that ran (a scratch copy has no .gitignore).
_NOT_CODE = (":(exclude,glob)**/__pycache__/**", ":(exclude,glob)**/*.pyc")


def _dirty(root: Path, parts: Sequence[str] = _CHECKOUT_PARTS) -> list[str]:
    """The paths of changed and untracked files under `parts`: an untracked benchmark runs as
    surely as an edited one. Read with -z: each entry is 'XY path' exactly (no quoting, no
    stripped status column), a rename's original path following as an entry of its own."""
    out = _git(root, "status", "--porcelain", "-z", "--untracked-files=all", "--", *parts, *_NOT_CODE,
               strip=False)
    entries = iter(out.split("\0"))
    paths = []
    for entry in entries:
        if len(entry) < 4:
            continue  # the empty string after the last NUL
        paths.append(entry[3:])
        if entry[0] in "RC":
            next(entries, None)  # the path it was renamed or copied from
    return paths


# In each scratch directory a run makes (its asv config, a commit's worktree): the run's pid,
# so that a later run can tell what a killed one left behind.
_OWNER = "owner.pid"


def _claim(scratch: Path) -> None:
    (scratch / _OWNER).write_text(str(os.getpid()))


def _owner_gone(scratch: Path) -> bool:
    """Whether the run that made `scratch` has ended. A directory without an owner file is
    not known to be a run's (or is being set up): left alone."""
    try:
        pid = int((scratch / _OWNER).read_text())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


def prune_stale(root: Path) -> list[Path]:
    """Remove what runs killed outright (SIGKILL, a lost machine) left: their scratch
    directories and commit worktrees under the temporary directory, where the owner process
    is gone; then `git worktree prune` forgets worktrees whose directory no longer exists."""
    removed = []
    for scratch in sorted(Path(tempfile.gettempdir()).glob("speedlib-*")):
        if scratch.is_symlink() or not scratch.is_dir() or not _owner_gone(scratch):
            continue
        if (scratch / "tree").exists():
            subprocess.run(["git", "worktree", "remove", "--force", str(scratch / "tree")], cwd=root,
                           capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
        removed.append(scratch)
    subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)
    return removed


class _library_at:
    """Context manager: a directory on whose path `speedlib` is the package at commit `sha`,
    and nothing else.

    The commit is checked out as a worktree, but the directory handed to the benchmarks
    holds only a link to its `speedlib/`: a commit's own `speedbench/` (timers, memory
    counters, workloads) must never replace the checkout's, or a harness change would
    show up as a technique's regression."""

    def __init__(self, root: Path, sha: str, use_checkout: bool):
        self.root, self.sha, self.use_checkout = root, sha, use_checkout
        self.scratch: Path | None = None

    def __enter__(self) -> Path:
        if self.use_checkout:
            return self.root
        self.scratch = Path(tempfile.mkdtemp(prefix=f"speedlib-{self.sha[:8]}-"))
        try:
            _claim(self.scratch)
            tree, only_library = self.scratch / "tree", self.scratch / "path"
            _git(self.root, "worktree", "add", "--detach", "--force", str(tree), self.sha)
            only_library.mkdir()
            (only_library / "speedlib").symlink_to(tree / "speedlib", target_is_directory=True)
        except BaseException:  # a failed or interrupted set-up: no __exit__ will remove it
            self.__exit__()
            raise
        return only_library

    def __exit__(self, *exc) -> None:
        if self.scratch is not None:
            # A group of its own: a Ctrl+C at the terminal during the cleanup must not kill it.
            subprocess.run(["git", "worktree", "remove", "--force", str(self.scratch / "tree")],
                           cwd=self.root, capture_output=True, process_group=0)
            shutil.rmtree(self.scratch, ignore_errors=True)
