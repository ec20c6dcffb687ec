"""The techniques the suite measures: each one's title, baseline and headline metric.

A new technique adds its entry to `TECHNIQUES` (docs/adding-a-technique.md). The tables read
each technique's baseline chain from here (speedbench.report.tables), the claims and the dashboard
its title; this module imports nothing else of the harness, so any of them can import it.

A baseline is plain PyTorch: a variant written with torch alone in its benchmark
(benchmarks/bench_<name>.py, listed there as PLAIN_PYTORCH and here as `plain`), never a
speedlib code path, so a ratio against it does not move when speedlib's code does.
tests/test_baselines.py holds the two lists together and runs every plain variant's step
with a check that no speedlib code runs in it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Technique", "TECHNIQUES"]


@dataclass(frozen=True)
class Technique:
    title: str
    baseline: str  # the variant every other variant is compared with
    headline: str  # the metric the overview shows where no paired headline was measured
    # Baselines for benchmarks that have no `baseline` variant, in order of preference
    # (DataParallel does not run on CPUs; some benchmarks switch one option off and on).
    fallbacks: tuple[str, ...] = ()
    # The class whose paired speedups (variants taking turns in one process) are the headline.
    suite: str | None = None
    # The variants written with torch alone in the benchmarks: every baseline is one of them.
    plain: tuple[str, ...] = ()
    # Variants that were a class's baseline in results measured before baselines were plain
    # PyTorch, though they are speedlib code paths: their own speedup was never recorded, by
    # design, and nothing is shown as a ratio against them.
    former: tuple[str, ...] = ()

    @property
    def baselines(self) -> tuple[str, ...]:
        return (self.baseline, *self.fallbacks)

    def __post_init__(self):
        speedlib = [b for b in self.baselines if b not in self.plain]
        if speedlib:  # the rule, checked where the chain is written
            raise ValueError(f"{self.title}: baselines {speedlib} are not plain PyTorch variants {self.plain}")


# The baselines are what each technique's source write-up compared against, written with
# torch alone (SpeedTorch's "PyTorch pinned" is torch_pinned, not speedlib's pinned backend).
TECHNIQUES = {
    "contiguous": Technique("Flat-buffer (contiguous) parameters", "forloop", "adam_step", suite="AdamStep",
                            plain=("forloop", "foreach", "fused")),
    # torch_pinned is the GPU baseline; CPUs run only pageable tables: torch_pageable there. EmbeddingStep
    # compares with sparse_adam_host, and Packing (measured up to 838236b) with index_select.
    "transfer": Technique("Host<->GPU transfer and CPU-hosted embeddings", "torch_pinned", "gather",
                          ("torch_pageable", "sparse_adam_host", "index_select"), suite="Transfer",
                          plain=("torch_pageable", "torch_pinned", "sparse_adam_host", "sparse_adam", "index_select"),
                          former=("pinned", "pageable")),
    "checkpoint": Technique("Activation checkpointing", "none", "step", suite="TrainingStep",
                            plain=("none", "reentrant", "non_reentrant", "sequential")),
    "amp": Technique("Mixed precision", "fp32", "step", suite="TrainingStep", plain=("fp32", "default")),
    # DDP and DataParallel are separate launches, not pairable: the headline is their step times
    "parallel": Technique("DistributedDataParallel vs DataParallel", "dataparallel", "step", ("single", "off"),
                          plain=("single", "dataparallel", "off")),
    "tuning": Technique("Performance Tuning Guide knobs", "off", "step", suite="TrainingStep", plain=("off",)),
}
