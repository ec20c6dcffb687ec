"""Forward hooks that only watch a segment run once per step, as without checkpointing.

An activation logger registered with `register_forward_hook` would otherwise see the rerun
in backward as a second forward and count twice. A hook is taken for such an observer when,
in every call of the first run, it returned None and left the module's tensors and the
output as they were; the rerun goes without it. Any other hook runs in the rerun too: the
rerun must compute what the first run computed (weight_norm's pre-hook sets the weight
forward reads; a hook may return or change the output).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module
from torch.utils._pytree import tree_leaves

# (hook dict, whether its hooks are pre-hooks): a module's own, and the global ones every module runs.
_HookDicts = list[tuple[dict[int, Callable[..., Any]], bool]]


def _module_state(module: nn.Module) -> tuple[Any, ...]:
    """What a pre-hook could set for forward to read: the module's attributes, by identity."""
    return (tuple((k, id(v)) for k, v in module.__dict__.items()),
            tuple((k, id(v)) for k, v in module._parameters.items()),
            tuple((k, id(v)) for k, v in module._buffers.items()))


def _versions(value: Any) -> list[int]:
    return [t._version for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


class HookLog:
    """The forward hooks of a segment's modules that only observed its first run."""

    def __init__(self, module: nn.Module | None):
        self.module = module
        self.observer: dict[tuple[int, int], bool] = {}  # (id of its dict, key) -> observer so far
        self.dicts: dict[int, dict[int, Callable[..., Any]]] = {}

    def _hook_dicts(self) -> _HookDicts:
        found: _HookDicts = [(_module._global_forward_pre_hooks, True), (_module._global_forward_hooks, False)]
        if self.module is not None:
            for m in self.module.modules():
                found += [(m._forward_pre_hooks, True), (m._forward_hooks, False)]
        return [(d, pre) for d, pre in found if d]

    def _watch(self, d: dict, key: int, hook: Callable[..., Any], pre: bool) -> Callable[..., Any]:
        where = (id(d), key)
        self.observer.setdefault(where, True)
        self.dicts[id(d)] = d

        def watched(module: nn.Module, *args: Any) -> Any:
            before = _module_state(module) if pre else _versions(args[-1])
            result = hook(module, *args)
            after = _module_state(module) if pre else _versions(args[-1])
            if result is not None or before != after:
                self.observer[where] = False
            return result

        return watched

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """The first run, its hooks wrapped to see whether they only observe."""
        wrapped = []
        for d, pre in self._hook_dicts():
            for key, hook in list(d.items()):
                d[key] = self._watch(d, key, hook, pre)
                wrapped.append((d, key, hook))
        try:
            yield
        finally:
            for d, key, hook in wrapped:
                if key in d:  # a hook removed meanwhile stays removed
                    d[key] = hook

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """The rerun, without the hooks that only observed the first run."""
        before: dict[int, tuple[dict, list]] = {}
        for (dict_id, key), observer in self.observer.items():
            d = self.dicts[dict_id]
            if observer and key in d:
                before.setdefault(dict_id, (d, list(d.items())))
                del d[key]
        try:
            yield
        finally:
            for d, items in before.values():
                now = dict(d)
                d.clear()
                d.update(items)  # the old order back
                d.update(now)  # a hook registered meanwhile goes after them
