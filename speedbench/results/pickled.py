"""A value kept as a pickle in speedlib's cache directory, beside the key it was computed for:
read back only where the key matches and the file is ours alone (unpickling runs code), written
whole (a reader sees the old file or the new one), and computed once where two processes want it
at the same moment (`computing`: the second waits for the first's file rather than do its work
again). Nothing here is ever needed: a cache that cannot be read or written only costs time.

The directory is `$SPEEDLIB_CACHE_DIR`, else `$XDG_CACHE_HOME/speedlib`, else `~/.cache/speedlib`:
outside `results/`, so a results directory stays what asv wrote.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import stat
import tempfile
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # not a POSIX system: two processes may compute the same value
    fcntl = None

__all__ = ["cache_dir", "read", "write", "computing", "trim"]


def cache_dir() -> Path:
    if os.environ.get("SPEEDLIB_CACHE_DIR"):
        return Path(os.environ["SPEEDLIB_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "speedlib"


def _trusted(path: Path) -> bool:
    """Ours and writable by us alone: a file someone else could have written is never unpickled."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def read(path: Path, key: str, kind: type | tuple[type, ...] = object):
    """The value stored at `path` for `key` (an instance of `kind`), else None."""
    if not hasattr(os, "getuid") or not _trusted(path):
        return None
    try:
        with path.open("rb") as f:
            stored_key, value = pickle.load(f)
    except Exception:  # noqa: BLE001 - a truncated or foreign file: as if there were none
        return None
    return value if stored_key == key and isinstance(value, kind) else None


def write(path: Path, key: str, value) -> None:
    """Store `value` for `key` at `path`, atomically; a read-only home or a full disk is let be."""
    if not hasattr(os, "getuid"):
        return
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump((key, value), f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        pass  # unwritable, or a value pickle cannot hold: computed again next time, nothing else


@contextlib.contextmanager
def computing(path: Path, wait_s: float = 60.0):
    """Held while `path`'s value is computed and written: a second process asking for it meanwhile
    waits here (up to `wait_s`, for a first one that hangs) and then finds the file. Where no lock
    can be taken (no fcntl, an unwritable directory), nothing waits."""
    fd = None
    if fcntl is not None:
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            fd = None
    try:
        if fd is not None:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break  # the holder hangs: compute without it
                    time.sleep(0.02)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # drops the lock with it


def trim(directory: Path, pattern: str, keep: int) -> None:
    """Remove all but the `keep` newest files matching `pattern` in `directory` (and their locks):
    a key changes with every new result, and the old values are never asked for again."""
    try:
        files = sorted(directory.glob(pattern), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    except OSError:
        return
    for old in files[keep:]:
        for gone in (old, Path(f"{old}.lock")):
            with contextlib.suppress(OSError):
                gone.unlink()
