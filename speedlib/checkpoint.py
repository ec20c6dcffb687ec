"""Activation checkpointing with explicit parameters, and BatchNorm that counts a step once.

`checkpoint(fn, *args, params=..., **kwargs)` runs `fn` without keeping its activations and reruns
it in backward; it takes torch.utils.checkpoint.checkpoint's arguments (speedlib/_checkpoint_args.py
reads them) and `checkpoint_sequential` torch's. Unlike `torch.utils.checkpoint(use_reentrant=True)` it never starts a
nested backward pass: the rerun's gradients come out of one `torch.autograd.grad` call and
are returned as the gradients of `inputs` and `params`, which are inputs of the autograd
node. The outer backward pass therefore accumulates every parameter's gradient itself,
once, in its own order, which is what DataParallel's per-device threads and
DistributedDataParallel's bucket hooks expect (the nested pass of the reentrant variant is
what made pytorch-checkpoint's "Official" row cost 1.4 s instead of 0.3 s on two GPUs).

What the original `CheckpointFunction` got wrong, fixed here:

- the RNG state (CPU and every CUDA device the inputs live on) is saved before the first
  run and restored for the rerun, so dropout draws the same mask twice;
- arguments and results of any structure: nested lists, tuples and dicts of tensors (the
  list of feature maps an efficient DenseNet layer takes), keyword arguments, inputs that
  do not require grad, and non-tensors (None, ints, strings) next to tensors;
- double backward: under `create_graph=True` (a gradient penalty) the rerun and its
  gradients are recorded, so second-order gradients reach inputs and parameters as
  without checkpointing (equal up to summation order) instead of being dropped;
- a tensor that needs a gradient but reaches the segment neither as an argument nor through
  `params` (a forgotten parameter) is an error in backward, not a silently missing gradient;
  a parameter listed twice (tied weights) counts once instead of getting its gradient twice;
- the autocast state of the first run is used for the rerun.

Where torch's non-reentrant checkpoint (which keeps the segment's own graph) already
behaved well, this one now does too: a parameter's gradient hook runs once (the inner
autograd.grad of the rerun leaves it to the outer pass); dataclass results and arguments
are flattened; each output has its own node (a hook on one output may backpropagate from
another) and autograd.grad(b, a) between outputs works; a segment may call autograd.grad
itself; and a rerun that saves other tensors than the first run (a nondeterministic
segment) raises NondeterministicSegmentError. docs/techniques/checkpoint.md lists what
still deliberately differs.

BatchNorm: both `torch.utils.checkpoint` variants (and any checkpoint) run a segment's
forward twice, and a plain `nn.BatchNorm*d` updates its running statistics and
`num_batches_tracked` on both runs. speedlib's `BatchNorm1d/2d/3d` skip the update when
their forward runs inside a backward pass, which is where every checkpoint reruns
segments; the decision does not depend on whether the input requires grad.
`convert_batchnorm(model)` swaps them into an existing model.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from speedlib._checkpoint_args import ModuleTensors, explicit_params, open_partial, owner, torch_options, two_contexts
from speedlib._checkpoint_batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d, convert_batchnorm, in_backward

# Five parts live in private modules, each readable on its own: the flattening of a segment's
# arguments and results and the log of its saved tensors (speedlib/_checkpoint_tree.py), and
# the BatchNorm that counts a step once (_checkpoint_batchnorm.py), and the reading of the
# caller's arguments as torch's (_checkpoint_args.py), and the segment's first run and rerun
# (_checkpoint_runs.py), and the autograd nodes (_checkpoint_node.py). This module keeps the
# calls a user makes and stays the technique's one import.
from speedlib._checkpoint_node import ForgottenParameterError, _Checkpoint, _own_nodes
from speedlib._checkpoint_runs import _Segment
from speedlib._checkpoint_tree import NondeterministicSegmentError, _flatten

__all__ = ["checkpoint", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "convert_batchnorm",
           "in_backward", "ForgottenParameterError", "NondeterministicSegmentError", "SEGMENT_VARIANTS", "run_segment",
           "CheckpointedSequential", "checkpoint_sequential"]


# --- the explicit-parameter checkpoint ---------------------------------------------------


def checkpoint(function: Callable[..., Any], *args: Any, use_reentrant: bool | None = None,
               context_fn: Callable[[], tuple[Any, Any]] | None = None, determinism_check: str = "default",
               debug: bool = False, params: Iterable[torch.Tensor] | None = None, preserve_rng_state: bool = True,
               check_params: bool = True, **kwargs: Any) -> Any:
    """Run `function(*args, **kwargs)` without keeping its activations; rerun it in backward.

    Takes torch.utils.checkpoint.checkpoint's arguments and behaves as its non-reentrant
    variant, except where docs/techniques/checkpoint.md says why not.

    args, kwargs: passed to `function`. They may be nested lists, tuples and dicts: every
        tensor anywhere in them gets its gradient (a DenseNet layer's list of feature maps).
        A keyword argument of the function named like one of this call's own must go
        through a lambda (as under torch).
    use_reentrant: None or False (the reentrant variant's nested backward is refused).
    context_fn: torch's: returns two context managers, for the first run and the rerun.
    determinism_check: "default" (a rerun that saves other tensors raises
        NondeterministicSegmentError) or "none". debug: False only.
    params: every tensor requiring grad that `function` uses besides `args` and `kwargs`
        (its parameters). Found automatically when `function` is an `nn.Module`, a bound
        method of one, or a `functools.partial` over either; any other callable must list
        them (an empty tuple if it has none). `module.named_parameters()` is accepted too;
        a tensor listed twice counts once.
    preserve_rng_state: restore the RNG state for the rerun (dropout sees the same mask),
        the default generators and any generator the segment draws from itself.
    check_params: raise ForgottenParameterError in backward when the rerun reaches a tensor
        requiring grad that is in neither the arguments nor `params`.

    Returns what `function` returns, with the same structure: tensors, and non-tensors
    (None, ints, strings) next to them. Higher-order gradients (backward or autograd.grad
    with create_graph=True, as in a gradient penalty) equal those without checkpointing.
    """
    if torch.compiler.is_compiling():  # under torch.compile: a graph break, the segment runs eagerly
        return _eager_checkpoint()(function, *args, use_reentrant=use_reentrant, context_fn=context_fn,
                                   determinism_check=determinism_check, debug=debug, params=params,
                                   preserve_rng_state=preserve_rng_state, check_params=check_params, **kwargs)
    contexts = two_contexts(torch_options(use_reentrant, context_fn, determinism_check, debug))
    if not callable(function):
        raise TypeError(f"speedlib.checkpoint: the function to checkpoint must be callable, "
                        f"got {type(function).__name__}")
    function, args, kwargs = open_partial(function, args, kwargs)
    module = owner(function, args)
    params = explicit_params(module, params)
    if any(nn.parameter.is_lazy(p) for p in params):
        # A lazy module (nn.LazyLinear) shapes its parameters in its first call, and the node
        # needs their shapes before it: that one call runs without checkpointing.
        return function(*args, **kwargs)
    named = module.named_parameters() if check_params and module is not None else ()
    leaves, in_spec = _flatten((args, kwargs))
    segment = _Segment(function, in_spec, {id(p): f"parameter {n!r}" for n, p in named}, contexts,
                       ModuleTensors(module), determinism_check == "default")
    segment.generators.given = any(isinstance(leaf, torch.Generator) for leaf in leaves)
    # Recording the first run's saved tensors needs grad mode (without it there is no
    # backward to check) and saved-tensor hooks that are not disabled.
    record = torch.is_grad_enabled() and torch._C._autograd._saved_tensors_hooks_is_enabled()
    will_rerun = torch.is_grad_enabled() and any(torch.is_tensor(t) and t.requires_grad for t in (*leaves, *params))
    outputs = _Checkpoint.apply(segment, len(leaves), preserve_rng_state, check_params, record, will_rerun,
                                *leaves, *params)
    return segment.rebuild(_own_nodes(segment, outputs))


@functools.cache
def _eager_checkpoint() -> Callable[..., Any]:
    # The first run and the rerun must run the same code: compiled, they would save other tensors.
    return torch.compiler.disable(checkpoint)


def checkpoint_sequential(functions: nn.Sequential | list[Callable[..., Any]], segments: int, input: Any,
                          use_reentrant: bool | None = None, **kwargs: Any) -> Any:
    """torch.utils.checkpoint.checkpoint_sequential with speedlib's checkpoint.

    Runs `functions` (an nn.Sequential or a list of modules) in order on `input`, split into
    `segments` runs of len // segments functions; every run but the last is checkpointed.
    kwargs: preserve_rng_state, context_fn, determinism_check, check_params.
    """
    items = list(functions.children()) if isinstance(functions, nn.Sequential) else list(functions)
    if not isinstance(segments, int) or not 1 <= segments <= max(1, len(items)):
        raise ValueError(f"speedlib.checkpoint_sequential: segments must be an int from 1 to the number of "
                         f"functions ({len(items)}), got {segments!r}")
    size = len(items) // segments
    for start in range(0, size * (segments - 1), size):
        part = items[start:start + size]
        found = [m.parameters() for m in part if isinstance(m, nn.Module)]
        if len(found) < len(part):
            raise TypeError("speedlib.checkpoint_sequential: every function must be an nn.Module (its parameters "
                            "are the segment's); wrap other callables in a module")
        input = checkpoint(nn.Sequential(*part), input, use_reentrant=use_reentrant, **kwargs)
    for f in items[size * (segments - 1):]:
        input = f(input)
    return input


# --- the variants the benchmark compares ------------------------------------------------

# How one segment (a layer's bottleneck, a transformer block) can run.
SEGMENT_VARIANTS = ("none", "reentrant", "non_reentrant", "speedlib")


def run_segment(variant: str, function: Callable[..., Any], *inputs: Any, params: Iterable[torch.Tensor]) -> Any:
    """`function(*inputs)` under one checkpoint variant; `params` is what speedlib's needs."""
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
