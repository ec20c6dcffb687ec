"""A checkpointed segment's two runs, the first in forward and the rerun in backward, and the
`_Segment` that sees the user's function through flat argument and result lists."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import torch

from speedlib._checkpoint_args import ModuleTensors
from speedlib._checkpoint_generators import GeneratorLog
from speedlib._checkpoint_hooks import HookLog
from speedlib._checkpoint_tree import _flatten, _meta, _nondeterministic, _SavedLog, _unflatten


def _cuda_devices(tensors: Iterable[torch.Tensor]) -> list[int]:
    return sorted({t.get_device() for t in tensors if t.is_cuda})


def _autocast_state() -> list[tuple[str, bool, torch.dtype]]:
    types = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    return [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in types]


class _Segment:
    """The user's function seen through flat argument and result lists.

    Arguments and results may be nested lists, tuples and dicts (any structure torch's
    pytree knows) and dataclasses, holding tensors and other objects. autograd.Function
    only tracks tensors passed as its own arguments, so both sides are flattened: every
    tensor anywhere in the arguments becomes an input of the node (its gradient flows back
    to whatever produced it, which a list hidden from the node would silently cut), and
    every tensor anywhere in the result becomes an output.
    """

    # The autograd node holds this object, and the node is held by its outputs: a tensor
    # kept here would make a cycle that only the garbage collector frees, keeping the
    # segment's inputs and outputs (GPU memory) alive until it runs. Only structure,
    # metadata and weak references are kept.
    _TENSOR = object()  # where a tensor stood in the first run's result

    def __init__(self, function: Callable[..., Any], in_spec: Any, names: dict[int, str], contexts: tuple[Any, Any],
                 tensors: ModuleTensors, check_determinism: bool):
        self.function, self.in_spec, self.names = function, in_spec, names
        self.forward_context, self.recompute_context = contexts  # context_fn's pair
        self.tensors = tensors  # the owning module's tensors as forward saw them
        self.check_determinism = check_determinism
        self.generators = GeneratorLog(function, tensors.module)  # its own generators, found in the first run
        self.hooks = HookLog(tensors.module)  # its modules' forward hooks that only observe
        self.out_spec: Any = None
        self.out_leaves: list[Any] = []  # the first run's flat result, tensors replaced by _TENSOR
        self.out_meta: list[tuple[Any, ...]] = []  # the first run's output shapes, dtypes, devices
        self.saved_meta: list[tuple[Any, ...]] | None = None  # what the first run saved (None: not recorded)
        self.links: dict[int, list[int]] = {}  # output j -> the earlier outputs it was computed from (_Link)

    def call(self, leaves: list[Any]) -> list[torch.Tensor]:
        """Run the function on `leaves`; return the tensors of its result, in order."""
        args, kwargs = _unflatten(leaves, self.in_spec)
        result = self.function(*args, **kwargs)
        if result is None:
            raise TypeError("speedlib.checkpoint: the function returned None; a checkpointed function must "
                            "return its output (a tensor, or a structure holding tensors)")
        flat, spec = _flatten(result)
        tensors = [o for o in flat if torch.is_tensor(o)]
        shape = [self._TENSOR if torch.is_tensor(o) else o for o in flat]
        if self.out_spec is None:  # the first run fixes the structure (no tensor at all is fine: no rerun)
            self.out_spec, self.out_leaves, self.out_meta = spec, shape, [_meta(t) for t in tensors]
        elif (spec != self.out_spec
              or [o is self._TENSOR for o in shape] != [o is self._TENSOR for o in self.out_leaves]):
            raise RuntimeError("speedlib.checkpoint: the rerun in backward returned a different structure than "
                               "the first run; a checkpointed function must return the same structure each time")
        else:
            for i, (a, t) in enumerate(zip(self.out_meta, tensors, strict=True)):
                if a != _meta(t):
                    raise _nondeterministic(f"output {i} had shape, dtype and device {a} in forward and "
                                            f"{_meta(t)} in the rerun")
        return tensors

    def rebuild(self, tensors: tuple[torch.Tensor, ...]) -> Any:
        """The first run's result, with the node's outputs in place of its tensors."""
        it = iter(tensors)
        return _unflatten([next(it) if o is self._TENSOR else o for o in self.out_leaves], self.out_spec)


class _Gate:
    """Closed while a segment computes its own gradients (see _Bridge)."""

    closed = False


class _Bridge(torch.autograd.Function):
    """Identity from a segment input to the rerun, for double backward only.

    Under create_graph the rerun must start from the real input (the second-order pass has
    to reach whatever produced it), yet the segment's gradients must be partial ones: a
    parameter in params= that also produced the input (a layer applied twice, tied
    weights) would otherwise get the input's path in its own gradient and then again
    through the input's gradient in the outer pass. While the gate is closed, no gradient
    crosses the bridge upstream; afterwards, for the second-order pass, it is the identity.
    """

    @staticmethod
    def forward(ctx, x, gate):
        ctx.gate = gate
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return (None if ctx.gate.closed else grad), None


def _set_rng(ctx) -> None:
    torch.set_rng_state(ctx.cpu_rng)
    for dev, state in zip(ctx.cuda_devices, ctx.cuda_rng, strict=True):
        torch.cuda.set_rng_state(state, dev)


def _first_run(ctx, segment: _Segment, leaves: tuple[Any, ...], record: bool, will_rerun: bool) -> list[torch.Tensor]:
    """The forward run. With `record` (grad mode was on at the call) it runs with grad
    from fresh leaves under saved-tensor hooks that log, and drop, what it saves: the log
    is what the rerun is checked against, and nothing is kept. A segment that
    differentiates itself (autograd.grad inside) needs its graph: it is run once more
    keeping it, from the same RNG state."""
    with segment.forward_context, contextlib.ExitStack() as stack:
        if will_rerun and ctx.preserve_rng:  # a rerun will come: log the generators it must replay
            stack.enter_context(segment.generators.watched())
        if will_rerun:
            stack.enter_context(segment.hooks.watching())
        return _first_run_logged(ctx, segment, leaves, record)


def _first_run_logged(ctx, segment: _Segment, leaves: tuple[Any, ...], record: bool) -> list[torch.Tensor]:
    if not record:
        with torch.no_grad():
            return segment.call(list(leaves))
    for keep in ("none", "all"):
        log = _SavedLog(keep)
        try:
            with torch.enable_grad(), log.hooks():
                raw = segment.call(_fresh(leaves, ctx.input_grad))
        except Exception:
            if keep == "all" or not log.unpacked_dropped:
                raise
            if ctx.preserve_rng:
                _set_rng(ctx)
            continue
        # A segment that differentiates itself needs its rerun's saved tensors with their
        # graphs, which only the default saving keeps without a cycle: no log for it.
        segment.saved_meta = log.meta if keep == "none" else None
        if sum(o.requires_grad for o in raw) > 1:
            segment.links = _links(raw)
        # Detached: the first run's graph (and whatever it kept) dies here; the node's
        # outputs get their history from the node.
        return [o.detach() for o in raw]
    raise AssertionError("unreachable")


def _fresh(leaves: Any, input_grad: list[bool]) -> list[Any]:
    """The first run's arguments: tensors needing a gradient as new leaves, so its graph stops there."""
    return [t.detach().requires_grad_() if g else t for t, g in zip(leaves, input_grad, strict=True)]


def _edges_below(t: torch.Tensor) -> set[tuple[Any, int]]:
    """Every graph edge (node, output number) that `t` was computed through."""
    edges: set[tuple[Any, int]] = set()
    stack, seen = list(t.grad_fn.next_functions) if t.grad_fn is not None else [], set()
    while stack:
        node, nr = stack.pop()
        if node is None:
            continue
        edges.add((node, nr))
        if node not in seen:
            seen.add(node)
            stack.extend(node.next_functions)
    return edges


def _links(outputs: list[torch.Tensor]) -> dict[int, list[int]]:
    """For each output, the earlier outputs it was computed from (see _Link). An edge, not
    a node, marks the dependence: two results of one multi-output op (chunk's) are not
    computed from each other."""
    links = {}
    for j, o in enumerate(outputs):
        if not (j and o.requires_grad):
            continue
        below = _edges_below(o)
        deps = [i for i in range(j) if outputs[i].grad_fn is not None
                and (outputs[i].grad_fn, outputs[i].output_nr) in below]
        if deps:
            links[j] = deps
    return links


@contextlib.contextmanager
def _hooks_silenced(tensors: Iterable[torch.Tensor]):
    """Empty the tensors' Python gradient-hook dicts while the segment computes its own gradients.

    The node returns those gradients to the outer pass, which runs the hooks on them (on
    the total, once, as without checkpointing); the inner autograd.grad would otherwise
    run them too, on the partial gradient, and a hook that changes the gradient would
    count twice. autograd reads the dict when it calls the hooks, so emptying it is
    enough. The outer pass cannot reach these parameters meanwhile: their gradient
    nodes wait for this node's result.
    """
    emptied = []
    for t in tensors:
        hooks = t._backward_hooks
        if hooks:
            emptied.append((hooks, dict(hooks)))
            hooks.clear()
    try:
        yield
    finally:
        for hooks, items in emptied:
            added = dict(hooks)  # a hook registered meanwhile goes after the old ones
            hooks.clear()
            hooks.update(items)
            hooks.update(added)


def _rerun(ctx, create_graph: bool) -> tuple[list[Any], list[torch.Tensor], _Gate]:
    """Rerun the segment as in forward (RNG, autocast); return its leaves and outputs."""
    gate = _Gate()
    leaves = list(ctx.others)
    for i, t in zip(ctx.tensor_at, ctx.saved_tensors, strict=True):
        if create_graph and ctx.input_grad[i]:
            # A bridge per position: autograd.grad then reports each position's own
            # gradient even when one tensor is passed twice (a leaf listed twice would
            # get the total twice, and the outer pass would add it twice).
            leaves[i] = _Bridge.apply(t, gate)
        elif ctx.input_grad[i]:
            # A fresh leaf per input: the rerun's graph starts here and stops here.
            leaves[i] = t.detach().requires_grad_()
        else:
            leaves[i] = t  # no graph to cut: the segment sees the very object it got in forward
    if [p._version for p in ctx.params] != ctx.param_versions:
        raise RuntimeError("speedlib.checkpoint: a parameter of the segment was modified in place between "
                           "forward and backward (an optimizer step?); the rerun would not match the first run")
    # Under create_graph the rerun's saved tensors are differentiated again and must keep
    # their graphs: the default saving does that without a cycle, so nothing is logged.
    log = _SavedLog("values") if ctx.segment.saved_meta is not None and not create_graph else None
    segment = ctx.segment
    with torch.random.fork_rng(devices=ctx.cuda_devices, enabled=ctx.preserve_rng), segment.generators.replayed():
        if ctx.preserve_rng:
            _set_rng(ctx)
        with torch.enable_grad(), contextlib.ExitStack() as stack:
            stack.enter_context(segment.recompute_context)
            stack.enter_context(segment.tensors.restored())
            stack.enter_context(segment.hooks.quiet())
            for device_type, enabled, dtype in ctx.autocast:  # re-enter the first run's autocast state
                stack.enter_context(torch.autocast(device_type, enabled=enabled, dtype=dtype))
            if torch.get_default_device() != ctx.default_device:
                stack.enter_context(torch.device(ctx.default_device))
            if log is not None:
                stack.enter_context(log.hooks())
            outputs = ctx.segment.call(leaves)
    if log is not None:
        log.compare(ctx.segment.saved_meta, segment.check_determinism)
    return leaves, outputs, gate

