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
import hashlib
import io
import os
import subprocess
import tarfile
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from speedbench.results import pickled

__all__ = ["Behind", "behind", "behind_all", "technique_files", "ROOT"]

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


# one parse at a time: CPython 3.11's parser keeps its recursion depth per interpreter, and two
# threads parsing at once (behind_all's) fail with "AST constructor recursion depth mismatch"
_PARSING = threading.Lock()


def _statements(tree: ast.AST):
    """Every statement of `tree`, nested ones included: an import is a statement, and no
    expression holds one, so the expressions (most of a file's nodes) are never walked."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo += [c for c in ast.iter_child_nodes(node) if isinstance(c, (ast.stmt, ast.excepthandler, ast.match_case))]


@functools.lru_cache(maxsize=1024)
def _imports(text: str) -> frozenset[str]:
    """The top-level speedlib modules a file imports (speedlib.x, `from speedlib import x`, relative)."""
    found: set[str] = set()
    try:
        with _PARSING:
            tree = ast.parse(text)
    except SyntaxError:  # an old commit's broken file: nothing to follow
        return frozenset()
    for node in _statements(tree):
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
def _since(root: Path, head: str, commit: str) -> str | None:  # one per commit, whichever technique asks
    return _git(root, "rev-list", "--count", f"{commit}..{head}")


@functools.lru_cache(maxsize=512)
def _count(root: Path, head: str, commit: str, files: tuple[str, ...]) -> tuple[int, int] | None:
    since = _since(root, head, commit)
    changed = _git(root, "rev-list", "--count", f"{commit}..{head}", "--", *files)
    return None if since is None or changed is None else (int(since), int(changed))


def _is_hash(commit: str) -> bool:  # nothing from a result file may reach git as an option or a range
    return bool(commit) and all(c in "0123456789abcdef" for c in commit.lower())


@functools.lru_cache(maxsize=512)
def _known(root: Path, commit: str) -> bool:  # a commit object stays one: asked once per commit
    return _git(root, "cat-file", "-e", f"{commit}^{{commit}}") is not None


def behind(commit: str, technique: str, root: Path = ROOT, head: str | None = None) -> Behind | None:
    """How far `commit` is behind `root`'s HEAD (`head`: its hash, where the caller has just read
    it) for `technique`'s figures, or None where git, the checkout or the commit is missing (the
    commit must be a full or abbreviated hash)."""
    files = technique_files(technique, root)
    if not files or not _is_hash(commit):
        return None
    head = head or _git(root, "rev-parse", "HEAD")
    if head is None or not _known(root, commit):
        return None
    # The files now, at the figure's commit and just before each commit since that removed or
    # renamed files of speedlib/: a commit that changed the technique's code under paths it no
    # longer has (before speedlib/<name>.py became a package, say) is counted too.
    then = {f for c in (commit, *(f"{m}^" for m in _moves(root, commit, head)))
            for f in technique_files(technique, root, c)}
    counted = _count(root, head, commit, tuple(sorted({*files, *then})))
    return None if counted is None else Behind(commit, *counted, files)


def behind_all(pairs: Iterable[tuple[str, str]], root: Path = ROOT) -> dict[tuple[str, str], Behind | None]:
    """`behind(commit, technique)` for every (commit, technique) of `pairs`, against one reading
    of HEAD. Each answer is a few `git` runs that wait on git, not on Python: they run side by
    side (a chart's 19 cells took a second one after another on 2 cores). The answers are kept
    on disk for the next process, keyed by HEAD, the pairs and the checkout's speedlib/ files
    (the code a figure is compared with)."""
    pairs = list(dict.fromkeys(pairs))
    head = _git(root, "rev-parse", "HEAD")
    if head is None or not pairs:
        return dict.fromkeys(pairs)
    path, key = _kept_as(root, head, pairs)
    found = pickled.read(path, key, dict)
    if found is not None:
        return found
    with ThreadPoolExecutor(max_workers=4) as pool:
        # what each commit needs whatever the technique first, once (two threads asking for the
        # same commit's tree would both run `git archive`), then each pair's own count
        list(pool.map(lambda c: _per_commit(root, head, c), dict.fromkeys(c for c, _ in pairs)))
        found = dict(zip(pairs, pool.map(lambda p: behind(*p, root, head), pairs), strict=True))
    pickled.write(path, key, found)
    pickled.trim(path.parent, "behind-*.pickle", 16)
    return found


def _kept_as(root: Path, head: str, pairs: list[tuple[str, str]]) -> tuple[Path, str]:
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(f"{os.path.realpath(root)}\0{head}\0{pairs!r}\0".encode(errors="surrogateescape"))
    for f in sorted((root / "speedlib").rglob("*.py")):  # uncommitted edits move the files' answers too
        try:
            st = f.stat()
        except OSError:
            continue
        h.update(f"{f.relative_to(root)} {st.st_size} {st.st_mtime_ns}\n".encode(errors="surrogateescape"))
    key = h.hexdigest()
    return pickled.cache_dir() / f"behind-{key[:32]}.pickle", key


def _per_commit(root: Path, head: str, commit: str) -> None:
    if _is_hash(commit) and _known(root, commit):
        _since(root, head, commit)
        for c in (commit, *(f"{m}^" for m in _moves(root, commit, head))):
            _tree_at(root, c)
