"""What `speedlib run` keeps in a results directory survives a full disk and a kill.

speedlib's own files (environment records, chunk times) grow a line at a time. A line is
added by writing the whole new content beside the file, flushing it to the disk and renaming
it over the old one: a full disk or a kill leaves the old file or the new one, never half a
line (speedbench.results.atomic's `append_line`).

asv's files cannot be written that way: asv rewrites the listing (benchmarks.json), the
machine's machine.json and a commit's result file in place, truncating each before writing
it. So before each asv run the files it may rewrite are copied into a snapshot,
`.speedlib-snapshot/` in the results directory, with a journal naming them (`take`). When asv
is done (`settle`):
- it succeeded: asv's files are kept (a torn one is still put back: asv cannot have meant it);
- it failed, was stopped, or the run was killed outright (the next run finds the journal,
  `recover`): a file asv left torn (not a JSON object: 0 bytes, cut short) is put back from
  the copy, and a torn file that was not there before is removed. A result file or
  machine.json that lost entries is put back too (asv only ever adds to them); a whole one
  is kept: asv saves a commit's results last, so it holds this run's results. The listing is
  rewritten from the benchmark code first thing (a removed benchmark drops out): it is kept
  when results were saved with it, and put back when none were, since the results already
  on disk were filed against the old one.
Putting a file back is a rename within the results directory, which needs no free space: a
full disk cannot stop it. The snapshot's files are not named *.json and it has no
machine.json, so neither asv nor speedlib's loader reads it as results.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# written_whole and disk_full are re-exported: `speedlib report --output` uses them as safekeep.X
from speedbench.results.atomic import disk_full, sync_dir, write_whole, written_whole
from speedbench.results.common import printable
from speedbench.results.tree import BENCHMARKS, JOURNAL, MACHINE_FILE, SNAPSHOT, ResultsTree

__all__ = ["SNAPSHOT", "SnapshotError", "Snapshot", "written_whole", "disk_full", "take", "settle", "recover"]

_COPY = ".saved"
_SAVED, _LEFT = "saved", "left"  # copied / there before but not a regular file: never touched


class SnapshotError(RuntimeError):
    """asv's files could not be copied or put back; the message says what to do."""


# --- asv's files -----------------------------------------------------------------------

@dataclass
class Snapshot:
    results_dir: Path
    commit: str
    patterns: list[str]  # relative paths (globs) asv may write during this run
    before: dict[str, str]  # relative path -> _SAVED or _LEFT, for what existed before it

    @property
    def directory(self) -> Path:
        return ResultsTree(self.results_dir).snapshot

    def copy_of(self, rel: str) -> Path:
        return self.directory / (rel + _COPY)


def _matching(results_dir: Path, patterns: list[str]) -> list[str]:
    found = set()
    for pattern in patterns:
        found.update(str(p.relative_to(results_dir)) for p in results_dir.glob(pattern)
                     if p.is_file() or p.is_symlink())
    return sorted(found)


def refuse_links(results_dir: Path, machine: str, sha: str) -> None:
    """SnapshotError where a run of `sha` would write through a link: asv truncates its files
    and writes them in place, and a slot writes its GPU test verdict."""
    results_dir = Path(results_dir)
    tree = ResultsTree(results_dir)
    mdir = tree.machine(machine)
    # a linked machine directory may lead elsewhere in the tree (the loader reads it as an alias), not out of it
    linked_out = [] if _stays_in(results_dir, f"{machine}/{MACHINE_FILE}") else [mdir.path]
    patterns = tree.asv_writes(machine, sha)
    for path in [*linked_out, *(results_dir / rel for rel in _matching(results_dir, patterns)), *mdir.run_writes(sha)]:
        if path.is_symlink():
            raise SnapshotError(f"{printable(str(path))} is a link (to {printable(os.readlink(path))}), and the run "
                                "would write through it: put what it links to there instead, or remove the link; "
                                "nothing was run or changed")


def take(results_dir: Path, machine: str, sha: str) -> Snapshot:
    """Copy the files an `asv run` of `sha` may rewrite, then write the journal that marks
    the snapshot whole. No room for the copy: SnapshotError, and nothing has changed."""
    results_dir = Path(results_dir)
    patterns = ResultsTree(results_dir).asv_writes(machine, sha)
    snapshot = Snapshot(results_dir, sha, patterns, {})
    refuse_links(results_dir, machine, sha)
    if snapshot.directory.is_symlink() or snapshot.directory.exists():
        _remove_unjournaled(snapshot.directory)
    try:
        snapshot.directory.mkdir(parents=True)
        for rel in _matching(results_dir, patterns):
            source = results_dir / rel
            if source.is_symlink() or not source.is_file():
                snapshot.before[rel] = _LEFT  # not asv's kind of file: asv fails on it, we leave it
                continue
            copy = snapshot.copy_of(rel)
            copy.parent.mkdir(parents=True, exist_ok=True)
            write_whole(copy, source.read_bytes())
            snapshot.before[rel] = _SAVED
        journal = {"commit": sha, "patterns": patterns, "before": snapshot.before}
        write_whole(snapshot.directory / JOURNAL, json.dumps(journal, indent=1).encode())
    except OSError as e:
        shutil.rmtree(snapshot.directory, ignore_errors=True)
        todo = "free some space" if disk_full(e) else "give the run a results directory it can write (--results-dir)"
        raise SnapshotError(f"could not copy asv's files into {snapshot.directory} before asv runs "
                            f"({e.strerror or e}){disk_full(e)}; nothing was run or changed: {todo} "
                            "and run again") from None
    return snapshot


def _remove_unjournaled(directory: Path) -> None:
    """A snapshot without a journal was being taken when its run was killed, before asv
    started: the files it copied are still in place, so it is only removed."""
    if directory.is_symlink() or not directory.is_dir():
        raise SnapshotError(f"{directory} is in the way of the copy a run keeps of asv's files: move it away")
    if (directory / JOURNAL).exists():
        raise SnapshotError(f"{directory} holds the files of a run that was not put back: run speedlib run, "
                            "which puts them back first")
    shutil.rmtree(directory)


def _load(path: Path) -> dict | None:
    """The JSON object in `path`; None when it is torn, missing or not an object."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _entries(data: dict) -> set[str]:
    """What asv only ever adds to a result file or machine.json: its keys, and a result
    file's benchmarks (asv loads the commit's earlier results and adds this run's)."""
    results = data.get("results")
    return set(data) | ({f"results/{name}" for name in results} if isinstance(results, dict) else set())


def _is_result(rel: str) -> bool:
    return rel != BENCHMARKS and PurePosixPath(rel).name != MACHINE_FILE


def _saved_results(snapshot: Snapshot, now: dict[str, dict | None]) -> bool:
    """Whether asv saved a result file in this run (whole, and new or changed)."""
    for rel, data in now.items():
        if not _is_result(rel) or data is None or snapshot.before.get(rel) == _LEFT:
            continue
        if rel not in snapshot.before:
            return True
        copy = snapshot.copy_of(rel)  # gone: put back already, so not saved by asv
        if copy.exists() and copy.read_bytes() != (snapshot.results_dir / rel).read_bytes():
            return True
    return False


def _verdicts(snapshot: Snapshot, failed: bool) -> dict[str, str]:
    """relative path -> "put back" / "removed", with why."""
    results_dir = snapshot.results_dir
    names = sorted(set(_matching(results_dir, snapshot.patterns)) | set(snapshot.before))
    now = {rel: _load(results_dir / rel) for rel in names if snapshot.before.get(rel) != _LEFT}
    results_saved = _saved_results(snapshot, now)
    verdicts = {}
    for rel, data in now.items():
        if rel not in snapshot.before:  # asv made it in this run
            if data is None and (results_dir / rel).exists():
                verdicts[rel] = "removed (torn, and not there before asv ran)"
            continue
        if not snapshot.copy_of(rel).exists():
            continue  # put back already, by a settle that was itself stopped
        if data is None:
            verdicts[rel] = "put back (torn)" if (results_dir / rel).exists() else "put back (missing)"
        elif not failed:
            continue
        elif rel == BENCHMARKS:
            # asv rewrites the listing from the benchmark code, dropping removed benchmarks:
            # right when results were saved against it, wrong for the results on disk if none were.
            if not results_saved and snapshot.copy_of(rel).read_bytes() != (results_dir / rel).read_bytes():
                verdicts[rel] = "put back (rewritten, but no results were saved with it)"
        elif _entries(_load(snapshot.copy_of(rel)) or {}) - _entries(data):
            verdicts[rel] = "put back (entries lost)"
    return verdicts


def _put_back(snapshot: Snapshot, rel: str) -> None:
    target, copy = snapshot.results_dir / rel, snapshot.copy_of(rel)
    try:
        os.replace(copy, target)  # a rename: no free space needed
    except OSError as e:
        if e.errno != errno.EXDEV:  # a machine directory linked to another disk: copied instead
            raise
        write_whole(target, copy.read_bytes())
        copy.unlink()
    sync_dir(target.parent)


def settle(snapshot: Snapshot, failed: bool) -> list[str]:
    """Put back or remove what asv left torn (see the module's docstring), then drop the
    snapshot. One line per file handled. SnapshotError if a file cannot be put back: the
    snapshot is then kept, and named, for the next run to finish."""
    done, problems = [], []
    for rel, verdict in _verdicts(snapshot, failed).items():
        try:
            if verdict.startswith("removed"):
                (snapshot.results_dir / rel).unlink()
            else:
                _put_back(snapshot, rel)
            done.append(f"{snapshot.results_dir / rel}: {verdict}")
        except OSError as e:
            problems.append((rel, e))
    if problems:
        rel, e = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        todo = "free some space and run" if disk_full(e) else "fix what stopped it and run"
        raise SnapshotError(f"could not put back {snapshot.results_dir / rel}{more} ({e.strerror or e})"
                            f"{disk_full(e)}; the copy from before the run is kept in {snapshot.directory}: {todo} "
                            "speedlib run again, which puts it back first")
    _drop(snapshot.directory)
    return done


def _drop(directory: Path) -> None:
    """The journal goes first: a snapshot without one is never read again."""
    (directory / JOURNAL).unlink(missing_ok=True)
    sync_dir(directory)
    shutil.rmtree(directory, ignore_errors=True)


def _journaled(results_dir: Path) -> Snapshot:
    """The snapshot a killed run left, as its journal describes it; SnapshotError if the
    journal is not one this module wrote (paths outside the results directory included)."""
    directory = ResultsTree(results_dir).snapshot
    data = _load(directory / JOURNAL)
    patterns = data.get("patterns") if data else None
    before = data.get("before") if data else None
    ok = (isinstance(patterns, list) and isinstance(before, dict) and isinstance(data.get("commit"), str)
          and all(isinstance(p, str) and _inside(p) and _stays_in(results_dir, p) for p in [*patterns, *before])
          and all(v in (_SAVED, _LEFT) for v in before.values())
          and all(any(fnmatch.fnmatchcase(rel, p) for p in patterns) for rel in before))
    if not ok:
        raise SnapshotError(f"{directory} holds a copy of asv's files whose journal cannot be read: compare "
                            f"{results_dir} with it, then remove it")
    return Snapshot(results_dir, data["commit"], patterns, before)


def _stays_in(results_dir: Path, rel: str) -> bool:
    """Whether the directory of `rel` (under `results_dir`) is in the results tree, links followed."""
    root, where = Path(results_dir).resolve(), (Path(results_dir) / rel).parent.resolve()
    return where == root or root in where.parents


def _inside(rel: str) -> bool:
    path = PurePosixPath(rel)
    return bool(rel) and not path.is_absolute() and ".." not in path.parts and "\\" not in rel


def recover(results_dir: Path) -> list[str]:
    """Settle, as failed, the snapshot a run killed outright left in `results_dir` (call it
    holding the results directory's lock, so that the run is known to be gone). One line
    per file handled; none when there was nothing to do."""
    directory = ResultsTree(results_dir).snapshot
    if not (directory.is_symlink() or directory.exists()):
        return []
    if directory.is_symlink() or not directory.is_dir() or not (directory / JOURNAL).exists():
        _remove_unjournaled(directory)
        return []
    return settle(_journaled(Path(results_dir)), failed=True)
