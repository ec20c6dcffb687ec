"""The torch.Generators a checkpointed segment draws from itself, replayed for its rerun.

The default generators are restored for the rerun by fork_rng; a generator of the segment's
own (dropout drawn with generator=g) would otherwise give the rerun another mask, silently.
Finding them means watching every op of the first run through a TorchFunctionMode, a Python
call per op (docs/techniques/checkpoint.md says what it cost a DenseNet step). So a segment
is watched until one first run of it drew from no generator of its own; the same segment
(the same module in the same training mode, or the same function over the same objects) then
runs unwatched, as cudnn.benchmark keeps what it learned per shape.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

# Segments whose watched first run drew from no generator of their own, by `segment_key`.
_QUIET: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_QUIET_MODULES: weakref.WeakKeyDictionary[nn.Module, set[bool]] = weakref.WeakKeyDictionary()


def _same_objects(function: Any) -> tuple[Any, ...] | None:
    """What a function's closure holds, as weak references (values where immutable); None
    where it holds something neither (a list), whose later contents could differ unseen."""
    cells = []
    for cell in getattr(function, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            return None
        if isinstance(value, (int, float, str, bytes, bool, type(None))):
            cells.append(("value", value))
        else:
            try:
                cells.append(("ref", weakref.ref(value), getattr(value, "training", None)))
            except TypeError:
                return None
    return tuple(cells)


class GeneratorLog(TorchFunctionMode):
    """Every torch.Generator the first run draws from, with its state before the first draw."""

    def __init__(self, function: Any, module: nn.Module | None):
        super().__init__()
        self.states: dict[int, tuple[torch.Generator, torch.Tensor]] = {}
        self.module, self.function = module, function
        self.given = False  # a generator among the call's arguments: watched whatever was learned

    @functools.cached_property
    def _closure(self) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
        """A function segment's key in _QUIET and what its closure holds (`_same_objects`), read
        once for both the lookup and the learning; None where it cannot be told apart again."""
        code, cells = getattr(self.function, "__code__", None), _same_objects(self.function)
        return None if code is None or cells is None else (_key(code, cells), cells)

    def quiet_before(self) -> bool:
        """Whether an earlier first run of this segment drew from no generator of its own."""
        if self.given:
            return False
        if self.module is not None:
            return self.module.training in _QUIET_MODULES.get(self.module, ())
        if self._closure is None:
            return False
        key, cells = self._closure
        seen = _QUIET.get(key)
        if seen is not None and not all(_alive_and_same(a, b) for a, b in zip(seen, cells, strict=True)):
            del _QUIET[key]  # an object it named is gone, and the id may now name another
            return False
        return seen is not None

    def learn(self) -> None:
        """After a watched first run: remember the segment as quiet when it drew from none."""
        if self.states:
            return
        if self.module is not None:
            _QUIET_MODULES.setdefault(self.module, set()).add(self.module.training)
            return
        if self._closure is not None:
            key, cells = self._closure
            _QUIET[key] = cells

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for g in (kwargs.get("generator"), *args):
            if isinstance(g, torch.Generator) and id(g) not in self.states:
                self.states[id(g)] = (g, g.get_state())
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def watched(self) -> Iterator[None]:
        """The first run, watched unless this segment is known to draw from no generator of its own."""
        if self.quiet_before():
            yield
            return
        with self:
            yield
        self.learn()

    @contextlib.contextmanager
    def replayed(self) -> Iterator[None]:
        """The generators at their first-run states while the rerun runs; where they were afterwards."""
        now = [(g, g.get_state()) for g, _ in self.states.values()]
        for g, state in self.states.values():
            g.set_state(state)
        try:
            yield
        finally:
            for g, state in now:
                g.set_state(state)


def _key(code: Any, cells: tuple[Any, ...]) -> tuple[Any, ...]:
    return (code, *(c[1] if c[0] == "value" else id(c[1]()) for c in cells))


def _alive_and_same(seen: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    if seen[0] != now[0]:
        return False
    if seen[0] == "value":
        return type(seen[1]) is type(now[1]) and seen[1] == now[1]
    return seen[1]() is not None and seen[1]() is now[1]() and seen[2] == now[2]
