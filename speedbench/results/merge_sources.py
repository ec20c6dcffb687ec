"""Reading the inputs of `speedlib merge` (speedbench.results.merge): archives and results trees.

Archives are read in memory, never extracted; a member that is absolute, climbs out with
`..`, is a link, a device or anything but a plain file or directory refuses the archive, so
does a torn JSON file: `MergeError` with exit status 2 and one line. Only the layout
`speedlib run` writes is taken (benchmarks.json, each machine's machine.json, result files,
chunk times, environment records, the per-commit side files of `SIDE_DIRS`, and the merge's
own displaced-entry files).
"""

from __future__ import annotations

import json
import os
import re
import stat
import tarfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

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
)

# Directories of a machine holding one whole JSON object per commit (<machine>/<dir>/<name>.json),
# merged whole: the GPU tests' directory holds the verdict of a GPU slot's GPU-only tests.
SIDE_DIRS = (GPU_TESTS_DIR,)
CONFLICTS, BAD_INPUT = 1, 2  # exit statuses
_NAME = re.compile(r"[^./\x00-\x1f\x7f][^/\x00-\x1f\x7f]*\Z")  # a plain file or directory name


class MergeError(RuntimeError):
    """The merge was refused or stopped; `lines` say why, `status` is the exit status. Nothing
    was written (a merge stopped while renaming finishes on the next merge)."""

    def __init__(self, status: int, lines: Sequence[str]):
        super().__init__("\n".join(lines))
        self.status, self.lines = status, list(lines)


def _bad(text: str) -> MergeError:
    return MergeError(BAD_INPUT, [f"{text}; nothing was written"])


# --- reading a tree ------------------------------------------------------------------------

@dataclass
class _Machine:
    info: dict | None = None  # MACHINE_FILE
    info_raw: bytes = b""
    results: dict[str, dict] = field(default_factory=dict)  # file name -> asv result object
    raw: dict[str, bytes] = field(default_factory=dict)  # file name (or side file's path) -> its bytes as read
    side: dict[str, dict] = field(default_factory=dict)  # "<dir>/<name>.json" of SIDE_DIRS -> its object
    lines: dict[str, list[bytes]] = field(default_factory=dict)  # jsonl path in the directory -> lines


@dataclass
class _Tree:
    label: str
    listing: dict | None = None  # BENCHMARKS, the listing
    listing_raw: bytes = b""
    machines: dict[str, _Machine] = field(default_factory=dict)


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


def _add_file(tree: _Tree, rel: str, data: bytes, where: str, strict: bool) -> None:
    place = _place(rel)
    if place is None:
        return
    name, inner = place
    if inner.endswith(".jsonl"):
        lines = [line for line in data.splitlines() if line.strip()]
        for n, line in enumerate(lines, 1):
            if strict and not isinstance(_loads(line), dict):
                raise _bad(f"{where}: line {n} is torn or not a JSON record")
        tree.machines.setdefault(name, _Machine()).lines[inner] = lines
    elif not name:
        tree.listing, tree.listing_raw = _json(data, where), data
        if not isinstance(tree.listing, dict):
            raise _bad(f"{where} is not asv's {BENCHMARKS}")
    elif "/" in inner:  # a side file of SIDE_DIRS
        obj = _json(data, where)
        if not isinstance(obj, dict):
            raise _bad(f"{where} is not a JSON object")
        m = tree.machines.setdefault(name, _Machine())
        m.side[inner], m.raw[inner] = obj, data
    elif inner == MACHINE_FILE:
        m = tree.machines.setdefault(name, _Machine())
        m.info, m.info_raw = _json(data, where), data
        if not isinstance(m.info, dict):
            raise _bad(f"{where} is not asv's {MACHINE_FILE}")
    else:
        obj = _json(data, where)
        _check_result(obj, where)
        m = tree.machines.setdefault(name, _Machine())
        m.results[inner], m.raw[inner] = obj, data


def _checked_name(rel: str, where: str) -> str:
    parts = PurePosixPath(rel).parts
    if rel.startswith("/") or not parts or not all(_NAME.match(p) for p in parts):
        raise _bad(f"{where}: member {printable(rel)} is an absolute path, climbs out with '..' or is no plain "
                   "name: refused")
    return rel


def _read_archive(path: Path, label: str) -> _Tree:
    tree = _Tree(label)
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
                if member.size > files.MAX_FILE_BYTES:
                    raise _bad(f"{where} is larger than {files.MAX_FILE_BYTES >> 20} MiB")
                if _place(rel) is not None:
                    _add_file(tree, rel, tar.extractfile(member).read(), where, strict=True)
    except (tarfile.TarError, EOFError, zlib.error) as e:
        # tarfile's message for a file that is no archive lists every method it tried: the first line says it
        why = printable(str(e).splitlines()[0].rstrip(":")) if str(e) else type(e).__name__
        raise _bad(f"{label} is not a .tar.gz archive, or is cut short ({why})") from None
    except OSError as e:
        raise _bad(f"cannot read {label} ({e.strerror or e})") from None
    return tree


def _read_dir(root: Path, label: str, strict: bool) -> _Tree:
    """The results tree at `root` (or `root`/results for a checkout or an unpacked archive):
    only the layout `speedlib run` writes, dot-files (scratch, snapshots) left out."""
    root = ResultsTree.found_in(root).root
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
            if stat.S_ISDIR(st.st_mode):
                if descend:
                    entries(path, sub, depth + 1)
                continue
            if _place(sub) is None:
                continue
            if not stat.S_ISREG(st.st_mode):
                raise _bad(f"{where} is a link or special file: refused")
            if st.st_size > files.MAX_FILE_BYTES:
                raise _bad(f"{where} is larger than {files.MAX_FILE_BYTES >> 20} MiB")
            _checked_name(sub, label)
            _add_file(tree, sub, path.read_bytes(), where, strict)

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
    if not any(m.results for m in tree.machines.values()):
        raise _bad(f"{label} holds no asv result file (<machine>/<commit>-<env>.json): name a results tree "
                   "(the directory that holds the machine directories) or an archive of `speedlib run --archive`")
    return tree


def _loads(line: bytes):
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        return None
