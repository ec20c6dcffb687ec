"""Activation checkpointing that takes torch.utils.checkpoint's calls unchanged, and BatchNorm
that counts a step once.

`checkpoint(fn, *args, use_reentrant=..., context_fn=..., determinism_check=..., debug=...,
preserve_rng_state=..., early_stop=..., **kwargs)` and `checkpoint_sequential(functions, segments,
input, use_reentrant=..., **kwargs)` accept every argument torch's do, for any callable. Switching
is an import. Two variants, as in torch:

- use_reentrant=False (or left out): the segment's graph is recorded and what it saves for
  backward is dropped and recomputed when backward needs it (speedlib/_checkpoint_saved.py).
  Every tensor the function uses gets its gradient, whatever reached it; gradients are those of
  torch's non-reentrant checkpoint, bitwise on CPU. torch warns when use_reentrant is left out
  and then runs its reentrant variant; here leaving it out means False.
- use_reentrant=True: one node reruns the segment in a backward pass of its own
  (speedlib/_checkpoint_reentrant.py), with the reentrant variant's contract.

What speedlib adds in both (speedlib/_checkpoint_replay.py): dropout drawn from the segment's own
`torch.Generator` sees the first run's mask again; forward hooks that only observe run once per
step; the rerun uses the tensors a `torch.func.functional_call` gave the first run. And
`BatchNorm1d/2d/3d` (`convert_batchnorm(model)`) update their running statistics once per step
under any checkpoint, where torch's rerun would update a plain `nn.BatchNorm*d` twice
(speedlib/_checkpoint_batchnorm.py). Under torch.compile the call is torch's own checkpoint, which
the compiler traces. docs/techniques/checkpoint.md lists what is identical, added and different,
each with the test that shows it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from speedlib._checkpoint_batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d, convert_batchnorm, in_backward
from speedlib._checkpoint_reentrant import run_reentrant
from speedlib._checkpoint_replay import Replay
from speedlib._checkpoint_saved import Frame, NondeterministicSegmentError, OpLog

__all__ = ["checkpoint", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "convert_batchnorm",
           "in_backward", "ForgottenParameterError", "NondeterministicSegmentError", "SEGMENT_VARIANTS", "run_segment",
           "CheckpointedSequential", "checkpoint_sequential"]

DETERMINISM_CHECKS = ("default", "none")  # torch.utils.checkpoint's values
_TORCH_DEFAULTS = {"context_fn": None, "determinism_check": "default", "debug": False, "preserve_rng_state": True,
                   "early_stop": True, "respect_saved_tensors_hooks": None}
# checkpoint()'s own keywords, which checkpoint_sequential passes on too.
_OPTIONS = frozenset({"use_reentrant", "context_fn", "determinism_check", "debug", "preserve_rng_state", "early_stop",
                      "respect_saved_tensors_hooks", "params", "check_params"})


class ForgottenParameterError(RuntimeError):
    """No longer raised: the segment's graph is recorded, so every tensor it uses gets its gradient.

    Kept so that code written for the explicit-parameter checkpoint (`except ForgottenParameterError`)
    still imports."""


# --- the calls a user makes ----------------------------------------------------------------


def checkpoint(function: Callable[..., Any] | None = None, *args: Any, use_reentrant: bool | None = None,
               context_fn: Callable[[], tuple[Any, Any]] | None = None, determinism_check: str = "default",
               debug: bool = False, preserve_rng_state: bool = True, early_stop: bool = True,
               respect_saved_tensors_hooks: bool | None = None, params: Iterable[torch.Tensor] | None = None,
               check_params: bool = True, **kwargs: Any) -> Any:
    """Run `function(*args, **kwargs)` without keeping its activations; recompute them in backward.

    Takes torch.utils.checkpoint.checkpoint's arguments, with its meanings:

    use_reentrant: False or None (the default here; torch warns and takes True): the graph is
        recorded and what it saves is recomputed when backward needs it. True: one node reruns
        the segment in a nested backward pass (no torch.autograd.grad through it, no context_fn
        or debug; see docs/techniques/checkpoint.md).
    context_fn: returns two context managers, for the first run and the rerun (torch's
        selective-checkpoint contexts work). determinism_check: "default" compares the shape,
        dtype and device of every recomputed tensor with the first run's, "none" only their
        count. debug: a nondeterminism error lists the ops of both runs (so does
        torch.utils.checkpoint.set_checkpoint_debug_enabled(True)). early_stop: the rerun stops
        once everything backward needs is recomputed (torch's set_checkpoint_early_stop
        overrides it). preserve_rng_state: the rerun draws the first run's random numbers, from
        the default generators and from any generator of the segment's own.
    respect_saved_tensors_hooks: torch's option for selective checkpointing, passed to its
        caching context.
    params, check_params: accepted and checked (params= an iterable of tensors) so that calls
        written for speedlib's earlier explicit-parameter checkpoint run unchanged; nothing
        needs listing now, and neither changes the result.

    Without `function` (and arguments) it returns a decorator, as torch's does:
    `checkpoint(use_reentrant=False)(block)`.
    """
    options = dict(use_reentrant=use_reentrant, context_fn=context_fn, determinism_check=determinism_check,
                   debug=debug, preserve_rng_state=preserve_rng_state, early_stop=early_stop,
                   respect_saved_tensors_hooks=respect_saved_tensors_hooks)
    if function is None and not args:
        if kwargs:
            raise ValueError("speedlib.checkpoint: without a function it returns a decorator, which takes the "
                             f"checkpoint's own keywords only; got {', '.join(kwargs)}")
        return functools.partial(_Checkpointed, options=options)
    if torch.compiler.is_compiling():
        # Inside a compiled region: torch's checkpoint, which the compiler traces and partitions.
        # Only what differs from torch's defaults is passed: the compiler reads some of them as constants.
        given = {k: v for k, v in options.items() if k != "use_reentrant" and v != _TORCH_DEFAULTS[k]}
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **given, **kwargs)
    _check_compat(params, check_params)
    return _run(function, args, kwargs, options)


class _Checkpointed:
    """`checkpoint(**options)(function)`: the function, checkpointed on every call (and as a method)."""

    def __init__(self, function: Callable[..., Any], options: dict[str, Any]):
        self.function, self.options = function, options
        functools.update_wrapper(self, function, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(self.function, *args, **self.options, **kwargs)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        bind = getattr(self.function, "__get__", None)
        return self if instance is None or bind is None else _Checkpointed(bind(instance, owner), self.options)


def checkpoint_sequential(functions: nn.Sequential | list[Callable[..., Any]], segments: int, input: Any,
                          use_reentrant: bool | None = None, **kwargs: Any) -> Any:
    """torch.utils.checkpoint.checkpoint_sequential with speedlib's checkpoint.

    Runs `functions` (an nn.Sequential, or a list of modules or any callables) in order on
    `input`, in `segments` runs of len // segments functions; every run but the last is
    checkpointed. kwargs: checkpoint's keywords (preserve_rng_state, context_fn, ...).
    """
    if not (use_reentrant is None or isinstance(use_reentrant, bool)):
        raise TypeError(f"speedlib.checkpoint_sequential: use_reentrant takes True, False or None, "
                        f"got {type(use_reentrant).__name__}")
    items = list(functions.children()) if isinstance(functions, nn.Sequential) else list(functions)
    if not isinstance(segments, int) or not 1 <= segments <= max(1, len(items)):
        raise ValueError(f"speedlib.checkpoint_sequential: segments must be an int from 1 to the number of "
                         f"functions ({len(items)}), got {segments!r}")
    size = len(items) // segments
    options = {"use_reentrant": use_reentrant, **kwargs}
    for start in range(0, size * (segments - 1), size):
        part = tuple(items[start:start + size])
        input = _run(_in_order(part), (input,), {}, options, hook_modules=[f for f in part if isinstance(f, nn.Module)])
    return _in_order(tuple(items[size * (segments - 1):]))(input)


def _in_order(part: tuple[Callable[..., Any], ...]) -> Callable[[Any], Any]:
    def run(x: Any) -> Any:
        for f in part:
            x = f(x)
        return x
    return run


# --- reading torch's arguments and running a variant -----------------------------------------


def _run(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any],
         hook_modules: Iterable[nn.Module] = ()) -> Any:
    """checkpoint() past its argument checks: the variant `options` ask for, on `function`."""
    if not options.keys() <= _OPTIONS:
        raise TypeError(f"speedlib.checkpoint: unexpected keyword arguments {sorted(options.keys() - _OPTIONS)}")
    use_reentrant, context_fn, debug = options.get("use_reentrant"), options.get("context_fn"), options.get("debug")
    if context_fn is torch.utils.checkpoint.noop_context_fn:  # torch's default, passed explicitly
        context_fn = None
    if not (use_reentrant is None or isinstance(use_reentrant, bool)):
        raise TypeError(f"speedlib.checkpoint: use_reentrant takes True, False or None, "
                        f"got {type(use_reentrant).__name__}")
    determinism_check = options.get("determinism_check", "default")
    if determinism_check not in DETERMINISM_CHECKS:
        raise ValueError(f"speedlib.checkpoint: determinism_check must be one of {DETERMINISM_CHECKS}, "
                         f"got {determinism_check!r}")
    if context_fn is not None and not callable(context_fn):
        raise TypeError(f"speedlib.checkpoint: context_fn must be callable, got {type(context_fn).__name__}")
    if not callable(function):
        raise TypeError(f"speedlib.checkpoint: the function to checkpoint must be callable, "
                        f"got {type(function).__name__}")
    preserve_rng = bool(options.get("preserve_rng_state", True))
    module = _owner(function, args)
    if use_reentrant:
        if context_fn is not None or debug or options.get("respect_saved_tensors_hooks") is not None:
            raise ValueError("speedlib.checkpoint: passing `context_fn`, `debug`, or `respect_saved_tensors_hooks` "
                             "is only supported when use_reentrant=False (the reentrant rerun has no hooks to "
                             "give them)")
        if not torch.is_grad_enabled():
            return function(*args, **kwargs)
        return run_reentrant(function, args, kwargs, Replay(function, module, (args, kwargs), preserve_rng,
                                                            hook_modules))
    debug = _torch_setting("_checkpoint_debug_enabled", debug)
    if debug and context_fn is not None:
        raise ValueError("speedlib.checkpoint: debug=True is incompatible with a context_fn of your own (debug "
                         "logs the ops through its own contexts)")
    logs = (OpLog(), OpLog()) if debug else None
    forward_context, recompute_context = _two_contexts(context_fn, logs)
    if hasattr(forward_context, "respect_saved_tensors_hooks"):  # torch's selective-checkpoint caching context
        forward_context.respect_saved_tensors_hooks = options.get("respect_saved_tensors_hooks")
    if not torch.is_grad_enabled():  # nothing is saved, so nothing is rerun: the function runs as it is
        return function(*args, **kwargs)
    replay = Replay(function, module, (args, kwargs), preserve_rng, hook_modules)
    frame = Frame(function, args, kwargs, replay, recompute_context,
                  _torch_setting("_enable_checkpoint_early_stop", options.get("early_stop", True)),
                  determinism_check == "default", logs)
    versions = [(i, a, a._version) for i, a in enumerate((*args, *kwargs.values())) if isinstance(a, torch.Tensor)]
    with frame.recording(forward_context), replay.watching():
        result = function(*args, **kwargs)
    _check_arguments_unchanged(versions)
    return result


def _two_contexts(context_fn: Callable[[], Any] | None, logs: tuple[OpLog, OpLog] | None) -> tuple[Any, Any]:
    """context_fn()'s (first run, rerun) pair, torch's default pair, or debug's op logs."""
    if logs is not None:
        return logs
    if context_fn is None:
        return contextlib.nullcontext(), contextlib.nullcontext()
    pair = context_fn()
    if not (isinstance(pair, tuple) and len(pair) == 2):
        raise TypeError("speedlib.checkpoint: context_fn must return a tuple of two context managers "
                        f"(first run, rerun), got {type(pair).__name__}")
    return pair


def _torch_setting(name: str, given: bool) -> bool:
    """torch's global override (set_checkpoint_early_stop, set_checkpoint_debug_enabled) where one is set."""
    # Module globals of torch.utils.checkpoint, set by its public context managers; None when unset.
    override = getattr(torch.utils.checkpoint, name, None)
    return bool(given) if override is None else bool(override)


def _check_compat(params: Any, check_params: Any) -> None:
    """params= and check_params= of the explicit-parameter checkpoint: checked, not needed."""
    if not isinstance(check_params, bool):
        raise TypeError(f"speedlib.checkpoint: check_params takes a bool, got {type(check_params).__name__}")
    if params is None:
        return
    if torch.is_tensor(params):
        raise TypeError("speedlib.checkpoint: params= takes an iterable of tensors (params=[weight] or "
                        "params=module.parameters()), not a single tensor")
    if isinstance(params, (str, bytes)) or not isinstance(params, Iterable):
        raise TypeError(f"speedlib.checkpoint: params= takes an iterable of tensors, got {type(params).__name__}")
    for p in params:
        if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):  # module.named_parameters()
            p = p[1]
        if not torch.is_tensor(p):
            raise TypeError(f"speedlib.checkpoint: params must be tensors, got {type(p).__name__}")


def _owner(function: Any, args: tuple[Any, ...]) -> nn.Module | None:
    """The module the function belongs to: itself, the module of a bound method, the module an
    unbound method is called with (transformers 5 passes partial(forward, layer, **kwargs)), or
    that of a partial over these. Its hooks and tensors are what Replay looks after."""
    while isinstance(function, functools.partial):
        args, function = (*function.args, *args), function.func
    if isinstance(function, nn.Module):
        return function
    bound_to = getattr(function, "__self__", None)
    if isinstance(bound_to, nn.Module):
        return bound_to
    return args[0] if args and isinstance(args[0], nn.Module) and inspect.isfunction(function) else None


def _check_arguments_unchanged(versions: list[tuple[int, torch.Tensor, int]]) -> None:
    """A segment must not change its arguments in place: the rerun would start from the changed value."""
    for i, t, version in versions:
        if t._version != version:
            raise RuntimeError(
                f"speedlib.checkpoint: the segment modified its tensor argument {i} (counting tensor arguments, "
                "keyword arguments last) in place; the rerun in backward would start from the changed value, so "
                "the gradients would be wrong (torch.utils.checkpoint raises in backward). Use the out-of-place "
                "form inside the segment (m = m.mul(2) for m.mul_(2)) or change the tensor before the call.")


# --- the variants the benchmark compares ------------------------------------------------

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
