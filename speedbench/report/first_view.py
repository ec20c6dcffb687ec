"""What the dashboard's Overview computes from the results, and computing it ahead.

`speedlib dashboard` runs `warm(results)` in a process of its own while Streamlit starts: it
parses the tree, computes the Overview's tables from every result (what the page shows without a
link's pin or a machine filter) and how far behind HEAD each chart cell is, and keeps them on
disk (speedbench.results.cache, speedbench.report.kept). The first page view then reads them
back, or waits for the warm-up rather than compute the same tables beside it on the same cores.
A warm-up that fails or is killed costs nothing but that: the page computes what it misses.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pandas as pd

from speedbench.report import age, claims, comparisons, headline, kept
from speedbench.results import cache

__all__ = ["TABLES", "cells_behind", "warm"]

# The Overview's tables by the name it keeps them under: the chart's grid, the index of every
# paired comparison, the sources' claims beside the measured figures.
TABLES = {"headline": headline.grid, "every": comparisons.every_comparison, "claims": claims.claims_table}


def cells_behind(grid: pd.DataFrame, root: Path = age.ROOT) -> dict[tuple[str, str], age.Behind]:
    """How far behind `root`'s HEAD each measured cell of a grid's tidy rows (`Table.data`) is, by
    (question, machine); none where git or the checkout is missing."""
    measured = grid[grid["status"] == headline.MEASURED]
    cells = [r for r in measured.itertuples() if isinstance(r.commit, str) and r.commit]
    found = age.behind_all(((r.commit, r.technique) for r in cells), root)
    return {(r.question, r.machine): found[r.commit, r.technique] for r in cells
            if found[r.commit, r.technique] is not None}


def warm(results: str | Path) -> None:
    """Compute and keep what the Overview's first view of `results` needs."""
    root = Path(results).resolve()  # as the dashboard names it: the fingerprint holds the paths
    signature = cache.fingerprint(root)
    rows = cache.load(root, key=signature).measured
    if rows.empty:
        return
    # in the order the page asks: the chart's grid, its cells' ages (git runs that wait on git, not
    # on Python: beside the other two tables), the index of every comparison, the claims
    grid = kept.table(root, signature, "headline", rows, lambda: TABLES["headline"](rows))
    ages = threading.Thread(target=cells_behind, args=(grid.data,))
    ages.start()
    for name, compute in TABLES.items():
        if name != "headline":  # the grid above
            kept.table(root, signature, name, rows, lambda compute=compute: compute(rows))
    ages.join()


if __name__ == "__main__":
    warm(sys.argv[1])
