"""Activation checkpointing with explicit parameters, and BatchNorm that counts a step once.

`checkpoint(fn, *args, params=..., **kwargs)` runs `fn` without keeping its activations and reruns
it in backward; it takes torch.utils.checkpoint.checkpoint's arguments (speedlib/_checkpoint_args.py
reads them) and `checkpoint_sequential` torch's. Unlike `torch.utils.checkpoint(use_reentrant=True)` it never starts a
nested backward pass: the rerun's gradients come out of one `torch.autograd.grad` call and
are returned as the gradients of `inputs` and `params`, which are inputs of the autograd
node. The outer backward pass therefore accumulates every parameter's gradient itself,
once, in its own order, which is what DataParallel's per-device threads and
DistributedDataParallel's bucket hooks expect (the nested pass of the reentrant variant is
what made pytorch-checkpoint's "Official" row cost 1.4 s instead of 0.3 s on two GPUs).

What the original `CheckpointFunction` got wrong, fixed here:

- the RNG state (CPU and every CUDA device the inputs live on) is saved before the first
  run and restored for the rerun, so dropout draws the same mask twice;
- arguments and results of any structure: nested lists, tuples and dicts of tensors (the
  list of feature maps an efficient DenseNet layer takes), keyword arguments, inputs that
  do not require grad, and non-tensors (None, ints, strings) next to tensors;
- double backward: under `create_graph=True` (a gradient penalty) the rerun and its
  gradients are recorded, so second-order gradients reach inputs and parameters as
  without checkpointing (equal up to summation order) instead of being dropped;
- a tensor that needs a gradient but reaches the segment neither as an argument nor through
  `params` (a forgotten parameter) is an error in backward, not a silently missing gradient;
  a parameter listed twice (tied weights) counts once instead of getting its gradient twice;
- the autocast state of the first run is used for the rerun.

Where torch's non-reentrant checkpoint (which keeps the segment's own graph) already
behaved well, this one now does too: a parameter's gradient hook runs once (the inner
autograd.grad of the rerun leaves it to the outer pass); dataclass results and arguments
are flattened; each output has its own node (a hook on one output may backpropagate from
another) and autograd.grad(b, a) between outputs works; a segment may call autograd.grad
itself; and a rerun that saves other tensors than the first run (a nondeterministic
segment) raises NondeterministicSegmentError. docs/techniques/checkpoint.md lists what
still deliberately differs.

BatchNorm: both `torch.utils.checkpoint` variants (and any checkpoint) run a segment's
forward twice, and a plain `nn.BatchNorm*d` updates its running statistics and
`num_batches_tracked` on both runs. speedlib's `BatchNorm1d/2d/3d` skip the update when
their forward runs inside a backward pass, which is where every checkpoint reruns
segments; the decision does not depend on whether the input requires grad.
`convert_batchnorm(model)` swaps them into an existing model.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.utils.checkpoint
from torch import nn

from speedlib._checkpoint_args import ModuleTensors, explicit_params, open_partial, owner, torch_options, two_contexts
from speedlib._checkpoint_batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d, convert_batchnorm, in_backward

# Three parts live in private modules, each readable on its own: the flattening of a segment's
# arguments and results and the log of its saved tensors (speedlib/_checkpoint_tree.py), and
# the BatchNorm that counts a step once (_checkpoint_batchnorm.py), and the reading of the
# caller's arguments as torch's (_checkpoint_args.py). This module keeps the
# autograd node and stays the technique's one import.
from speedlib._checkpoint_generators import GeneratorLog
from speedlib._checkpoint_hooks import HookLog
from speedlib._checkpoint_tree import (
    NondeterministicSegmentError,
    _flatten,
    _meta,
    _nondeterministic,
    _SavedLog,
    _unflatten,
)

__all__ = ["checkpoint", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "convert_batchnorm",
           "in_backward", "ForgottenParameterError", "NondeterministicSegmentError", "SEGMENT_VARIANTS", "run_segment",
           "CheckpointedSequential", "checkpoint_sequential"]


class ForgottenParameterError(RuntimeError):
    """A checkpointed segment used a tensor that needs a gradient but was not passed to it."""


# --- the explicit-parameter checkpoint ---------------------------------------------------

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


class _Checkpoint(torch.autograd.Function):
    # Arguments: segment, n_leaves, preserve_rng, check_params, record, will_rerun, *leaves, *params.

    @staticmethod
    def forward(ctx, segment, n_leaves, preserve_rng, check_params, record, will_rerun, *args):
        leaves, params = args[:n_leaves], args[n_leaves:]
        ctx.segment, ctx.check_params, ctx.preserve_rng = segment, check_params, preserve_rng
        ctx.autocast = _autocast_state()
        # A `with torch.device(...)` around the call makes tensors created inside the segment
        # land there; the rerun, outside that block, must create them in the same place.
        ctx.default_device = torch.get_default_device()
        # Unused outputs get None instead of a zero tensor: no backward work for them.
        ctx.set_materialize_grads(False)
        # Tensors go through save_for_backward (so in-place changes after this are caught);
        # everything else is kept as is.
        ctx.tensor_at = [i for i, a in enumerate(leaves) if torch.is_tensor(a)]
        ctx.others = [None if torch.is_tensor(a) else a for a in leaves]
        ctx.input_grad = [torch.is_tensor(a) and a.requires_grad for a in leaves]
        ctx.cuda_devices = []
        if preserve_rng:
            ctx.cpu_rng = torch.get_rng_state()
            ctx.cuda_devices = _cuda_devices(a for a in args if torch.is_tensor(a))
            ctx.cuda_rng = [torch.cuda.get_rng_state(d) for d in ctx.cuda_devices]
        ctx.save_for_backward(*(leaves[i] for i in ctx.tensor_at))
        # Parameters are kept as the objects themselves, not through save_for_backward: the
        # rerun uses the module's own Parameter objects, and saved-tensor hooks (offloading
        # such as torch.autograd.graph.save_on_cpu) would hand back copies, whose gradients
        # autograd.grad would report as unused. Their version counters stand in for
        # save_for_backward's check that nothing changed them in place before backward.
        ctx.params = params
        versions = [leaves[i]._version for i in ctx.tensor_at]
        outputs = _first_run(ctx, segment, leaves, record, will_rerun)
        if will_rerun:
            _check_inputs_unchanged(versions, [leaves[i] for i in ctx.tensor_at], ctx.tensor_at)
        # Taken after the first run: a lazy module (nn.LazyLinear) materialises its parameters there.
        ctx.param_versions = [p._version for p in params]
        ctx.sent = {}  # output -> what _Link sent on to it from a later output (see _Link)
        ctx.mark_non_differentiable(*(o for o in outputs if not (o.is_floating_point() or o.is_complex())))
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        # Grad mode is on here only when the outer backward was asked for create_graph=True
        # (a gradient penalty, double backward): the gradients returned must then be
        # differentiable functions of the inputs and parameters, so the rerun is recorded
        # from the real inputs and autograd.grad keeps its graph. Otherwise the rerun starts
        # from detached leaves and its graph is freed as soon as the gradients exist.
        create_graph = torch.is_grad_enabled()
        grad_outputs = _minus_sent(ctx, grad_outputs)
        leaves, outputs, gate = _rerun(ctx, create_graph)
        params = ctx.params
        wrt = [leaves[i] for i in ctx.tensor_at if ctx.input_grad[i]] + [p for p in params if p.requires_grad]
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs, strict=True) if o.requires_grad and g is not None]
        if ctx.check_params and pairs:
            _check_no_forgotten(ctx.segment.names, [o for o, _ in pairs], wrt)
        gate.closed = True
        try:
            with _hooks_silenced(params):
                grads = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True,
                                                 create_graph=create_graph)
                             if pairs and wrt else [None] * len(wrt))
        finally:
            gate.closed = False
        input_grads = [next(grads) if needs else None for needs in ctx.input_grad]
        param_grads = [next(grads) if p.requires_grad else None for p in params]
        return (None, None, None, None, None, None, *input_grads, *param_grads)


class _Own(torch.autograd.Function):
    """Identity giving one output of a segment a node of its own.

    Every output of the segment comes out of one _Checkpoint node, so a hook on one output
    (a pre-hook of that node) would also run when another output is backpropagated from
    inside it, which re-enters the hook without end. torch's checkpoint has one node per
    output (the segment's own), and so does this, at the cost of one cheap node each.
    """

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x.detach()  # not a view: the output stays modifiable in place, as the node's own is

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Link(torch.autograd.Function):
    """_Own for an output computed from earlier outputs of the same segment.

    torch's checkpoint keeps the segment's own graph, so autograd.grad(b, a) works when b
    was computed from a inside the segment; here a and b are separate results of one
    node. The link gives b an edge to each such a. In an ordinary backward pass it sends
    nothing along it (the node's rerun already follows b's path through a). When only
    those outputs are asked for (the node itself will not run) it sends db/da from a rerun.
    When the pass computes chosen inputs only (autograd.grad(b, [a, x]), backward(inputs=))
    and the node runs too, `a` may be one of them: it sends db/da along, and the node
    takes what it sent off a's gradient again, so nothing counts twice.
    """

    @staticmethod
    def forward(ctx, checkpoint_ctx, j, deps, sentinel, x, *earlier):
        ctx.set_materialize_grads(False)
        ctx.checkpoint_ctx, ctx.j, ctx.deps, ctx.sentinel = checkpoint_ctx, j, deps, sentinel.grad_fn
        return x.detach()

    @staticmethod
    def backward(ctx, grad):
        none = [None] * len(ctx.deps)
        node_runs = torch._C._will_engine_execute_node(ctx.checkpoint_ctx)
        # The sentinel hangs off the graph leading nowhere: only a pass over every node runs it.
        every_node = torch._C._will_engine_execute_node(ctx.sentinel)
        if grad is None or (node_runs and every_node):
            return (None, None, None, None, grad, *none)
        create_graph = torch.is_grad_enabled()
        _, outputs, _ = _rerun(ctx.checkpoint_ctx, create_graph)
        earlier = [outputs[i] for i in ctx.deps]
        with _hooks_silenced(ctx.checkpoint_ctx.params):
            grads = torch.autograd.grad(outputs[ctx.j], earlier, grad, allow_unused=True, create_graph=create_graph)
        if not node_runs:
            return (None, None, None, None, None, *grads)
        sent = ctx.checkpoint_ctx.sent
        for i, g in zip(ctx.deps, grads, strict=True):
            if g is not None:
                sent[i] = g if sent.get(i) is None else sent[i] + g
        return (None, None, None, None, grad, *grads)


def _minus_sent(ctx, grad_outputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The gradients of the node's outputs without what _Link sent on to them from later outputs."""
    sent, ctx.sent = ctx.sent, {}
    return tuple(g if sent.get(i) is None or g is None else g - sent[i] for i, g in enumerate(grad_outputs))


def _check_inputs_unchanged(before: list[int], tensors: list[torch.Tensor], positions: list[int]) -> None:
    """A segment must not change its arguments in place: the rerun would change them again, from the changed value."""
    for i, (version, t) in enumerate(zip(before, tensors, strict=True)):
        if t._version != version:
            raise RuntimeError(
                f"speedlib.checkpoint: the segment modified its tensor argument {positions[i]} (counting every tensor "
                "in the arguments, keyword arguments last) in place; the rerun in backward would modify it again "
                "and compute from the changed value, so both the argument and the gradients would be wrong "
                "(torch.utils.checkpoint raises too). Use the out-of-place form inside the segment (m = m.mul(2) "
                "for m.mul_(2)) or change the tensor before the call.")


def _own_nodes(segment: _Segment, outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Each differentiable output through its own node (_Own, or _Link when it depends on others)."""
    if sum(o.requires_grad for o in outputs) < 2:
        return outputs
    node = next(o.grad_fn for o in outputs if o.requires_grad)
    sentinel = torch.empty(0, requires_grad=True) * 1 if segment.links else None  # see _Link
    result: list[torch.Tensor] = []
    for j, o in enumerate(outputs):
        if not o.requires_grad:
            result.append(o)
        elif j in segment.links:
            deps = segment.links[j]
            result.append(_Link.apply(node, j, deps, sentinel, o, *(result[i] for i in deps)))
        else:
            result.append(_Own.apply(o))
    return tuple(result)


def _check_no_forgotten(names: dict[int, str], outputs: list[torch.Tensor], known: list[torch.Tensor]) -> None:
    """Walk the rerun's graph from `outputs`; every path must end at a `known` tensor.

    A leaf that requires grad and is not known is a forgotten parameter: autograd.grad
    would not return its gradient and nothing else would accumulate it. The walk stops at
    known tensors, so it never leaves the segment unless something was forgotten.
    """
    known_leaves = {id(t) for t in known if t.grad_fn is None}
    # aliases, non-leaf params (DataParallel replicas)
    known_nodes = {t.grad_fn for t in known if t.grad_fn is not None}
    # An output may be a leaf itself (a closed-over parameter returned unchanged): it has no node to walk from.
    stack: list[Any] = [o.grad_fn if o.grad_fn is not None else o for o in outputs]
    seen = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen or node in known_nodes:
            continue
        seen.add(node)
        variable = node if torch.is_tensor(node) else getattr(node, "variable", None)  # AccumulateGrad holds its leaf
        if torch.is_tensor(node) and id(node) in known_leaves:
            continue
        if variable is not None and id(variable) not in known_leaves:
            name = names.get(id(variable), f"a tensor of shape {tuple(variable.shape)}")
            # The walk cannot tell a parameter used inside the segment from one reached through
            # an activation the segment closes over, so the message names both fixes.
            hint = "" if isinstance(variable, nn.Parameter) else (
                " It is not an nn.Parameter: a tensor made inside the segment by code that trains outside "
                "autograd's accumulation (a HostEmbedding lookup) must be made outside it and passed in.")
            raise ForgottenParameterError(
                f"speedlib.checkpoint: the segment uses {name}, which requires grad but was passed neither "
                "as an argument nor in params=; its gradient would be lost. If the segment uses it directly, "
                "add it to params= (for a module: params=module.parameters()); if it reaches the segment "
                "through a tensor computed outside it (a closure over an activation), pass that tensor as an "
                "argument instead." + hint)
        if not torch.is_tensor(node):
            stack.extend(next_node for next_node, _ in node.next_functions)


def checkpoint(function: Callable[..., Any], *args: Any, use_reentrant: bool | None = None,
               context_fn: Callable[[], tuple[Any, Any]] | None = None, determinism_check: str = "default",
               debug: bool = False, params: Iterable[torch.Tensor] | None = None, preserve_rng_state: bool = True,
               check_params: bool = True, **kwargs: Any) -> Any:
    """Run `function(*args, **kwargs)` without keeping its activations; rerun it in backward.

    Takes torch.utils.checkpoint.checkpoint's arguments and behaves as its non-reentrant
    variant, except where docs/techniques/checkpoint.md says why not.

    args, kwargs: passed to `function`. They may be nested lists, tuples and dicts: every
        tensor anywhere in them gets its gradient (a DenseNet layer's list of feature maps).
        A keyword argument of the function named like one of this call's own must go
        through a lambda (as under torch).
    use_reentrant: None or False (the reentrant variant's nested backward is refused).
    context_fn: torch's: returns two context managers, for the first run and the rerun.
    determinism_check: "default" (a rerun that saves other tensors raises
        NondeterministicSegmentError) or "none". debug: False only.
    params: every tensor requiring grad that `function` uses besides `args` and `kwargs`
        (its parameters). Found automatically when `function` is an `nn.Module`, a bound
        method of one, or a `functools.partial` over either; any other callable must list
        them (an empty tuple if it has none). `module.named_parameters()` is accepted too;
        a tensor listed twice counts once.
    preserve_rng_state: restore the RNG state for the rerun (dropout sees the same mask),
        the default generators and any generator the segment draws from itself.
    check_params: raise ForgottenParameterError in backward when the rerun reaches a tensor
        requiring grad that is in neither the arguments nor `params`.

    Returns what `function` returns, with the same structure: tensors, and non-tensors
    (None, ints, strings) next to them. Higher-order gradients (backward or autograd.grad
    with create_graph=True, as in a gradient penalty) equal those without checkpointing.
    """
    if torch.compiler.is_compiling():  # under torch.compile: a graph break, the segment runs eagerly
        return _eager_checkpoint()(function, *args, use_reentrant=use_reentrant, context_fn=context_fn,
                                   determinism_check=determinism_check, debug=debug, params=params,
                                   preserve_rng_state=preserve_rng_state, check_params=check_params, **kwargs)
    contexts = two_contexts(torch_options(use_reentrant, context_fn, determinism_check, debug))
    if not callable(function):
        raise TypeError(f"speedlib.checkpoint: the function to checkpoint must be callable, "
                        f"got {type(function).__name__}")
    function, args, kwargs = open_partial(function, args, kwargs)
    module = owner(function, args)
    params = explicit_params(module, params)
    if any(nn.parameter.is_lazy(p) for p in params):
        # A lazy module (nn.LazyLinear) shapes its parameters in its first call, and the node
        # needs their shapes before it: that one call runs without checkpointing.
        return function(*args, **kwargs)
    named = module.named_parameters() if check_params and module is not None else ()
    leaves, in_spec = _flatten((args, kwargs))
    segment = _Segment(function, in_spec, {id(p): f"parameter {n!r}" for n, p in named}, contexts,
                       ModuleTensors(module), determinism_check == "default")
    segment.generators.given = any(isinstance(leaf, torch.Generator) for leaf in leaves)
    # Recording the first run's saved tensors needs grad mode (without it there is no
    # backward to check) and saved-tensor hooks that are not disabled.
    record = torch.is_grad_enabled() and torch._C._autograd._saved_tensors_hooks_is_enabled()
    will_rerun = torch.is_grad_enabled() and any(torch.is_tensor(t) and t.requires_grad for t in (*leaves, *params))
    outputs = _Checkpoint.apply(segment, len(leaves), preserve_rng_state, check_params, record, will_rerun,
                                *leaves, *params)
    return segment.rebuild(_own_nodes(segment, outputs))


@functools.cache
def _eager_checkpoint() -> Callable[..., Any]:
    # The first run and the rerun must run the same code: compiled, they would save other tensors.
    return torch.compiler.disable(checkpoint)


def checkpoint_sequential(functions: nn.Sequential | list[Callable[..., Any]], segments: int, input: Any,
                          use_reentrant: bool | None = None, **kwargs: Any) -> Any:
    """torch.utils.checkpoint.checkpoint_sequential with speedlib's checkpoint.

    Runs `functions` (an nn.Sequential or a list of modules) in order on `input`, split into
    `segments` runs of len // segments functions; every run but the last is checkpointed.
    kwargs: preserve_rng_state, context_fn, determinism_check, check_params.
    """
    items = list(functions.children()) if isinstance(functions, nn.Sequential) else list(functions)
    if not isinstance(segments, int) or not 1 <= segments <= max(1, len(items)):
        raise ValueError(f"speedlib.checkpoint_sequential: segments must be an int from 1 to the number of "
                         f"functions ({len(items)}), got {segments!r}")
    size = len(items) // segments
    for start in range(0, size * (segments - 1), size):
        part = items[start:start + size]
        found = [m.parameters() for m in part if isinstance(m, nn.Module)]
        if len(found) < len(part):
            raise TypeError("speedlib.checkpoint_sequential: every function must be an nn.Module (its parameters "
                            "are the segment's); wrap other callables in a module")
        input = checkpoint(nn.Sequential(*part), input, use_reentrant=use_reentrant, **kwargs)
    for f in items[size * (segments - 1):]:
        input = f(input)
    return input


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
