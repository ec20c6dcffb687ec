"""The suite's chunks (benchmarks/chunks.py) as asv selections, and which chunk measures a benchmark.

Data about the suite, read by the runner (speedbench.run.plan prices and selects chunks) and by
the viewer (a page or a claim not measured yet names the `speedlib run` that would measure it),
so it sits below both: this module imports nothing of the harness but the checkout's path.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from speedbench import CHECKOUT

__all__ = ["Chunk", "ChunkError", "load_chunks", "how_to_measure"]


class ChunkError(ValueError):
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
        raise ChunkError(f"no {path}: this checkout's suite is not split into chunks")
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


def how_to_measure(benchmark: str, root: Path = CHECKOUT) -> str:
    """The `speedlib run` command that measures `benchmark` ("bench_amp.TrainingStep." or a
    full "module.Class.method"): its chunk where the checkout has chunks, else a --bench
    selection of it. Pages that say "not measured yet" say this too."""
    chunk = next((c for c in _checkout_chunks(Path(root)) if re.match(c.regex, benchmark)), None)
    if chunk is not None:
        return f"speedlib run --chunk {chunk.name}"
    return f"speedlib run --bench '^{re.escape(benchmark)}'"


@functools.lru_cache(maxsize=4)
def _checkout_chunks(root: Path) -> tuple[Chunk, ...]:
    """`load_chunks` once per checkout for the pages that name a chunk (a page names several,
    each render); none for an installed copy without benchmarks/."""
    try:
        return tuple(load_chunks(root))
    except (ChunkError, OSError, SyntaxError):
        return ()
