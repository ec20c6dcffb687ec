"""The results tree on disk: every path under a results root, and what guards it.

A results root holds asv's listing (`BENCHMARKS`) and one directory per machine (`MachineDir`):
asv's machine file and result files, and speedlib's own files beside them (environment records,
chunk times, the GPU tests' verdicts, entries a merge displaced). The loader, `speedlib run` and
its planner, `speedlib merge`, `speedlib slot` and `speedlib slurm` ask `ResultsTree` for a path
instead of spelling it. The tree also owns:
- the lock that lets one run or merge at a time write under the root (`lock`);
- the check that a directory can be written, made before anything is measured (`check_writable`);
- the markers a stopped run or merge leaves: safekeep's snapshot of asv's files, and the merge's
  staging directory with the journal of its renames (`stage`, `finish_staged`);
- the archive that carries a run's files to another checkout, laid out as `results/...` (`pack`,
  `archive_path`).
The lock, the writable check and `ResultsError` are speedbench.results.lock's, re-exported here.
Stdlib only: `speedlib --help` builds `speedlib merge`'s parser, which imports this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from speedbench.results.atomic import append_line, written_whole
from speedbench.results.common import printable
from speedbench.results.lock import ResultsError, ResultsLock, TreeBusy, check_writable

__all__ = ["ResultsTree", "MachineDir", "ResultsLock", "ResultsError", "TreeBusy", "check_writable", "archive_path",
           "inside", "machine_name_refused", "BENCHMARKS", "MACHINE_FILE", "ENVIRONMENT_DIR", "CHUNK_TIMES",
           "GPU_TESTS_DIR", "DISPLACED", "SNAPSHOT", "MERGE_STAGING", "JOURNAL", "CHECKOUT_RESULTS", "ARCHIVE_ROOT",
           "PLAIN_NAME", "MACHINE_NAME", "MACHINE_NAME_MAX"]

BENCHMARKS = "benchmarks.json"  # asv's listing, rewritten by every asv run
MACHINE_FILE = "machine.json"  # asv's description of a machine: what makes a directory a machine's
# speedlib's own files in a machine directory: not *.json where asv would read them as results
ENVIRONMENT_DIR = "environment"  # <commit8>.jsonl: one record per run of that commit
CHUNK_TIMES = "chunk-times.jsonl"
GPU_TESTS_DIR = "gpu-tests"  # <commit8>.json: the verdict of `speedlib slot`'s GPU tests (a subdirectory)
DISPLACED = "merge-displaced.jsonl"
# Leftovers of a stopped command, dot-directories that neither asv nor the loader reads
SNAPSHOT = ".speedlib-snapshot"  # asv's files as a run copied them before asv ran (safekeep)
MERGE_STAGING = ".speedlib-merge"  # a merge's files, written in full before they are renamed
JOURNAL = "journal"  # in either: what to put back or rename (not *.json: asv reads every .json)
CHECKOUT_RESULTS = "results"  # a checkout's committed tree (asv.conf.json's results_dir)
ARCHIVE_ROOT = CHECKOUT_RESULTS  # an archive unpacks in a checkout's root, into its results tree
# A name in a path a merge writes: nothing that climbs out ('..'), hides (a leading dot, as the
# tree's own staging and snapshot do) or holds a control character.
PLAIN_NAME = re.compile(r"[^./\x00-\x1f\x7f][^/\x00-\x1f\x7f]*\Z")
# An asv machine name is a directory under results/: one path component, nothing that
# climbs out (..), hides (a leading dot) or reads as an option (a leading dash).
MACHINE_NAME_MAX = 100
MACHINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
_STAGED = re.compile(r"[0-9]+\.new")  # a staged file's name (`staging`)


@dataclass(frozen=True)
class MachineDir:
    """One machine's directory in a results tree."""

    tree: ResultsTree
    name: str

    @property
    def path(self) -> Path:
        return self.tree.root / self.name

    @property
    def machine_file(self) -> Path:
        return self.path / MACHINE_FILE

    @property
    def environment_dir(self) -> Path:
        return self.path / ENVIRONMENT_DIR

    def environment_record(self, sha: str) -> Path:
        """Where a run of `sha` adds its environment record (a line per run)."""
        return self.environment_dir / f"{sha[:8]}.jsonl"

    def environment_records(self) -> list[Path]:
        return sorted(self.environment_dir.glob("*.jsonl"))

    @property
    def gpu_tests_dir(self) -> Path:
        return self.path / GPU_TESTS_DIR

    def verdict(self, sha: str) -> Path:
        """Where `speedlib slot` writes the verdict of `sha`'s GPU tests on this machine."""
        return self.gpu_tests_dir / f"{sha[:8]}.json"

    @property
    def chunk_times(self) -> Path:
        return self.path / CHUNK_TIMES

    @property
    def displaced(self) -> Path:
        return self.path / DISPLACED

    def run_writes(self, sha: str) -> list[Path]:
        """What a run of `sha` writes here besides asv's files (directories too): a link at any
        of them would take the write out of the tree (safekeep refuses one before asv runs)."""
        return [self.environment_dir, self.environment_record(sha), self.chunk_times, self.gpu_tests_dir,
                self.verdict(sha)]

    def check_run_writes(self, sha: str) -> None:
        """ResultsError, one line, unless every file a run or slot of `sha` writes here (asv's
        listing, machine file and result files of `sha`, the environment record, the chunk times,
        the GPU tests' verdict) can be written: each a regular file or missing, each directory on
        the way a directory or missing, none of them a link (`ResultsTree.check_target`). Asked
        before anything runs: a directory or a FIFO where the verdict goes was found only after
        the GPU tests had spent the slot's first minutes."""
        own = [ENVIRONMENT_DIR + "/" + self.environment_record(sha).name, CHUNK_TIMES,
               GPU_TESTS_DIR + "/" + self.verdict(sha).name, MACHINE_FILE]
        results = [p.name for p in self.path.glob(result_pattern(sha))] if self.path.is_dir() else []
        self.tree.check_target(BENCHMARKS)
        for rel in [*own, *results]:
            self.tree.check_target(f"{self.name}/{rel}")

    def result_files(self, sha: str) -> list[Path]:
        """asv's result files of `sha` here (one per environment asv names)."""
        return sorted(self.path.glob(result_pattern(sha)))

    def record_chunk_time(self, entry: dict) -> None:
        """Add `entry` as a line of the chunk times, or raise OSError (a full disk) and leave them as they were."""
        append_line(self.chunk_times, json.dumps(entry))

    def chunk_time_lines(self) -> list[bytes]:
        """The non-blank lines of the chunk times as bytes (decoded one by one by the reader: a
        line that is not UTF-8 spoils only itself); none when there is no file."""
        if not self.chunk_times.is_file():
            return []
        return [line for line in self.chunk_times.read_bytes().splitlines() if line.strip()]

    def pack_run(self, shas: Sequence[str], dest: Path) -> Path:
        """One archive (`pack`) of what a run of `shas` wrote here: the result files, each
        commit's environment records and GPU test verdict, the machine file, the chunk times and
        the listing (the benchmark versions asv compares). ResultsError when there is nothing to pack."""
        files = [self.tree.benchmarks, self.machine_file, self.chunk_times]
        measured = [f for sha in shas for f in self.result_files(sha)]
        for sha in shas:
            files += [self.environment_record(sha), self.verdict(sha)]
        files += measured
        missing = [str(f) for f in files[:2] if not f.is_file()]
        if missing or not measured:
            raise ResultsError(f"nothing to pack for {self.name} in {self.tree.root}: missing "
                               f"{missing or 'result files'}")
        return self.tree.pack(files, dest)


def machine_name_refused(name: str) -> str | None:
    """Why `name` cannot name a machine directory, in the words `speedlib run --machine` and
    `speedlib merge` refuse it with ("is 300 characters long: ..."); None for a name they take."""
    if len(name) > MACHINE_NAME_MAX:
        return (f"is {len(name)} characters long: a machine name names a directory, "
                f"at most {MACHINE_NAME_MAX} characters")
    if not MACHINE_NAME.fullmatch(name) or ".." in name:
        return (f"'{printable(name)}' is not a plain name: use letters, digits and . _ + - (no path separators, "
                "no '..', not starting with '.' or '-')")
    return None


def inside(rel) -> bool:
    """Whether `rel` is a path of plain names (PLAIN_NAME) joined by '/': joined to a tree's
    root it stays inside the tree, whatever the links in it (checked apart: `check_target`)."""
    return isinstance(rel, str) and all(PLAIN_NAME.match(name) for name in rel.split("/"))


def result_pattern(sha: str) -> str:
    """asv's result files of `sha` in a machine directory (asv names them <commit8>-<environment>.json)."""
    return f"{sha[:8]}-*.json"


@dataclass(frozen=True)
class ResultsTree:
    """A results root (`speedlib run --results-dir`, `speedlib merge --into`, results/)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def in_checkout(cls, root: Path) -> ResultsTree:
        """The results tree committed in the checkout at `root`."""
        return cls(Path(root) / CHECKOUT_RESULTS)

    @classmethod
    def found_in(cls, path: Path) -> ResultsTree:
        """The tree at `path`, or the one in it where `path` is a checkout or an unpacked archive."""
        inner = cls.in_checkout(path)
        return inner if inner.root.is_dir() and not (Path(path) / BENCHMARKS).exists() else cls(path)

    @property
    def benchmarks(self) -> Path:
        return self.root / BENCHMARKS

    def machine(self, name: str) -> MachineDir:
        return MachineDir(self, name)

    def asv_writes(self, machine: str, sha: str) -> list[str]:
        """The files (globs under the root) an `asv run` of `sha` on `machine` rewrites in place."""
        return [BENCHMARKS, f"{machine}/{MACHINE_FILE}", f"{machine}/{result_pattern(sha)}"]

    # --- the lock and the writable check --------------------------------------------------

    def lock(self) -> ResultsLock:
        return ResultsLock(self.root)

    def check_writable(self, what: str, instead: str) -> None:
        check_writable(self.root, what, instead)

    # --- what a stopped run or merge leaves -----------------------------------------------

    @property
    def snapshot(self) -> Path:
        return self.root / SNAPSHOT

    @property
    def merge_staging(self) -> Path:
        return self.root / MERGE_STAGING

    def left_by_killed_run(self) -> Path | None:
        """The snapshot a run killed outright while asv wrote here left (journal written), or None."""
        return self.snapshot if _is_file(self.snapshot / JOURNAL) else None

    def left_by_stopped_merge(self) -> Path | None:
        """The staging directory of a merge stopped between its renames, or None: with its
        journal written, part of the tree is merged and part not yet."""
        return self.merge_staging if _is_file(self.merge_staging / JOURNAL) else None

    def check_stopped_merge(self) -> None:
        """The check `finish_staged` makes before it moves anything, and nothing more (it reads
        only: the loader says what the next merge will do): ResultsError, the same one line,
        where the journal a stopped merge left is one that `finish_staged` refuses."""
        if not self.merge_staging.is_symlink() and _is_file(self.merge_staging / JOURNAL):
            self._journaled_renames()

    def check_target(self, rel: str) -> None:
        """ResultsError, one line, unless a file can be renamed to `rel` without leaving the tree
        or stopping part way: `rel` a path of plain names (`inside`), each directory on the way
        a directory or missing, the file a regular file or missing, and none of them a link."""
        if not inside(rel):
            raise ResultsError(f"{printable(rel)} is not a path inside {printable(str(self.root))}")
        path, names = self.root, rel.split("/")
        for i, name in enumerate(names):
            path = path / name
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                return  # this and what lies under it are made by the rename
            except OSError as e:
                raise ResultsError(f"cannot examine {printable(str(path))} ({e.strerror or e})") from None
            if stat.S_ISLNK(mode):
                raise ResultsError(f"{printable(str(path))} is a link: a file written through it could land outside "
                                   f"{printable(str(self.root))}")
            if i < len(names) - 1 and not stat.S_ISDIR(mode):
                raise ResultsError(f"{printable(str(path))} is a file where a directory goes")
            if i == len(names) - 1 and not stat.S_ISREG(mode):
                raise ResultsError(f"{printable(str(path))} is a directory or special file where a file goes")

    def stage(self, files: Iterable[tuple[str, bytes]]) -> None:
        """`staging` of `files` ((path under the root, content)), each written whole."""
        files = list(files)
        with self.staging([rel for rel, _ in files]) as staged:
            for rel, data in files:
                with staged(rel) as f:
                    f.write(data)

    @contextlib.contextmanager
    def staging(self, rels: Sequence[str]) -> Iterator:
        """Stage the files to be renamed to `rels` (paths under the root). Every target is
        checked first (`check_target`: ResultsError, nothing written). The block gets a function
        that opens the staged file of one of `rels` for writing, one at a time (a merge copies
        from its sources file by file, never holding them all); on leaving it, the journal naming
        the renames of those written is written (`finish_staged` does them). OSError or any
        other exception: the staging is removed and the tree is as it was."""
        for rel in rels:
            self.check_target(rel)
        stage, names, written = self.merge_staging, {rel: f"{i}.new" for i, rel in enumerate(rels)}, []

        @contextlib.contextmanager
        def staged(rel: str):
            with (stage / names[rel]).open("xb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            written.append(rel)

        try:
            stage.mkdir()
            yield staged
            with written_whole(stage / JOURNAL, streams=False) as f:
                f.write(b"".join(json.dumps([names[rel], rel]).encode() + b"\n" for rel in written))
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise

    def finish_staged(self) -> int | None:
        """Finish or drop what a staging left (hold the lock): the renames its journal names are
        completed, and their number returned; files staged before the journal was written are
        removed (None, as when nothing was staged). A journal that names anything a staging
        never writes (a path outside the tree, a link on the way, a file where a directory
        goes) is refused whole, with one line (ResultsError) and nothing moved."""
        stage = self.merge_staging
        if not (stage.exists() or stage.is_symlink()):
            return None
        journal = stage / JOURNAL
        if stage.is_symlink() or not journal.is_file():
            if stage.is_symlink() or not stage.is_dir():
                stage.unlink()
            else:
                shutil.rmtree(stage)
            return None
        renames, named = self._journaled_renames()
        for tmp, rel in renames:
            _rename(stage / tmp, self.root / rel)
        journal.unlink()
        shutil.rmtree(stage)
        return named

    def _journaled_renames(self) -> tuple[list[tuple[str, str]], int]:
        """The renames the journal names that are still to do, and how many it names; every one
        checked before any is done: ResultsError where the journal is not one `staging` wrote, or a target cannot take
        its file (`check_target`). A journal copied in with a tree is read like one left here."""
        stage = self.merge_staging
        journal = stage / JOURNAL

        def refused(n: int, why: str) -> ResultsError:
            return ResultsError(f"{printable(str(journal))} cannot be finished: line {n} {why}; nothing was moved: "
                                f"look at {printable(str(stage))}, then remove it")

        if not stat.S_ISREG(os.lstat(journal).st_mode):
            raise refused(1, "is in a link or special file, not a journal a merge writes")
        todo, named = [], 0
        for n, line in enumerate(journal.read_bytes().splitlines(), 1):
            if not line.strip():
                continue
            named += 1
            try:
                entry = json.loads(line)
            except (ValueError, RecursionError):
                entry = None
            if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)):
                raise refused(n, "is not a [staged file, path] pair")
            tmp, rel = entry
            if not _STAGED.fullmatch(tmp):
                raise refused(n, f"names {printable(tmp)}, not a file a merge stages")
            if not inside(rel):
                raise refused(n, f"names {printable(rel)}, not a path inside {printable(str(self.root))}")
            try:
                mode = os.lstat(stage / tmp).st_mode
            except FileNotFoundError:
                continue  # renamed before the merge stopped
            if not stat.S_ISREG(mode):
                raise refused(n, f"stages {printable(tmp)}, a link or special file")
            try:
                self.check_target(rel)
            except ResultsError as e:
                raise refused(n, f"cannot be renamed: {e}") from None
            todo.append((tmp, rel))
        return todo, named

    # --- archives -------------------------------------------------------------------------

    def pack(self, files: Iterable[Path], dest: Path) -> Path:
        """One .tar.gz of those of `files` (under the root) that exist, laid out as `results/...`
        so that unpacking it in a checkout's root adds them there. Written aside and renamed: a
        command killed while packing, or a full disk (OSError), keeps the previous archive whole."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with written_whole(dest) as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for f in files:
                if f.is_file():
                    tar.add(f, arcname=str(Path(ARCHIVE_ROOT) / f.relative_to(self.root)))
        return dest


def archive_path(member: str) -> str | None:
    """The path under the results root of an archive's member named `member`: '' for the root
    itself, None for a member outside it (not an archive `pack` wrote)."""
    if member in (ARCHIVE_ROOT, "."):
        return ""
    prefix = f"{ARCHIVE_ROOT}/"
    return member[len(prefix):] if member.startswith(prefix) else None


def _is_file(path: Path) -> bool:
    """path.is_file(), False where it cannot be examined: a tree this user cannot read is said
    so by whoever reads it next, in one line, not by a traceback here."""
    try:
        return path.is_file()
    except OSError:
        return False


def _rename(tmp: Path, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, final)
