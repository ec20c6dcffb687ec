"""speedlib.checkpoint: every variant trains exactly like no checkpointing.

Bitwise equality is expected and asserted on CPU: a rerun executes the same kernels on the
same inputs with the same random numbers, and each gradient is computed by the same
backward kernel whichever checkpoint asked for it.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from benchmarks import bench_checkpoint as bench
from speedbench.measure import ddp_launch, instruments, workloads
from speedlib.checkpoint import (
    BatchNorm2d,
    ForgottenParameterError,
    NondeterministicSegmentError,
    checkpoint,
    convert_batchnorm,
    in_backward,
    run_segment,
)

STEPS = 3
CHECKPOINTED = [v for v in workloads.CHECKPOINT_VARIANTS if v != "none"]


def _train(workload: str, variant: str, steps: int = STEPS, batch: int | None = None):
    """Train `steps` SGD steps with a fixed seed; the final state_dict and last gradients."""
    wl = workloads.get(workload, "cpu")
    if batch:
        wl = wl.with_batch(batch)
    model = workloads.set_checkpointing(wl.model(seed=0), variant)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)  # dropout draws from here
    for step in range(steps):
        x, y = wl.batch(seed=step)
        opt.zero_grad()
        wl.loss(model(x), y).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
    return model.state_dict(), grads


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs by {(a[k].double() - b[k].double()).abs().max().item()}"


@pytest.fixture(scope="module")
def baselines():
    return {}


@pytest.mark.parametrize("variant", CHECKPOINTED)
@pytest.mark.parametrize("workload, batch", [("densenet_bc", 4), ("densenet121", 2), ("transformer", None)])
def test_variants_train_exactly_like_no_checkpointing(baselines, workload, batch, variant):
    """Parameters, gradients and BatchNorm running mean, var and num_batches_tracked after
    N steps (state_dict holds them all). The transformer has dropout 0.1, so this is the
    dropout-equality test for every variant as well."""
    if workload not in baselines:
        baselines[workload] = _train(workload, "none", batch=batch)
    state, grads = _train(workload, variant, batch=batch)
    _assert_same(baselines[workload][1], grads)
    _assert_same(baselines[workload][0], state)
    counters = [v for k, v in state.items() if k.endswith("num_batches_tracked")]
    assert all(int(c) == STEPS for c in counters)  # once per step, also under torch's checkpoints
    assert bool(counters) == workload.startswith("densenet")  # the transformer has no BatchNorm


def _bn_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))


def _bn_steps(run, convert: bool, input_requires_grad: bool = True, steps: int = STEPS) -> nn.Module:
    net = _bn_net()
    if convert:
        convert_batchnorm(net)
    for i in range(steps):
        x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(i), requires_grad=input_requires_grad)
        run(net, x).sum().backward()
    return net


TORCH_VARIANTS = {
    "reentrant": lambda m, x: torch_checkpoint(m, x, use_reentrant=True),
    "non_reentrant": lambda m, x: torch_checkpoint(m, x, use_reentrant=False),
}


@pytest.mark.parametrize("variant", sorted(TORCH_VARIANTS))
def test_pytorch_checkpoint_updates_plain_batchnorm_twice(variant):
    """Documents the open PyTorch bug speedlib works around: a plain nn.BatchNorm under
    torch.utils.checkpoint counts every step twice and moves its running stats twice.
    If this starts failing, PyTorch fixed it: update speedlib/checkpoint.py's docstring."""
    plain = _bn_steps(lambda m, x: m(x), convert=False)[1]
    twice = _bn_steps(TORCH_VARIANTS[variant], convert=False)[1]
    assert int(plain.num_batches_tracked) == STEPS
    assert int(twice.num_batches_tracked) == 2 * STEPS
    assert not torch.allclose(plain.running_mean, twice.running_mean)


@pytest.mark.parametrize("variant", [*sorted(TORCH_VARIANTS), "speedlib"])
@pytest.mark.parametrize("input_requires_grad", [True, False])
def test_speedlib_batchnorm_updates_once_under_every_checkpoint(variant, input_requires_grad):
    if variant == "reentrant" and not input_requires_grad:
        pytest.skip("reentrant checkpoint computes no gradients at all when no input requires grad")
    run = TORCH_VARIANTS.get(variant, lambda m, x: checkpoint(m, x))
    plain = _bn_steps(lambda m, x: m(x), convert=False, input_requires_grad=input_requires_grad)[1]
    once = _bn_steps(run, convert=True, input_requires_grad=input_requires_grad)[1]
    assert isinstance(once, BatchNorm2d)
    assert int(once.num_batches_tracked) == STEPS
    assert torch.equal(plain.running_mean, once.running_mean) and torch.equal(plain.running_var, once.running_var)


def test_speedlib_batchnorm_with_momentum_none_and_eval_mode():
    """Cumulative averages (momentum=None) depend on the count, so a double count would show."""
    plain, once = nn.BatchNorm1d(3, momentum=None), convert_batchnorm(nn.BatchNorm1d(3, momentum=None))
    for i in range(STEPS):
        x = torch.randn(5, 3, generator=torch.Generator().manual_seed(i), requires_grad=True)
        plain(x).sum().backward()
        checkpoint(once, x).sum().backward()
    assert torch.equal(plain.running_mean, once.running_mean) and int(once.num_batches_tracked) == STEPS
    once.eval()
    x = torch.randn(4, 3)
    assert torch.equal(plain.eval()(x), once(x))


def test_convert_batchnorm_keeps_parameters_and_state_dict():
    net = _bn_net()
    weight, keys = net[1].weight, net.state_dict().keys()
    assert convert_batchnorm(net) is net
    assert type(net[1]) is BatchNorm2d and net[1].weight is weight and net.state_dict().keys() == keys


def test_in_backward_is_true_only_during_backward():
    seen = []
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: seen.append(in_backward()))
    assert not in_backward()
    y.sum().backward()
    assert seen == [True] and not in_backward()


def _dropout_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 8), nn.Dropout(0.5))


def _grads(run, preserve: bool = True) -> list[torch.Tensor]:
    net = _dropout_net()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    torch.manual_seed(2)
    run(net, x, preserve).sum().backward()
    return [x.grad, *(p.grad for p in net.parameters())]


def test_dropout_sees_the_same_mask_on_the_rerun():
    plain = _grads(lambda m, x, _: m(x))
    same = _grads(lambda m, x, keep: checkpoint(m, x, preserve_rng_state=keep))
    assert all(torch.equal(a, b) for a, b in zip(plain, same, strict=True))
    # The check can fail: without restoring the RNG state the rerun draws a new mask.
    other = _grads(lambda m, x, keep: checkpoint(m, x, preserve_rng_state=keep), preserve=False)
    assert not all(torch.equal(a, b) for a, b in zip(plain, other, strict=True))


def test_multiple_outputs_inputs_without_grad_and_non_tensor_inputs():
    lin = nn.Linear(4, 4)

    def segment(x, mask, scale, label):
        assert label == "tag"
        h = lin(x) * mask * scale
        return h.relu(), h.sum(dim=1), torch.argmax(h, dim=1)

    x = torch.randn(3, 4, requires_grad=True)
    mask = torch.tensor([1.0, 0.0, 1.0, 1.0])  # requires no grad
    a, s, idx = segment(x, mask, 2.0, "tag")
    ((a ** 2).sum() + s.sum()).backward()
    expected = [x.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone()]
    x.grad = lin.weight.grad = lin.bias.grad = None

    a2, s2, idx2 = checkpoint(segment, x, mask, 2.0, "tag", params=lin.parameters())
    assert torch.equal(a, a2) and torch.equal(s, s2) and torch.equal(idx, idx2) and not idx2.requires_grad
    ((a2 ** 2).sum() + s2.sum()).backward()
    assert all(torch.equal(e, g) for e, g in zip(expected, [x.grad, lin.weight.grad, lin.bias.grad], strict=True))
    assert mask.grad is None


def test_an_unused_output_gets_no_gradient_and_breaks_nothing():
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    used, _unused = checkpoint(lambda t: (lin(t), lin(t) * 3), x, params=lin.parameters())
    used.sum().backward()
    assert torch.equal(lin.weight.grad, x.sum(0).expand(4, 4))


def test_what_the_segment_uses_gets_its_gradient_without_params():
    """A closure over a module, over a parameter and over an activation computed outside: the
    graph is recorded, so each gets the gradient torch's non-reentrant checkpoint gives, bitwise
    (the explicit-parameter checkpoint needed params= and raised ForgottenParameterError)."""
    def run(ckpt):
        torch.manual_seed(0)
        lin, w = nn.Linear(4, 4), torch.randn(4, requires_grad=True)
        x = torch.randn(3, 4, requires_grad=True)
        h = lin(x)
        ckpt(lambda t: lin(t) * w * h, x).sum().backward()
        return [x.grad, w.grad, *(p.grad for p in lin.parameters())]

    ours, theirs = run(checkpoint), run(lambda f, *a: torch_checkpoint(f, *a, use_reentrant=False))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    assert issubclass(ForgottenParameterError, RuntimeError)  # still importable for old except clauses


def test_bad_calls_are_clear_errors():
    with pytest.raises(TypeError, match="params must be tensors"):
        checkpoint(lambda t: t, torch.ones(2), params=[3])
    with pytest.raises(TypeError, match="must be callable, got Tensor"):
        checkpoint(torch.ones(2), nn.Linear(2, 2))  # arguments swapped
    with pytest.raises(TypeError, match="must be callable, got str"):
        checkpoint("relu", torch.ones(2))
    with pytest.raises(TypeError, match="not a single tensor"):
        checkpoint(lambda t: t, torch.ones(2), params=nn.Linear(2, 2).weight)
    with pytest.raises(TypeError, match="iterable of tensors, got int"):
        checkpoint(lambda t: t, torch.ones(2), params=3)
    with pytest.raises(TypeError, match="use_reentrant takes True, False or None"):
        checkpoint(nn.Linear(2, 2), torch.ones(2), use_reentrant="yes")
    with pytest.raises(ValueError, match="determinism_check must be one of"):
        checkpoint(nn.Linear(2, 2), torch.ones(2), determinism_check="strict")
    with pytest.raises(TypeError, match="context_fn must return a tuple of two"):
        checkpoint(nn.Linear(2, 2), torch.ones(2), context_fn=lambda: None)
    with pytest.raises(ValueError, match="unknown segment checkpoint variant"):
        run_segment("magic", lambda t: t, torch.ones(1), params=())


# --- what users of the originals and of torch.utils.checkpoint do -----------------------

def _penalty_net() -> nn.Module:
    # Tanh and Softplus have non-zero second derivatives, so every parameter gets a
    # second-order term; Dropout checks that the rerun sees the first run's mask here too.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Dropout(0.3), nn.Linear(8, 8), nn.Softplus(),
                         nn.Linear(8, 1)).double()


def _penalty_step(net: nn.Module, run, penalty: str) -> list[torch.Tensor]:
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    params = list(net.parameters())
    torch.manual_seed(2)
    out = run(net, x)
    if penalty == "input":  # WGAN-GP style: the norm of d out / d input
        grads = torch.autograd.grad(out.sum(), x, create_graph=True)
    elif penalty == "params":  # gradient-norm regularisation
        grads = torch.autograd.grad(out.sum(), params, create_graph=True)
    else:  # backward(create_graph=True), then a function of the .grad fields
        out.sum().backward(create_graph=True)
        grads = [p.grad for p in params]
        for p in params:
            p.grad = None
        x.grad = None
    (out.mean() + sum((g ** 2).sum() for g in grads)).backward()
    return [x.grad, *(p.grad for p in params)]


@pytest.mark.parametrize("penalty", ["input", "params", "backward_create_graph"])
def test_double_backward_matches_no_checkpointing(penalty):
    """A gradient penalty differentiates through the checkpoint's backward. The gradients
    are equal up to float64 rounding, not bitwise: the outer pass adds the first- and
    second-order contributions of each parameter in another order."""
    expected = _penalty_step(_penalty_net(), lambda m, x: m(x), penalty)
    got = _penalty_step(_penalty_net(), lambda m, x: checkpoint(m, x), penalty)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-14)
    assert all(p.abs().sum() > 0 for p in got)


def test_double_backward_of_a_tensor_passed_twice_counts_it_once():
    w = torch.randn(4, 4, dtype=torch.float64)

    def f(a, b):
        return torch.tanh(a @ w) * b

    results = []
    for run in (f, lambda a, b: checkpoint(f, a, b, params=())):
        x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
        gx, = torch.autograd.grad(run(x, x).sum(), x, create_graph=True)
        (gx ** 2).sum().backward()
        results.append(x.grad)
    torch.testing.assert_close(results[1], results[0], rtol=1e-12, atol=1e-14)


def test_double_backward_when_a_parameter_also_produced_the_input():
    """One layer applied three times (ALBERT-style sharing, RNN steps): each segment's input
    comes from the same weights the segment lists in params=. Its gradients must be partial
    ones, or the input's path is counted in the weight's gradient and again through the
    input's gradient."""
    def penalised(run):
        torch.manual_seed(0)
        layer = nn.Sequential(nn.Linear(4, 4), nn.Tanh()).double()
        h = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        for _ in range(3):
            h = run(layer, h)
        loss = h.square().sum()
        grads = torch.autograd.grad(loss, list(layer.parameters()), create_graph=True)
        (loss + sum(g.square().sum() for g in grads)).backward()
        return [*grads, *(p.grad for p in layer.parameters())]

    expected = penalised(lambda m, h: m(h))
    got = penalised(lambda m, h: checkpoint(m, h))
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("check_params", [True, False])
def test_densenet_layer_takes_its_list_of_feature_maps(check_params):
    """Efficient DenseNet checkpoints the bottleneck on the list of all earlier feature maps:
    each map must get its gradient, and through it whatever produced it."""
    from torchvision.models.densenet import _DenseLayer  # noqa: PLC0415 - torchvision: optional, heavy

    def step(checkpointed: bool):
        torch.manual_seed(0)
        stem = nn.Conv2d(3, 8, 3, padding=1)
        layers = [_DenseLayer(8 + 4 * i, growth_rate=4, bn_size=2, drop_rate=0.0) for i in range(3)]
        x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
        features = [stem(x)]
        for layer in layers:
            if checkpointed:
                params = (*layer.norm1.parameters(), *layer.conv1.parameters())
                bottleneck = checkpoint(layer.bn_function, features, params=params, check_params=check_params)
            else:
                bottleneck = layer.bn_function(features)
            features.append(layer.conv2(layer.relu2(layer.norm2(bottleneck))))
        torch.cat(features, 1).square().sum().backward()
        return [p.grad for m in (stem, *layers) for p in m.parameters()]

    expected, got = step(False), step(True)
    assert len(got) == len(expected) and all(g is not None for g in got)
    assert all(torch.equal(e, g) for e, g in zip(expected, got, strict=True))


def test_dict_tuple_nested_and_keyword_arguments_get_their_gradients():
    lin = nn.Linear(4, 4)

    def segment(batch, pair, *, scale, shift=None, tag="x"):
        assert tag == "named" and shift is None
        h = lin(batch["a"]) * pair[0] + pair[1][0]
        return h * scale

    def grads(run):
        torch.manual_seed(0)
        leaves = [torch.randn(3, 4, requires_grad=True) for _ in range(4)]
        a, b, c, s = leaves
        run(segment, {"a": a}, (b, [c]), scale=s, tag="named").square().sum().backward()
        return [t.grad for t in leaves] + [p.grad.clone() for p in lin.parameters()]

    expected = grads(lambda f, *a, **k: f(*a, **k))
    lin.zero_grad()
    got = grads(lambda f, *a, **k: checkpoint(f, *a, params=lin.parameters(), **k))
    assert all(g is not None and torch.equal(e, g) for e, g in zip(expected, got, strict=True))


def test_results_with_non_tensors_keep_their_structure():
    lin = nn.Linear(4, 4)

    def segment(x):
        h = lin(x)
        return {"out": h.relu(), "aux": (h.sum(), None, 3, [h.argmax(1), "tag"])}

    x = torch.randn(3, 4, requires_grad=True)
    plain = segment(x)
    (plain["out"].sum() + plain["aux"][0]).backward()
    expected = [x.grad.clone(), *(p.grad.clone() for p in lin.parameters())]
    x.grad = None
    lin.zero_grad()
    got = checkpoint(segment, x, params=lin.parameters())
    assert got.keys() == plain.keys() and got["aux"][1:3] == (None, 3) and got["aux"][3][1] == "tag"
    assert torch.equal(got["out"], plain["out"]) and torch.equal(got["aux"][3][0], plain["aux"][3][0])
    (got["out"].sum() + got["aux"][0]).backward()
    assert all(torch.equal(e, g) for e, g in zip(expected, [x.grad, *(p.grad for p in lin.parameters())], strict=True))
    # A result without any tensor comes back as it is (torch's checkpoint allows it too).
    assert checkpoint(lambda a, n: (a * n, "tag"), 0.5, 4, params=()) == (2.0, "tag")


@pytest.mark.parametrize("backward", [False, True])
def test_inputs_and_outputs_are_freed_without_the_garbage_collector(backward):
    """The node must not hold its own inputs or outputs in Python attributes: that makes a
    cycle through autograd that only gc.collect() breaks, and on a GPU the segment's memory
    would stay allocated until it happens to run."""
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    gc.disable()
    try:
        h = x * 2
        out = checkpoint(lambda t: {"y": lin(t), "n": 1}, h, params=lin.parameters())["y"]
        if backward:
            out.sum().backward()
        refs = [weakref.ref(out), weakref.ref(h)]
        del out, h
        assert [r() for r in refs] == [None, None]
    finally:
        gc.enable()


def test_a_parameter_listed_twice_gets_its_gradient_once():
    """Tied weights reached through two modules' parameters() appear twice in params=."""
    enc, dec = nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False)
    dec.weight = enc.weight
    x = torch.randn(3, 4)
    dec(enc(x)).sum().backward()
    expected = enc.weight.grad.clone()
    enc.weight.grad = None
    both = [*enc.parameters(), *dec.parameters()]
    assert len(both) == 2
    checkpoint(lambda t: dec(enc(t)), x, params=both).sum().backward()
    assert torch.equal(expected, enc.weight.grad)


def test_named_parameters_are_accepted_as_params():
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4)
    lin(x).sum().backward()
    expected = [p.grad.clone() for p in lin.parameters()]
    lin.zero_grad()
    checkpoint(lambda t: lin(t), x, params=lin.named_parameters()).sum().backward()
    assert all(torch.equal(e, p.grad) for e, p in zip(expected, lin.parameters(), strict=True))


def test_a_parameter_changed_in_place_before_backward_is_caught():
    """torch's rerun would silently compute with the stepped weight; here it is an error. Where
    nothing saved depends on the weight (the input needs no gradient), plain autograd is right
    after the step, and so is the checkpoint."""
    lin = nn.Linear(4, 4)
    out = checkpoint(lin, torch.randn(2, 4, requires_grad=True))
    with torch.no_grad():
        lin.weight.add_(1.0)  # an optimizer step between forward and backward
    with pytest.raises(RuntimeError, match="modified in place between forward and backward"):
        out.sum().backward()
    x = torch.randn(2, 4)
    out = checkpoint(lin, x)
    with torch.no_grad():
        lin.weight.add_(1.0)
    out.sum().backward()
    assert torch.equal(lin.weight.grad, x.sum(0).expand(4, 4))


def test_gradients_survive_saved_tensor_offloading():
    """Saved-tensor hooks (here an identity pair, like torch's save_on_cpu) hand back
    copies of what was saved; the gradients must still reach the real parameters."""
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    lin(x).sum().backward()
    expected = lin.weight.grad.clone()
    lin.weight.grad = None
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        checkpoint(lin, x).sum().backward()
    assert torch.equal(expected, lin.weight.grad)


def test_autocast_state_is_used_for_the_rerun():
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = lin(x)
    plain.float().sum().backward()
    expected = lin.weight.grad.clone()
    lin.weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = checkpoint(lin, x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()  # backward outside autocast: the rerun must re-enter it
    assert torch.equal(expected, lin.weight.grad)


def test_checkpointing_keeps_only_the_segment_inputs():
    """The point of it all, exactly: a checkpointed stack saves its input, nothing inside."""
    net = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(4)))
    x = torch.randn(32, 64, requires_grad=True)
    params = list(net.parameters())
    full = instruments.saved_tensor_bytes(lambda: net(x).sum(), exclude=params)
    saved = instruments.saved_tensor_bytes(lambda: checkpoint(net, x).sum(), exclude=params)
    assert saved == x.numel() * 4
    # The input and the four ReLU outputs (each also the next Linear's saved input).
    assert full == 5 * x.numel() * 4


@pytest.mark.gpu(reason="needs a CUDA GPU; the CPU dropout test covers the logic")
def test_cuda_rng_and_gradients_match_on_gpu():
    net = _dropout_net().cuda()
    x = torch.randn(64, 8, device="cuda", requires_grad=True)
    torch.manual_seed(3)
    net(x).sum().backward()
    expected = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    torch.manual_seed(3)
    checkpoint(net, x).sum().backward()
    assert all(torch.equal(e, p.grad) for e, p in zip(expected, net.parameters(), strict=True))


@pytest.mark.gpu(devices=2, reason="DataParallel needs two GPUs; DDP (gloo) is tested on CPU")
def test_data_parallel_replicas_get_gradients():
    wl = workloads.densenet_bc("small", depth=16).with_batch(8)
    grads = {}
    for variant in ("none", "speedlib"):
        model = workloads.set_checkpointing(wl.model("cuda"), variant)
        x, y = wl.batch("cuda")
        wl.loss(nn.DataParallel(model)(x), y).backward()
        grads[variant] = [p.grad for p in model.parameters()]
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6)
               for a, b in zip(grads["none"], grads["speedlib"], strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["speedlib", "reentrant"])
def test_distributed_data_parallel_two_processes_match(variant):
    """DDP with gloo, 2 processes, through speedbench.measure.ddp_launch: the checkpointed
    model ends bitwise equal to the uncheckpointed one (parameters and BN statistics)."""
    config = ddp_launch.RunConfig(mode="ddp", world_size=2, workload="densenet_bc", batch=8, steps=2, warmup=1)
    none = ddp_launch.run(config)
    other = ddp_launch.run(dataclasses.replace(config, checkpoint=variant))
    assert len(other.step_times[0]) == 2
    _assert_same(none.state_dict, other.state_dict)
    assert int(other.state_dict["features.denseblock1.denselayer1.norm1.num_batches_tracked"]) == 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour of the benchmark")
def test_benchmark_gpu_only_classes_skip_without_importing_torch():
    """asv starts a process per class and per reported set: on a CPU the GPU-only classes
    must record their skips (NaN) without paying for a torch import."""
    script = """
import math, sys
from benchmarks import bench_checkpoint as bench
for cls, metric, params in [(bench.PeakMemory, "track_peak_memory", ("densenet_bc", 4, "none")),
                            (bench.PeakMemory, "track_peak_activation_memory", ("transformer", 16, "speedlib")),
                            (bench.DataParallelStep, "track_speedup", (64, "reentrant")),
                            (bench.DistributedStep, "track_step_time", (256, "none"))]:
    b = cls()
    cache = b.measure_all()
    assert {status for status, _ in cache.values()} == {"skip"}, cache
    assert math.isnan(getattr(b, metric)(cache, *params))
assert "torch" not in sys.modules
"""
    env = {k: v for k, v in os.environ.items() if k != "SPEEDLIB_DEVICE"}
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[1], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour of the benchmark")
def test_benchmark_pairs_the_variants_and_counts_saved_activations(monkeypatch):
    """One process measures a class (setup_cache), its track_* methods only read it."""
    assert bench.BATCHES == [4, 16]
    checkpointed = bench.VARIANTS[1:]
    one_config = (["transformer"], [4], bench.VARIANTS)  # the fastest configuration on a CPU

    steps = bench.TrainingStep()
    monkeypatch.setattr(bench.TrainingStep, "params", one_config)
    monkeypatch.setattr(bench.TrainingStep, "pairs", 2)
    monkeypatch.setattr(bench.TrainingStep, "warmup", 0)
    cache = steps.measure_all()
    assert {status for status, _ in cache.values()} == {"ok"}, cache
    none = steps.track_seconds(cache, "transformer", 4, "none")["samples"]
    assert len(none) == 2 and min(none) > 0
    assert math.isnan(steps.track_speedup(cache, "transformer", 4, "none"))  # 1 by definition: not reported
    for variant in checkpointed:
        seconds = steps.track_seconds(cache, "transformer", 4, variant)["samples"]
        ratios = steps.track_speedup(cache, "transformer", 4, variant)["samples"]
        assert len(seconds) == len(ratios) == 2 and min(seconds) > 0
        # per round, never of medians
        assert ratios == pytest.approx([a / b for a, b in zip(none, seconds, strict=True)])

    memory = bench.ActivationMemory()
    monkeypatch.setattr(bench.ActivationMemory, "params", one_config)
    cache = memory.measure_all()
    saved = {v: memory.track_saved_activations(cache, "transformer", 4, v) for v in bench.VARIANTS}
    assert all(0 < saved[v] < saved["none"] for v in checkpointed), saved
    # The three per-block variants keep the same thing: each block's input.
    assert saved["reentrant"] == saved["non_reentrant"] == saved["speedlib"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour of the benchmark")
@pytest.mark.parametrize("workload, batch", [("densenet_bc", 4), ("transformer", 4)])
def test_the_benchmarks_plain_variants_train_as_the_checkpointable_model_did(workload, batch):
    """The plain variants moved from speedbench.measure.workloads' checkpointable model (speedlib's
    BatchNorm, CheckpointedSequential, run_segment) to a model built with torch alone and
    checkpointed with torch.utils.checkpoint (issue 40): the same initial weights, and after
    two steps the same parameters, bitwise. The one difference is PyTorch's own: nn.BatchNorm
    updates its running statistics again when a checkpoint reruns it, which speedlib's does not."""
    wl = workloads.get(workload, "cpu").with_batch(batch)
    _assert_same(wl.torch_model().state_dict(), wl.model().state_dict())
    for variant in bench.PLAIN_PYTORCH:
        states = []
        for model in (bench._model(wl, torch.device("cpu"), variant), workloads.set_checkpointing(wl.model(), variant)):
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
            torch.manual_seed(1)  # dropout draws from here
            for step in range(2):
                x, y = wl.batch(seed=step)
                opt.zero_grad()
                wl.loss(model(x), y).backward()
                opt.step()
            states.append(model.state_dict())
        plain, before = states
        assert plain.keys() == before.keys()
        rerun = [k for k in plain if not torch.equal(plain[k], before[k])]
        # only BatchNorm statistics, and only where a rerun happened; none reruns nothing
        assert all(k.rsplit(".", 1)[1] in ("running_mean", "running_var", "num_batches_tracked") for k in rerun), rerun
        assert (not rerun) == (variant == "none" or workload == "transformer"), (variant, rerun[:3])
        counted = [k for k in rerun if k.endswith("num_batches_tracked")]
        assert all(int(plain[k]) == 2 * int(before[k]) == 4 for k in counted), variant  # twice a step, as PyTorch does


# --- behaving like torch's non-reentrant checkpoint (issue 31) ---------------------------

def _torch_cp(function, *args, early_stop=True, **_params):
    return torch_checkpoint(function, *args, use_reentrant=False, early_stop=early_stop)


@pytest.mark.parametrize("create_graph", [False, True])
def test_a_parameter_hook_runs_once_and_sees_torchs_gradient(create_graph):
    """The rerun's inner autograd.grad must not fire a parameter's hook: the outer pass
    fires it on the accumulated gradient, once, as torch's checkpoint does."""
    results = []
    for run in (_torch_cp, checkpoint):
        torch.manual_seed(0)
        lin = nn.Linear(3, 3).double()
        seen = []
        lin.weight.register_hook(lambda g, seen=seen: seen.append(g.clone()) or g * 2)  # scales: twice would show
        x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
        out = run(lambda t, lin=lin: lin(t).tanh(), x, params=lin.parameters())
        grads = torch.autograd.grad(out.sum(), [x, lin.weight], create_graph=create_graph)
        second = torch.autograd.grad(sum((g ** 2).sum() for g in grads), x) if create_graph else ()
        results.append((len(seen), grads, second))
    (n_torch, g_torch, s_torch), (n_ours, g_ours, s_ours) = results
    assert n_ours == n_torch == 1
    for e, g in zip([*g_torch, *s_torch], [*g_ours, *s_ours], strict=True):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-14)


@dataclasses.dataclass
class _Pair:
    main: torch.Tensor
    aux: torch.Tensor
    tag: str = "pair"


@dataclasses.dataclass(frozen=True)
class _Frozen:
    value: torch.Tensor
    scale: float = dataclasses.field(default=3.0)


def test_dataclass_results_and_arguments_get_torchs_gradients():
    def segment(pair, frozen):
        h = lin(pair.main) + pair.aux * frozen.value * frozen.scale
        return _Pair(h.relu(), h.sum(dim=1), tag=pair.tag + "!")

    results = []
    for run in (_torch_cp, checkpoint):
        torch.manual_seed(0)
        lin = nn.Linear(4, 4)
        x = torch.randn(3, 4, requires_grad=True)
        w = torch.randn(4, requires_grad=True)
        out = run(segment, _Pair(x * 2, x), _Frozen(w), params=lin.parameters())
        assert isinstance(out, _Pair) and out.tag == "pair!"
        ((out.main ** 2).sum() + out.aux.sum()).backward()
        results.append([x.grad, w.grad, lin.weight.grad, lin.bias.grad])
    assert all(g is not None and torch.equal(e, g) for e, g in zip(*results, strict=True))


def _counter_segment(make):
    """A segment that is not the same function on its rerun: it reads a call counter."""
    calls = []

    def segment(x):
        calls.append(1)
        return make(x, len(calls))
    return segment


@pytest.mark.parametrize("case, early_stop, torch_raises", [
    ("saved_shape", True, True),     # an intermediate that is saved changes shape
    ("saved_count", False, True),    # it saves more tensors: seen when the rerun runs to its end
])
def test_a_nondeterministic_segment_is_an_error_not_the_reruns_gradient(case, early_stop, torch_raises):
    make = {
        "saved_shape": lambda x, n: (x[:n] ** 2).sum(),
        "saved_count": lambda x, n: x.sin().sum() if n == 1 else (x.exp() * x).sum(),
    }[case]
    x = torch.randn(4, 3, requires_grad=True)
    if torch_raises:  # the case is one torch catches too: same verdict
        with pytest.raises(RuntimeError, match="different metadata|more tensors"):
            _torch_cp(_counter_segment(make), x, early_stop=early_stop).sum().backward()
    out = checkpoint(_counter_segment(make), x, early_stop=early_stop)
    with pytest.raises(NondeterministicSegmentError, match="not deterministic"):
        out.sum().backward()
    assert x.grad is None


def test_a_segment_whose_rerun_would_differ_only_after_what_backward_needs_is_right():
    """The rerun stops once every saved tensor is back (early_stop, torch's default): a result
    that changes shape afterwards is never recomputed, and the gradient is the first run's."""
    x = torch.randn(4, 3, requires_grad=True)
    out = checkpoint(_counter_segment(lambda t, n: t.sin()[:n] * 2), x)
    out.sum().backward()
    expected = torch.zeros(4, 3)
    expected[:1] = 2 * x[:1].detach().cos()
    assert torch.equal(x.grad, expected)


def test_a_hook_on_one_output_calling_backward_on_another_terminates():
    """All outputs of one segment used to share one autograd node, so a hook on one output
    that backpropagates from another re-entered itself without end."""
    results = []
    for run in (_torch_cp, checkpoint):
        x = torch.randn(4, 3, requires_grad=True, generator=torch.Generator().manual_seed(0))
        a, b = run(lambda t: (t * 2, t.sin()), x, params=())
        calls = []

        def hook(g, b=b, calls=calls):
            calls.append(1)
            if len(calls) > 5:
                raise RuntimeError("the hook re-entered itself")
            with torch.enable_grad():
                b.sum().backward(retain_graph=True)
            return g
        a.register_hook(hook)
        a.sum().backward()
        results.append((len(calls), x.grad))
    assert results[1][0] == results[0][0] == 1
    assert torch.equal(results[0][1], results[1][1])


def test_a_segment_may_call_autograd_grad_inside_itself():
    def segment(t):
        y = (t ** 3).sum()
        g, = torch.autograd.grad(y, t, create_graph=True)
        return g * t.sin()

    results = []
    for run in (_torch_cp, checkpoint):
        x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True, generator=torch.Generator().manual_seed(0))
        out = run(segment, x, params=())
        out.sum().backward()
        results.append((out.detach(), x.grad))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=0, atol=0)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-12, atol=1e-14)


def test_gradient_of_one_output_with_respect_to_another():
    def segment(t):
        h = t * 2
        return h, h.sin() * t

    results = []
    for run in (_torch_cp, checkpoint):
        x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True, generator=torch.Generator().manual_seed(0))
        a, b = run(segment, x, params=())
        from_a, = torch.autograd.grad(b.sum(), a, retain_graph=True)  # b was computed from a in the segment
        (a.sum() + b.sum()).backward()  # and an ordinary pass does not count b's path through a twice
        results.append((from_a, x.grad))
    for e, g in zip(*results, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("create_graph", [False, True])
def test_the_reruns_tensors_are_freed_without_the_garbage_collector(create_graph):
    """A rerun keeps the tensors it recomputes only until backward takes them; a saved output
    kept as is would hold its own node in a cycle (exp saves its result), and the rerun's memory
    would wait for the garbage collector, here with one output left unused."""
    made = []

    def segment(t):
        h = t.exp()  # exp saves its result
        made.append(weakref.ref(h))
        return h.sin() * 2, h.cos()

    x = torch.randn(3, requires_grad=True)
    gc.disable()
    try:
        used, _unused = checkpoint(segment, x)
        grad, = torch.autograd.grad(used.sum(), x, create_graph=create_graph)
        torch.testing.assert_close(grad, 2 * x.exp().cos() * x.exp())
        del grad, used, _unused
        assert len(made) == 2 and [r() for r in made] == [None, None]
    finally:
        gc.enable()
