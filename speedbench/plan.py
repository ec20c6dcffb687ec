"""The suite's chunks (benchmarks/chunks.py) as asv selections, with what each will cost.

Part of the harness, not the library: no torch here, so `speedlib run --plan` answers at
once on a machine that is about to spend its slot.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Chunk", "load_chunks", "benchmark_listing", "select_chunks", "combinations", "estimate_seconds",
           "SECONDS_PER_COMBINATION", "SECONDS_PER_CLASS", "SECONDS_PER_METHOD", "HEADROOM", "PlanError", "chunk_times_path", "record_chunk_time",
           "recorded_chunk_seconds", "chunk_cost"]

# A class is measured in one process (benchmarks/common.py: its setup_cache measures every
# parameter combination, variants taking turns), then each of its track_ methods reports
# from the cache in a short torch-free process. On one H100 (2026-11-23) the headline
# classes took 24-103 s for 3-30 combinations: 3-8 s a combination (ResNet-50 and DenseNet
# steps, 30 paired rounds, warm-up), a few seconds to import torch and start CUDA per class,
# about a second per reporting process. Used only where this machine has no measured time
# for the chunk (results/<machine>/chunk-times.jsonl).
SECONDS_PER_COMBINATION = 6.0
SECONDS_PER_CLASS = 3.0
SECONDS_PER_METHOD = 1.0
# The estimate runs short for classes of big models (checkpointed DenseNet-121 at batch
# 256); a measured chunk time replaces it after the first run.
HEADROOM = 1.5


class PlanError(ValueError):
    """A chunk name or definition that cannot be used; the message says which."""


@dataclass(frozen=True)
class Chunk:
    name: str
    about: str
    regex: str  # for asv --bench: this chunk's patterns, none of an earlier chunk's


def load_chunks(root: Path) -> list[Chunk]:
    """The chunks of the checkout at `root`, each excluding what earlier chunks take."""
    path = Path(root) / "benchmarks" / "chunks.py"
    if not path.is_file():
        raise PlanError(f"no {path}: this checkout's suite is not split into chunks")
    spec = importlib.util.spec_from_file_location("_speedlib_chunks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    chunks, earlier = [], []
    for name, about, patterns in module.CHUNKS:
        mine = "|".join(f"(?:{p})" for p in patterns)
        exclude = f"(?!{'|'.join(earlier)})" if earlier else ""
        chunks.append(Chunk(name, about, f"^{exclude}(?:{mine})"))
        earlier += [f"(?:{p})" for p in patterns]
    return chunks


def select_chunks(chunks: list[Chunk], names: list[str]) -> list[Chunk]:
    """`names` in suite order ("all": every chunk; a group such as "headline": every chunk
    named "headline-..."); an unknown name is an error."""
    known = [c.name for c in chunks]
    def picked(chunk: Chunk, name: str) -> bool:
        if name in ("all", chunk.name):
            return True
        # A group prefix, unless the name is a chunk's own: "headline-checkpoint" is that
        # chunk, not also "headline-checkpoint-memory" (an H100 slot lost 90 s to that).
        return name not in known and chunk.name.startswith(name + "-")

    unknown = [n for n in names if not any(picked(c, n) for c in chunks)]
    if unknown:
        raise PlanError(f"unknown chunk {unknown[0]!r}; the chunks are: {', '.join(known)} (or all)")
    return [c for c in chunks if any(picked(c, n) for n in names)]


def benchmark_listing(root: Path, results_dir: Path) -> Path | None:
    """asv's benchmark listing: the results directory's (a run writes it first thing), else
    the checkout's committed one; None before the suite ever ran."""
    for listing in (Path(results_dir) / "benchmarks.json", Path(root) / "results" / "benchmarks.json"):
        if listing.is_file():
            return listing
    return None


def combinations(benchmarks_json: Path) -> dict[str, list[str]]:
    """Every benchmark's selectable names, as asv's --bench sees them: `name(p0, p1)` per
    parameter combination (the parameters' reprs), or just `name`."""
    data = json.loads(Path(benchmarks_json).read_text(encoding="utf-8"))
    names = {}
    for name, bench in data.items():
        if not isinstance(bench, dict):  # the file's "version" entry
            continue
        params = bench.get("params") or []
        names[name] = [f"{name}({', '.join(c)})" for c in itertools.product(*params)] if params else [name]
    return names


def estimate_seconds(chunk: Chunk, names: dict[str, list[str]]) -> tuple[float, int, int]:
    """(seconds, parameter combinations measured, benchmark methods) for `chunk`: each class
    it selects is one measuring process over the union of its selected combinations, plus
    one reporting process per selected method."""
    pattern = re.compile(chunk.regex)
    per_class: dict[str, set[str]] = {}
    methods = 0
    for name, combos in names.items():
        chosen = [c[len(name):] for c in combos if pattern.search(c)]  # the "(p0, p1)" part
        if not chosen:
            continue
        methods += 1
        per_class.setdefault(name.rsplit(".", 1)[0], set()).update(chosen)
    n = sum(len(c) for c in per_class.values())
    seconds = SECONDS_PER_CLASS * len(per_class) + SECONDS_PER_COMBINATION * n + SECONDS_PER_METHOD * methods
    return seconds, n, methods


# --- measured chunk times: the estimate that needs no guessing --------------------------

def chunk_times_path(results_dir: Path, machine: str) -> Path:
    """One JSON line per chunk and commit a run measured (not *.json: asv would read it)."""
    return Path(results_dir) / machine / "chunk-times.jsonl"


def record_chunk_time(results_dir: Path, machine: str, chunk: str, sha: str, seconds: float) -> None:
    path = chunk_times_path(results_dir, machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"chunk": chunk, "commit": sha, "seconds": round(seconds, 1)}) + "\n")


def recorded_chunk_seconds(results_dir: Path, machine: str) -> dict[str, float]:
    """Per chunk, the wall time of its latest measured run over one commit on this machine."""
    seconds: dict[str, float] = {}
    path = chunk_times_path(results_dir, machine)
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
                seconds[str(entry["chunk"])] = float(entry["seconds"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn line from a killed run says nothing
    return seconds


def chunk_cost(chunk: Chunk, names: dict[str, list[str]], results_dir: Path, machine: str) -> tuple[float, str]:
    """(seconds for one commit, where the figure comes from): a measured run of this chunk on
    this machine, else the per-class estimate with HEADROOM. (asv's own recorded durations
    leave out setup_cache, where the measuring happens, so they are no estimate.)"""
    measured = recorded_chunk_seconds(results_dir, machine)
    if chunk.name in measured:
        return measured[chunk.name], "measured chunk time"
    seconds, combos, methods = estimate_seconds(chunk, names)
    return seconds * HEADROOM, f"estimate x {HEADROOM} ({combos} combinations, {methods} methods)"
