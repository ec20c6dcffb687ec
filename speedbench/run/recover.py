"""Bring back results set aside for nothing (`speedlib versions --recover`).

Before benchmarks/versions.json, a benchmark's asv version was a hash of its source text, so
a comment or a moved import set every older result aside. Such a result names no commit of
benchmark code, only that hash; this module finds the code behind it and its fingerprint
(speedbench.run.fingerprint), and where the ledger accepts that fingerprint as a version
(the code of that version, or code judged to measure the same: `speedlib versions --same
--at COMMIT`), the result's file is rewritten to carry that version. What was rewritten is
kept in the ledger (`asv`: the old hash and the code that produced it), so that a reader sees
which commits each version spans.

Which code produced a result: the commits whose benchmarks give that asv hash, no newer than
the run. A run filed under the checkout it measured (`speedlib run` without --commits,
`speedlib slot`: both refuse uncommitted benchmark or harness code) used that commit's code,
as its environment record shows; a commit walk used whatever checkout it ran from, so every
candidate must be accepted, or the result stays aside.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from speedbench.results.atomic import write_whole
from speedbench.results.common import printable
from speedbench.results.tree import BENCHMARKS, ENVIRONMENT_DIR, MACHINE_FILE, ResultsTree
from speedbench.run import ledger
from speedbench.run.fingerprint import FingerprintError, SourceTree, fingerprint

# What discovers a tree's asv versions: asv_runner, in a process of its own whose path is
# that tree (an old commit's benchmarks import its own harness).
_DISCOVER = """
import io, json, sys
sys.path.insert(0, sys.argv[1])
from asv_runner.discovery import list_benchmarks
out = io.StringIO()
list_benchmarks(sys.argv[1] + "/benchmarks", out)
print(json.dumps({b["name"]: b["version"] for b in json.loads(out.getvalue())}))
"""


@dataclass
class Recovered:
    """What a recovery found: per results file, how many entries it rewrote, and why the
    others stayed as they were."""

    rewritten: dict[str, int] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)  # reason -> entries


class History:
    """A repository's commits, with each one's asv versions and fingerprints, computed on
    demand and kept (a recovery asks about the same few commits again and again)."""

    def __init__(self, repo: Path, say: Callable[[str], None]):
        self.repo = Path(repo)
        self.say = say
        log = _git(self.repo, "log", "--format=%H %ct", "HEAD")
        self.time = {sha: int(t) for sha, t in (line.split() for line in log.splitlines())}
        self._trees: dict[str, str] = {}
        self._asv: dict[str, dict[str, str]] = {}
        self._fingerprints: dict[tuple[str, str], str | None] = {}

    def benchmarks_tree(self, sha: str) -> str | None:
        if sha not in self._trees:
            try:
                self._trees[sha] = _git(self.repo, "rev-parse", f"{sha}:benchmarks").strip()
            except FingerprintError:
                self._trees[sha] = ""
        return self._trees[sha] or None

    def asv_versions(self, sha: str) -> dict[str, str]:
        """{benchmark: asv version} as asv discovers them at `sha` (by its benchmarks tree)."""
        tree = self.benchmarks_tree(sha)
        if tree is None:
            return {}
        if tree not in self._asv:
            self.say(f"discovering the benchmarks of {sha[:8]}")
            self._asv[tree] = _discover(self.repo, sha)
        return self._asv[tree]

    def candidates(self, benchmark: str, version: str, before: float | None) -> list[str]:
        """Commits whose benchmarks give `benchmark` the asv `version`, none newer than `before`."""
        distinct: dict[str, str] = {}
        for sha in self.time:
            tree = self.benchmarks_tree(sha)
            if tree is not None:
                distinct.setdefault(tree, sha)
        trees = {t for t, sha in distinct.items() if self.asv_versions(sha).get(benchmark) == version}
        return [sha for sha in self.time if self.benchmarks_tree(sha) in trees
                and (before is None or self.time[sha] <= before)]

    def fingerprint(self, sha: str, benchmark_class: str) -> str | None:
        key = (sha, benchmark_class)
        if key not in self._fingerprints:
            try:
                self._fingerprints[key] = fingerprint(SourceTree.commit(self.repo, sha), benchmark_class).digest
            except FingerprintError:
                self._fingerprints[key] = None
        return self._fingerprints[key]


def _git(repo: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout
    except subprocess.CalledProcessError as e:
        raise FingerprintError(f"git {' '.join(args[:2])} failed: {e.stderr.strip()}") from e


def _discover(repo: Path, sha: str) -> dict[str, str]:
    """asv's view of the benchmarks at `sha`: exported (no worktree), then discovered."""
    with tempfile.TemporaryDirectory(prefix="speedlib-discover-") as tmp:
        archive = subprocess.run(["git", "archive", "--format=tar", sha, "--", "benchmarks", "speedbench", "speedlib"],
                                 cwd=repo, capture_output=True)
        if archive.returncode != 0:
            return {}
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tmp, filter="data")
        return _discover_tree(Path(tmp))


def _discover_tree(root: Path) -> dict[str, str]:
    """{benchmark: version} as asv discovers the benchmarks of the tree at `root`, in a child
    process whose path is that tree ({} where they do not import)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPEEDLIB_DEVICE")}
    found = subprocess.run([sys.executable, "-c", _DISCOVER, str(root)], capture_output=True, text=True, env=env,
                           cwd=root, timeout=300)
    if found.returncode != 0:
        return {}
    try:
        return json.loads(found.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {}


def _run_command(machine_dir: Path, sha: str, started: float | None) -> str | None:
    """The command of the run that measured a result of `sha` started at `started` (epoch
    seconds): the first environment record written at or after it (speedbench.run.records
    writes one as each run of a commit ends); None where none says."""
    record = machine_dir / ENVIRONMENT_DIR / f"{sha[:8]}.jsonl"
    runs = []
    try:
        for line in record.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                runs.append((datetime.fromisoformat(entry["recorded_at"]).timestamp(), str(entry["command"])))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
    except OSError:
        return None
    after = sorted(r for r in runs if started is not None and r[0] >= started - 1)  # recorded_at has whole seconds
    return after[0][1] if after else None


def recover(root: Path, results: list[Path], say: Callable[[str], None] = print) -> Recovered:
    """Rewrite, in every result file under `results`, the entries whose asv-hash version the
    ledger of the checkout at `root` accepts (see the module's docstring); record the old
    hashes in the ledger. Returns what was rewritten and why the rest was not."""
    data = ledger.load(root)
    book = data["benchmarks"]
    accepted = {(name, digest): version for name, entry in book.items()
                for version, v in entry.get("versions", {}).items() for digest in v.get("fingerprints", {})}
    known = {(name, v) for name, entry in book.items() for v in entry.get("versions", {})}
    for tree_root in results:  # each a results tree with a listing this can rewrite, before any is touched
        _check_tree(ResultsTree(Path(tree_root)))
    history = History(root, say)
    out = Recovered()
    for tree_root in results:
        tree = ResultsTree(Path(tree_root))
        with tree.lock():
            for machine_dir in sorted(p for p in tree.root.iterdir() if (p / MACHINE_FILE).is_file()):
                for path in sorted(machine_dir.glob("*.json")):
                    if path.name == MACHINE_FILE:
                        continue
                    n = _recover_file(path, machine_dir, history, accepted, known, book, out)
                    if n:
                        out.rewritten[str(path)] = n
                        say(f"{path}: {n} result(s) now carry the version they measure")
            _relist(tree, book)
    ledger.save(root, data)
    return out


def _check_tree(tree: ResultsTree) -> None:
    """LedgerError, one line, unless `tree` is a results tree whose listing can be read and
    rewritten (a regular file of asv's JSON): found before any result file is rewritten."""
    if not tree.root.is_dir():
        raise ledger.LedgerError(f"--recover {printable(str(tree.root))} is not a results directory")
    try:
        listing = json.loads(tree.benchmarks.read_text(encoding="utf-8")) if tree.benchmarks.is_file() else {}
    except (OSError, ValueError, RecursionError) as e:
        raise ledger.LedgerError(f"--recover {printable(str(tree.root))}: its {BENCHMARKS} cannot be read "
                                 f"({printable(str(e))[:200]}): restore it first") from None
    if not isinstance(listing, dict):
        raise ledger.LedgerError(f"--recover {printable(str(tree.root))}: its {BENCHMARKS} is not asv's listing")


# Why a file's entries stay as they were where it cannot be read as asv's.
_UNREADABLE = "in a file that is not a readable asv result file (left as it was; speedlib report names it)"


def _result_doc(path: Path) -> dict | None:
    """The asv result file at `path`, or None where it is not one this can rewrite safely."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8")) if path.is_file() and not path.is_symlink() else None
    except (OSError, ValueError, RecursionError):
        return None
    ok = (isinstance(doc, dict) and isinstance(doc.get("result_columns"), list) and "version" in doc["result_columns"]
          and isinstance(doc.get("results"), dict) and isinstance(doc.get("commit_hash"), str)
          and all(isinstance(row, list) and len(row) > doc["result_columns"].index("version")
                  for row in doc["results"].values()))
    return doc if ok else None


def _recover_file(path: Path, machine_dir: Path, history: History, accepted: dict, known: set, book: dict,
                  out: Recovered) -> int:
    doc = _result_doc(path)
    if doc is None:
        out.kept[_UNREADABLE] = out.kept.get(_UNREADABLE, 0) + 1
        return 0
    columns = doc["result_columns"]
    at_version, at_start = columns.index("version"), columns.index("started_at") if "started_at" in columns else None
    sha = doc["commit_hash"]
    rewritten = 0
    for name, row in doc["results"].items():
        benchmark_class = name.rsplit(".", 1)[0]
        version = row[at_version]
        if not isinstance(version, str):
            continue  # not asv's: nothing to match a hash against
        if (benchmark_class, version) in known:
            continue  # already a hand-set version
        started = row[at_start] if at_start is not None and at_start < len(row) else None
        before = started / 1000 if isinstance(started, (int, float)) else None
        found = history.candidates(name, version, before)
        command = _run_command(machine_dir, sha, before)
        if command is not None and "--commits" not in command:  # it measured the checkout it is filed under
            found = [c for c in found if c == sha]
        digests = {history.fingerprint(c, benchmark_class) for c in found}
        versions = {accepted.get((benchmark_class, d)) for d in digests}
        if not found:
            why = "no commit's benchmarks give this asv version (uncommitted code, or another repository)"
        elif len(versions) != 1 or None in versions:
            why = "its code is not accepted as any version" if len(found) == 1 else \
                "its code is not known: several commits give this asv version, not all accepted as one version"
        else:
            new = versions.pop()
            row[at_version] = new
            recovered = book[benchmark_class]["versions"][new].setdefault("asv", {})
            code = set(recovered.get(version, "").split(", ")) - {""}
            recovered[version] = ", ".join(sorted(code | {c[:8] for c in found}))
            rewritten += 1
            continue
        out.kept[why] = out.kept.get(why, 0) + 1
    if rewritten:  # in asv's own layout: one line, keys in asv's order
        write_whole(path, json.dumps(doc).encode("utf-8"))
    return rewritten


def _relist(tree: ResultsTree, book: dict) -> None:
    """asv's listing names each benchmark's version: set it to the ledger's, so that asv's own
    tools and speedlib's loader take the rewritten results as current."""
    path = tree.root / BENCHMARKS
    if not path.is_file():
        return
    listing = json.loads(path.read_text(encoding="utf-8"))
    for name, entry in listing.items():
        if isinstance(entry, dict) and name.rsplit(".", 1)[0] in book:
            entry["version"] = book[name.rsplit(".", 1)[0]]["version"]
    write_whole(path, json.dumps(listing, indent=4).encode("utf-8"))  # asv's layout
