"""A cache of loaded results, so that a dashboard's first view does not parse every file again.

Parsing is what grows with the results: thousands of asv files take seconds, while the
loaded frames come back from one pickle in a fraction of that. The cache is keyed on the
whole results tree, every entry's path, type, size, mtime, ctime, device and inode (a
symlink's target too), and on the loader's own source: any change to any file, a file added
or removed, or a new speedlib, and the tree is loaded afresh (and the cache rewritten).
The ctime is what an edit cannot hide: an editor can keep a file's size and set its mtime
back (`touch -r`), but every write sets the ctime to the time of the change, and nothing
but the system clock can set it back. (Its clock ticks every few milliseconds: only an edit
within a tick of the write before it keeps it, and a whole load lies between a cached state
and the next edit.) No file is read: the dashboard takes this key on every page view.

It lives outside `results/` (`$SPEEDLIB_CACHE_DIR`, else `$XDG_CACHE_HOME/speedlib`, else
`~/.cache/speedlib`), so a results directory stays what asv wrote. A cache file that cannot be
read, was written by another version, or could have been written by another user is
ignored and replaced: a cache can make loading faster, never different.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pandas

from speedbench.results import load as results
from speedbench.results import pickled
from speedbench.results.pickled import cache_dir
from speedbench.stats import contention

__all__ = ["cache_dir", "fingerprint", "load", "place"]

_FORMAT = 1  # bump when what is pickled changes shape


def _loader_digest() -> bytes:
    """The loader's source (with the contention rules it applies) and pandas' version: a
    changed parser must not reuse old frames."""
    h = hashlib.sha256(f"{_FORMAT} {pandas.__version__}".encode())
    # every module of the results package: the loader and the parts it parses files with
    for part in sorted(Path(results.__file__).parent.glob("*.py")):
        h.update(part.read_bytes())
    h.update(Path(contention.__file__).read_bytes())  # its verdicts are columns of the frames
    return h.digest()


def fingerprint(root: Path) -> str:
    """A digest of every entry under `root` (not following directory symlinks) and of the loader."""
    h = hashlib.sha256(_loader_digest())
    todo = [Path(root)]
    while todo:
        directory = todo.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as e:
            h.update(f"unlistable {directory} {e.errno}\n".encode(errors="surrogateescape"))
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile: the listing above already differs
            h.update(f"{entry.path}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_dev}\0"
                     f"{st.st_ino}\n".encode(errors="surrogateescape"))
            if stat.S_ISLNK(st.st_mode):  # the loader may read through it: its target counts
                try:
                    target = os.stat(entry.path)
                    h.update(f"-> {os.readlink(entry.path)} {target.st_size} {target.st_mtime_ns} "
                             f"{target.st_ctime_ns} {target.st_dev} {target.st_ino}\n".encode(errors="surrogateescape"))
                except OSError:
                    h.update(b"-> dangling\n")
            elif stat.S_ISDIR(st.st_mode):
                todo.append(Path(entry.path))
    return h.hexdigest()


def place(root: Path, kind: str = "results", suffix: str = ".pickle") -> Path | None:
    """Where `root`'s cached `kind` goes (its parsed frames; "tables", a directory of tables
    computed from them); None if that would be inside `root` itself."""
    real = Path(os.path.realpath(root))
    directory = Path(os.path.realpath(cache_dir()))
    if directory == real or real in directory.parents:
        return None
    return directory / f"{kind}-{hashlib.sha256(str(real).encode(errors='surrogateescape')).hexdigest()[:16]}{suffix}"


def load(root: str | Path, key: str | None = None) -> results.LoadedResults:
    """`results.load_results(root)`, from the cache when nothing under `root` changed.
    `key`: `fingerprint(root)` if the caller has just computed it. Two processes loading the
    same tree at once (the dashboard's warm-up and its first page) parse it once."""
    root = Path(root)
    path = place(root)
    if path is None or not hasattr(os, "getuid"):
        return results.load_results(root)
    key = key or fingerprint(root)
    loaded = pickled.read(path, key, results.LoadedResults)
    if loaded is not None:
        return loaded
    with pickled.computing(path):
        loaded = pickled.read(path, key, results.LoadedResults)  # the other process's, if it just wrote it
        if loaded is None:
            loaded = results.load_results(root)
            if fingerprint(root) == key:  # not changed while it loaded: safe to keep
                pickled.write(path, key, loaded)
    return loaded
