"""How far behind the checkout's HEAD a figure is: the commits since the one it was measured at,
and how many of them changed the technique's code in speedlib/ (`git log` on its files).

A GPU figure measured 200 commits ago still describes today's code where none of those commits
touched the technique's module; where some did, the reader should know before citing it. Read
from the checkout the dashboard runs in; nothing where there is no git, no checkout, or the
commit is not in its history (results copied from another clone).
"""

from __future__ import annotations

import ast
import functools
import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Behind", "behind", "technique_files", "ROOT"]

ROOT = Path(__file__).resolve().parents[2]  # the checkout speedbench runs from


@dataclass(frozen=True)
class Behind:
    """`commits` since the figure's commit; `changed` of them touched the technique's code: `files`
    (as the checkout has them), or the files it had at the figure's commit or before a move since."""

    commit: str
    commits: int
    changed: int
    files: tuple[str, ...]

    def __str__(self) -> str:
        if self.files[0].endswith("/__init__.py"):  # a package: its modules
            code = f"{self.files[0].removesuffix('__init__.py')} ({len(self.files)} modules)"
        else:
            code = self.files[0] + (f" and {len(self.files) - 1} module(s) it imports" if len(self.files) > 1 else "")
        since = f"changed in {self.changed} of them" if self.changed else "unchanged since"
        return f"measured at {self.commit[:8]}, {self.commits} commits behind HEAD; {code} {since}"


@functools.lru_cache(maxsize=1024)
def _imports(text: str) -> frozenset[str]:
    """The top-level speedlib modules a file imports (speedlib.x, `from speedlib import x`, relative)."""
    found: set[str] = set()
    try:
        tree = ast.parse(text)
    except SyntaxError:  # an old commit's broken file: nothing to follow
        return frozenset()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("speedlib.")}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1 or module == "speedlib" or module.startswith("speedlib."):
                inner = module.removeprefix("speedlib").lstrip(".") if node.level == 0 else module
                found |= {inner.split(".")[0]} if inner else {a.name for a in node.names}
    return frozenset(found)


@functools.cache
def technique_files(name: str, root: Path = ROOT, commit: str | None = None) -> tuple[str, ...]:
    """The code a technique's figures measure: speedlib/<name>.py and the private modules
    (speedlib/_*.py) it imports, those modules' own included; or, for a package
    speedlib/<name>/, every module in it (and any such private module they import). In the
    checkout, or at `commit` where given: a figure's commit may predate a move."""
    files = _checkout(root) if commit is None else _tree_at(root, commit)
    start = sorted(f for f in files if f.startswith(f"speedlib/{name}/")) or [f"speedlib/{name}.py"]
    todo, seen = list(start), []
    while todo:
        path = todo.pop()
        if path in seen or path not in files:
            continue
        seen.append(path)
        text = (root / path).read_text(encoding="utf-8") if files[path] is None else files[path]
        todo += sorted(f"speedlib/{m}.py" for m in _imports(text) if m.startswith("_") and m != "__init__")
    return tuple(sorted(seen, key=lambda f: (f not in start, f)))


def _checkout(root: Path) -> dict[str, None]:
    """speedlib/'s .py files in the checkout (read from disk when followed)."""
    return {p.relative_to(root).as_posix(): None for p in (root / "speedlib").rglob("*.py")}


@functools.lru_cache(maxsize=64)
def _tree_at(root: Path, commit: str) -> dict[str, str]:
    """speedlib/'s .py files at `commit` and their text, from one `git archive` ({} where git fails)."""
    try:
        done = subprocess.run(["git", "archive", "--format=tar", commit, "--", "speedlib"], cwd=root,
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if done.returncode != 0:
        return {}
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        return {m.name: tar.extractfile(m).read().decode("utf-8", "replace")
                for m in tar.getmembers() if m.isfile() and m.name.endswith(".py")}


@functools.lru_cache(maxsize=512)
def _moves(root: Path, commit: str, head: str) -> tuple[str, ...]:
    """The commits in commit..head that removed or renamed files of speedlib/."""
    return tuple((_git(root, "log", "--diff-filter=DR", "--format=%H", f"{commit}..{head}", "--", "speedlib")
                  or "").split())


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):  # no git, or a checkout that does not answer
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.lru_cache(maxsize=512)
def _count(root: Path, head: str, commit: str, files: tuple[str, ...]) -> tuple[int, int] | None:
    since = _git(root, "rev-list", "--count", f"{commit}..{head}")
    changed = _git(root, "rev-list", "--count", f"{commit}..{head}", "--", *files)
    return None if since is None or changed is None else (int(since), int(changed))


def behind(commit: str, technique: str, root: Path = ROOT) -> Behind | None:
    """How far `commit` is behind `root`'s HEAD for `technique`'s figures, or None where git,
    the checkout or the commit is missing (the commit must be a full or abbreviated hash)."""
    files = technique_files(technique, root)
    # a hash only: nothing from a result file may reach git as an option or a revision range
    if not files or not commit or not all(c in "0123456789abcdef" for c in commit.lower()):
        return None
    head = _git(root, "rev-parse", "HEAD")
    if head is None or _git(root, "cat-file", "-e", f"{commit}^{{commit}}") is None:
        return None
    # The files now, at the figure's commit and just before each commit since that removed or
    # renamed files of speedlib/: a commit that changed the technique's code under paths it no
    # longer has (before speedlib/<name>.py became a package, say) is counted too.
    then = {f for c in (commit, *(f"{m}^" for m in _moves(root, commit, head)))
            for f in technique_files(technique, root, c)}
    counted = _count(root, head, commit, tuple(sorted({*files, *then})))
    return None if counted is None else Behind(commit, *counted, files)
