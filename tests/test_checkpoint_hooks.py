"""Forward hooks under speedlib's checkpoint (speedlib/checkpoint/replay.py): a hook that only
observes runs once per step; one the computation needs (it sets the weight, returns or changes
the output) runs in the rerun too, so gradients equal those without checkpointing."""

import pytest
import torch
from torch import nn

from speedlib.checkpoint import checkpoint, in_backward


def _twice(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(x) * 2


def _step(model: nn.Module, use_checkpoint: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(1)
    x = torch.randn(4, 3, requires_grad=True)
    out = checkpoint(model, x) if use_checkpoint else model(x)
    out.square().sum().backward()
    grads = [x.grad] + [p.grad for p in model.parameters()]
    model.zero_grad()
    return out.detach(), grads


def _same_step(make) -> None:
    out_a, grads_a = _step(make(), use_checkpoint=False)
    out_b, grads_b = _step(make(), use_checkpoint=True)
    assert torch.equal(out_a, out_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b, strict=True))


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))


def test_a_hook_that_returns_a_new_output_runs_in_the_rerun_too():
    calls = []

    def make():
        model = _model()
        model[0].register_forward_hook(lambda m, args, out: calls.append(1) or out * 3)
        return model

    _same_step(make)
    assert len(calls) == 1 + 2  # once without checkpoint; first run and rerun with it


def test_a_hook_that_changes_the_output_in_place_runs_in_the_rerun_too():
    def halve(module, args, out):
        out.mul_(0.5)  # returns None: only the version counter tells it from an observer

    def make():
        model = _model()
        model[0].register_forward_hook(halve)
        return model

    _same_step(make)


def test_a_pre_hook_that_sets_what_forward_reads_runs_in_the_rerun_too():
    # weight_norm's way: a pre-hook computes the weight from g and v before every forward.
    def make():
        model = _model()
        layer = model[2]
        g = nn.Parameter(torch.ones(2, 1))
        v = nn.Parameter(layer.weight.detach().clone())
        del layer.weight
        layer.register_parameter("g", g)
        layer.register_parameter("v", v)
        layer.register_forward_pre_hook(lambda m, args: setattr(m, "weight", m.g * m.v / m.v.norm(dim=1, keepdim=True)))
        return model

    _same_step(make)


def test_a_pre_hook_that_returns_new_arguments_runs_in_the_rerun_too():
    def make():
        model = _model()
        model[0].register_forward_pre_hook(lambda m, args: (args[0] + 1,))
        return model

    _same_step(make)


@pytest.mark.parametrize("with_kwargs", [False, True])
def test_observers_with_kwargs_and_global_ones_run_once(with_kwargs):
    seen = {True: [], False: []}
    for use_checkpoint in (False, True):
        model = _model()
        log = seen[use_checkpoint]
        if with_kwargs:
            model[0].register_forward_hook(lambda m, args, kwargs, out, log=log: log.append("local"), with_kwargs=True)
        handle = nn.modules.module.register_module_forward_hook(lambda m, a, o, log=log: log.append(type(m).__name__))
        try:
            _step(model, use_checkpoint)
        finally:
            handle.remove()
    assert seen[True] == seen[False]
    assert seen[True].count("Linear") == 2 and seen[True].count("local") == with_kwargs


def test_hooks_are_back_in_their_order_after_the_rerun_and_one_added_during_it_goes_last():
    model = _model()
    layer = model[0]
    order = []

    def needed(m, a, o):  # returns the output, so it runs in the rerun, where it adds one more
        order.append("b")
        if in_backward() and "d" not in order:
            order.append("d")
            layer.register_forward_hook(lambda m, a, o: order.append("d"))
        return o

    layer.register_forward_hook(lambda m, a, o: order.append("a"))
    layer.register_forward_hook(needed)
    layer.register_forward_hook(lambda m, a, o: order.append("c"))
    x = torch.randn(2, 3, requires_grad=True)
    checkpoint(model, x).sum().backward()
    assert order == ["a", "b", "c", "b", "d"]  # forward, then the rerun without the observers
    order.clear()
    model(x)
    assert order == ["a", "b", "c", "d"]


def test_a_module_called_through_a_method_or_twice_counts_its_calls_once_each():
    model = _model()
    seen = []
    model[1].register_forward_hook(lambda m, a, o: seen.append(1))
    x = torch.randn(2, 3, requires_grad=True)
    checkpoint(_twice, model, x).sum().backward()
    first = len(seen)
    seen.clear()
    _twice(model, x)
    assert first == len(seen) == 1
