"""Activation checkpointing with explicit parameters, and BatchNorm that counts a step once.

`checkpoint(fn, *inputs, params=...)` runs `fn` without keeping its activations and reruns
it in backward. Unlike `torch.utils.checkpoint(use_reentrant=True)` it never starts a
nested backward pass: the rerun's gradients come out of one `torch.autograd.grad` call and
are returned as the gradients of `inputs` and `params`, which are inputs of the autograd
node. The outer backward pass therefore accumulates every parameter's gradient itself,
once, in its own order, which is what DataParallel's per-device threads and
DistributedDataParallel's bucket hooks expect (the nested pass of the reentrant variant is
what made pytorch-checkpoint's "Official" row cost 1.4 s instead of 0.3 s on two GPUs).

What the original `CheckpointFunction` got wrong, fixed here:

- the RNG state (CPU and every CUDA device the inputs live on) is saved before the first
  run and restored for the rerun, so dropout draws the same mask twice;
- any number of tensor outputs, inputs that do not require grad, and non-tensor inputs;
- a tensor that needs a gradient but reaches the segment neither as an input nor through
  `params` (a forgotten parameter) is an error in backward, not a silently missing gradient;
- the autocast state of the first run is used for the rerun.

BatchNorm: both `torch.utils.checkpoint` variants (and any checkpoint) run a segment's
forward twice, and a plain `nn.BatchNorm*d` updates its running statistics and
`num_batches_tracked` on both runs. speedlib's `BatchNorm1d/2d/3d` skip the update when
their forward runs inside a backward pass, which is where every checkpoint reruns
segments; the decision does not depend on whether the input requires grad.
`convert_batchnorm(model)` swaps them into an existing model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
import contextlib
import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["checkpoint", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "convert_batchnorm",
           "in_backward", "ForgottenParameterError", "SEGMENT_VARIANTS", "run_segment", "CheckpointedSequential"]


class ForgottenParameterError(RuntimeError):
    """A checkpointed segment used a tensor that needs a gradient but was not passed to it."""


def in_backward() -> bool:
    """True while this thread runs part of an autograd backward pass (where checkpoints rerun)."""
    # torch.utils.checkpoint relies on the same call (-1 outside backward); there is no
    # public equivalent. Checked by tests, so a torch that drops it fails loudly.
    return torch._C._current_graph_task_id() != -1


# --- the explicit-parameter checkpoint ---------------------------------------------------

def _cuda_devices(tensors: Iterable[torch.Tensor]) -> list[int]:
    return sorted({t.get_device() for t in tensors if t.is_cuda})


def _autocast_state() -> list[tuple[str, bool, torch.dtype]]:
    types = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    return [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in types]


class _Checkpoint(torch.autograd.Function):
    # Arguments: run_function, n_inputs, preserve_rng, check_params, meta, *inputs, *params.
    # `meta` carries parameter names in and whether the function returned a bare tensor out.

    @staticmethod
    def forward(ctx, run_function, n_inputs, preserve_rng, check_params, meta, *args):
        inputs, params = args[:n_inputs], args[n_inputs:]
        ctx.run_function, ctx.check_params, ctx.names = run_function, check_params, meta["names"]
        ctx.preserve_rng = preserve_rng
        ctx.autocast = _autocast_state()
        # Tensors go through save_for_backward (so in-place changes after this are caught);
        # everything else is kept as is.
        ctx.tensor_at = [i for i, a in enumerate(inputs) if torch.is_tensor(a)]
        ctx.others = [None if torch.is_tensor(a) else a for a in inputs]
        ctx.input_grad = [torch.is_tensor(a) and a.requires_grad for a in inputs]
        ctx.cuda_devices = []
        if preserve_rng:
            ctx.cpu_rng = torch.get_rng_state()
            ctx.cuda_devices = _cuda_devices(a for a in args if torch.is_tensor(a))
            ctx.cuda_rng = [torch.cuda.get_rng_state(d) for d in ctx.cuda_devices]
        ctx.save_for_backward(*(inputs[i] for i in ctx.tensor_at))
        # Parameters are kept as the objects themselves, not through save_for_backward: the
        # rerun uses the module's own Parameter objects, and saved-tensor hooks (offloading
        # such as torch.autograd.graph.save_on_cpu) would hand back copies, whose gradients
        # autograd.grad would report as unused. Their version counters stand in for
        # save_for_backward's check that nothing changed them in place before backward.
        ctx.params = params
        ctx.param_versions = [p._version for p in params]
        with torch.no_grad():
            outputs = run_function(*inputs)
        meta["single"] = torch.is_tensor(outputs)
        outputs = (outputs,) if meta["single"] else tuple(outputs)
        if not all(torch.is_tensor(o) for o in outputs):
            raise TypeError("speedlib.checkpoint: the function must return a tensor or a tuple of tensors, "
                            f"got {[type(o).__name__ for o in outputs]}")
        ctx.mark_non_differentiable(*(o for o in outputs if not (o.is_floating_point() or o.is_complex())))
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs):
        inputs = list(ctx.others)
        for i, t in zip(ctx.tensor_at, ctx.saved_tensors):
            # A fresh leaf per input: the rerun's graph starts here and stops here.
            inputs[i] = t.detach().requires_grad_(ctx.input_grad[i])
        params = ctx.params
        if [p._version for p in params] != ctx.param_versions:
            raise RuntimeError("speedlib.checkpoint: a parameter of the segment was modified in place between "
                               "forward and backward (an optimizer step?); the rerun would not match the first run")
        with torch.random.fork_rng(devices=ctx.cuda_devices, enabled=ctx.preserve_rng):
            if ctx.preserve_rng:
                torch.set_rng_state(ctx.cpu_rng)
                for dev, state in zip(ctx.cuda_devices, ctx.cuda_rng):
                    torch.cuda.set_rng_state(state, dev)
            with torch.enable_grad(), contextlib.ExitStack() as stack:
                for device_type, enabled, dtype in ctx.autocast:  # re-enter the first run's autocast state
                    stack.enter_context(torch.autocast(device_type, enabled=enabled, dtype=dtype))
                outputs = ctx.run_function(*inputs)
        outputs = (outputs,) if torch.is_tensor(outputs) else tuple(outputs)

        wrt = [inputs[i] for i in ctx.tensor_at if ctx.input_grad[i]] + [p for p in params if p.requires_grad]
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad and g is not None]
        if ctx.check_params and pairs:
            _check_no_forgotten(ctx, [o for o, _ in pairs], wrt)
        grads = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
                     if pairs and wrt else [None] * len(wrt))
        input_grads = [next(grads) if needs else None for needs in ctx.input_grad]
        param_grads = [next(grads) if p.requires_grad else None for p in params]
        return (None, None, None, None, None, *input_grads, *param_grads)


def _check_no_forgotten(ctx, outputs: list[torch.Tensor], known: list[torch.Tensor]) -> None:
    """Walk the rerun's graph from `outputs`; every path must end at a `known` tensor.

    A leaf that requires grad and is not known is a forgotten parameter: autograd.grad
    would not return its gradient and nothing else would accumulate it. The walk stops at
    known tensors, so it never leaves the segment unless something was forgotten.
    """
    known_leaves = {id(t) for t in known if t.grad_fn is None}
    known_nodes = {t.grad_fn for t in known if t.grad_fn is not None}  # non-leaf params (DataParallel replicas)
    stack = [o.grad_fn for o in outputs if o.grad_fn is not None]
    seen = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen or node in known_nodes:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad nodes hold their leaf
        if variable is not None and id(variable) not in known_leaves:
            name = ctx.names.get(id(variable), f"a tensor of shape {tuple(variable.shape)}")
            raise ForgottenParameterError(
                f"speedlib.checkpoint: the segment uses {name}, which requires grad but was passed neither "
                "as an input nor in params=; its gradient would be lost. Add it to params= "
                "(for a module: params=module.parameters()).")
        stack.extend(next_node for next_node, _ in node.next_functions)


def checkpoint(function: Callable[..., Any], *inputs: Any, params: Iterable[torch.Tensor] | None = None,
               preserve_rng_state: bool = True, check_params: bool = True) -> Any:
    """Run `function(*inputs)` without keeping its activations; rerun it in backward.

    params: every tensor requiring grad that `function` uses besides `inputs` (its
        parameters). Defaults to `function.parameters()` when `function` is an
        `nn.Module`; any other callable must list them (an empty tuple if it has none).
    preserve_rng_state: restore the RNG state for the rerun (dropout sees the same mask).
    check_params: raise ForgottenParameterError in backward when the rerun reaches a tensor
        requiring grad that is in neither `inputs` nor `params`.

    Returns what `function` returns: a tensor or a tuple of tensors.
    """
    if params is None:
        if not isinstance(function, nn.Module):
            raise TypeError("speedlib.checkpoint: pass params= (the tensors requiring grad that the function uses "
                            "besides its inputs; () if none); only an nn.Module's can be found automatically")
        params = function.parameters()
    params = tuple(params)
    for p in params:
        if not torch.is_tensor(p):
            raise TypeError(f"speedlib.checkpoint: params must be tensors, got {type(p).__name__}")
    named = function.named_parameters() if check_params and isinstance(function, nn.Module) else ()
    meta = {"names": {id(p): f"parameter {n!r}" for n, p in named}}
    outputs = _Checkpoint.apply(function, len(inputs), preserve_rng_state, check_params, meta, *inputs, *params)
    return outputs[0] if meta["single"] else outputs


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
        from torch.utils.checkpoint import checkpoint as torch_checkpoint  # noqa: PLC0415

        return torch_checkpoint(function, *inputs, use_reentrant=variant == "reentrant")
    raise ValueError(f"unknown segment checkpoint variant {variant!r}; expected one of {SEGMENT_VARIANTS}")


class CheckpointedSequential(nn.Sequential):
    """nn.Sequential that, with checkpoint_variant = "sequential", trains through
    `torch.utils.checkpoint.checkpoint_sequential` in ceil(sqrt(n)) segments (the sqrt(n)
    schedule of Chen et al., 2016: memory and recompute both grow as sqrt of the depth).
    Same children and state_dict as the nn.Sequential it replaces."""

    checkpoint_variant = "none"

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - nn.Sequential's name
        if self.checkpoint_variant != "sequential" or not torch.is_grad_enabled():
            return super().forward(input)
        from torch.utils.checkpoint import checkpoint_sequential  # noqa: PLC0415

        segments = max(1, math.ceil(math.sqrt(len(self))))
        return checkpoint_sequential(self, segments, input, use_reentrant=False)


# --- BatchNorm that updates its statistics once per step -----------------------------------

class _OnceBatchNorm:
    """Mixin for nn.BatchNorm*d: no running-statistics update when rerun in backward."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - nn.Module's name
        if not (self.training and self.track_running_stats and in_backward()):
            return super().forward(input)
        self._check_input_dim(input)
        # A rerun: normalise with the batch's statistics exactly as the first run did (the
        # same kernel, hence scratch copies of the running buffers rather than None), and
        # throw the update away. num_batches_tracked is left alone too.
        return F.batch_norm(input, self.running_mean.clone(), self.running_var.clone(), self.weight, self.bias,
                            True, 0.0 if self.momentum is None else self.momentum, self.eps)


class BatchNorm1d(_OnceBatchNorm, nn.BatchNorm1d):
    """nn.BatchNorm1d whose running statistics see each training step once under checkpointing."""


class BatchNorm2d(_OnceBatchNorm, nn.BatchNorm2d):
    """nn.BatchNorm2d whose running statistics see each training step once under checkpointing."""


class BatchNorm3d(_OnceBatchNorm, nn.BatchNorm3d):
    """nn.BatchNorm3d whose running statistics see each training step once under checkpointing."""


_SWAP = {nn.BatchNorm1d: BatchNorm1d, nn.BatchNorm2d: BatchNorm2d, nn.BatchNorm3d: BatchNorm3d}


def convert_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every plain nn.BatchNorm1d/2d/3d in `module` (in place) by speedlib's.

    Parameters and buffers are the same objects, so optimizers, state_dicts and flat
    buffers built before the call stay valid. Returns `module` (or the replacement when
    `module` is itself a BatchNorm).
    """
    swap = _SWAP.get(type(module))
    if swap is not None:
        module.__class__ = swap  # same attributes, new forward: no copy, nothing re-registered
        return module
    for child in module.children():
        convert_batchnorm(child)
    return module
