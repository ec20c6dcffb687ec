"""Activation checkpointing that takes torch.utils.checkpoint's calls unchanged, and BatchNorm
that counts a step once.

`checkpoint(fn, *args, use_reentrant=..., context_fn=..., determinism_check=..., debug=...,
preserve_rng_state=..., early_stop=..., **kwargs)` and `checkpoint_sequential(functions, segments,
input, use_reentrant=..., **kwargs)` accept every argument torch's do, for any callable. Switching
is an import. Two variants, as in torch, both in speedlib/checkpoint/recompute.py:

- use_reentrant=False (or left out): the segment's graph is recorded and what it saves for
  backward is dropped and recomputed when backward needs it.
  Every tensor the function uses gets its gradient, whatever reached it; gradients are those of
  torch's non-reentrant checkpoint, bitwise on CPU. torch warns when use_reentrant is left out
  and then runs its reentrant variant; here leaving it out means False.
- use_reentrant=True: one node reruns the segment in a backward pass of its own, with the
  reentrant variant's contract.

What speedlib adds in both (speedlib/checkpoint/replay.py): dropout drawn from the segment's own
`torch.Generator` sees the first run's mask again; forward hooks that only observe run once per
step; the rerun uses the tensors a `torch.func.functional_call` gave the first run. And
`BatchNorm1d/2d/3d` (`convert_batchnorm(model)`) update their running statistics once per step
under any checkpoint, where torch's rerun would update a plain `nn.BatchNorm*d` twice
(speedlib/checkpoint/batchnorm.py). Under torch.compile the call is torch's own checkpoint, which
the compiler traces. docs/techniques/checkpoint.md lists what is identical, added and different,
each with the test that shows it. The variants the benchmark compares (`run_segment`,
`CheckpointedSequential`) are in speedlib/checkpoint/variants.py.
"""

from speedlib.checkpoint.batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d, convert_batchnorm, in_backward
from speedlib.checkpoint.recompute import (
    ForgottenParameterError,
    NondeterministicSegmentError,
    checkpoint,
    checkpoint_sequential,
)
from speedlib.checkpoint.variants import SEGMENT_VARIANTS, CheckpointedSequential, run_segment

__all__ = ["checkpoint", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "convert_batchnorm",
           "in_backward", "ForgottenParameterError", "NondeterministicSegmentError", "SEGMENT_VARIANTS", "run_segment",
           "CheckpointedSequential", "checkpoint_sequential"]
