"""PyTorch's own checkpoint tests, mirrored for speedlib's checkpoint with torch's calls unchanged.

Each test names the PyTorch test it follows (TestCheckpoint in test/test_utils.py; the
checkpoint tests of TestAutograd, TestNestedCheckpoint and TestSelectiveActivationCheckpoint in
test/test_autograd.py). The code is ours: a case runs the same call under speedlib's checkpoint as
a switching user would (the import changed, the call not) and, where the torch test compares
with no checkpointing or with torch's checkpoint, so does this one. Not mirrored: torch's unit
tests of its private helpers (get_device_states, _infer_device_type), and the two tests that
expect a warning when use_reentrant is left out (speedlib's default is False and silent, as
docs/techniques/checkpoint.md says). A case that needs a GPU skips itself on CPU and has a CPU
twin where the logic allows.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import gc
import subprocess
import sys
import textwrap
import weakref
from itertools import pairwise

import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint_sequential, create_selective_checkpoint_contexts
from torch.utils.checkpoint import checkpoint as torch_checkpoint

from speedlib.checkpoint import checkpoint
from speedlib.checkpoint import checkpoint_sequential as speedlib_checkpoint_sequential

needs_cuda = pytest.mark.gpu(reason="needs a CUDA GPU; the CPU twin covers the logic")


def _torch_ckpt(fn, *args, **kwargs):
    return torch_checkpoint(fn, *args, use_reentrant=False, **kwargs)


def _speedlib_ckpt(params=()):
    """A checkpoint wrapper with the same call shape as `_torch_ckpt`, for parametrising."""
    return lambda fn, *args, **kwargs: checkpoint(fn, *args, params=params, **kwargs)


def _close(actual, expected) -> None:
    torch.testing.assert_close(actual, expected)


def _grads(tensors):
    return [None if t.grad is None else t.grad.clone() for t in tensors]


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 20), nn.ReLU(), nn.Linear(20, 5), nn.ReLU())


# --- test_utils.py: TestCheckpoint ---------------------------------------------------------

class _Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.counter = 0

    def forward(self, x):
        self.counter += 1
        return x * torch.tensor(2.0)


def test_forward_runs_once_and_reruns_once_in_backward():
    """Adapts test_utils.py TestCheckpoint.test_checkpoint_trigger."""
    modules = [_Counting() for _ in range(10)]
    x = torch.randn(3, 4, requires_grad=True)
    # The first half is one checkpointed segment, the second half runs plainly, as
    # checkpoint_sequential does with its last chunk.
    out = checkpoint(nn.Sequential(*modules[:5]), x)
    for m in modules[5:]:
        out = m(out)
    assert [m.counter for m in modules] == [1] * 10
    out.sum().backward()
    assert [m.counter for m in modules] == [2] * 5 + [1] * 5


def test_autograd_grad_with_create_graph_matches_no_checkpoint():
    """Adapts test_utils.py TestCheckpoint.test_checkpoint_valid (its non-reentrant half)."""
    model = _mlp()
    x = torch.randn(1, 100, requires_grad=True)
    ones = torch.ones(1, 5)
    expected = torch.autograd.grad(model(x), x, ones, create_graph=True)
    chunks = [model[:3], model[3:]]
    out = x
    for chunk in chunks:
        out = checkpoint(chunk, out)
    _close(out, model(x))
    _close(torch.autograd.grad(out, x, ones, create_graph=True), expected)


def _module_list_net() -> nn.Module:
    class ModuleListNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.module_list = nn.ModuleList(_mlp())

        def forward(self, x):
            for layer in self.module_list:
                x = layer(x)
            return x

    return ModuleListNet()


@pytest.mark.parametrize("make", [_mlp, _module_list_net], ids=["sequential", "module_list"])
def test_segments_in_sequence_match_no_checkpoint_and_checkpoint_sequential(make):
    """Adapts test_utils.py TestCheckpoint.test_checkpoint and test_checkpoint_module_list."""
    model = make()
    layers = list(model.children()) if isinstance(model, nn.Sequential) else list(model.module_list)
    x = torch.randn(1, 100)
    runs = {
        "none": lambda inp: model(inp),
        "torch": lambda inp: checkpoint_sequential(layers, 2, inp, use_reentrant=False),
        # two segments of three layers each, their parameters passed explicitly
        "speedlib": lambda inp: checkpoint(nn.Sequential(*layers[3:]), checkpoint(nn.Sequential(*layers[:3]), inp)),
    }
    results = {}
    for name, run in runs.items():
        model.zero_grad()
        inp = x.clone().requires_grad_()
        out = run(inp)
        out.sum().backward()
        results[name] = (out.detach(), inp.grad, _grads(model.parameters()))
    for name in ("torch", "speedlib"):
        _close(results[name], results["none"])


def _dropout_run(device, ckpt):
    """Gradient of a dropout before and inside a segment, with the RNG fixed first."""
    inp = torch.randn(20000, device=device).requires_grad_()
    before, inside = nn.Dropout(), nn.Dropout()
    torch.manual_seed(7)
    out = before(inp)
    out = ckpt(inside, out) if ckpt else inside(out)
    out.sum().backward()
    return inp.grad


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_dropout_mask_is_the_same_on_the_rerun(device):
    """Adapts test_utils.py TestCheckpoint.test_checkpoint_rng_cpu and test_checkpoint_rng_gpu."""
    expected = _dropout_run(device, None)
    for _ in range(5):
        _close(_dropout_run(device, _speedlib_ckpt()), expected)
    _close(_dropout_run(device, _torch_ckpt), expected)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_preserve_rng_state_false_runs(device):
    """Adapts test_utils.py TestCheckpoint.test_checkpoint_not_preserve_rng_state_and_without_reentrant
    (a GPU test in torch; the logic is the same on CPU)."""
    inp = torch.randn(2, device=device).requires_grad_()
    layer = nn.Dropout()
    out = checkpoint(layer, inp, preserve_rng_state=False)
    out.sum().backward()
    assert inp.grad is not None and inp.grad.shape == inp.shape


def test_none_argument():
    """Adapts test_utils.py TestCheckpoint.test_checkpoint_non_tensor."""
    def run_fn(t1, t2):
        return t1 if t2 is None else t1 + t2

    x = torch.randn(1, 100, requires_grad=True)
    checkpoint(run_fn, x, None, params=()).sum().backward()
    _close(x.grad, torch.ones_like(x))


def _mixed(t1, t2, scale, t3):
    t4 = t1 + t2 * t3
    t5 = t1 * t2 + t3
    t4 *= scale
    t5 *= scale
    return scale, t4, None, True, t5, "bar", t1


@pytest.mark.parametrize("reentrant", [True, False])
def test_non_tensor_inputs_and_outputs(reentrant):
    """Mirrors test_utils.py TestCheckpoint.test_checkpoint_non_tensor_inputs_outputs (reentrant),
    and the same call non-reentrant against torch's."""
    torch.manual_seed(0)
    t1, t2, t3 = torch.rand(10, requires_grad=True), torch.rand(10, requires_grad=True), torch.rand(10)
    scale = 4
    res = checkpoint(_mixed, t1, t2, scale, t3, use_reentrant=reentrant)
    expected = _mixed(t1, t2, scale, t3)
    assert (res[0], res[2], res[3], res[5]) == (scale, None, True, "bar")
    for i in (1, 4, 6):
        _close(res[i], expected[i])
    res[1].sum().backward(retain_graph=True)
    res[4].sum().backward(retain_graph=True)
    res[6].sum().backward()
    if reentrant:  # the last backward freed the segment's node, as torch's reentrant one does
        with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
            res[6].sum().backward()
    else:  # res[6] is t1 itself, as under torch's non-reentrant checkpoint
        assert res[6] is t1 and torch_checkpoint(_mixed, t1, t2, scale, t3, use_reentrant=False)[6] is t1
    got = _grads([t1, t2])
    t1.grad = t2.grad = None
    torch.autograd.backward([expected[1].sum(), expected[4].sum(), expected[6].sum()])
    _close(got, _grads([t1, t2]))


def test_no_tensors_at_all():
    """Adapts test_utils.py TestCheckpoint.test_checkpoint_no_tensors."""
    args = (0.25, 0.5, 3, 0.75)
    expected = _mixed(*args)
    assert checkpoint(_mixed, *args, params=()) == expected
    assert _torch_ckpt(_mixed, *args) == expected


@pytest.mark.parametrize("reentrant", [True, False])
def test_partial_grad_outputs(reentrant):
    """Mirrors test_utils.py TestCheckpoint.test_checkpoint_partial_grad: an output that needs no
    gradient is an error in backward, where torch raises (its message for each variant)."""
    x = torch.randn(1, 4, requires_grad=True)
    other = torch.randn(1, 4)
    out = checkpoint(lambda a, b: (a, b), x, other, use_reentrant=reentrant)
    out[0].sum().backward()
    _close(x.grad, torch.ones_like(x))
    x, y = torch.randn(1, 4), torch.randn(1, 4, requires_grad=True)
    error = "none of output has requires_grad=True" if reentrant else "does not require grad"
    for ckpt in (torch_checkpoint, checkpoint):
        with pytest.raises(RuntimeError, match=error):
            ckpt(lambda a, b: a, x, y, use_reentrant=reentrant).sum().backward()
    assert y.grad is None


def _chain(x, track):
    """Four squarings, each saving its input; `track` sees the results of the first three, as
    in torch's test: each is saved by the next squaring, and its gradient is a buffer of its own.
    (Tracking the last three instead, as this test once did, watched the summed result, which
    nothing saves, and whose gradient is a free expanded view of the backward's scalar: on the
    first step one freed buffer met one new gradient, and a plain backward's allocation stayed
    level there, as the H200 run of 838236b found.)"""
    for idx in (2, 1, 0, None):
        x = x ** 2
        if idx is not None:
            track(x, idx)
    return x.sum()


def _freed_as_backward_goes(run, device: str, n: int) -> list[tuple[int, int | None, int]]:
    """`_chain` on a fresh leaf of `n` floats, differentiated by `run(fn, x)`. At each tracked
    result's gradient hook, in backward order: its idx, the bytes allocated on the GPU (None on
    CPU) and how many tracked results' storages are still alive (StorageWeakRef: a buffer is
    freed when the last tensor on it, a saved one included, is released)."""
    x = torch.zeros(n, device=device, requires_grad=True)
    x.grad = torch.zeros_like(x)
    storages, trace = [], []

    def track(t, idx):
        if not t.requires_grad:
            return
        # Only a weak reference: a strong one would keep the buffer this test watches being freed.
        storages.append(StorageWeakRef(t.untyped_storage()))

        def hook(_grad):
            allocated = None
            if device == "cuda":
                torch.cuda.synchronize()
                allocated = torch.cuda.memory_allocated()
            trace.append((idx, allocated, sum(not s.expired() for s in storages)))

        t.register_hook(hook)

    gc.collect()  # no garbage of earlier tests freed in the middle of a trace
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    gc.disable()
    try:
        run(lambda inp: _chain(inp, track), x)
    finally:
        gc.enable()
    return trace


def _backward(retain_graph: bool):
    return lambda fn, x: fn(x).backward(retain_graph=retain_graph)


def _checkpointed(retain_graph: bool):
    return lambda fn, x: checkpoint(fn, x, params=()).backward(retain_graph=retain_graph)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("retain_graph", [False, True])
def test_rerun_buffers_are_freed_during_backward(device, retain_graph):
    """Adapts test_utils.py TestCheckpoint.test_checkpointing_without_reentrant_early_free, which
    checks that a checkpointed backward frees each step's saved buffers as it goes, like a plain
    backward and unlike one with retain_graph=True, even under retain_graph=True (the rerun's
    graph is the segment's own). Counted here exactly, on any device: the storages of the
    three tracked results still alive at each gradient hook (the GPU's allocation trace is
    the next test). A plain backward with retain_graph=True keeps all three: the count can
    tell keeping from freeing, so the test cannot pass for want of anything to free."""
    plain = _freed_as_backward_goes(_backward(False), device, 10)
    kept = _freed_as_backward_goes(_backward(True), device, 10)
    ours = _freed_as_backward_goes(_checkpointed(retain_graph), device, 10)
    assert [(i, alive) for i, _, alive in plain] == [(0, 2), (1, 1), (2, 0)]  # each step frees what it saved
    assert [(i, alive) for i, _, alive in kept] == [(0, 3), (1, 3), (2, 3)]
    assert [(i, alive) for i, _, alive in ours] == [(0, 2), (1, 1), (2, 0)]


# Floats per tensor in the GPU trace: 32 MiB, so that each saved buffer is an allocation of its
# own and a step frees tens of MiB. The caching allocator rounds each allocation up to 512
# bytes and may hand a large request a cached block up to 1 MiB larger than asked: with
# torch's 10-float tensors such slack is the size of a whole buffer, at 32 MiB it is 3 %.
_GPU_FLOATS = 8 << 20
_GPU_BUFFER = _GPU_FLOATS * 4


@needs_cuda
@pytest.mark.parametrize("retain_graph", [False, True])
def test_rerun_buffers_are_freed_during_backward_on_gpu(retain_graph):
    """The allocation trace of the test above, as torch's test reads it: a plain backward's
    allocation falls by about one buffer at each step (the saved input and the gradient
    consumed are freed, one gradient is made), a retain_graph=True one stays level, and a
    checkpointed backward, retained or not, falls at each step and holds what a plain one holds
    at every step (torch asserts the traces equal; here within half a buffer, the allocator's
    rounding and the checkpoint's few scalars being far smaller). Seen on an H200 (torch
    2.11, this chain run by hand, 2026-11-28): plain and checkpointed traces each fell by
    exactly 32 MiB per step, retained or not, the checkpointed one 512 bytes above the plain
    one; the retain_graph one stayed level. The old order of _chain was level at its first
    step at 32 MiB as at 10 floats."""
    half = _GPU_BUFFER // 2
    plain = [b for _, b, _ in _freed_as_backward_goes(_backward(False), "cuda", _GPU_FLOATS)]
    kept = [b for _, b, _ in _freed_as_backward_goes(_backward(True), "cuda", _GPU_FLOATS)]
    ours = [b for _, b, _ in _freed_as_backward_goes(_checkpointed(retain_graph), "cuda", _GPU_FLOATS)]
    assert len(plain) == len(kept) == len(ours) == 3
    assert all(a - b > half for a, b in pairwise(plain)), plain  # frees as it goes
    assert all(abs(a - b) < half for a, b in pairwise(kept)), kept  # keeps: the trace can tell
    assert all(a - b > half for a, b in pairwise(ours)), ours
    assert all(abs(a - b) < half for a, b in zip(ours, plain, strict=True)), (ours, plain)


def _device_context_case(device):
    seen = []

    def fn(x):
        intermediate = torch.empty(4)  # no device given: the torch.device context decides
        seen.append(intermediate.device.type)
        return x * intermediate.sum()

    x = torch.randn(4, device=device, requires_grad=True)
    with torch.device(device):
        y = checkpoint(fn, x, params=())
        y.sum().backward()
    return seen


@pytest.mark.parametrize("device", ["meta", pytest.param("cuda", marks=needs_cuda)])
def test_rerun_keeps_the_device_context(device):
    """Adapts test_utils.py TestCheckpoint.test_checkpoint_preserves_device_context
    (a GPU test in torch; "meta" is its CPU twin: a default device other than the CPU)."""
    assert _device_context_case(device) == [device, device]


# --- test_autograd.py: TestAutograd, the non-reentrant checkpoint cases --------------------

def _autocast_segment(enabled):
    def foo(x, y, z):
        x = torch.mm(x, y)
        y = torch.mm(x, z)
        z = torch.mm(z, z)
        # mm runs in autocast's precision on the first run and on the rerun alike
        assert z.dtype == (torch.bfloat16 if enabled else torch.float32)
        return z
    return foo


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("enabled", [True, False])
def test_rerun_uses_the_first_runs_autocast(device, enabled):
    """Adapts test_autograd.py test_checkpointing_non_reentrant_autocast_cpu and _gpu."""
    if device == "cuda" and not torch.cuda.is_bf16_supported():
        pytest.skip("needs a GPU with bf16")
    torch.manual_seed(0)
    inputs = [torch.randn(3, 3, device=device, requires_grad=True) for _ in range(3)]
    grads = {}
    for name, ckpt in (("torch", _torch_ckpt), ("speedlib", _speedlib_ckpt())):
        for t in inputs:
            t.grad = None
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=enabled):
            loss = ckpt(_autocast_segment(enabled), *inputs).sum()
        loss.backward()  # outside autocast: the rerun must restore it
        grads[name] = _grads(inputs)
    _close(grads["speedlib"], grads["torch"])


def _layers(n=8):
    torch.manual_seed(0)
    return nn.ModuleList(nn.Sequential(nn.Linear(256, 256), nn.Linear(256, 256), nn.Linear(256, 256)) for _ in range(n))


def _through(layers, x, ckpt):
    for layer in layers:
        x = ckpt(layer, x) if ckpt else layer(x)
    return x


@needs_cuda
def test_checkpointing_saves_memory_on_gpu():
    """Adapts test_autograd.py test_checkpointing_without_reentrant_memory_savings."""
    layers = _layers().cuda()
    for p in layers.parameters():  # gradients exist up front: the peak is activations
        p.grad = torch.ones_like(p)
    x = torch.randn(100, 256, device="cuda", requires_grad=True)
    peaks = {}
    for name, ckpt in (("none", None), ("speedlib", lambda m, t: checkpoint(m, t))):
        torch.cuda.reset_peak_memory_stats()
        _through(layers, x.clone(), ckpt).sum().backward()
        peaks[name] = torch.cuda.max_memory_allocated()
    assert peaks["speedlib"] < peaks["none"]


def test_checkpointing_saves_fewer_activations():
    """CPU twin of test_checkpointing_without_reentrant_memory_savings: bytes autograd saves."""
    layers = _layers(4)
    x = torch.randn(10, 256, requires_grad=True)

    def saved_bytes(ckpt):
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _through(layers, x, ckpt)
        return total[0]

    assert saved_bytes(lambda m, t: checkpoint(m, t)) < saved_bytes(None)


def test_custom_autograd_function_inside_the_segment():
    """Adapts test_autograd.py test_checkpointing_without_reentrant_custom_function_works
    (its check is that a custom Function in the segment works; the double-unpack error it
    also asserts is an artefact of torch's saved-tensor hooks)."""
    class MyFunc(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y, z):
            w = x * y * z
            out = w + w
            ctx.save_for_backward(x, y, z, w, out)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            x, y, z, _, _ = ctx.saved_tensors
            return x * grad_out, y * grad_out, z * grad_out

    def foo(x, y, z):
        return MyFunc.apply(x * y * z, y * y * z, z * z)

    leaves = [torch.tensor(v, requires_grad=True) for v in (1.0, 2.0, 3.0)]
    foo(*leaves).sum().backward()
    expected = _grads(leaves)
    for t in leaves:
        t.grad = None
    checkpoint(foo, *leaves, params=()).sum().backward()
    _close(_grads(leaves), expected)


def test_gradient_of_one_output_with_respect_to_another():
    """Adapts test_autograd.py test_checkpoint_graph_execution_group (without the group)."""
    def fn(x):
        y = x.sin().cos()
        return y, y.sin().cos()

    def grads(ckpt):
        x = torch.randn(3, 3, requires_grad=True, generator=torch.Generator().manual_seed(0))
        y, z = ckpt(fn, x) if ckpt else fn(x)
        (grad_y,) = torch.autograd.grad(z, y, torch.ones(3, 3))
        (grad_x,) = torch.autograd.grad(y, x, grad_y)
        return grad_y, grad_x

    expected = grads(None)
    _close(grads(_torch_ckpt), expected)
    _close(grads(_speedlib_ckpt()), expected)


def _non_deterministic(first, rerun):
    calls = [0]

    def fn(x):
        calls[0] += 1
        return first(x) if calls[0] == 1 else rerun(x)
    return fn


def _saves_three(x):
    return x.sin().exp().sin()


def _saves_two(x):
    return x.sin().exp()


def _saves_two_other_shape(x):
    # The result has the first run's shape, so nothing downstream notices; only the
    # tensors saved inside differ (a (2,) product instead of a (1,) one).
    return (x.sin().expand(2) * torch.tensor([1.0, 2.0])).sum(0, keepdim=True).exp()


@pytest.mark.parametrize("first, rerun", [(_saves_three, _saves_two), (_saves_two, _saves_two_other_shape)],
                         ids=["fewer_tensors", "other_shapes"])
def test_a_nondeterministic_segment_is_an_error(first, rerun):
    """Adapts test_autograd.py test_checkpoint_detects_non_determinism (fewer tensors saved
    on the rerun; the same number with other shapes)."""
    a = torch.randn(1, requires_grad=True)
    with pytest.raises(RuntimeError, match="different"):  # torch: "A different number ...", "... different metadata"
        _torch_ckpt(_non_deterministic(first, rerun), a).backward()
    with pytest.raises(RuntimeError, match="(?i)different|determinis"):
        checkpoint(_non_deterministic(first, rerun), a, params=()).backward()


def test_a_rerun_that_does_more_is_an_error_or_correct():
    """Adapts test_autograd.py test_checkpoint_detects_non_determinism, the case of more
    tensors saved on the rerun: torch (early stop) stops the rerun where the first run ended
    and gets the right gradient; an error is acceptable too, a wrong gradient is not."""
    a = torch.randn(1, requires_grad=True)
    (expected,) = torch.autograd.grad(_saves_two(a), a)
    (from_torch,) = torch.autograd.grad(_torch_ckpt(_non_deterministic(_saves_two, _saves_three), a), a)
    _close(from_torch, expected)
    try:
        (ours,) = torch.autograd.grad(checkpoint(_non_deterministic(_saves_two, _saves_three), a, params=()), a)
    except RuntimeError:
        return
    _close(ours, expected)


@pytest.mark.parametrize("input_requires_grad", [True, False])
def test_many_segments_with_a_keyword_input_match_no_checkpoint(input_requires_grad):
    """Adapts test_autograd.py test_checkpointing_without_reentrant (and test_checkpointing):
    one module checkpointed per input, called with a keyword argument."""
    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.module = nn.Sequential(nn.Linear(10, 100), nn.ReLU(), nn.Linear(100, 10))

        def forward(self, data):
            return self.module(data)

    module = Holder()
    plain = copy.deepcopy(module)
    ours, theirs = [], []
    for _ in range(50):
        data = torch.rand(1, 10).requires_grad_(input_requires_grad)
        ours.append(checkpoint(module, data=data))
        theirs.append(plain(data.clone()))
    torch.stack(ours).mean().backward()
    torch.stack(theirs).mean().backward()
    _close(_grads(module.parameters()), _grads(plain.parameters()))


@pytest.mark.parametrize("variant", ["torch", "speedlib"])
def test_a_segment_computing_under_no_grad(variant):
    """Adapts test_autograd.py test_checkpointing_without_reentrant_detached_tensor."""
    class NoGradModule(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 2, bias=False)
            self.lin2 = nn.Linear(2, 2, bias=False)

        def forward(self, x):
            with torch.no_grad():
                return self.lin2(self.linear(x))

    module = NoGradModule()
    a = torch.randn(2, 2, requires_grad=True)
    for _ in range(3):
        out = _torch_ckpt(module, a) if variant == "torch" else checkpoint(module, a)
        out += a
        out.sum().backward()
    _close(a.grad, torch.full_like(a, 3.0))
    assert all(p.grad is None or not p.grad.any() for p in module.parameters())


def test_the_rerun_sees_the_same_tensor_objects():
    """Adapts test_autograd.py test_checkpointing_without_reentrant_saved_object_identity:
    a tensor argument that needs no gradient reaches the rerun as the same object."""
    seen = []

    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            ctx.save_for_backward(y)
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            seen.append(ctx.saved_tensors[0])
            return grad, None

    a, b = torch.tensor(1.0, requires_grad=True), torch.tensor(1.0)
    _torch_ckpt(Keep.apply, a, b).backward()
    checkpoint(Keep.apply, a, b, params=()).backward()
    assert seen[0] is b
    assert seen[1] is b


def test_backward_and_autograd_grad_agree():
    """Adapts test_autograd.py test_checkpointing_without_reentrant_correct_grad."""
    a = torch.randn(2, 2, requires_grad=True)
    torch.exp(a).sum().backward()
    expected, a.grad = a.grad, None
    checkpoint(torch.exp, a, params=()).sum().backward()
    _close(a.grad, expected)
    (via_grad,) = torch.autograd.grad(checkpoint(torch.exp, a, params=()).sum(), a)
    _close(via_grad, expected)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_data_parallel_module(device):
    """Adapts test_autograd.py test_checkpointing_without_reentrant_dataparallel (on CPU,
    DataParallel runs the module itself: the twin checks the wrapping, not the replicas)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2, bias=False)).to(device)
    a = torch.randn(2, 2, device=device, requires_grad=True)
    copy.deepcopy(model)(a).sum().backward()
    expected, a.grad = a.grad, None
    checkpoint(nn.DataParallel(copy.deepcopy(model)), a).sum().backward()
    _close(a.grad, expected)


def _hooked_parameter_run(segment):
    """A weight used outside and inside the segment, with a gradient hook that doubles.

    `segment(w, h)` computes w * h, checkpointed or not."""
    w = torch.randn(10, 10, requires_grad=True, generator=torch.Generator().manual_seed(0))
    calls = [0]

    def hook(grad):
        calls[0] += 1
        return grad * 2

    w.register_hook(hook)
    x = torch.rand(10, 10, requires_grad=True, generator=torch.Generator().manual_seed(1))
    h = w * x  # w outside the segment
    segment(w, h).sum().backward()  # and inside it
    return calls[0], w.grad, x.grad


def test_a_parameter_hook_runs_once():
    """Adapts test_autograd.py test_checkpointing_without_reentrant_parameter_used_in_an_out
    (a hook that changes the gradient shows a second call in the gradient too)."""
    expected = _hooked_parameter_run(lambda w, h: w * h)
    assert expected[0] == 1
    _close(_hooked_parameter_run(lambda w, h: _torch_ckpt(lambda t: w * t, h)), expected)
    _close(_hooked_parameter_run(lambda w, h: checkpoint(lambda t: w * t, h, params=[w])), expected)


def test_dict_input_and_dict_output():
    """Adapts test_autograd.py test_checkpointing_without_reentrant_arbitrary_input_output."""
    class DictModel(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = nn.Linear(5, 5, bias=False)

        def forward(self, inputs):
            return {"result": self.layer(inputs["tensor"])}

    plain = DictModel()
    ours = copy.deepcopy(plain)
    inp = {"tensor": torch.randn(5, 5)}
    expected = plain(inp)["result"].sum()
    got = checkpoint(ours, inp)["result"].sum()
    _close(got, expected)
    expected.backward()
    got.backward()
    _close(_grads(ours.parameters()), _grads(plain.parameters()))


# --- test_autograd.py: TestNestedCheckpoint ------------------------------------------------

def _grad_of(fn):
    """x -> d fn(x) / dx, differentiable (create_graph), as TestNestedCheckpoint's `grad`."""
    def wrapper(x):
        with torch.enable_grad():
            (g,) = torch.autograd.grad(fn(x), x, create_graph=True)
        return g
    return wrapper


def _sum_of(fn):
    return lambda x: fn(x).sum()


def _ckpt_of(fn):
    return lambda x: checkpoint(fn, x, params=())


def _nested_cases(fn):
    """(reference, [the same function with checkpoints nested in various ways])."""
    g, c = _grad_of, _ckpt_of
    return [
        (fn, [c(fn), c(c(fn))]),
        (g(fn), [g(c(fn)), g(c(c(fn)))]),
        (g(g(fn)), [g(c(g(fn))), c(g(g(c(fn)))), g(c(g(c(fn))))]),
        (g(g(g(fn))), [g(c(g(g(c(fn))))), g(c(g(c(g(c(fn))))))]),
    ]


def _graph_nodes(root):
    seen, queue = {root}, collections.deque([root])
    while queue:
        node = queue.popleft()
        yield node
        for nxt, _ in node.next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)


def _assert_graph_dies(fn):
    """Once its output is gone, no node of the graph `fn` built stays alive (no cycle)."""
    class Marker:
        pass

    def build():
        out = fn(torch.randn((), requires_grad=True))
        refs = []
        for node in _graph_nodes(out.grad_fn):
            marker = Marker()
            node.metadata["marker"] = marker
            refs.append(weakref.ref(marker))
        return refs

    assert [r for r in build() if r() is not None] == []


def _smooth(x):
    return x.sin().exp().sin()


def _grads_inside(x):
    """A segment that itself calls autograd.grad twice, then returns something else."""
    a, b = x.sin().exp().sin(), x.sin().exp().sin()
    torch.autograd.grad(a, x)
    torch.autograd.grad(b, x)
    return x.sin()


@pytest.mark.parametrize("fn", [_smooth, _grads_inside], ids=["plain", "autograd_grad_inside"])
def test_nested_checkpoints_and_higher_order_gradients(fn):
    """Adapts test_autograd.py TestNestedCheckpoint.test_nested_checkpoint."""
    x = torch.randn((), requires_grad=True)
    for reference, variants in _nested_cases(fn):
        expected = reference(x)
        for variant in variants:
            _close(variant(x), expected)
            _assert_graph_dies(variant)


def test_nested_checkpoint_with_two_children():
    """Adapts test_autograd.py TestNestedCheckpoint.test_nested_checkpoint_two_children."""
    g, s, c = _grad_of, _sum_of, _ckpt_of

    def second(x):
        return x.cos().sin().exp()

    def plain(x):
        return second(_smooth(x))

    def checkpointed(x):
        return c(second)(c(_smooth)(x))

    a = torch.randn(3, 3, requires_grad=True)
    expected = g(s(g(s(plain))))(a)
    _close(g(s(g(s(c(checkpointed)))))(a), expected)
    _close(g(s(c(g(s(c(checkpointed))))))(a), expected)
    _assert_graph_dies(g(c(checkpointed)))
    _assert_graph_dies(g(s(g(s(c(checkpointed))))))
    _assert_graph_dies(g(s(c(g(s(c(checkpointed)))))))


def test_nested_non_tensor_inputs_and_outputs():
    """Adapts test_autograd.py TestNestedCheckpoint.test_nested_checkpoint_non_tensor_inputs_and_outputs:
    an int and a function among the arguments, an int and a string among the results."""
    def fn(k, a, b, f):
        return f(k * a * b.exp()), 1, "abcd"

    a, b = torch.tensor(2.0, requires_grad=True), torch.tensor(3.0, requires_grad=True)
    out, one, text = checkpoint(fn, 3, a, b, torch.sin, params=())
    assert (one, text) == (1, "abcd")
    _close(torch.autograd.grad(out, (a, b)), torch.autograd.grad(fn(3, a, b, torch.sin)[0], (a, b)))


def test_nested_keyword_argument():
    """Adapts test_autograd.py TestNestedCheckpoint.test_nested_checkpoint_kwargs."""
    def fn(a, blah=None):
        out = a.sin().exp()
        if blah is not None:
            out = out * blah
        return out.sin().exp()

    a, b = torch.tensor(2.0, requires_grad=True), torch.tensor(3.0, requires_grad=True)
    got = torch.autograd.grad(checkpoint(fn, a, blah=b, params=()), (a, b))
    _close(got, torch.autograd.grad(fn(a, blah=b), (a, b)))


@pytest.mark.parametrize("variant", ["torch", "speedlib"])
def test_a_hook_on_the_original_graph_runs_once(variant):
    """Adapts test_autograd.py TestNestedCheckpoint.test_nested_checkpoint_same_graph: a hook
    on a node of the graph the forward built (for speedlib, the segment's node and the node
    before it; the rerun's nodes are not in that graph) runs once per backward."""
    calls = collections.Counter()
    leaf = torch.tensor(1.0, requires_grad=True)
    a = leaf * 1.5
    out = _torch_ckpt(_smooth, a) if variant == "torch" else checkpoint(_smooth, a, params=())
    out.grad_fn.register_hook(lambda *_: calls.update(["segment"]))
    a.grad_fn.register_hook(lambda *_: calls.update(["before"]))
    out.backward()
    assert calls == {"segment": 1, "before": 1}


_REENTRANT_HOOK = textwrap.dedent("""
    import torch
    from torch.utils.checkpoint import checkpoint as torch_checkpoint
    from speedlib.checkpoint import checkpoint

    def fn(a):
        x = a.sin().cos()
        return x, x.sin()

    def run(ckpt):
        a = torch.tensor(1.0, requires_grad=True)
        x, out = ckpt(fn, a)
        # the hook starts a backward from the other output of the same segment
        out.grad_fn.register_hook(lambda *_: x.backward(retain_graph=True))
        out.backward(retain_graph=True)
        return a.grad

    expected = run(lambda f, a: torch_checkpoint(f, a, use_reentrant=False))
    got = run(lambda f, a: checkpoint(f, a, params=()))
    torch.testing.assert_close(got, expected)
    print("ok")
""")


def test_a_hook_that_backwards_through_another_output_finishes():
    """Adapts test_autograd.py TestNestedCheckpoint.test_nested_checkpoint_reentrant_backwards.
    Run in a child process: the failure this guards against is a hang."""
    try:
        done = subprocess.run([sys.executable, "-c", _REENTRANT_HOOK], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("backward from a hook on one output through another output of the same segment hangs")
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


# --- what the explicit-parameter checkpoint could not take: torch's calls, now mirrored -----------

def test_checkpoint_sequential_refuses_what_torchs_refuses():
    """Mirrors TestCheckpoint.test_checkpoint_sequential_deprecated_multiple_args and _no_args."""
    class Two(nn.Module):
        def forward(self, a, b):
            return a, b

    a, b = torch.randn(1, 4, requires_grad=True), torch.randn(1, 4, requires_grad=True)
    for fn in (checkpoint_sequential, speedlib_checkpoint_sequential):
        with pytest.raises(TypeError):
            fn(nn.Sequential(Two()), 1, a, b)
        with pytest.raises(TypeError):
            fn(nn.Sequential(nn.Identity()), 1)


def _verbose_mode():
    class Verbose(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.__name__)
            return func(*args, **(kwargs or {}))
    return Verbose()


def test_a_dispatch_mode_from_context_fn_sees_what_it_sees_under_torch():
    """Mirrors TestAutograd.test_checkpointing_without_reentrant_with_context_fn: the first run's
    mode sees only the user's op; the rerun's sees it and the one detach a saved result gets."""
    seen = {}
    for name, ckpt in (("torch", torch_checkpoint), ("speedlib", checkpoint)):
        x = torch.tensor(1.0, requires_grad=True)
        first, rerun = _verbose_mode(), _verbose_mode()
        ckpt(lambda t: t.exp(), x, use_reentrant=False, context_fn=lambda m=first: (m, contextlib.nullcontext()))
        out = ckpt(lambda t: t.exp(), x, use_reentrant=False,
                   context_fn=lambda m=rerun: (contextlib.nullcontext(), m))
        out.backward()
        seen[name] = (first.ops, rerun.ops)
    assert seen["speedlib"] == seen["torch"] == (["exp.default"], ["exp.default", "detach.default"])


def _clone_counted(counter):
    def fn(t):
        y = t.sin().cos()
        counter.append(1)
        return y.clone()  # clone saves nothing: an early-stopped rerun never gets here
    return fn


def test_early_stop_argument_and_torchs_switch():
    """Mirrors TestNestedCheckpoint.test_nested_checkpoint_set_early_stop: the argument, torch's
    set_checkpoint_early_stop (which wins, and needs to be active in forward only)."""
    cases = [({}, None, 1), ({"early_stop": False}, None, 2), ({"early_stop": True}, None, 1),
             ({}, False, 2), ({"early_stop": True}, False, 2), ({"early_stop": False}, True, 1)]
    for kwargs, switch, calls in cases:
        counter = []
        a = torch.tensor(1.0, requires_grad=True)
        ctx = contextlib.nullcontext() if switch is None else torch.utils.checkpoint.set_checkpoint_early_stop(switch)
        with ctx:
            out = checkpoint(_clone_counted(counter), a, use_reentrant=False, **kwargs)
        out.backward()
        assert len(counter) == calls, (kwargs, switch)


def test_early_stop_skips_the_kernels_after_the_last_saved_tensor():
    """Mirrors TestNestedCheckpoint.test_nested_checkpoint_set_early_stop_no_recompution_needed:
    the rerun calls the Python function but stops before the sin kernel; with nothing saved it
    does not rerun at all."""
    class Sins(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Sins.count += func is torch.ops.aten.sin.default
            return func(*args, **(kwargs or {}))

    for early_stop, sins in ((True, 1), (False, 2)):
        calls, Sins.count = [], 0
        a = torch.tensor(1.0, requires_grad=True)
        with Sins():
            out = checkpoint(lambda t, c=calls: c.append(1) or t.sin(), a, use_reentrant=False, early_stop=early_stop)
            out.backward()
        assert (len(calls), Sins.count) == (2, sins)
    calls = []
    checkpoint(lambda t: calls.append(1) or t.clone(), torch.tensor(1.0, requires_grad=True)).backward()
    assert len(calls) == 1


def _fickle(first, later):
    calls = []

    def fn(x):
        calls.append(1)
        return first(x) if len(calls) == 1 else later(x)
    return fn


def test_debug_and_torchs_switch_explain_a_nondeterministic_rerun():
    """Mirrors TestAutograd.test_checkpoint_detects_non_determinism: fewer tensors, more tensors
    without early stop, other metadata, and debug=True or set_checkpoint_debug_enabled (which wins)."""
    two, three = (lambda x: x.sin().exp()), (lambda x: x.sin().exp().sin())
    other = lambda x: x.sin() * torch.tensor([1.0, 2.0])  # noqa: E731 - one of the three runs compared
    a = torch.randn(1, requires_grad=True)
    with pytest.raises(RuntimeError, match="A different number of tensors was saved"):
        checkpoint(_fickle(three, two), a, use_reentrant=False).backward()
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        out = checkpoint(_fickle(two, three), a, use_reentrant=False)
    with pytest.raises(RuntimeError, match="trying to save more tensors during recomputation"):
        out.backward()
    checkpoint(_fickle(two, three), a, use_reentrant=False).backward()  # early stop: never sees the extra one
    with pytest.raises(RuntimeError, match="tensors have different metadata"):
        checkpoint(_fickle(two, other), a, use_reentrant=False).sum().backward()
    with pytest.raises(RuntimeError, match="passed `debug=True` to checkpoint"):
        checkpoint(_fickle(two, other), a, use_reentrant=False, debug=True).sum().backward()
    with torch.utils.checkpoint.set_checkpoint_debug_enabled(True), \
            pytest.raises(RuntimeError, match="passed `debug=True` to checkpoint"):
        checkpoint(_fickle(two, other), a, use_reentrant=False).sum().backward()
    with torch.utils.checkpoint.set_checkpoint_debug_enabled(False), \
            pytest.raises(RuntimeError, match=r"Recomputed values for the following tensors have different(?!.*debug)"):
        checkpoint(_fickle(two, other), a, use_reentrant=False, debug=True).sum().backward()


def test_a_saved_tensor_read_outside_backward_reruns_each_time():
    """Mirrors TestAutograd.test_access_saved_tensor_twice_without_recomputation_works."""
    count = []

    def foo(t):
        count.append(1)
        return torch.exp(t * t)

    d = checkpoint(foo, torch.randn(5, requires_grad=True), use_reentrant=False)
    for _ in range(2):  # each read outside backward reruns the segment
        assert torch.equal(d.grad_fn._saved_result, d)
    d.sum().backward()
    assert len(count) == 4
    with pytest.raises(RuntimeError, match="after they have already been freed"):
        _ = d.grad_fn._saved_result


def test_a_custom_function_reading_its_saved_tensors_twice_is_told_so():
    """Mirrors TestAutograd.test_checkpointing_without_reentrant_custom_function_works."""
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x, x * 2)
            return x * 3

        @staticmethod
        def backward(ctx, grad):
            x, _ = ctx.saved_tensors
            with pytest.raises(RuntimeError, match="already unpacked once"):
                _ = ctx.saved_tensors
            return grad * 3

    x = torch.tensor(2.0, requires_grad=True)
    checkpoint(lambda t: Twice.apply(t * t), x, use_reentrant=False).backward()
    assert x.grad == 12.0


def test_a_graph_exec_group_reruns_a_segment_once():
    """Mirrors TestAutograd.test_checkpoint_graph_execution_group."""
    for grouped, runs in ((True, 2), (False, 3)):
        counter = []

        def fn(t, counter=counter):
            counter.append(1)
            y = t.sin().cos()
            return y, y.sin().cos()

        x = torch.randn(3, 3, requires_grad=True)
        y, z = checkpoint(fn, x, use_reentrant=False)
        with torch.utils.checkpoint.GraphExecGroup() if grouped else contextlib.nullcontext():
            grad_y, = torch.autograd.grad(z, (y,), (torch.ones(3, 3),))
            torch.autograd.grad(y, (x,), (grad_y,))
        assert len(counter) == runs
    out = checkpoint(lambda t: t.sin().cos(), torch.randn(3, requires_grad=True), use_reentrant=False)
    with torch.utils.checkpoint.GraphExecGroup():
        out.sum().backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="Performing two backward calls that overlap"):
            out.sum().backward()


def test_selective_checkpointing_contexts_work_as_under_torch():
    """Mirrors TestSelectiveActivationCheckpoint (test_function_with_more_than_one_output,
    test_version_counter, test_can_only_trigger_recompute_once): what the policy saves is not
    recomputed, a saved result changed in place is an error, a second backward is refused."""
    def save(*ops):
        return functools.partial(create_selective_checkpoint_contexts,
                                 lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE if op in ops
                                 else CheckpointPolicy.PREFER_RECOMPUTE)

    x = torch.randn(3, requires_grad=True)
    results = []
    for ckpt in (torch_checkpoint, checkpoint):
        out = ckpt(lambda t: torch.mul(*torch.var_mean(t)), x, use_reentrant=False,
                   context_fn=save(torch.ops.aten.var_mean.correction))
        results.append(torch.autograd.grad(out.sum(), (x,)))
        with pytest.raises(RuntimeError, match="has been mutated"):
            ckpt(lambda t: t.sin().mul_(2).cos().exp(), x, use_reentrant=False,
                 context_fn=save(torch.ops.aten.sin.default)).sum().backward()
        out = ckpt(lambda t: t.sin().cos().exp(), x, use_reentrant=False, context_fn=save(torch.ops.aten.sin.default))
        out.sum().backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="Trying to backward an extra time"):
            out.sum().backward(retain_graph=True)
    assert torch.equal(results[0][0], results[1][0])


class _Handle:
    pass


def test_nested_checkpoints_recompute_the_inner_inputs_through_the_outer():
    """Mirrors TestNestedCheckpoint.test_nested_checkpoint_two_children (grad of grad through
    checkpoints inside checkpoints) and its check that the graph dies without the collector."""
    def f(t):
        return t.sin().exp().sin()

    def g(t):
        return t.cos().sin().exp()

    def nested(t):
        return checkpoint(g, checkpoint(f, t, use_reentrant=False), use_reentrant=False)

    a = torch.randn(3, 3, requires_grad=True, dtype=torch.float64)
    grads = []
    for fn in (lambda t: g(f(t)), lambda t: checkpoint(nested, t, use_reentrant=False)):
        first, = torch.autograd.grad(fn(a).sum(), a, create_graph=True)
        second, = torch.autograd.grad(first.sum(), a)
        grads.append(second)
    torch.testing.assert_close(grads[0], grads[1])
    gc.disable()
    try:
        out = checkpoint(nested, a, use_reentrant=False)
        handle = _Handle()
        out.grad_fn.metadata["handle"] = handle  # the node's metadata dies with the node
        ref = weakref.ref(handle)
        del out, handle
        assert ref() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("reentrant", [True, False])
def test_reentrant_or_not_a_segment_computing_under_no_grad(reentrant):
    """Mirrors TestAutograd.test_checkpointing_without_reentrant_detached_tensor."""
    lin = nn.Linear(2, 2, bias=False)

    def no_grad_segment(t):
        with torch.no_grad():
            return lin(t)

    a = torch.randn(2, 2, requires_grad=True)
    for _ in range(3):
        out = checkpoint(no_grad_segment, a, use_reentrant=reentrant)
        out = out + a
        if reentrant:
            with pytest.raises(RuntimeError, match="none of output has requires_grad=True"):
                out.sum().backward()
        else:
            out.sum().backward()
    assert reentrant or torch.equal(a.grad, torch.full((2, 2), 3.0))
