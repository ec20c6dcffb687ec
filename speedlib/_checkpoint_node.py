"""The autograd nodes of speedlib's checkpoint: `_Checkpoint`, which reruns its segment in
backward, and one `_Own` or `_Link` node per output; a forgotten parameter raises there."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from speedlib._checkpoint_runs import _autocast_state, _cuda_devices, _first_run, _hooks_silenced, _rerun, _Segment


class ForgottenParameterError(RuntimeError):
    """A checkpointed segment used a tensor that needs a gradient but was not passed to it."""


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

