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
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Behind", "behind", "technique_files", "ROOT"]

ROOT = Path(__file__).resolve().parents[2]  # the checkout speedbench runs from


@dataclass(frozen=True)
class Behind:
    """`commits` since the figure's commit; `changed` of them touched `files` (the technique's code)."""

    commit: str
    commits: int
    changed: int
    files: tuple[str, ...]

    def __str__(self) -> str:
        code = self.files[0] + (f" and {len(self.files) - 1} module(s) it imports" if len(self.files) > 1 else "")
        since = f"changed in {self.changed} of them" if self.changed else "unchanged since"
        return f"measured at {self.commit[:8]}, {self.commits} commits behind HEAD; {code} {since}"


def _imports(path: Path) -> set[str]:
    """The speedlib modules `path` imports (speedlib.x, `from speedlib import x`, relative)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("speedlib.")}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1 or module == "speedlib" or module.startswith("speedlib."):
                inner = module.removeprefix("speedlib").lstrip(".") if node.level == 0 else module
                found |= {inner.split(".")[0]} if inner else {a.name for a in node.names}
    return found


@functools.cache
def technique_files(name: str, root: Path = ROOT) -> tuple[str, ...]:
    """speedlib/<name>.py and the private modules (speedlib/_*.py) it imports, those modules'
    own included: the code a technique's figures measure."""
    package = root / "speedlib"
    todo, seen = [name], []
    while todo:
        module = todo.pop()
        path = package / f"{module}.py"
        if module in seen or not path.is_file():
            continue
        seen.append(module)
        todo += sorted(m for m in _imports(path) if m.startswith("_") and m != "__init__")
    return tuple(f"speedlib/{m}.py" for m in sorted(seen, key=lambda m: (m != name, m)))


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
    counted = _count(root, head, commit, files)
    return None if counted is None else Behind(commit, *counted, files)
