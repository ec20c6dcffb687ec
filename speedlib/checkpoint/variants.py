"""The checkpoint variants the benchmark compares, side by side on one segment: none, torch's two,
speedlib's, and torch's checkpoint_sequential over a feature stack (speedbench.measure.workloads
builds its checkpointed DenseNets and transformer from these)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from speedlib.checkpoint.recompute import checkpoint

# How one segment (a layer's bottleneck, a transformer block) can run.
SEGMENT_VARIANTS = ("none", "reentrant", "non_reentrant", "speedlib")


def run_segment(variant: str, function: Callable[..., Any], *inputs: Any, params: Iterable[torch.Tensor]) -> Any:
    """`function(*inputs)` under one checkpoint variant; `params` goes to speedlib's (accepted, not needed)."""
    if variant == "none":
        return function(*inputs)
    if variant == "speedlib":
        return checkpoint(function, *inputs, params=params)
    if variant in ("reentrant", "non_reentrant"):
        return torch.utils.checkpoint.checkpoint(function, *inputs, use_reentrant=variant == "reentrant")
    raise ValueError(f"unknown segment checkpoint variant {variant!r}; expected one of {SEGMENT_VARIANTS}")


class CheckpointedSequential(nn.Sequential):
    """nn.Sequential that, with checkpoint_variant = "sequential", trains through
    `torch.utils.checkpoint.checkpoint_sequential` in ceil(sqrt(n)) segments (the sqrt(n)
    schedule of Chen et al., 2016: memory and recompute both grow as sqrt of the depth).
    Same children and state_dict as the nn.Sequential it replaces."""

    checkpoint_variant = "none"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.checkpoint_variant != "sequential" or not torch.is_grad_enabled():
            return super().forward(input)
        segments = max(1, math.ceil(math.sqrt(len(self))))
        return torch.utils.checkpoint.checkpoint_sequential(self, segments, input, use_reentrant=False)
