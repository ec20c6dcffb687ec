"""Tables computed from results, kept on disk: a new dashboard server's first Overview, or
`speedlib report --table headline` run again, reads them back instead of computing them (the
headline grid, the index of every comparison and the claims took 2 s of a 2-core machine's
first view; reading one back takes milliseconds).

A table is kept under the content it was computed from, so a kept table is never a stale one:
- the results tree's fingerprint (speedbench.results.cache: every file under it, and the
  loader's code),
- the rows the table was computed from (their result IDs: a link's pin or a machine filter
  picks other rows, and another key),
- the table's name, and anything else its caller says it depends on,
- every line of speedbench's own code, and pandas' and numpy's versions.
A new result, another selection, an edited speedbench, and the table is computed afresh. The
last `KEEP` tables of a tree are kept; older ones are removed as new ones are written.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy
import pandas as pd

import speedbench
from speedbench.results import cache, pickled

__all__ = ["table", "key", "KEEP"]

KEEP = 64  # tables per results tree: every filter a reader tries is a table of its own
T = TypeVar("T")


def _code_digest() -> bytes:
    """speedbench's source as this process imported it (read at import: a file edited later is
    code this process does not run), with the versions of the libraries that compute the tables."""
    h = hashlib.sha256(f"{pd.__version__} {numpy.__version__}".encode())
    package = Path(speedbench.__file__).parent
    for part in sorted(package.rglob("*.py")):
        h.update(str(part.relative_to(package)).encode())
        h.update(part.read_bytes())
    return h.digest()


_CODE = _code_digest()


def key(tree: str, name: str, rows: pd.DataFrame, *also: str) -> str | None:
    """The key of table `name` computed from `rows` of the tree whose fingerprint is `tree`, or
    None where the rows cannot be named (a frame without unique result IDs: built by hand)."""
    if "result_id" not in rows or not rows["result_id"].is_unique or rows["result_id"].isna().any():
        return None
    h = hashlib.sha256(_CODE)
    for part in (tree, name, *also):
        h.update(str(part).encode(errors="surrogateescape") + b"\0")
    h.update("\n".join(sorted(rows["result_id"].astype(str))).encode())
    return h.hexdigest()


def table(root: Path, tree: str, name: str, rows: pd.DataFrame, compute: Callable[[], T], *also: str) -> T:
    """`compute()`, the table `name` computed from `rows` of results tree `root` (fingerprint
    `tree`), read back where it was kept. Two processes asking at once compute it once."""
    k = key(tree, name, rows, *also)
    directory = cache.place(root, "tables", suffix="")
    if k is None or directory is None:
        return compute()
    path = directory / f"{re.sub(r'[^A-Za-z0-9_-]', '_', name)[:40]}-{k[:32]}.pickle"
    found = pickled.read(path, k)
    if found is not None:
        return found
    with pickled.computing(path):
        found = pickled.read(path, k)  # another process's, written while this one waited
        if found is None:
            found = compute()
            pickled.write(path, k, found)
            pickled.trim(directory, "*.pickle", KEEP)
    return found
