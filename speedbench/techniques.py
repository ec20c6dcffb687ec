"""The techniques the suite measures: each one's title, baseline and headline metric.

A new technique adds its entry to `TECHNIQUES` (docs/adding-a-technique.md). The tables read
each technique's baseline chain from here (speedbench.tables), the claims and the dashboard
its title; this module imports nothing else of the harness, so any of them can import it.
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

    @property
    def baselines(self) -> tuple[str, ...]:
        return (self.baseline, *self.fallbacks)


# The baselines are what each technique's source write-up compared against.
TECHNIQUES = {
    "contiguous": Technique("Flat-buffer (contiguous) parameters", "forloop", "adam_step", suite="AdamStep"),
    # pinned is the GPU baseline; CPUs run only pageable tables (and the sparse_adam reference)
    "transfer": Technique("Host<->GPU transfer and CPU-hosted embeddings", "pinned", "gather", ("pageable",),
                          suite="Transfer"),
    "checkpoint": Technique("Activation checkpointing", "none", "step", suite="TrainingStep"),
    "amp": Technique("Mixed precision", "fp32", "step", suite="TrainingStep"),
    # DDP and DataParallel are separate launches, not pairable: the headline is their step times
    "parallel": Technique("DistributedDataParallel vs DataParallel", "dataparallel", "step", ("single", "off")),
    "tuning": Technique("Performance Tuning Guide knobs", "off", "step", suite="TrainingStep"),
}
