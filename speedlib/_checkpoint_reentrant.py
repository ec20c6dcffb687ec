"""The checkpoint that reruns its segment inside a backward pass of its own (use_reentrant=True).

One autograd node stands for the whole segment: its first run goes without grad, and its
backward reruns the segment from detached copies of the arguments and calls
`torch.autograd.backward` on the rerun, which accumulates the parameters' gradients in that
nested pass and leaves the arguments' gradients for the node to return. That is
torch.utils.checkpoint's reentrant variant, with its contract (torch.autograd.grad and
backward(inputs=...) through it are refused; a rerun whose outputs need no gradient is an
error), here in our code with speedlib's additions: keyword arguments and tensors nested in
lists, tuples and dicts are inputs of the node, and `Replay` restores the segment's own
generators, quiets observer hooks and keeps the module's tensors, as for the other variant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from speedlib._checkpoint_replay import Replay


class _Run:
    """The segment seen through flat argument and result lists (the node tracks flat tensors only)."""

    def __init__(self, function: Callable[..., Any], in_spec: Any, replay: Replay):
        self.function, self.in_spec, self.replay = function, in_spec, replay
        self.out_spec: Any = None

    def __call__(self, leaves: list[Any]) -> list[Any]:
        args, kwargs = tree_unflatten(leaves, self.in_spec)
        flat, self.out_spec = tree_flatten(self.function(*args, **kwargs))
        return flat


class _Reentrant(torch.autograd.Function):

    @staticmethod
    def forward(ctx, run, *leaves):
        ctx.run = run
        ctx.tensor_at = [i for i, a in enumerate(leaves) if isinstance(a, torch.Tensor)]
        ctx.others = [None if isinstance(a, torch.Tensor) else a for a in leaves]
        ctx.save_for_backward(*(leaves[i] for i in ctx.tensor_at))
        with torch.no_grad(), run.replay.watching():
            return tuple(run(list(leaves)))

    @staticmethod
    def backward(ctx, *grads):
        if not torch.autograd._is_checkpoint_valid():  # the reentrant contract: torch's variant asks the same
            raise RuntimeError(
                "speedlib.checkpoint(use_reentrant=True) reruns its segment in a backward pass of its own, as the "
                "reentrant torch.utils.checkpoint does, and like torch.utils.checkpoint is incompatible with .grad() "
                "or passing an `inputs` parameter to .backward() then. Pass use_reentrant=False (or leave it "
                "out) to take torch.autograd.grad through the checkpoint.")
        leaves = list(ctx.others)
        for i, t in zip(ctx.tensor_at, ctx.saved_tensors, strict=True):
            leaves[i] = t.detach().requires_grad_(t.requires_grad)
        with torch.enable_grad(), ctx.run.replay.replaying():
            outputs = ctx.run(leaves)
        pairs = [(o, g) for o, g in zip(outputs, grads, strict=True)
                 if isinstance(o, torch.Tensor) and o.requires_grad]
        if not pairs:
            raise RuntimeError("speedlib.checkpoint(use_reentrant=True): none of output has requires_grad=True, "
                               "this checkpoint() is not necessary (the rerun's results need no gradient)")
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, *(t.grad if isinstance(t, torch.Tensor) else None for t in leaves))


def run_reentrant(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                  replay: Replay) -> Any:
    """`function(*args, **kwargs)` through one reentrant node; results rebuilt in their structure."""
    leaves, in_spec = tree_flatten((args, kwargs))
    run = _Run(function, in_spec, replay)
    outputs = _Reentrant.apply(run, *leaves)
    return tree_unflatten(list(outputs), run.out_spec)
