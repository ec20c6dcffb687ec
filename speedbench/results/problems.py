"""How the loader's problems are told: `speedlib report`, the end of `speedlib run`, the dashboard.

The committed results carry ordinary traces of history: result files with results of a
benchmark that has changed since (set aside, or kept and flagged † where the machine has
nothing newer) or been removed. Printed one per line on every call, some twenty-five of them
buried the line that matters, a damaged file, and called all of them "skipped", the kept ones
too. So: what is damaged or incomplete is always listed, one line each; the traces of
history are counted in one summary line and listed on request (--verbose, an expander).
"""

from __future__ import annotations

from collections.abc import Iterable

from speedbench.results.load import Problem

__all__ = ["kind", "describe", "summary", "lines"]

# kind -> (the word that starts its line in a list, what happened, in the summary)
_KINDS = {
    "damaged": ("problem", "damaged or incomplete"),
    "outdated": ("set aside", "set aside: older benchmark version"),
    "removed": ("skipped", "skipped: benchmark removed"),
    "earlier": ("kept, flagged †", "kept, flagged †: the machine's newest"),
}


def kind(problem: Problem) -> str:
    """damaged (anything not expected), or the trace of history an expected one is."""
    if not problem.expected:
        return "damaged"
    return problem.kind if problem.kind in _KINDS else "outdated"  # history of a kind not named here


def describe(problem: Problem) -> str:
    """One line, starting with what happened: 'set aside: results/m/x.json: 3 result(s) ...'."""
    return f"{_KINDS[kind(problem)][0]}: {problem}"  # str(problem) escapes control characters


def summary(problems: Iterable[Problem], hint: str = "") -> str | None:
    """One line counting `problems` (None when there are none): damaged ones by number, the
    traces of history by result file and kind. `hint` ends it: how to see the list."""
    problems = list(problems)
    damaged = [p for p in problems if kind(p) == "damaged"]
    history = [p for p in problems if kind(p) != "damaged"]
    parts = []
    if damaged:
        parts.append(f"{len(damaged)} problem(s) with damaged or incomplete results")
    if history:
        files = {p.path for p in history}
        counts = [f"{len({p.path for p in history if kind(p) == k})} {words}"
                  for k, (_, words) in _KINDS.items() if k != "damaged" and any(kind(p) == k for p in history)]
        # a file can hold results of several kinds: the counts are files with each, not a partition
        parts.append(f"{len(files)} result file(s) hold older results (files per kind, one file may hold "
                     f"several: {'; '.join(counts)})")
    if not parts:
        return None
    return "; ".join(parts) + (f"; {hint}" if hint else "")


def lines(problems: Iterable[Problem], verbose: bool = False, hint: str = "--verbose lists them") -> list[str]:
    """What a command prints: every damaged one (always: a torn file must be noticed), every
    other one too when `verbose`, then the summary line."""
    problems = list(problems)
    shown = [describe(p) for p in problems if verbose or kind(p) == "damaged"]
    hidden = any(kind(p) != "damaged" for p in problems) and not verbose
    line = summary(problems, hint if hidden else "")
    return shown + ([line] if line else [])
