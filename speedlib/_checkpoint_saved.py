"""The checkpoint that keeps the segment's graph and drops what it saves (use_reentrant=False).

The first run records its graph as usual, under saved-tensor hooks that keep, in place of each
tensor an op saves for backward, an empty `_Slot` (and the tensor's shape, dtype and device).
When backward first unpacks a slot, the segment is rerun (`Replay` restores RNG, autocast and
the rest) under hooks that fill the slots in order, and each slot hands its tensor over once.
The graph is the segment's own, so every tensor it uses gets its gradient whatever reached it
(an argument, a parameter, a closure), hooks on its nodes run, and gradients are those of the
same graph without checkpointing. A rerun stops as soon as the last slot is filled
(`early_stop`): the ops after the last saving one are not run again.

Rules the design follows (those of torch.utils.checkpoint's non-reentrant variant, in our
code): a slot belongs to the innermost checkpoint running when it was saved; the arguments of a
checkpoint are saved tensors of a node of their own (`_Arguments`), so an enclosing checkpoint
drops and recomputes them too; each backward pass (its graph task, or a GraphExecGroup) reruns
a segment at most once, and a rerun's tensors are handed over and forgotten as they are read.
"""

from __future__ import annotations

import contextlib
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.checkpoint
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from speedlib._checkpoint_replay import Replay


class NondeterministicSegmentError(torch.utils.checkpoint.CheckpointError):
    """The rerun of a checkpointed segment in backward did not repeat its first run.

    A `torch.utils.checkpoint.CheckpointError` (so a RuntimeError), as torch's own is."""

    __module__ = "speedlib.checkpoint"  # its public home: tracebacks and pickles name it


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
                      if "/torch/" not in f.filename and "/speedlib/_checkpoint" not in f.filename), "?")
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
