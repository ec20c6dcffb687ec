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

__all__ = ["Chunk", "load_chunks", "benchmark_listing", "select_chunks", "combinations", "recorded_durations", "estimate_seconds",
           "SECONDS_PER_COMBINATION", "HEADROOM", "PlanError", "chunk_times_path", "record_chunk_time",
           "recorded_chunk_seconds", "chunk_cost"]

# asv starts one process per parameter combination: about 3 s for the torch import and CUDA
# start on a GPU host, then setup (building a model) and up to 10 samples of a step that
# takes well under a second there. Used only where this machine has recorded no duration.
SECONDS_PER_COMBINATION = 6.0
# Estimates that are not a measured chunk time run long: asv keeps only the last run's
# duration of a benchmark, so after a chunk ran part of its parameter combinations the
# pro-rata split undercounts, and combinations differ in cost (ResNet-50 ones dominate).
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
    def picked(chunk: Chunk, name: str) -> bool:
        return name in ("all", chunk.name) or chunk.name.startswith(name + "-")

    known = [c.name for c in chunks]
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


def recorded_durations(results_dir: Path, machine: str) -> dict[str, tuple[float, int]]:
    """Per benchmark, (seconds asv took, parameter combinations that took them) from this
    machine's newest result that holds it."""
    newest: dict[str, tuple[float, float, int]] = {}
    for path in sorted((Path(results_dir) / machine).glob("*.json")):
        if path.name == "machine.json":
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            columns = data["result_columns"]
            for name, entry in data["results"].items():
                record = dict(zip(columns, entry))
                seconds, started = record.get("duration"), record.get("started_at") or 0
                if not isinstance(seconds, (int, float)):
                    continue
                n = len(list(itertools.product(*(record.get("params") or []))))
                if name not in newest or started > newest[name][0]:
                    newest[name] = (started, float(seconds), n)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # an unreadable file says nothing about cost; the results loader reports it
    return {name: (seconds, n) for name, (_, seconds, n) in newest.items()}


def estimate_seconds(chunk: Chunk, names: dict[str, list[str]],
                     durations: dict[str, tuple[float, int]]) -> tuple[float, int, int]:
    """(seconds, combinations, of which recorded) for `chunk`: a recorded benchmark costs its
    duration pro rata to the combinations selected, any other SECONDS_PER_COMBINATION each."""
    pattern = re.compile(chunk.regex)
    seconds, total, recorded = 0.0, 0, 0
    for name, combos in names.items():
        chosen = sum(1 for c in combos if pattern.search(c))
        if not chosen:
            continue
        total += chosen
        if name in durations and durations[name][1]:
            spent, n = durations[name]
            seconds += spent * chosen / n
            recorded += chosen
        else:
            seconds += SECONDS_PER_COMBINATION * chosen
    return seconds, total, recorded


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
    this machine, else asv's recorded durations or the per-combination estimate with HEADROOM."""
    measured = recorded_chunk_seconds(results_dir, machine)
    if chunk.name in measured:
        return measured[chunk.name], "measured chunk time"
    seconds, combos, recorded = estimate_seconds(chunk, names, recorded_durations(results_dir, machine))
    return seconds * HEADROOM, f"estimate x {HEADROOM} ({recorded} of {combos} combinations recorded)"
