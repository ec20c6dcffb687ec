"""Small things every part of the results loader shares (speedbench.results.load re-exports them).

`Problem` (what a load reports), `printable` (a name from a file made safe to print) and the
JSON number checks. Stdlib only (the results tree and `speedlib merge`'s parser use `printable`
too). They sit apart, below the loader's other modules (speedbench.results.files,
speedbench.results.environment, speedbench.results.across_rows, speedbench.results.result_file and
speedbench.results.load itself), so that each can import them without importing
speedbench.results.load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Problem", "Status", "printable"]


class Status(StrEnum):
    """A row's `status`, from its value (speedbench.results.load) and its benchmark's version
    (speedbench.results.across_rows); only MEASURED rows are in the measured frame."""

    MEASURED = "measured"
    SKIPPED = "skipped"  # asv's NaN: the benchmark skipped itself
    FAILED = "failed"  # asv's null: it raised
    INVALID = "invalid"  # infinite, or a time or ratio of zero or less
    OUTDATED = "outdated"  # an older version of its benchmark, set aside


def printable(text) -> str:
    """`text` with every character that could move the cursor, colour a terminal, start a new
    line or not encode (control characters, lone surrogates from undecodable file names)
    written as its Python escape. Names come from files anyone can drop in results/."""
    return "".join(c if c.isprintable() else _escape(c) for c in str(text))


def _escape(c: str) -> str:
    # A byte of an undecodable file name arrives as a lone surrogate (U+DC80 to U+DCFF, Python's
    # surrogateescape): shown as the byte it stands for, as `ls -b` would.
    return f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else repr(c)[1:-1]


@dataclass(frozen=True)
class Problem:
    """Something under results/ that was not loaded (or loaded with a gap), and why."""

    path: str
    reason: str
    # True for the ordinary traces of history, not damage: results of a benchmark that has
    # since changed (outdated) or been removed. A viewer may list them more quietly.
    expected: bool = False
    # Which of those traces (speedbench.results.problems counts them apart): "removed" (a benchmark no
    # longer in benchmarks.json), "outdated" (set aside) or "earlier" (kept, flagged †).
    kind: str = ""

    def __str__(self) -> str:
        return printable(f"{self.path}: {self.reason}")



def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _to_float(x) -> float:
    """A JSON number as a float. json reads 1e400 as inf, but an integer too large for a float
    stays an int; it becomes an infinity here, so one check catches every overflow."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf
