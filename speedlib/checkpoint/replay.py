"""What a checkpointed segment's rerun needs to repeat its first run, and nothing more.

`Replay` is taken when the first run starts and entered around the rerun in backward:

- the RNG state (CPU, and each CUDA device the arguments are on), the autocast state and a
  `with torch.device(...)` default, as the first run saw them;
- the tensors of the module being checkpointed as the first run saw them: a
  `torch.func.functional_call` swaps them only while the call lasts, and the rerun comes later;
- the segment's own `torch.Generator`s (`GeneratorLog`): dropout drawn with `generator=g` gets the
  first run's mask again. Finding them means watching every op of the first run through a
  TorchFunctionMode, a Python call per op, so a segment is watched until one first run of it drew
  from no generator of its own; the same segment (the same module in the same training mode, or
  the same function over the same objects) then runs unwatched, as cudnn.benchmark keeps what it
  learned per shape;
- its modules' forward hooks that only observed the first run (`HookLog`): an activation logger
  counts each forward once. A hook is such an observer when, in every call of the first run, it
  returned None and left the module's tensors and the output as they were; the rerun goes without
  it. Any other hook runs in the rerun too (weight_norm's pre-hook sets the weight forward reads).

Both checkpoint variants (speedlib/checkpoint/recompute.py) use it.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _module

# functional_call's own swap of a module's tensors; there is no public context manager for it.
from torch.nn.utils.stateless import _reparametrize_module
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves


class Replay:
    """The first run's conditions, taken when it starts; `replaying()` restores them for a rerun."""

    def __init__(self, function: Callable[..., Any], module: nn.Module | None, arguments: Any,
                 preserve_rng: bool, hook_modules: Iterable[nn.Module] = ()):
        self.preserve_rng = preserve_rng
        tensors = [t for t in tree_leaves(arguments) if isinstance(t, torch.Tensor)]
        self.cuda_devices: list[int] = []
        if preserve_rng:
            self.cpu_rng = torch.get_rng_state()
            self.cuda_devices = sorted({t.get_device() for t in tensors if t.is_cuda})
            self.cuda_rng = [torch.cuda.get_rng_state(d) for d in self.cuda_devices]
        types = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        self.autocast = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in types]
        # A `with torch.device(...)` around the call makes tensors created inside the segment
        # land there; the rerun, outside that block, must create them in the same place.
        self.default_device = torch.get_default_device()
        self.module = module
        self.seen = _tensors_of(module) if module is not None else {}
        self.generators = GeneratorLog(function, module)
        self.generators.given = any(isinstance(a, torch.Generator) for a in tree_leaves(arguments))
        self.hooks = HookLog([module] if module is not None else list(hook_modules))

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """The first run, watched for the segment's own generators and its observer hooks."""
        with contextlib.ExitStack() as stack:
            if self.preserve_rng:
                stack.enter_context(self.generators.watched())
            stack.enter_context(self.hooks.watching())
            yield

    @contextlib.contextmanager
    def replaying(self) -> Iterator[None]:
        """A rerun under the first run's RNG, generators, autocast, default device and module tensors,
        without the hooks that only observed it. The caller's RNG state is left as it was."""
        with torch.random.fork_rng(devices=self.cuda_devices, enabled=self.preserve_rng), \
                contextlib.ExitStack() as stack:
            if self.preserve_rng:
                torch.set_rng_state(self.cpu_rng)
                for dev, state in zip(self.cuda_devices, self.cuda_rng, strict=True):
                    torch.cuda.set_rng_state(state, dev)
                stack.enter_context(self.generators.replayed())
            for device_type, enabled, dtype in self.autocast:
                stack.enter_context(torch.autocast(device_type, enabled=enabled, dtype=dtype))
            if torch.get_default_device() != self.default_device:
                stack.enter_context(torch.device(self.default_device))
            stack.enter_context(self._module_tensors())
            stack.enter_context(self.hooks.quiet())
            yield

    def _module_tensors(self) -> Any:
        if self.module is None:
            return contextlib.nullcontext()
        now = _tensors_of(self.module)
        if now.keys() == self.seen.keys() and all(now[k] is t for k, t in self.seen.items()):
            return contextlib.nullcontext()
        return _reparametrize_module(self.module, self.seen)


def _tensors_of(module: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters(remove_duplicate=False)),
            **dict(module.named_buffers(remove_duplicate=False))}


# --- the segment's own generators ---------------------------------------------------------

# Segments whose watched first run drew from no generator of their own, by `_key`.
_QUIET: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_QUIET_MODULES: weakref.WeakKeyDictionary[nn.Module, set[bool]] = weakref.WeakKeyDictionary()


def _held(value: Any) -> tuple[Any, ...] | None:
    """One closure value as a weak reference (the value itself where immutable; a tuple item by
    item); None where it is neither (a list), whose later contents could differ unseen."""
    if isinstance(value, (int, float, str, bytes, bool, type(None))):
        return ("value", value)
    if isinstance(value, tuple):
        items = [_held(v) for v in value]
        return None if any(i is None for i in items) else ("tuple", tuple(items))
    try:
        return ("ref", weakref.ref(value), getattr(value, "training", None))
    except TypeError:
        return None


def _same_objects(function: Any) -> tuple[Any, ...] | None:
    """What a function's closure holds (`_held`, cell by cell); None where it cannot be told apart again."""
    cells = []
    for cell in getattr(function, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            return None
        held = _held(value)
        if held is None:
            return None
        cells.append(held)
    return tuple(cells)


def _identity(held: tuple[Any, ...]) -> Any:
    if held[0] == "value":
        return held[1]
    if held[0] == "tuple":
        return tuple(_identity(h) for h in held[1])
    return id(held[1]())


def _alive_and_same(seen: tuple[Any, ...], now: tuple[Any, ...]) -> bool:
    if seen[0] != now[0]:
        return False
    if seen[0] == "value":
        return type(seen[1]) is type(now[1]) and seen[1] == now[1]
    if seen[0] == "tuple":
        return len(seen[1]) == len(now[1]) and all(map(_alive_and_same, seen[1], now[1]))
    return seen[1]() is not None and seen[1]() is now[1]() and seen[2] == now[2]


class GeneratorLog(TorchFunctionMode):
    """Every torch.Generator the first run draws from, with its state before the first draw."""

    def __init__(self, function: Any, module: nn.Module | None):
        super().__init__()
        self.states: dict[int, tuple[torch.Generator, torch.Tensor]] = {}
        self.module, self.function = module, function
        self.given = False  # a generator among the call's arguments: watched whatever was learned
        self.was_watched = False

    @functools.cached_property
    def _closure(self) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
        """A function segment's key in _QUIET and what its closure holds (`_same_objects`), read
        once for both the lookup and the learning; None where it cannot be told apart again."""
        code, cells = getattr(self.function, "__code__", None), _same_objects(self.function)
        return None if code is None or cells is None else ((code, *map(_identity, cells)), cells)

    def quiet_before(self) -> bool:
        """Whether an earlier first run of this segment drew from no generator of its own (or it
        is compiled code, whose graph a mode would change and whose random ops draw from the
        default generators, which are restored anyway)."""
        # What torch.compile returns: a module with _orig_mod, a function with _torchdynamo_orig_callable.
        if hasattr(self.function, "_orig_mod") or hasattr(self.function, "_torchdynamo_orig_callable"):
            return True
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
        self.was_watched = True
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
            # Under a mode of the same kind as the first run's: compiled code inside the segment
            # (torch.compile'd blocks) picks its graph by the modes active, and must pick the same.
            with GeneratorLog(None, None) if self.was_watched else contextlib.nullcontext():
                yield
        finally:
            for g, state in now:
                g.set_state(state)


# --- forward hooks that only observe -----------------------------------------------------

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

    def __init__(self, modules: list[nn.Module]):
        self.modules = modules
        self.observer: dict[tuple[int, int], bool] = {}  # (id of its dict, key) -> observer so far
        self.dicts: dict[int, dict[int, Callable[..., Any]]] = {}

    def _hook_dicts(self) -> _HookDicts:
        found: _HookDicts = [(_module._global_forward_pre_hooks, True), (_module._global_forward_hooks, False)]
        for top in self.modules:
            for m in top.modules():
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
