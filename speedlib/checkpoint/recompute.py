"""`checkpoint()` and `checkpoint_sequential()`: a segment run without keeping what it saves for
backward, rerun when backward needs it, in torch's two variants. The whole call is in this file:
the arguments read as torch.utils.checkpoint reads them, then one of

- use_reentrant=False (or left out), `Frame`: the segment's graph is recorded and each tensor it
  saves for backward is dropped and recomputed by a rerun when backward first asks for one;
- use_reentrant=True, `_Reentrant`: one autograd node stands for the segment and reruns it in a
  backward pass of its own.

Both rerun the segment under `Replay` (speedlib/checkpoint/replay.py), which repeats the first
run's random numbers, generators, autocast and module tensors and leaves out its observer hooks.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import traceback
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from speedlib.checkpoint.replay import Replay

DETERMINISM_CHECKS = ("default", "none")  # torch.utils.checkpoint's values
_TORCH_DEFAULTS = {"context_fn": None, "determinism_check": "default", "debug": False, "preserve_rng_state": True,
                   "early_stop": True, "respect_saved_tensors_hooks": None}
# checkpoint()'s own keywords, which checkpoint_sequential passes on too.
_OPTIONS = frozenset({"use_reentrant", "context_fn", "determinism_check", "debug", "preserve_rng_state", "early_stop",
                      "respect_saved_tensors_hooks", "params", "check_params"})


class NondeterministicSegmentError(torch.utils.checkpoint.CheckpointError):
    """The rerun of a checkpointed segment in backward did not repeat its first run.

    A `torch.utils.checkpoint.CheckpointError` (so a RuntimeError), as torch's own is."""

    __module__ = "speedlib.checkpoint"  # its public home: tracebacks and pickles name it


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


# --- use_reentrant=False: the graph kept, what it saves recomputed ---------------------------
#
# The first run records its graph as usual, under saved-tensor hooks that keep, in place of each
# tensor an op saves for backward, an empty `_Slot` (and the tensor's shape, dtype and device).
# When backward first unpacks a slot, the segment is rerun (`Replay` restores RNG, autocast and
# the rest) under hooks that fill the slots in order, and each slot hands its tensor over once.
# The graph is the segment's own, so every tensor it uses gets its gradient whatever reached it
# (an argument, a parameter, a closure), hooks on its nodes run, and gradients are those of the
# same graph without checkpointing. A rerun stops as soon as the last slot is filled
# (`early_stop`): the ops after the last saving one are not run again.
#
# Rules the design follows (those of torch.utils.checkpoint's non-reentrant variant, in our
# code): a slot belongs to the innermost checkpoint running when it was saved; the arguments of a
# checkpoint are saved tensors of a node of their own (`_Arguments`), so an enclosing checkpoint
# drops and recomputes them too; each backward pass (its graph task, or a GraphExecGroup) reruns
# a segment at most once, and a rerun's tensors are handed over and forgotten as they are read.


_ADVICE = ("The rerun in backward must repeat the first run, or its gradients belong to another computation: "
           "make the segment depend only on its arguments, its module's tensors and the RNG (which is "
           "restored), not on counters or other state that changes between forward and backward.")

_TAKEN = object()  # a slot's tensor for one pass, already handed to backward


class _Stop(BaseException):  # BaseException: a user's `except Exception` in the segment lets it by
    """Raised inside the rerun once the last slot is filled: nothing after it is needed."""


class _Slot:
    """What the first run keeps in place of a saved tensor: the rerun's tensor, per backward pass."""

    __slots__ = ("values", "__weakref__")

    def __init__(self) -> None:
        self.values: dict[Any, Any] = {}


class _Arguments(torch.autograd.Function):
    """A node that only keeps the segment's tensor arguments as saved tensors: so an enclosing
    checkpoint drops and recomputes them, saved-tensor hooks (save_on_cpu) see them, and one
    changed in place before backward is an error when the rerun reads it."""

    @staticmethod
    def forward(ctx, anchor, *tensors):
        ctx.save_for_backward(*tensors)
        return anchor.detach()

    @staticmethod
    def backward(ctx, *grads):  # never reached: nothing uses its output
        return (None,) * (1 + len(ctx.saved_tensors))


def _pass_key() -> Any:
    """Which backward pass asks: a GraphExecGroup, the current graph task, or (outside backward) a new one."""
    group = torch._C._get_graph_exec_group() if hasattr(torch._C, "_get_graph_exec_group") else None
    if group is not None:
        return group
    task = torch._C._current_graph_task_id()  # -1 outside backward; torch's checkpoint reads it too
    return task if task != -1 else object()


def _of_a_leaf(t: torch.Tensor) -> bool:
    """A leaf requiring grad (a parameter) or a view of one (a linear layer saves weight.t())."""
    if not t.requires_grad:
        return False
    base = t._base if t.grad_fn is not None else t
    return base is not None and base.grad_fn is None


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


@contextlib.contextmanager
def _own_hooks(pack: Callable[[torch.Tensor], Any], unpack: Callable[[Any], torch.Tensor]) -> Iterator[None]:
    """saved_tensors_hooks that torch's selective checkpointing takes for a checkpoint's own, not the
    user's (it routes what it caches through the user's hooks, the ones around ours)."""
    # torch.utils.checkpoint's marks for this; _top_saved_tensors_default_hooks(False) is what a
    # saved tensor would use now, below which its selective-checkpoint code looks for the user's.
    pack._checkpoint_internal = True
    top = torch._C._autograd._top_saved_tensors_default_hooks(False)
    while top is not None and getattr(top[0], "_checkpoint_internal", False):
        top = top[0]._user_hooks
    pack._user_hooks = top
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
    finally:
        del pack._user_hooks  # the graph keeps the hook: it must not keep the user's hooks alive too


class OpLog(TorchDispatchMode):
    """debug=True: each op a run executes, with the line of user code that called it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        where = next((f"{f.filename}:{f.lineno}" for f in reversed(traceback.extract_stack())
                      if "/torch/" not in f.filename and "/speedlib/checkpoint/" not in f.filename), "?")
        self.ops.append(f"{func}  ({where})")
        return func(*args, **(kwargs or {}))


class Frame:
    """One checkpointed call: the slots of its first run, and the reruns that fill them."""

    def __init__(self, function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 replay: Replay, recompute_context: Any, early_stop: bool, check_metadata: bool,
                 logs: tuple[OpLog, OpLog] | None):
        self.function, self.replay = function, replay
        self.recompute_context, self.early_stop, self.check_metadata, self.logs = (
            recompute_context, early_stop, check_metadata, logs)
        self.slots: list[weakref.ref[_Slot]] = []
        self.meta: list[tuple[Any, ...]] = []  # shape, dtype, device of each saved tensor
        self.versions: list[int | None] = []  # versions of parameters and their views: in-place changes are caught
        self.rerun_for: set[Any] = set()  # the passes this segment was rerun for
        self.forward_done = False
        self.mismatch_allowed = False  # a backward inside the first run, without early stop (see _pack_rerun)
        # The arguments as they are now (a list the caller appends to later stays as it was), their
        # tensors on a node of their own (see _Arguments).
        leaves, self.spec = tree_flatten((args, kwargs))
        tensors = [a for a in leaves if isinstance(a, torch.Tensor)]
        self.leaves = [None if isinstance(a, torch.Tensor) else a for a in leaves]
        anchor = torch.empty(0, requires_grad=True)
        self.arguments = _Arguments.apply(anchor, *tensors).grad_fn

    # --- the first run ---

    @contextlib.contextmanager
    def recording(self, forward_context: Any) -> Iterator[None]:
        """The first run: every saved tensor becomes a slot."""
        slots, meta, versions = self.slots, self.meta, self.versions

        def pack(t: torch.Tensor) -> _Slot:
            slot = _Slot()
            slots.append(weakref.ref(slot))
            meta.append((t.shape, t.dtype, t.device))
            versions.append(t._version if _of_a_leaf(t) else None)
            return slot

        with _own_hooks(pack, self._unpack), forward_context:
            yield
        self.forward_done = True

    def _unpack(self, slot: _Slot) -> torch.Tensor:
        key = _pass_key()
        if key not in self.rerun_for:
            self._rerun(key)
            self.rerun_for.add(key)
        value = slot.values.get(key, _TAKEN)
        if value is _TAKEN:
            group = "" if isinstance(key, int) or type(key) is object else (
                "Performing two backward calls that overlap (they need the same saved tensor) is not allowed under "
                "one torch.utils.checkpoint.GraphExecGroup. ")
            raise torch.utils.checkpoint.CheckpointError(
                "speedlib.checkpoint: Unpack is being triggered for a tensor that was already unpacked once in this "
                f"backward pass. {group}A custom Function reading ctx.saved_tensors in backward must read them "
                "once; a rerun's tensors are handed over and then forgotten.")
        slot.values[key] = _TAKEN
        return value

    # --- the rerun ---

    def _rerun(self, key: Any) -> None:
        saved = iter(self.arguments.saved_tensors)  # may rerun an enclosing checkpoint first
        args, kwargs = tree_unflatten([next(saved) if a is None else a for a in self.leaves], self.spec)
        filled = [0]

        def pack(t: torch.Tensor) -> torch.Tensor:
            i = filled[0]
            filled[0] += 1
            if i >= len(self.slots):
                if not self.forward_done:  # backward inside the first run, early stop off: it saves on
                    self.mismatch_allowed = True
                    return t
                self._fail(NondeterministicSegmentError(
                    "speedlib.checkpoint: the segment is not deterministic: trying to save more tensors during "
                    f"recomputation than during the original forward pass ({len(self.slots)}). " + _ADVICE))
            if self.versions[i] is not None and t._version != self.versions[i]:
                raise RuntimeError(
                    f"speedlib.checkpoint: a tensor requiring grad that the segment used (shape {tuple(t.shape)}: a "
                    "parameter, or a view of one) was modified in place between forward and backward (an optimizer "
                    "step?); the rerun would compute with the new values. Step after backward.")
            # Detached: the value alone is needed, and the tensor's own node would otherwise hold it in a cycle.
            t = t.detach() if t.requires_grad else t
            slot = self.slots[i]()
            if slot is not None:  # a slot already freed by backward needs nothing
                slot.values[key] = t
            if self.early_stop and filled[0] == len(self.slots):
                raise _Stop
            return t

        with contextlib.ExitStack() as stack:
            stack.enter_context(_own_hooks(pack, _identity))
            stack.enter_context(torch.enable_grad())
            stack.enter_context(self.replay.replaying())
            stack.enter_context(self.recompute_context)
            if self.logs is not None:
                self.logs[1].ops.clear()
                stack.enter_context(self.logs[1])
            try:
                self.function(*args, **kwargs)
            except _Stop:
                pass
        self._check(key, filled[0])

    def _check(self, key: Any, saved: int) -> None:
        if self.mismatch_allowed:
            return
        if saved != len(self.slots):
            self._fail(NondeterministicSegmentError(
                "speedlib.checkpoint: the segment is not deterministic: A different number of tensors was saved "
                f"during the original forward and recomputation ({len(self.slots)} in forward, {saved} in the "
                "rerun). " + _ADVICE))
        if not self.check_metadata:
            return
        differ = []
        for i, (ref, meta) in enumerate(zip(self.slots, self.meta, strict=True)):
            slot = ref()
            if slot is None:
                continue
            t = slot.values[key]
            if (t.shape, t.dtype, t.device) != meta:
                differ.append(f"saved tensor {i} had shape {tuple(meta[0])}, dtype {meta[1]} and device {meta[2]} "
                              f"in forward, {tuple(t.shape)}, {t.dtype} and {t.device} in the rerun")
        if differ:
            self._fail(NondeterministicSegmentError(
                "speedlib.checkpoint: the segment is not deterministic: Recomputed values for the following tensors "
                "have different metadata than during the forward pass: " + "; ".join(differ) + ". " + _ADVICE))

    def _fail(self, error: NondeterministicSegmentError) -> None:
        if self.logs is None:
            raise error
        first, rerun = (("\n".join(log.ops) or "(none)") for log in self.logs)
        raise NondeterministicSegmentError(
            f"{error}\n\nYou are seeing this error because you passed `debug=True` to checkpoint (or turned "
            "torch.utils.checkpoint.set_checkpoint_debug_enabled on). Ops of the first run, in order:\n"
            f"{first}\n\nOps of the rerun (checkpointing adds its own `detach` calls there):\n{rerun}") from error


# --- use_reentrant=True: one node reruns the segment in a backward pass of its own -----------
#
# The node's first run goes without grad, and its backward reruns the segment from detached
# copies of the arguments and calls `torch.autograd.backward` on the rerun, which accumulates the
# parameters' gradients in that nested pass and leaves the arguments' gradients for the node to
# return. That is torch.utils.checkpoint's reentrant variant, with its contract
# (torch.autograd.grad and backward(inputs=...) through it are refused; a rerun whose outputs need
# no gradient is an error), here in our code with speedlib's additions: keyword arguments and
# tensors nested in lists, tuples and dicts are inputs of the node, and `Replay` restores the
# segment's own generators, quiets observer hooks and keeps the module's tensors, as for the
# other variant.


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
