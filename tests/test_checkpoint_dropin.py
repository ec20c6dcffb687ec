"""speedlib.checkpoint as a drop-in for torch.utils.checkpoint (issue 43).

Each behaviour is compared with torch.utils.checkpoint(use_reentrant=False) or with no
checkpointing; where speedlib raises instead, the test says what torch does.
"""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint
from torch.utils.checkpoint import checkpoint_sequential as torch_checkpoint_sequential

from speedlib.checkpoint import NondeterministicSegmentError, checkpoint, checkpoint_sequential, in_backward


def _block(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Dropout(0.3), nn.Linear(6, 4))


def _grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters()]


# --- torch's signature --------------------------------------------------------------------

def _grads_of(ckpt, reentrant):
    block = _block()
    x = torch.randn(3, 4, requires_grad=True, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(1)
    ckpt(block, x, use_reentrant=reentrant).sum().backward()
    return [x.grad, *_grads(block)]


@pytest.mark.parametrize("reentrant", [False, True])
def test_use_reentrant_either_way_gives_torchs_gradients_bitwise(reentrant):
    ours, theirs = _grads_of(checkpoint, reentrant), _grads_of(torch_checkpoint, reentrant)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    with pytest.raises(TypeError, match="use_reentrant takes True, False or None"):
        checkpoint(_block(), torch.ones(1, 4), use_reentrant="no")


def test_use_reentrant_true_keeps_torchs_reentrant_contract():
    """Mirrors test_utils.py test_checkpoint_valid and test_autograd.py
    test_checkpoint_valid_reset_on_error: autograd.grad through a reentrant checkpoint raises,
    and the next plain backward works."""
    a = torch.randn(2, 2, requires_grad=True)
    with pytest.raises(RuntimeError, match="torch.utils.checkpoint is incompatible with .grad()"):
        torch.autograd.grad(checkpoint(torch.exp, a, use_reentrant=True).sum(), (a,))
    checkpoint(torch.exp, a, use_reentrant=True).sum().backward()
    torch.testing.assert_close(a.grad, a.exp())
    with pytest.raises(ValueError, match="only supported when use_reentrant=False"):
        checkpoint(torch.exp, a, use_reentrant=True, context_fn=lambda: (contextlib.nullcontext(),) * 2)


class _Kwargs(nn.Module):
    """A forward(**kwargs) would swallow torch's keywords silently if they were passed on."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.seen: list[set[str]] = []

    def forward(self, x, **kwargs):
        self.seen.append(set(kwargs))
        return self.lin(x)


def test_torch_keywords_never_reach_the_function():
    m = _Kwargs()
    out = checkpoint(m, torch.randn(1, 2, requires_grad=True), use_reentrant=False, determinism_check="none",
                     debug=False, context_fn=lambda: (contextlib.nullcontext(), contextlib.nullcontext()), scale=2)
    out.sum().backward()
    assert m.seen == [{"scale"}, {"scale"}]


def test_debug_true_names_the_ops_of_both_runs_and_bad_options_are_refused_by_name():
    calls = []

    def fickle(x):
        calls.append(1)
        return x.sin().exp() if len(calls) == 1 else x.sin() * torch.ones(1, 2, 1)

    out = checkpoint(fickle, torch.ones(1, 2, requires_grad=True), debug=True)
    with pytest.raises(NondeterministicSegmentError, match=r"(?s)passed `debug=True`.*aten\.exp\.default.*rerun"):
        out.sum().backward()
    m = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"determinism_check must be one of \('default', 'none'\)"):
        checkpoint(m, torch.ones(1, 2), determinism_check="strict")
    with pytest.raises(TypeError, match="context_fn must return a tuple of two context managers"):
        checkpoint(m, torch.ones(1, 2), context_fn=contextlib.nullcontext)
    with pytest.raises(ValueError, match="debug=True is incompatible with a context_fn"):
        checkpoint(m, torch.ones(1, 2), debug=True, context_fn=lambda: (contextlib.nullcontext(),) * 2)


def test_context_fn_wraps_the_first_run_and_the_rerun_as_in_torch():
    def make(log):
        @contextlib.contextmanager
        def entered(name):
            log.append(f"{name} in backward={in_backward()}")
            yield
        return lambda: (entered("forward"), entered("recompute"))

    logs = {}
    for name, ckpt in (("torch", functools.partial(torch_checkpoint, use_reentrant=False)), ("speedlib", checkpoint)):
        logs[name] = []
        x = torch.randn(2, 2, requires_grad=True)
        ckpt(nn.Linear(2, 2), x, context_fn=make(logs[name])).sum().backward()
    assert logs["speedlib"] == logs["torch"] == ["forward in backward=False", "recompute in backward=True"]


class _Counted(nn.Module):
    """Saves tensors of another shape on every other call (as many, the same gradients)."""

    def __init__(self):
        super().__init__()
        self.lin, self.calls = nn.Linear(2, 2), 0

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        w = y.unsqueeze(0) if self.calls % 2 else y
        return (w * w).reshape(y.shape)


@pytest.mark.parametrize("ckpt", [checkpoint, functools.partial(torch_checkpoint, use_reentrant=False)],
                         ids=["speedlib", "torch"])
def test_determinism_check_none_turns_the_shape_check_off_as_in_torch(ckpt):
    x = torch.randn(1, 2, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"saved tensor \d had shape|tensor at position"):
        ckpt(_Counted(), x).sum().backward()
    model = _Counted()
    x.grad = None
    model(x).sum().backward()
    expected, x.grad = x.grad, None
    ckpt(model, x, determinism_check="none").sum().backward()
    torch.testing.assert_close(x.grad, expected)


# --- parameters found without params= -------------------------------------------------------

class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x, scale=1.0, bias=None):
        y = self.b(torch.relu(self.a(x))) * scale
        return y if bias is None else y + bias

    def half_step(self, x):
        return self.a(x).sin()


@pytest.mark.parametrize("how", ["bound_method", "partial_of_call", "partial_with_tensor_keyword"])
def test_parameters_are_found_for_bound_methods_and_partials(how):
    torch.manual_seed(0)
    layer = _Layer()
    x = torch.randn(2, 3, requires_grad=True)
    bias = torch.randn(3, requires_grad=True)
    fn, args = {
        "bound_method": (layer.half_step, (x,)),
        # what Hugging Face's GradientCheckpointingLayer passes: partial(super().__call__, **kwargs)
        "partial_of_call": (functools.partial(layer.__call__, scale=2.0), (x,)),
        "partial_with_tensor_keyword": (functools.partial(layer.__call__, bias=bias), (x,)),
    }[how]
    fn(*args).sum().backward()
    expected = [t.grad.clone() for t in (x, bias, *layer.parameters()) if t.grad is not None]
    for t in (x, bias, *layer.parameters()):
        t.grad = None
    checkpoint(fn, *args).sum().backward()
    got = [t.grad for t in (x, bias, *layer.parameters()) if t.grad is not None]
    assert len(got) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize("how", ["lambda", "closure", "closure_over_nothing"])
def test_plain_functions_and_closures_need_no_params(how):
    """Old Hugging Face code wraps a module in `def custom_forward(*inputs): return module(*inputs)`."""
    def run(ckpt):
        layer = _Layer()
        torch.manual_seed(0)
        layer.load_state_dict(_Layer().state_dict())
        x = torch.randn(2, 3, requires_grad=True)

        def custom_forward(*inputs):
            return layer(*inputs)

        fn = {"lambda": lambda t: layer(t, 2.0), "closure": custom_forward, "closure_over_nothing": torch.sin}[how]
        ckpt(fn, x).square().sum().backward()
        return [x.grad, *(p.grad for p in layer.parameters())]

    ours, theirs = run(checkpoint), run(functools.partial(torch_checkpoint, use_reentrant=False))
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_checkpoint_sequential_matches_torchs():
    model = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(5)))
    x = torch.randn(3, 4, requires_grad=True)
    results = []
    for fn in (checkpoint_sequential, functools.partial(torch_checkpoint_sequential, use_reentrant=False)):
        model.zero_grad(set_to_none=True)
        x.grad = None
        out = fn(model, 2, x)
        out.pow(2).sum().backward()
        results.append([out.detach(), x.grad, *_grads(model)])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))
    with pytest.raises(ValueError, match="segments must be an int from 1 to the number of functions"):
        checkpoint_sequential(model, 0, x)


# --- what was silently wrong ---------------------------------------------------------------

def _scale_input_in_place(x, m):
    m.mul_(2)
    return x * m


def _add_to_input_in_place(x, w):
    x.add_(1)
    return x * w


@pytest.mark.parametrize("segment", [_scale_input_in_place, _add_to_input_in_place])
def test_a_segment_changing_its_input_in_place_raises_as_torch_does(segment):
    for ckpt, error in ((functools.partial(torch_checkpoint, use_reentrant=False), "modified by an inplace"),
                        (functools.partial(checkpoint, params=()), "modified its tensor argument [01] .* in place")):
        first, second = torch.ones(3, requires_grad=segment is _scale_input_in_place), torch.ones(3)
        if segment is _add_to_input_in_place:
            first, second = torch.zeros(3), torch.ones(3, requires_grad=True)
        with pytest.raises(RuntimeError, match=error):
            ckpt(segment, first, second).sum().backward()


def test_a_segment_changing_its_input_in_place_without_grad_runs_once():
    m = torch.ones(3)
    with torch.no_grad():
        out = checkpoint(_scale_input_in_place, torch.ones(3), m, params=())
    assert torch.equal(m, torch.full((3,), 2.0)) and torch.equal(out, m)


def test_a_closed_over_parameter_returned_unchanged_gets_torchs_gradient():
    lin, w = nn.Linear(3, 3), nn.Parameter(torch.ones(3))
    grads = []
    for ckpt in (functools.partial(torch_checkpoint, use_reentrant=False), checkpoint):
        a, b = ckpt(lambda t: (lin(t), w), torch.ones(2, 3))
        (a.sum() + 3 * b.sum()).backward()
        grads.append(w.grad)
        w.grad = None
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[1], torch.full((3,), 3.0))


def _sin_exp(t):
    y = t.sin()
    return y, y.exp()


@pytest.mark.parametrize("ask", ["outputs_and_input", "input_then_output", "backward_inputs"])
def test_autograd_grad_over_two_outputs_and_the_input_matches_torch(ask):
    results = []
    for ckpt in (functools.partial(torch_checkpoint, use_reentrant=False), functools.partial(checkpoint, params=())):
        t = torch.randn(4, requires_grad=True, generator=torch.Generator().manual_seed(0))
        y, z = ckpt(_sin_exp, t)
        if ask == "backward_inputs":
            (z.sum() + y.sum()).backward(inputs=[t])
            results.append([t.grad])
        else:
            wrt = [y, t] if ask == "outputs_and_input" else [t, y]
            results.append(list(torch.autograd.grad(z.sum() + 2 * y.sum(), wrt, allow_unused=True)))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)


def test_dropout_from_the_segments_own_generator_sees_the_same_mask():
    def run(ckpt):
        gen = torch.Generator().manual_seed(7)
        x = torch.ones(256, requires_grad=True)
        out = ckpt(lambda t: t * (torch.rand(t.shape, generator=gen) > 0.5), x)
        out.sum().backward()
        return x.grad, out.detach(), gen.get_state()

    grad, out, state = run(lambda f, x: f(x))
    ours = run(functools.partial(checkpoint, params=()))
    assert torch.equal(ours[0], grad) and torch.equal(ours[1], out)
    assert torch.equal(ours[2], state)  # the generator is left where the first run left it
    assert torch.equal(grad, out)


# --- torch.compile, lazy modules, functional_call ---------------------------------------------

class _Outer(nn.Module):
    def __init__(self, checkpointed: bool):
        super().__init__()
        torch.manual_seed(3)
        self.block, self.head, self.checkpointed = _block(3)[:2], nn.Linear(6, 1), checkpointed

    def forward(self, x):
        return self.head(checkpoint(self.block, x) if self.checkpointed else self.block(x))


def _compiled_grads(ckpt, where: str) -> list[torch.Tensor]:
    """Three steps of a block checkpointed by `ckpt`, compiled with inductor inside the
    checkpoint (`checkpoint(torch.compile(block), x)`) or around it (a compiled model)."""
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    inner = torch.compile(block) if where == "inside" else block

    def model(x):
        return ckpt(inner, x).sum()

    step = torch.compile(model) if where == "outside" else model
    grads = []
    for seed in range(3):
        x = torch.randn(4, 8, requires_grad=True, generator=torch.Generator().manual_seed(seed))
        step(x).backward()
        grads += [x.grad, *(p.grad.clone() for p in block.parameters())]
    return grads


@pytest.mark.parametrize("where", ["inside", "outside"])
def test_a_compiled_block_checkpoints_as_in_torch(where):
    """Issue 53: checkpoint(torch.compile(block), x) raised NondeterministicSegmentError (the
    first run's generator watch changed the compiled graph). Now it gives, as torch's checkpoint
    does, the compiled block's gradients without checkpointing, bitwise; inside a compiled model
    the call is torch's checkpoint."""
    plain = _compiled_grads(lambda f, x: f(x), where)
    ours = _compiled_grads(checkpoint, where)
    theirs = _compiled_grads(functools.partial(torch_checkpoint, use_reentrant=False), where)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    if where == "inside":
        assert all(torch.equal(a, b) for a, b in zip(ours, plain, strict=True))
    else:  # the compiler partitions the checkpointed graph: equal to float rounding
        assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(ours, plain, strict=True))


def test_a_lazy_module_is_checkpointed_from_its_second_call():
    results = []
    for ckpt in (lambda m, x: m(x), checkpoint):
        torch.manual_seed(4)
        lazy = nn.LazyLinear(3)
        for _ in range(2):
            x = torch.randn(2, 5, requires_grad=True)
            ckpt(lazy, x).tanh().sum().backward()
        results.append(_grads(lazy))
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_functional_call_over_a_checkpointed_module_uses_the_given_tensors():
    x = torch.randn(3, 4)
    results = []
    for checkpointed in (False, True):
        model = _Outer(checkpointed)
        given = {k: v.detach() * 2 for k, v in model.named_parameters()}
        for t in given.values():
            t.requires_grad_()
        torch.func.functional_call(model, given, (x,)).sum().backward()
        assert all(p.grad is None for p in model.parameters())
        results.append([given[k].grad for k in sorted(given)])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


# --- hooks and side effects ------------------------------------------------------------------

def _hook_counts(ckpt) -> dict[str, int]:
    counts = {"pre": 0, "first_layer": 0, "logged": 0}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 3))
    model[0].register_forward_pre_hook(lambda *a: counts.__setitem__("pre", counts["pre"] + 1))
    model[0].register_forward_hook(lambda *a: counts.__setitem__("first_layer", counts["first_layer"] + 1))

    def logger(*a):  # an activation logger that skips the rerun counts once under any checkpoint
        if not in_backward():
            counts["logged"] += 1

    for m in model:
        m.register_forward_hook(logger)
    ckpt(model, torch.randn(2, 3, requires_grad=True)).sum().backward()
    return counts


def test_forward_hooks_that_only_observe_run_once_per_step_as_without_checkpointing():
    # torch's rerun stops after the last tensor it needs, so a hook placed before that point
    # (a pre-hook, the first layer's hook) runs twice under it; ours run once, as without any
    # checkpoint; in_backward() still tells a rerun apart.
    ours = _hook_counts(checkpoint)
    assert ours == _hook_counts(lambda model, x: model(x)) == {"pre": 1, "first_layer": 1, "logged": 3}
    assert _hook_counts(functools.partial(torch_checkpoint, use_reentrant=False)) == {
        "pre": 2, "first_layer": 2, "logged": 3}
