"""asv's benchmark listing (benchmarks.json) as the names `asv run --bench` selects.

Read by the runner (a chunk's price counts the combinations it selects, speedbench.run.plan)
and by the dashboard (the benchmarks a page offers), so it lives with the results tree's files.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from speedbench.results.result_file import params_over_limits

__all__ = ["combinations"]


def combinations(benchmarks_json: Path, skipped: list[str] | None = None) -> dict[str, list[str]]:
    """Every benchmark's selectable names, as asv's --bench sees them: `name(p0, p1)` per
    parameter combination (the parameters' reprs), or just `name`. A benchmark whose
    parameters are not lists of strings, or go past the loader's limits (too many
    combinations, too long a value: speedbench.results.result_file.params_over_limits), is left out (never expanded),
    with a line saying why appended to `skipped`."""
    data = json.loads(Path(benchmarks_json).read_text(encoding="utf-8"))
    names = {}
    for name, bench in data.items():
        if not isinstance(bench, dict):
            if name != "version" and skipped is not None:  # the file's own "version" is a number
                skipped.append(f"{name}: not an object describing a benchmark; left out")
            continue
        params = bench.get("params") or []
        why = _unusable_params(params)
        if why:
            if skipped is not None:
                skipped.append(f"{name}: {why}; left out")
            continue
        names[name] = [f"{name}({', '.join(c)})" for c in itertools.product(*params)] if params else [name]
    return names


def _unusable_params(params) -> str | None:
    """Why a listing's `params` cannot be expanded into names, or None."""
    if not isinstance(params, list) or not all(isinstance(p, list) and all(isinstance(v, str) for v in p)
                                               for p in params):
        return "'params' is not a list of lists of strings"
    return params_over_limits(params)
