"""What a caller of `speedlib.checkpoint.checkpoint` passes, read as torch.utils.checkpoint reads it.

torch's keywords (`use_reentrant`, `context_fn`, `determinism_check`, `debug`) are taken or
refused by name, never passed on to the function; `functools.partial` is opened so the
tensors it holds become tracked arguments; the segment's parameters are found on the module a
function belongs to (the module itself, a bound method of it, a partial over either: what
Hugging Face models pass, bound or with the module as first argument); and that module's
tensors as seen in forward are kept, so the rerun in backward uses them even outside a
`torch.func.functional_call`. These need no autograd node, so they live apart from
speedlib/checkpoint.py's.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

# functional_call's own swap of a module's tensors; there is no public context manager for it.
from torch.nn.utils.stateless import _reparametrize_module

DETERMINISM_CHECKS = ("default", "none")  # torch.utils.checkpoint's values


def torch_options(use_reentrant: Any, context_fn: Any, determinism_check: Any, debug: Any) -> Callable[[], Any]:
    """Check torch's keywords; return the context_fn to use (torch's default: two null contexts)."""
    if use_reentrant is True:
        raise ValueError("speedlib.checkpoint: use_reentrant=True is refused: the reentrant variant runs a nested "
                         "backward pass per segment, which is what this checkpoint exists to avoid (it returns the "
                         "segment's gradients to the outer pass). Drop the argument or pass use_reentrant=False; "
                         "for the reentrant variant itself call torch.utils.checkpoint.checkpoint")
    if use_reentrant not in (None, False):
        raise TypeError(f"speedlib.checkpoint: use_reentrant takes None or False, got {use_reentrant!r}")
    if determinism_check not in DETERMINISM_CHECKS:
        raise ValueError(f"speedlib.checkpoint: determinism_check must be one of {DETERMINISM_CHECKS}, "
                         f"got {determinism_check!r}")
    if debug is not False:
        raise ValueError("speedlib.checkpoint: debug=True (torch's operator trace on a nondeterminism error) is not "
                         "supported: NondeterministicSegmentError already names the first saved tensor that "
                         "differs; pass debug=False or leave it out")
    if context_fn is None:
        return lambda: (contextlib.nullcontext(), contextlib.nullcontext())
    if not callable(context_fn):
        raise TypeError(f"speedlib.checkpoint: context_fn must be callable, got {type(context_fn).__name__}")
    return context_fn


def two_contexts(context_fn: Callable[[], Any]) -> tuple[Any, Any]:
    """context_fn()'s (forward, recompute) pair, or a clear error for anything else."""
    pair = context_fn()
    if not (isinstance(pair, tuple) and len(pair) == 2):
        raise TypeError("speedlib.checkpoint: context_fn must return a tuple of two context managers "
                        f"(forward, recompute), got {type(pair).__name__}")
    return pair


def open_partial(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, tuple, dict]:
    """partial(f, *a, **k)(*args, **kwargs) as f(*a, *args, **{**k, **kwargs}): its tensors become arguments."""
    while isinstance(function, functools.partial):
        args, kwargs = (*function.args, *args), {**function.keywords, **kwargs}
        function = function.func
    return function, args, kwargs


def owner(function: Any, args: tuple[Any, ...]) -> nn.Module | None:
    """The module whose parameters `function` uses: itself, the module a bound method belongs
    to, or the module an unbound method is called with (transformers 5 passes
    partial(forward, layer, **kwargs))."""
    if isinstance(function, nn.Module):
        return function
    bound_to = getattr(function, "__self__", None)
    if isinstance(bound_to, nn.Module):
        return bound_to
    return args[0] if args and isinstance(args[0], nn.Module) and inspect.isfunction(function) else None


def explicit_params(module: nn.Module | None, params: Any) -> tuple[torch.Tensor, ...]:
    """`params` as a tuple of distinct tensors, or a clear error for what cannot be meant."""
    if params is None:
        if module is None:
            raise TypeError("speedlib.checkpoint: pass params= (the tensors requiring grad that the function uses "
                            "besides its inputs; () if none); they are found automatically only for an nn.Module, "
                            "a bound method of one, a function called with one as its first argument, or a "
                            "functools.partial over these")
        params = module.parameters()
    if torch.is_tensor(params):
        # Iterating a tensor yields its rows: views that are not the parameter, whose
        # gradients would never reach it.
        raise TypeError("speedlib.checkpoint: params= takes an iterable of tensors (params=[weight] or "
                        "params=module.parameters()), not a single tensor")
    if isinstance(params, (str, bytes)) or not isinstance(params, Iterable):
        raise TypeError(f"speedlib.checkpoint: params= takes an iterable of tensors, got {type(params).__name__}")
    unique: dict[int, torch.Tensor] = {}
    for p in params:
        if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):  # module.named_parameters()
            p = p[1]
        if not torch.is_tensor(p):
            raise TypeError(f"speedlib.checkpoint: params must be tensors, got {type(p).__name__}")
        # A tensor listed twice (tied weights reached through two modules) would be an input
        # of the node twice, and the outer backward would add its gradient twice.
        unique.setdefault(id(p), p)
    return tuple(unique.values())


def _tensors_of(module: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters(remove_duplicate=False)),
            **dict(module.named_buffers(remove_duplicate=False))}


class ModuleTensors:
    """A module's parameters and buffers as its forward saw them, put back for the rerun.

    `torch.func.functional_call` swaps a module's tensors only while the call lasts; the
    rerun in backward comes later and would otherwise compute with the module's own weights.
    """

    def __init__(self, module: nn.Module | None):
        self.module = module
        self.seen = _tensors_of(module) if module is not None else {}

    def restored(self) -> Any:
        if self.module is None:
            return contextlib.nullcontext()
        now = _tensors_of(self.module)
        if now.keys() == self.seen.keys() and all(now[k] is t for k, t in self.seen.items()):
            return contextlib.nullcontext()
        return _reparametrize_module(self.module, self.seen)
