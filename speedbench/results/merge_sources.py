"""Reading the inputs of `speedlib merge` (speedbench.results.merge): archives and results trees.

Archives are read member by member, never extracted, and no member is held after it is read:
a JSON file is parsed and let go, keeping where it was and its digest (`_Raw`), and a file the
merge adds whole is copied from its source again when it is written (`copy_whole`). So a merge
holds one member at a time, however many an archive packs.

Refused with exit status 2 and one line (`MergeError`): a member that is absolute, climbs out
with `..`, is a link, a device or anything but a plain file or directory, or comes twice; a
torn JSON file; an archive cut short or failing its gzip checksum; a machine name that `speedlib
run --machine` refuses; a machine.json naming another machine than its directory; a result
file named for one commit holding another's results; one machine whose environment records
name two kinds of hardware. Only the layout `speedlib run` writes is taken (benchmarks.json,
each machine's machine.json, result files, chunk times, environment records, the per-commit
side files of `SIDE_DIRS`, and the merge's own displaced-entry files).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import lzma
import os
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from speedbench.results import files
from speedbench.results.common import printable
from speedbench.results.tree import (
    ARCHIVE_ROOT,
    BENCHMARKS,
    CHUNK_TIMES,
    DISPLACED,
    ENVIRONMENT_DIR,
    GPU_TESTS_DIR,
    MACHINE_FILE,
    ResultsTree,
    archive_path,
    inside,
    machine_name_refused,
)

# Directories of a machine holding one whole JSON object per commit (<machine>/<dir>/<name>.json),
# merged whole: the GPU tests' directory holds the verdict of a GPU slot's GPU-only tests.
SIDE_DIRS = (GPU_TESTS_DIR,)
# What a merge takes, in words, for a refusal naming something else.
KNOWN = (f"{BENCHMARKS}, <machine>/{MACHINE_FILE}, <machine>/<commit8>-<env>.json, <machine>/{CHUNK_TIMES}, "
         f"<machine>/{ENVIRONMENT_DIR}/*.jsonl, <machine>/{GPU_TESTS_DIR}/<commit8>.json")
CONFLICTS, BAD_INPUT = 1, 2  # exit statuses
_CHUNK = 1 << 20  # bytes copied at a time


class MergeError(RuntimeError):
    """The merge was refused or stopped; `lines` say why, `status` is the exit status. Nothing
    was written (a merge stopped while renaming finishes on the next merge)."""

    def __init__(self, status: int, lines: Sequence[str]):
        super().__init__("\n".join(lines))
        self.status, self.lines = status, list(lines)


def _bad(text: str) -> MergeError:
    return MergeError(BAD_INPUT, [f"{text}; nothing was written"])


# --- reading a tree ------------------------------------------------------------------------

@dataclass(frozen=True)
class _Raw:
    """Where a file's bytes can be read again, and their digest: a file added whole is copied
    from its source when the merge writes it (`copy_whole`), not kept in memory until then."""

    source: Path  # the archive, or the file itself in a results tree
    member: str | None  # the archive's member; None for a file in a tree
    digest: str  # sha256 of the bytes as they were read and checked
    label: str  # the source, as messages name it
    where: str  # the file, as messages name it


@dataclass
class _Machine:
    info: dict | None = None  # MACHINE_FILE
    info_raw: _Raw | None = None
    results: dict[str, dict] = field(default_factory=dict)  # file name -> asv result object
    raw: dict[str, _Raw] = field(default_factory=dict)  # file name (or side file's path) -> where its bytes are
    side: dict[str, dict] = field(default_factory=dict)  # "<dir>/<name>.json" of SIDE_DIRS -> its object
    lines: dict[str, list[bytes]] = field(default_factory=dict)  # jsonl path in the directory -> lines


@dataclass
class _Tree:
    label: str
    listing: dict | None = None  # BENCHMARKS, the listing
    listing_raw: _Raw | None = None
    machines: dict[str, _Machine] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)  # a results tree's files no merge takes (a README)


def _place(rel: str) -> tuple[str, str] | None:
    """(machine or '', path inside it) for a file the merge takes, None for one it leaves out."""
    parts = PurePosixPath(rel).parts
    if parts == (BENCHMARKS,):
        return "", parts[0]
    if len(parts) == 2 and (parts[1].endswith(".json") or parts[1] in (CHUNK_TIMES, DISPLACED)):
        return parts[0], parts[1]
    if len(parts) == 3 and parts[1] == ENVIRONMENT_DIR and parts[2].endswith(".jsonl"):
        return parts[0], f"{ENVIRONMENT_DIR}/{parts[2]}"
    if len(parts) == 3 and parts[1] in SIDE_DIRS and parts[2].endswith(".json"):
        return parts[0], f"{parts[1]}/{parts[2]}"
    return None


def _json(data: bytes, where: str):
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise _bad(f"{where} is torn or not JSON") from None


def _check_result(obj, where: str) -> None:
    ok = (isinstance(obj, dict) and isinstance(obj.get("results"), dict) and isinstance(obj.get("commit_hash"), str)
          and isinstance(obj.get("env_name"), str) and isinstance(obj.get("result_columns"), list)
          and "started_at" in obj["result_columns"] and isinstance(obj.get("durations", {}), dict)
          and all(isinstance(row, list) for row in obj["results"].values()))
    if not ok:
        raise _bad(f"{where} is not an asv result file")


def _lines(f: BinaryIO, where: str, strict: bool) -> list[bytes]:
    """The non-blank lines of `f`, read a line at a time; strict: each a JSON record."""
    lines: list[bytes] = []
    for chunk in f:
        for line in chunk.splitlines():  # bytes.splitlines: \r and \r\n end a line as \n does
            if not line.strip():
                continue
            if strict and not isinstance(_loads(line), dict):
                raise _bad(f"{where}: line {len(lines) + 1} is torn or not a JSON record")
            lines.append(line)
    return lines


def _add_file(tree: _Tree, rel: str, f: BinaryIO, where: str, strict: bool, raw_at: Callable[[str], _Raw]) -> None:
    """Read the file `f` found at `rel` into `tree`; `raw_at(digest)` says where it can be read again."""
    place = _place(rel)
    if place is None:
        return
    name, inner = place
    if strict and name and (why := machine_name_refused(name)):
        raise _bad(f"{where}: the machine name {why}")
    if inner.endswith(".jsonl"):
        tree.machines.setdefault(name, _Machine()).lines[inner] = _lines(f, where, strict)
        return
    data = f.read()
    raw = raw_at(hashlib.sha256(data).hexdigest())
    obj = _json(data, where)
    del data  # only what was parsed is kept
    if not name:
        tree.listing, tree.listing_raw = obj, raw
        if not isinstance(tree.listing, dict):
            raise _bad(f"{where} is not asv's {BENCHMARKS}")
        return
    m = tree.machines.setdefault(name, _Machine())
    if "/" in inner:  # a side file of SIDE_DIRS
        if not isinstance(obj, dict):
            raise _bad(f"{where} is not a JSON object")
        if strict:
            _check_side(obj, name, inner, where)
        m.side[inner], m.raw[inner] = obj, raw
    elif inner == MACHINE_FILE:
        if not isinstance(obj, dict):
            raise _bad(f"{where} is not asv's {MACHINE_FILE}")
        named = obj.get("machine", name)
        if strict and named != name:  # asv would file its results under the other name
            raise _bad(f"{where} names the machine {printable(str(named))}, not {printable(name)} whose directory "
                       "holds it")
        m.info, m.info_raw = obj, raw
    else:
        _check_result(obj, where)
        named = PurePosixPath(inner).stem.split("-", 1)[0]  # asv names it <commit8>-<environment>.json
        if strict and obj["commit_hash"][:8] != named:
            raise _bad(f"{where} is named for commit {printable(named)} and holds results of commit "
                       f"{printable(obj['commit_hash'][:8])}")
        recorded = obj.get("params").get("machine", name) if isinstance(obj.get("params"), dict) else name
        if strict and recorded != name:  # asv and the dashboard would show it under one name, the tree under another
            raise _bad(f"{where} records the machine {printable(str(recorded))} (its params), not {printable(name)} "
                       "whose directory holds it: rerun it with speedlib run --machine, or file it under its own "
                       "machine's directory")
        m.results[inner], m.raw[inner] = obj, raw


def _check_side(obj: dict, machine: str, inner: str, where: str) -> None:
    """Refuse a side file the loader would refuse (a GPU tests' verdict not filed under its
    machine and commit, or missing what a verdict holds): merged, it would be set aside as a
    problem on every page instead of marking its commit's figures."""
    from speedbench.results.gpu_tests import check_verdict  # noqa: PLC0415 - pandas; `speedlib --help` imports this module

    if inner.startswith(f"{GPU_TESTS_DIR}/"):
        try:
            check_verdict(obj, machine, PurePosixPath(inner).stem)
        except ValueError as e:
            raise _bad(f"{where} is not a GPU tests' verdict speedlib slot writes ({printable(str(e))}): "
                       "refused") from None


def _checked_name(rel: str, where: str) -> str:
    if not inside(rel):
        raise _bad(f"{where}: member {printable(rel)} is an absolute path, climbs out with '..' or is no plain "
                   "name: refused")
    return rel


def _read_error(label: str, e: BaseException) -> MergeError:
    """What reading the archive `label` raised, as one line."""
    if isinstance(e, (gzip.BadGzipFile, lzma.LZMAError)):  # its checksum, read at the end of the stream
        return _bad(f"{label} is damaged ({printable(str(e) or type(e).__name__)})")
    if isinstance(e, (tarfile.TarError, EOFError, zlib.error)):
        # tarfile's message for a file that is no archive lists every method it tried: the first line says it
        why = printable(str(e).splitlines()[0].rstrip(":")) if str(e) else type(e).__name__
        return _bad(f"{label} is not a .tar.gz archive, or is cut short ({why})")
    return _bad(f"cannot read {label} ({getattr(e, 'strerror', None) or e})")


_READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError)  # OSError: BadGzipFile too


def _read_archive(path: Path, label: str) -> _Tree:
    tree, seen = _Tree(label), set()
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                name = member.name.rstrip("/")
                where = f"{label}: {printable(name)}"
                if not (member.isfile() or member.isdir()):
                    kind = "a link" if member.issym() or member.islnk() else "a device or other special file"
                    raise _bad(f"{where} is {kind}: refused")
                rel = archive_path(name)
                if rel == "":  # the tree itself
                    continue
                if rel is None:
                    _checked_name(name, label)
                    raise _bad(f"{where} is not under {ARCHIVE_ROOT}/: not an archive of `speedlib run --archive`")
                rel = _checked_name(rel, label)
                if member.isdir():
                    continue
                if rel in seen:  # unpacked, the second would replace the first without a word
                    raise _bad(f"{where} is in the archive twice: refused")
                seen.add(rel)
                if member.size > files.MAX_FILE_BYTES:
                    raise _bad(f"{where} is larger than {files.MAX_FILE_BYTES >> 20} MiB")
                if _place(rel) is None:  # `speedlib run --archive` and `speedlib slot` pack none: nothing to guess
                    raise _bad(f"{where} is not a file speedlib run or speedlib slot writes ({KNOWN}): refused, "
                               "rather than left out without a word")
                _add_file(tree, rel, tar.extractfile(member), where, True,
                          lambda digest, at=member.name, where=where: _Raw(path, at, digest, label, where))
            # gzip checks its checksum at the end of the stream, which tarfile stops short of
            while tar.fileobj.read(_CHUNK):
                pass
    except _READ_ERRORS as e:
        raise _read_error(label, e) from None
    return tree


def _read_dir(root: Path, label: str, strict: bool) -> _Tree:
    """The results tree at `root` (or `root`/results for a checkout or an unpacked archive):
    only the layout `speedlib run` writes, dot-files (scratch, snapshots) left out."""
    try:
        root = ResultsTree.found_in(root).root
    except OSError as e:  # a directory this user cannot read
        raise _bad(f"cannot read {label} ({e.strerror or e})") from None
    tree = _Tree(label)

    def entries(directory: Path, rel: str, depth: int) -> None:
        try:
            names = sorted(os.listdir(directory))
        except OSError as e:
            raise _bad(f"cannot read {label}/{printable(rel)} ({e.strerror or e})") from None
        for name in names:
            if name.startswith("."):
                continue
            sub = f"{rel}/{name}" if rel else name
            path, where = directory / name, f"{label}/{printable(sub)}"
            try:
                st = os.lstat(path)
            except OSError as e:
                raise _bad(f"cannot read {where} ({e.strerror or e})") from None
            descend = depth == 0 or (depth == 1 and name in (ENVIRONMENT_DIR, *SIDE_DIRS))
            if stat.S_ISLNK(st.st_mode) and (descend or _place(sub) is not None):
                raise _bad(f"{where} is a link: refused")
            if stat.S_ISDIR(st.st_mode) and descend:
                entries(path, sub, depth + 1)
                continue
            if _place(sub) is None:
                if strict and depth == 2:  # inside speedlib's own directories (gpu-tests/, environment/)
                    raise _bad(f"{where} is not a file speedlib run or speedlib slot writes ({KNOWN}): refused, "
                               "rather than left out without a word")
                if strict and (depth == 1 or not stat.S_ISDIR(st.st_mode)):
                    tree.left_out.append(printable(sub))
                continue
            if not stat.S_ISREG(st.st_mode):
                raise _bad(f"{where} is a link or special file: refused")
            if st.st_size > files.MAX_FILE_BYTES:
                raise _bad(f"{where} is larger than {files.MAX_FILE_BYTES >> 20} MiB")
            _checked_name(sub, label)
            try:
                with path.open("rb") as f:
                    _add_file(tree, sub, f, where, strict,
                              lambda digest, at=path, where=where: _Raw(at, None, digest, label, where))
            except OSError as e:
                raise _bad(f"cannot read {where} ({e.strerror or e})") from None

    entries(root, "", 0)
    return tree


def _read_source(path: Path) -> _Tree:
    label = printable(str(path))
    if path.is_dir():
        tree = _read_dir(path, label, strict=True)
    elif not path.exists():
        raise _bad(f"{label}: no such archive or directory")
    elif not path.is_file():
        raise _bad(f"{label} is neither an archive nor a directory")
    else:
        tree = _read_archive(path, label)
    # A merge job pointed at a machine's directory (or an empty one) read nothing and said
    # "nothing changed", exit 0: on a cluster that reads as success with every result left out.
    # A slot whose chunks all failed or ran out of time still carries its GPU tests' verdict.
    if not any(m.results or m.side for m in tree.machines.values()):
        raise _bad(f"{label} holds no asv result file (<machine>/<commit>-<env>.json) and no GPU test verdict: name "
                   "a results tree (the directory that holds the machine directories) or an archive of "
                   "`speedlib run --archive` or `speedlib slot`")
    _one_kind_of_hardware(tree)
    return tree


def rehearsals(tree: _Tree) -> list[str]:
    """The GPU test verdicts of `tree` that a slot rehearsed without a GPU wrote
    (speedbench.results.gpu_tests.rehearsal), as `<machine>/gpu-tests/<commit8>.json`."""
    from speedbench.results.gpu_tests import rehearsal  # noqa: PLC0415 - it loads pandas; `speedlib --help` imports this module

    return [f"{name}/{inner}" for name, m in sorted(tree.machines.items()) for inner, verdict in sorted(m.side.items())
            if inner.startswith(f"{GPU_TESTS_DIR}/") and rehearsal(verdict)]


def _one_kind_of_hardware(tree: _Tree) -> None:
    """Refuse a source whose environment records name two kinds of hardware under one machine
    name: merged, its history would read the hardware's difference as the code's."""
    from speedbench.results import machines  # noqa: PLC0415 - it loads pandas; `speedlib --help` imports this module

    for name, m in tree.machines.items():
        seen: list[dict] = []
        for hardware in map(machines.hardware, records(m)):
            other = machines.clash(seen, hardware)
            if other is not None:
                raise _bad(f"{tree.label}: machine {printable(name)} recorded {printable(machines.describe(other))} "
                           f"and {printable(machines.describe(hardware))}: a machine name stands for one kind of "
                           "hardware; rerun one of them with speedlib run --machine NEWNAME")
            if hardware not in seen:
                seen.append(hardware)


def records(m: _Machine) -> list[dict]:
    """The environment records of machine `m`, as read."""
    out = []
    for inner, lines in m.lines.items():
        if inner.startswith(f"{ENVIRONMENT_DIR}/"):
            out += [r for r in map(_loads, lines) if isinstance(r, dict)]
    return out


def _loads(line: bytes):
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None


# --- copying what is added whole -------------------------------------------------------------

def copy_whole(files: Sequence[tuple[str, _Raw]], staged) -> None:
    """Copy each file added whole from where it was read into its staged file (`staged(rel)`,
    ResultsTree.staging), a chunk at a time, each archive read once in the order of its
    members. MergeError where a source is gone or has changed since it was read."""
    by_source: dict[Path, dict[str | None, tuple[str, _Raw]]] = {}
    for rel, raw in files:
        by_source.setdefault(raw.source, {})[raw.member] = (rel, raw)
    for source, wanted in by_source.items():
        if None in wanted:  # a file of a results tree: the source is the file
            rel, raw = wanted.pop(None)
            with _opened(source, raw.where) as read:
                _copy(read, rel, raw, staged)
            continue
        label = next(iter(wanted.values()))[1].label
        for member, read in _members(source, label, set(wanted)):
            rel, raw = wanted.pop(member)
            _copy(read, rel, raw, staged)
        if wanted:
            raise _bad(f"{next(iter(wanted.values()))[1].where} has gone from the archive since it was read")


def _copy(read: Callable[[int], bytes], rel: str, raw: _Raw, staged) -> None:
    digest = hashlib.sha256()
    with staged(rel) as f:
        while chunk := read(_CHUNK):
            digest.update(chunk)
            f.write(chunk)
    if digest.hexdigest() != raw.digest:
        raise _bad(f"{raw.where} has changed since it was read")


def _reader(f: BinaryIO, label: str) -> Callable[[int], bytes]:
    """f.read, with what reading the source raises as one line (MergeError): the writes
    between the reads go to the results tree, and their errors are the caller's."""
    def read(size: int) -> bytes:
        try:
            return f.read(size)
        except _READ_ERRORS as e:
            raise _read_error(label, e) from None
    return read


@contextlib.contextmanager
def _opened(path: Path, where: str) -> Iterator[Callable[[int], bytes]]:
    try:
        f = path.open("rb")
    except OSError as e:
        raise _read_error(where, e) from None
    with f:
        yield _reader(f, where)


def _members(path: Path, label: str, names: set[str]) -> Iterator[tuple[str, Callable[[int], bytes]]]:
    """The members named `names` of the archive at `path`, in its order: (name, read)."""
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                if member.isfile() and member.name in names:
                    yield member.name, _reader(tar.extractfile(member), label)
    except _READ_ERRORS as e:
        raise _read_error(label, e) from None
