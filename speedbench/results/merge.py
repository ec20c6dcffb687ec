"""Combine results from several hosts into one results tree (`speedlib merge`).

Why: a chunked run on two GPU nodes at once leaves two archives of one commit, each holding a
whole asv result file for it. Unpacking the second replaces the first, so one node's work was
lost (docs/gpu-slots.md). This module merges instead of unpacking.

What: the inputs are `.tar.gz` archives made by `speedlib run --archive` and results trees, in
any mix. Archives are read a member at a time, never extracted (speedbench.results.merge_sources,
which says what refuses an input: an unsafe or repeated member, a torn JSON file, a name its
content contradicts, a damaged archive), and combined in memory by speedbench.results.merge_rules.
Into the `--into` tree (default results/):
- a result file new there is added as it is; one of the same machine, commit and environment
  (the same file name) is merged benchmark by benchmark in asv's own format (asv's columns,
  the newest `date`, `durations` united), so `asv publish` and speedbench.results.load read it;
- environment records, chunk times and displaced entries are appended line by line, lines
  already there left out;
- a per-commit side file (`<machine>/gpu-tests/<commit>.json`, the GPU-only tests' verdict;
  `SIDE_DIRS`) is one entry, taken whole: added where missing, identical is nothing, different
  is a conflict;
- machine.json is taken where missing;
- benchmarks.json follows the newest listing, as asv rewrites it from the benchmarks it
  discovers on every run. A listing is as new as the latest `started_at` of its tree's results
  of the versions it lists (the run that wrote it; unknown counts as oldest, a tie keeps the
  one already there). Entries in both listings take the newer one's; entries in one only are
  kept (a benchmark removed since still needs its entry for its old results to load). A
  replaced entry is no loss: every row of a result file carries its benchmark's version, and
  the loader shows results of a version other than the listing's, marked (speedbench.results.load).
Identical entries are no conflict, so merging an archive twice changes nothing.

Conflicts: only one benchmark of one version measured twice for one machine, commit and
environment with other values, or one side file with two contents. Listings never conflict;
two versions of one benchmark in one result file are two measurements, of which asv's format
holds one: the one that started later stays, the other goes to `merge-displaced.jsonl`. By
default a conflict refuses the merge (exit 1, nothing written, one line per conflict with
both sources' start times). `--prefer newer` keeps the entry that started later (the one
already there on a tie) and writes each displaced entry whole, one JSON line, into
`merge-displaced.jsonl` in the machine's directory, so nothing is lost. Two sources whose
recorded hardware differs under one machine name (machine.json's cpu, arch, num_cpu, ram; the
environment records' GPU or CPU model) are always refused: rerun one with another `--machine`.

Atomic: under the results lock every target is checked (a file where a directory goes, a link
on the way: refused, nothing written), then every output file is written in full into
`.speedlib-merge/` inside the tree (same filesystem, not *.json: neither asv nor the loader
reads it), one at a time, then a journal naming the renames, then the renames. A merge stopped
before the journal leaves the tree as it was (the next merge removes the leftovers); one
stopped after it is rolled forward by the next merge or `speedlib run`, which first check that
the journal names only files a merge stages and paths inside the tree. A full disk stops the
merge before any rename.
"""

from __future__ import annotations

import functools
import json
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

from speedbench.results import safekeep
from speedbench.results.atomic import disk_full
from speedbench.results.merge_rules import _Merge
from speedbench.results.merge_sources import (
    BAD_INPUT,
    CONFLICTS,
    MergeError,
    _bad,
    _Raw,
    _read_dir,
    _read_source,
    _Tree,
    copy_whole,
    printable,
    rehearsals,
)
from speedbench.results.tree import (
    BENCHMARKS,
    DISPLACED,
    MACHINE_FILE,
    MERGE_STAGING,
    ResultsError,
    ResultsTree,
)

__all__ = ["MergeError", "merge", "recover", "STAGING", "DISPLACED", "CONFLICTS", "BAD_INPUT"]

STAGING = MERGE_STAGING


# --- writing -------------------------------------------------------------------------------

def _content(tree: _Tree, machine: str, inner: str) -> bytes | _Raw:
    """A file's new content; for one added whole, where to copy it from."""
    if not machine and inner == BENCHMARKS:
        if tree.listing_raw is not None:
            return tree.listing_raw
        return json.dumps(tree.listing, indent=4, sort_keys=True).encode()  # asv's write_json
    m = tree.machines[machine]
    if inner.endswith(".jsonl"):
        return b"".join(line.rstrip(b"\r\n") + b"\n" for line in m.lines[inner])
    if inner == MACHINE_FILE:
        return m.info_raw
    if inner in m.raw:  # added whole from one source
        return m.raw[inner]
    return json.dumps(m.results[inner]).encode()  # asv's compact result format


def recover(into: Path) -> list[str]:
    """Finish or drop what a stopped merge left in `into` (hold its lock): renames its journal
    names are completed; files staged before the journal was written are removed. MergeError,
    one line, where the journal names what no merge writes (`speedlib run` calls this too)."""
    try:
        done = ResultsTree(into).finish_staged()
    except ResultsError as e:
        raise MergeError(BAD_INPUT, [f"cannot settle what a stopped run left in {printable(str(into))}: "
                                     f"{printable(str(e))}"]) from None
    except OSError as e:
        raise MergeError(BAD_INPUT, [f"stopped while renaming into {printable(str(into))} ({e.strerror or e}); "
                                     "run speedlib merge again to finish"]) from None
    return [] if done is None else [f"finished a merge that was stopped while renaming its files ({done} file(s))"]


def _write(into: Path, files: list[tuple[str, Callable[[], bytes] | _Raw]]) -> None:
    """Stage `files` (path under `into`, its content made on demand or copied from a source),
    one at a time, then rename them under the journal. Every target is checked first: a file
    where a directory goes refuses the merge before anything is written."""
    try:
        with ResultsTree(into).staging([rel for rel, _ in files]) as staged:
            for rel, content in files:
                if not isinstance(content, _Raw):
                    with staged(rel) as f:
                        f.write(content())
            copy_whole([(rel, c) for rel, c in files if isinstance(c, _Raw)], staged)
    except ResultsError as e:
        raise _bad(f"cannot merge into {printable(str(into))}: {printable(str(e))}") from None
    except OSError as e:
        raise MergeError(BAD_INPUT, [f"could not write into {printable(str(into))} ({e.strerror or e})"
                                     f"{disk_full(e)}; it is as it was: free some space and merge again"]) from None
    recover(into)  # the renames


def merge(sources: Sequence[Path], into: Path, prefer: str | None = None, rehearsal: bool = False) -> list[str]:
    """Merge `sources` (archives, results trees) into the results tree `into`; the lines to
    print. MergeError (nothing written) on bad input, conflicts or a full disk, and for a slot
    rehearsed without a GPU unless `rehearsal` (its results would join a machine's history as
    if measured for it: the rehearsal of the H200 slot's command added a result file to a
    committed CPU machine and replaced the listing)."""
    into = Path(into)
    if prefer not in (None, "newer"):
        raise _bad(f"--prefer must be 'newer', got {printable(prefer)}")
    if into.exists() and not into.is_dir():
        raise _bad(f"--into {printable(str(into))} is not a directory")
    trees = [_read_source(Path(s)) for s in sources]
    for tree in trees:
        rehearsed = rehearsals(tree)
        if rehearsed and not rehearsal:
            raise _bad(f"{tree.label} is a slot rehearsed without a GPU ({', '.join(map(printable, rehearsed))} says "
                       "so): its results rehearse the command, they are not measurements to file; merge it with "
                       "--rehearsal to keep it anyway (into a scratch tree: --into DIR)")
    said = []
    try:
        with ResultsTree(into).lock():
            try:
                said += recover(into)
                said += safekeep.recover(into)  # what a killed `speedlib run` left torn
            except (OSError, ValueError, safekeep.SnapshotError) as e:
                raise MergeError(BAD_INPUT, [f"cannot settle what a stopped run left in {printable(str(into))}: "
                                             f"{printable(str(e))}"]) from None
            return said + _merge_locked(trees, into, prefer)
    except ResultsError as e:  # another run or merge holds it, or it cannot be locked
        raise MergeError(BAD_INPUT, [printable(str(e))]) from None


def _merge_locked(trees: list[_Tree], into: Path, prefer: str | None) -> list[str]:
    base = _read_dir(into, printable(str(into)), strict=False)
    m = _Merge(base, prefer)
    for tree in trees:  # said, never dropped without a word
        if tree.left_out:
            shown = ", ".join(tree.left_out[:5]) + (", ..." if len(tree.left_out) > 5 else "")
            m.said.append(f"left out of {tree.label}: {len(tree.left_out)} file(s) or directorie(s) no merge takes "
                          f"({shown}): copy them by hand if they matter")
    for tree in trees:
        m.listing(tree)  # first: its start times are the tree's own and those already merged
        for name, src in tree.machines.items():
            m.check_hardware(name, src, tree.label)
            m.machine(name, src, tree.label)
    if m.hardware:
        raise MergeError(CONFLICTS, [*(f"hardware differs: {h}" for h in m.hardware),
                                     "a machine name stands for one kind of hardware: rerun one of them with "
                                     "speedlib run --machine NEWNAME; nothing was written"])
    if m.conflicts:
        raise MergeError(CONFLICTS, [*(f"conflict: {c}" for c in m.conflicts),
                                     f"{len(m.conflicts)} entr(y/ies) measured twice with different data; nothing was "
                                     "written: --prefer newer keeps the later one and the other in "
                                     "merge-displaced.jsonl"])
    files: list[tuple[str, Callable[[], bytes] | _Raw]] = []
    for machine, inner in sorted(m.changed):
        rel = str(PurePosixPath(machine, inner)) if machine else inner
        data = _content(base, machine, inner)
        if isinstance(data, _Raw):  # added whole: new there
            files.append((rel, data))
        elif data != _old(into / rel):  # made again when it is written: no merge holds every file at once
            files.append((rel, functools.partial(_content, base, machine, inner)))
    for (machine, file), (added, replaced) in sorted(m.added.items()):
        if added or replaced:
            commit = base.machines[machine].results[file]["commit_hash"][:8]
            m.said.append(f"{printable(machine)} commit {printable(commit)}: {added} benchmark(s) added"
                          + (f", {replaced} replaced by newer ones" if replaced else ""))
    for (machine, inner), n in sorted(m.appended.items()):
        m.said.append(f"appended {n} line(s) to {printable(machine)}/{printable(inner)}")
    if not files:
        return [*m.said, f"nothing changed: {printable(str(into))} already holds everything in the sources"]
    _write(into, files)
    return [*m.said, f"{len(files)} file(s) written in {printable(str(into))}"]


def _old(path: Path) -> bytes | None:
    """What a file of the tree holds now; None for none (or no regular file: the target check says so)."""
    try:
        return path.read_bytes() if stat.S_ISREG(os.lstat(path).st_mode) else None
    except OSError:  # missing, or not to be read: written anew
        return None
