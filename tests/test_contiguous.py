"""speedlib.ContiguousParams: equivalence with per-tensor optimizers, and every trap of the original."""

from __future__ import annotations

import copy
import math
import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from speedlib import ContiguousParams, FlatParameter, InvalidBufferError

requires_cuda = pytest.mark.gpu(reason="needs a CUDA GPU; the CPU variant of this test covers the logic")
STEPS = 5


def small_net() -> nn.Module:
    """Conv (4-D weight), BatchNorm (1-D params + buffers), Linear: the shapes real models have.

    No conv bias before BatchNorm: its gradient is rounding noise, which Adam normalises into
    steps of full size, so two exact-in-theory implementations would diverge on it.
    """
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 10), nn.ReLU(), nn.Linear(10, 5),
    )


def twin(seed: int = 0, device: str = "cpu") -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    a = small_net().to(device)
    return a, copy.deepcopy(a)


def batches(n: int = STEPS, device: str = "cpu"):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, 6, 6, generator=gen).to(device), torch.randint(0, 5, (4,), generator=gen).to(device))
            for _ in range(n)]


def train(model, optimizer, clip_params=None, data=None, zero=lambda opt: opt.zero_grad(), max_norm=0.5):
    losses = []
    clip_params = None if clip_params is None else list(clip_params)  # a generator would run dry
    for x, y in data or batches():
        zero(optimizer)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if clip_params is not None:
            torch.nn.utils.clip_grad_norm_(clip_params, max_norm)
        optimizer.step()
        losses.append(loss.item())
    return losses


def assert_same_params(a: nn.Module, b: nn.Module, atol=1e-6, rtol=1e-5):
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}")


OPTIMIZERS = {
    "sgd-momentum": lambda ps, **kw: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3, **kw),
    "adam": lambda ps, **kw: torch.optim.Adam(ps, lr=1e-2, **kw),
    "adamw": lambda ps, **kw: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, **kw),
}


@pytest.mark.parametrize("impl", [{}, {"foreach": True}, {"fused": True}], ids=["default", "foreach", "fused"])
@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("clip", [False, True], ids=["noclip", "clip"])
def test_equivalent_to_per_tensor_optimizer(name, impl, clip):
    """Same parameters and losses after N steps with the default training loop (zero_grad() sets None)."""
    ref, flat_model = twin()
    ref_opt = OPTIMIZERS[name](ref.parameters(), **impl)  # like for like: fused differs from for-loop
    params = ContiguousParams(flat_model.parameters())
    opt = OPTIMIZERS[name](params.contiguous(), **impl)
    ref_losses = train(ref, ref_opt, ref.parameters() if clip else None)
    losses = train(flat_model, opt, params.contiguous() if clip else None)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert_same_params(ref, flat_model)
    assert params.buffer_is_valid()
    # it really trained: the parameters moved away from where they started
    start, _ = twin()
    assert not torch.allclose(next(start.parameters()), next(flat_model.parameters()))


def test_default_zero_grad_keeps_gradients_fresh():
    """zero_grad() (set_to_none=True) must leave the flat gradient linked and zero, not None."""
    model, _ = twin()
    params = ContiguousParams(model.parameters())
    opt = torch.optim.SGD(params.contiguous(), lr=0.1)
    nn.functional.cross_entropy(model(batches(1)[0][0]), batches(1)[0][1]).backward()
    flat = params.contiguous()[0]
    assert flat.grad.abs().sum() > 0
    opt.zero_grad()
    assert flat.grad is not None and flat.grad.abs().sum() == 0
    assert all(p.grad is not None and p.grad.abs().sum() == 0 for p in model.parameters())
    assert params.buffer_is_valid()


def test_original_package_stops_training_under_default_zero_grad():
    """Documents the trap speedlib fixes: with contiguous_params 1.0.0 the parameters stop moving."""
    original = pytest.importorskip("contiguous_params", reason="contiguous_params is not installed")
    model, _ = twin()
    params = original.ContiguousParams(model.parameters())
    opt = torch.optim.Adam(params.contiguous(), lr=1e-2)
    train(model, opt, data=batches(1))
    after_first = [p.detach().clone() for p in model.parameters()]
    train(model, opt, data=batches(3))
    assert all(torch.equal(a, p) for a, p in zip(after_first, model.parameters()))


def test_matches_original_package_on_its_intended_loop():
    """Drop-in: same API, same result as contiguous_params with zero_grad(set_to_none=False)."""
    original = pytest.importorskip("contiguous_params", reason="contiguous_params is not installed")
    ours_model, theirs_model = twin()
    ours = ContiguousParams(ours_model.parameters())
    theirs = original.ContiguousParams(theirs_model.parameters())
    keep = lambda opt: opt.zero_grad(set_to_none=False)  # noqa: E731
    train(theirs_model, torch.optim.Adam(theirs.contiguous(), lr=1e-2), theirs.contiguous(), zero=keep)
    train(ours_model, torch.optim.Adam(ours.contiguous(), lr=1e-2), ours.contiguous(), zero=keep)
    assert_same_params(theirs_model, ours_model)
    for method in ("contiguous", "original", "buffer_is_valid", "assert_buffer_is_valid"):
        assert callable(getattr(ours, method))


@pytest.mark.parametrize("impl", ["speedlib", "contiguous_params"])
def test_original_readme_buffer_inspection_idiom(impl):
    """The original README's advice: check that the gradient buffer is non-zero, zero_() it by hand."""
    if impl == "speedlib":
        wrapper = ContiguousParams
    else:
        wrapper = pytest.importorskip("contiguous_params", reason="contiguous_params is not installed").ContiguousParams
    model = small_net()
    params = wrapper(model.parameters())
    one_backward(model)
    assert params._grad_buffer.abs().sum() > 0
    torch.testing.assert_close(params._grad_buffer.sum(), sum(p.grad.sum() for p in model.parameters()))
    torch.testing.assert_close(params._param_buffer.sum(), sum(p.sum() for p in model.parameters()))
    params._grad_buffer.zero_()
    assert all(p.grad.abs().sum() == 0 for p in model.parameters())
    params.assert_buffer_is_valid()


def test_original_buffer_attributes_are_read_only_and_need_one_buffer():
    params = ContiguousParams(nn.Linear(2, 2).parameters())
    with pytest.raises(AttributeError):
        params._grad_buffer = torch.zeros(6)
    two = ContiguousParams(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).double()).parameters())
    with pytest.raises(AttributeError, match=r"2 flat buffers.*params\.grad_buffers\[\(device, dtype\)\]"):
        _ = two._grad_buffer
    with pytest.raises(AttributeError, match=r"params\.param_buffers\["):
        _ = two._param_buffer


def test_optimizer_checkpoint_of_the_original_resumes_with_align_bytes_1():
    """Without alignment padding the flat layout is the original's, so its optimizer state loads."""
    original = pytest.importorskip("contiguous_params", reason="contiguous_params is not installed")
    keep = lambda opt: opt.zero_grad(set_to_none=False)  # noqa: E731
    data = batches(6)
    theirs, _ = twin()
    theirs_params = original.ContiguousParams(theirs.parameters())
    theirs_opt = torch.optim.Adam(theirs_params.contiguous(), lr=1e-2)
    train(theirs, theirs_opt, data=data[:3], zero=keep)
    model_state, opt_state = copy.deepcopy(theirs.state_dict()), copy.deepcopy(theirs_opt.state_dict())
    train(theirs, theirs_opt, data=data[3:], zero=keep)

    ours = small_net()
    ours.load_state_dict(model_state)
    params = ContiguousParams(ours.parameters(), align_bytes=1)
    opt = torch.optim.Adam(params.contiguous(), lr=1e-2)
    opt.load_state_dict(opt_state)
    train(ours, opt, data=data[3:])
    assert_same_params(theirs, ours, atol=0, rtol=0)


# -- invalidation is caught, with a message that says what happened and how to fix it ----

def wrapped(model=None):
    model = model or small_net()
    params = ContiguousParams(model.parameters())
    return model, params, torch.optim.Adam(params.contiguous(), lr=1e-3)


def one_backward(model):
    x, y = batches(1)[0]
    nn.functional.cross_entropy(model(x), y).backward()


def in_grad_buffer(params, p) -> bool:
    """p.grad is a view of the flat gradient buffer p was wrapped into."""
    buffer = params.grad_buffers[(p.device, p.dtype)]
    start = buffer.data_ptr()
    return p.grad is not None and start <= p.grad.data_ptr() < start + buffer.numel() * buffer.element_size()


def test_model_zero_grad_reattaches_the_flat_gradient():
    """model.zero_grad() (set_to_none=True) detaches the gradient views; the next backward puts
    them back, zeroed, so the flat gradient is exactly the per-parameter gradients."""
    ref, model = twin()
    params = ContiguousParams(model.parameters())
    one_backward(model)  # leaves stale values that must not leak into the next gradient
    model.zero_grad()
    assert params.buffer_is_valid()  # None gradients are re-attached, not an invalid buffer
    one_backward(model)
    one_backward(ref)
    assert params.buffer_is_valid()
    for pr, p in zip(ref.parameters(), model.parameters()):
        assert in_grad_buffer(params, p)
        torch.testing.assert_close(p.grad, pr.grad, rtol=0, atol=0)


def test_model_zero_grad_without_set_to_none_is_fine():
    model, params, opt = wrapped()
    one_backward(model)
    model.zero_grad(set_to_none=False)
    assert params.buffer_is_valid()
    assert all(p.grad.abs().sum() == 0 for p in model.parameters())


# -- PyTorch Lightning: zero_grad(set_to_none=True) on the optimizer and on the module ----------

def all_optimizer_params(optimizer):
    return [p for group in optimizer.param_groups for p in group["params"]]


def lightning_style_fit(model, optimizer, data, *, closure, zero):
    """The calls Lightning's Trainer makes, without Lightning: gradients set to None before the
    first backward and before every step's backward, the step taken with a closure that runs
    forward, backward and gradient clipping over the optimizer's parameters (as
    gradient_clip_val does), or without one (manual optimization)."""
    zero(model, optimizer)
    losses = []
    for x, y in data:
        def closure_fn(x=x, y=y):
            zero(model, optimizer)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(all_optimizer_params(optimizer), 0.5)
            losses.append(loss.item())
            return loss
        if closure:
            optimizer.step(closure_fn)
        else:
            closure_fn()
            optimizer.step()
    return losses


LIGHTNING_ZERO = {  # what may set gradients to None in a Lightning module's training
    "optimizer+module": lambda m, o: (o.zero_grad(set_to_none=True), m.zero_grad(set_to_none=True)),
    "module+optimizer": lambda m, o: (m.zero_grad(set_to_none=True), o.zero_grad(set_to_none=True)),
    "module-only": lambda m, o: m.zero_grad(set_to_none=True),
}


@pytest.mark.parametrize("zero", LIGHTNING_ZERO)
@pytest.mark.parametrize("closure", [True, False], ids=["closure", "no-closure"])
@pytest.mark.parametrize("name", ["adam", "sgd-momentum"])
def test_lightning_style_loop_trains_like_a_per_tensor_optimizer(name, closure, zero):
    ref, model = twin()
    params = ContiguousParams(model.parameters())
    ref_losses = lightning_style_fit(ref, OPTIMIZERS[name](ref.parameters()), batches(), closure=closure,
                                     zero=LIGHTNING_ZERO[zero])
    losses = lightning_style_fit(model, OPTIMIZERS[name](params.contiguous()), batches(), closure=closure,
                                 zero=LIGHTNING_ZERO[zero])
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert_same_params(ref, model)
    assert params.buffer_is_valid()
    assert all(in_grad_buffer(params, p) for p in model.parameters())


class TwoHeads(nn.Module):
    """A trunk and two heads used on alternate steps: the unused head gets no gradient."""

    def __init__(self):
        super().__init__()
        self.trunk, self.heads = nn.Linear(4, 6), nn.ModuleList([nn.Linear(6, 3), nn.Linear(6, 3)])

    def forward(self, x, head):
        return self.heads[head](torch.relu(self.trunk(x)))


def _sgd_twins(module: type[nn.Module]):
    """A model and its copy on ContiguousParams, each with plain SGD (lr 0.1), from seed 0."""
    torch.manual_seed(0)
    ref = module()
    model = copy.deepcopy(ref)
    params = ContiguousParams(model.parameters())
    return ref, model, params, torch.optim.SGD(ref.parameters(), lr=0.1), torch.optim.SGD(params.contiguous(), lr=0.1)


def test_unused_parameters_after_module_zero_grad_have_no_stale_gradient():
    """After model.zero_grad(set_to_none=True) the unused head's slice of the flat gradient must
    read zero, not last step's gradient: clipping over the flat tensors would count it and the
    step would apply it. Plain SGD, for which a zero gradient and a skipped parameter agree."""
    ref, model, params, ref_opt, opt = _sgd_twins(TwoHeads)
    gen = torch.Generator().manual_seed(3)
    for step in range(4):
        x, y = torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        for m, o, clip in ((ref, ref_opt, ref.parameters()), (model, opt, params.contiguous())):
            m.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(m(x, step % 2), y).backward()
            norm = torch.nn.utils.clip_grad_norm_(clip, 0.05)  # small: every step is clipped
            o.step()
            if m is ref:
                ref_norm = norm
        torch.testing.assert_close(norm, ref_norm, rtol=1e-6, atol=0)
        assert_same_params(ref, model, atol=0, rtol=1e-6)


class MixedPrecisionHeads(nn.Module):
    """A float32 head used every step and a float64 head used on even steps only: on odd steps
    no backward reaches the float64 buffer at all."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 3).double()

    def forward(self, x, step):
        out = self.a(x)
        return out + self.b(x.double()).float() if step % 2 == 0 else out


def test_closure_that_sets_gradients_to_none_leaves_no_stale_gradient_in_an_untouched_buffer():
    """Lightning sets gradients to None inside the step's closure, after the step's own check:
    a buffer the closure's backward never reaches must still read zero when the update runs."""
    ref, model, params, ref_opt, opt = _sgd_twins(MixedPrecisionHeads)
    gen = torch.Generator().manual_seed(5)
    for step in range(4):
        x, y = torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        for m, o in ((ref, ref_opt), (model, opt)):
            def closure(m=m):
                m.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(m(x, step), y)
                loss.backward()
                return loss
            o.step(closure)
        assert_same_params(ref, model, atol=0, rtol=1e-6)


def test_step_right_after_module_zero_grad_is_a_zero_gradient_step():
    """Lightning zeroes before training; a step with no backward since then changes nothing
    under plain SGD and leaves every gradient a zeroed view of the flat buffer."""
    model, _ = twin()
    params = ContiguousParams(model.parameters())
    opt = torch.optim.SGD(params.contiguous(), lr=0.1)
    one_backward(model)
    model.zero_grad(set_to_none=True)
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert all(in_grad_buffer(params, p) and p.grad.abs().sum() == 0 for p in model.parameters())


def test_a_replaced_wrapper_does_not_reattach_gradients_to_its_buffer():
    model = small_net()
    old = ContiguousParams(model.parameters())
    params = ContiguousParams(model.parameters())  # the new wrapper takes the parameters over
    model.zero_grad(set_to_none=True)
    one_backward(model)
    assert params.buffer_is_valid()
    assert all(in_grad_buffer(params, p) for p in model.parameters())
    assert not old.buffer_is_valid()


def test_conversion_after_module_zero_grad_is_still_reported_at_the_step():
    """Re-attaching must leave a converted parameter alone (a float32 gradient cannot be given to
    a float64 parameter): backward runs, and the step names the conversion."""
    model, params, opt = wrapped()
    model.zero_grad(set_to_none=True)
    model.double()
    x, y = batches(1)[0]
    nn.functional.cross_entropy(model(x.double()), y).backward()
    with pytest.raises(InvalidBufferError, match=r"dtype changed from torch\.float32 to torch\.float64"):
        opt.step()


def test_saving_a_wrapped_model_does_not_warn_about_hooks(tmp_path, recwarn):
    model, _, _ = wrapped()
    torch.save(model, tmp_path / "model.pt")
    assert not [w for w in recwarn if "hook" in str(w.message)]


def _lightning_fit(flat: bool, model: nn.Module) -> list[float]:
    """Train `model` with a real Lightning Trainer (gradient clipping on), Adam either on the flat
    tensors or per tensor; return the losses."""
    L = pytest.importorskip("lightning", reason="lightning is not installed; the Lightning-style tests emulate it")
    losses = []

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, batch_idx):
            loss = nn.functional.cross_entropy(self.net(batch[0]), batch[1])
            losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            if not flat:
                return torch.optim.Adam(self.parameters(), lr=1e-2)
            self.contiguous_params = ContiguousParams(self.parameters())
            return torch.optim.Adam(self.contiguous_params.contiguous(), lr=1e-2)

    data = batches()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.cat([x for x, _ in data]), torch.cat([y for _, y in data])), batch_size=4)
    trainer = L.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, gradient_clip_val=0.5, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Module(), loader)
    return losses


@pytest.mark.filterwarnings("ignore::UserWarning")  # Lightning's advice on DataLoader workers
def test_real_lightning_trainer_trains_like_a_per_tensor_optimizer():
    ref, model = twin()
    ref_losses = _lightning_fit(False, ref)
    losses = _lightning_fit(True, model)
    assert len(losses) == STEPS
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert_same_params(ref, model)


@pytest.mark.parametrize("convert, pattern", [
    (lambda m: m.half(), r"dtype changed from torch\.float32 to torch\.float16.*model\.half\(\)"),
    (lambda m: m.to(torch.float64), r"dtype changed.*float64"),
    (lambda m: m.to(memory_format=torch.channels_last), r"strides changed.*channels_last"),
], ids=["half", "to-dtype", "channels_last"])
def test_conversion_after_wrapping_is_caught(convert, pattern):
    model, params, opt = wrapped()
    convert(model)
    assert not params.buffer_is_valid()
    with pytest.raises(InvalidBufferError, match=pattern) as info:
        params.assert_buffer_is_valid()
    assert "Convert the model first, then create ContiguousParams" in str(info.value)
    with pytest.raises(InvalidBufferError):
        opt.step()


def test_following_the_advice_after_a_conversion_trains_correctly():
    """Convert, then wrap again and build a new optimizer: the old wrapper fails, the new one trains."""
    ref, model = twin()
    old = ContiguousParams(model.parameters())
    old_opt = torch.optim.Adam(old.contiguous(), lr=1e-2)
    for m in (ref, model):
        m.double()
    data = [(x.double(), y) for x, y in batches()]
    new = ContiguousParams(model.parameters())
    assert new.buffer_is_valid() and not old.buffer_is_valid()
    with pytest.raises(InvalidBufferError):
        old_opt.step()
    train(ref, torch.optim.Adam(ref.parameters(), lr=1e-2), data=data)
    train(model, torch.optim.Adam(new.contiguous(), lr=1e-2), data=data)
    assert_same_params(ref, model, atol=1e-12, rtol=1e-10)


def test_noop_conversions_keep_the_buffer_valid():
    model, params, _ = wrapped()
    model.to("cpu").float().train()
    assert params.buffer_is_valid()


def test_device_move_is_diagnosed():
    """CPU stand-in for model.cuda(): the slot remembers another device, the data moved."""
    model, params, _ = wrapped()
    params._slots[0].key = (torch.device("cuda", 0), torch.float32)
    model[0].weight.data = model[0].weight.data.clone()
    with pytest.raises(InvalidBufferError, match=r"moved from cuda:0 to cpu.*model\.cuda\(\)"):
        params.assert_buffer_is_valid()


@requires_cuda
def test_cuda_after_wrapping_is_caught():
    model, params, opt = wrapped()
    model.cuda()
    with pytest.raises(InvalidBufferError, match=r"moved from cpu to cuda"):
        params.assert_buffer_is_valid()


def test_load_state_dict_assign_is_caught():
    model, params, opt = wrapped()
    model.load_state_dict(small_net().state_dict(), assign=True)
    with pytest.raises(InvalidBufferError, match=r"assign=True.*assign=False"):
        params.assert_buffer_is_valid()
    with pytest.raises(InvalidBufferError):
        opt.step()


def test_load_state_dict_copy_keeps_buffer_and_loads_values():
    model, params, _ = wrapped()
    other = small_net()
    model.load_state_dict(other.state_dict())
    assert params.buffer_is_valid()
    assert_same_params(other, model, atol=0, rtol=0)
    torch.testing.assert_close(params.contiguous()[0][: other[0].weight.numel()], other[0].weight.flatten())


def test_ddp_bucket_view_gradients_are_caught():
    """gradient_as_bucket_view=True replaces .grad with DDP's own buffer: simulated here on one process."""
    model, params, opt = wrapped()
    model[0].weight.grad = torch.zeros_like(model[0].weight)  # what DDP's reducer does
    with pytest.raises(InvalidBufferError, match="gradient_as_bucket_view=False"):
        params.assert_buffer_is_valid()


CREATE_GRAPH_WARNING = "ignore:Using backward\\(\\) with create_graph=True:UserWarning"


@pytest.mark.filterwarnings(CREATE_GRAPH_WARNING)
def test_create_graph_backward_is_named_as_the_cause():
    """backward(create_graph=True) replaces every .grad with a new graph-connected tensor."""
    model, params, opt = wrapped()
    x, y = batches(1)[0]
    nn.functional.cross_entropy(model(x), y).backward(create_graph=True)
    assert not params.buffer_is_valid()
    assert "torch.autograd.grad(..., create_graph=True)" in params.problem()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(InvalidBufferError, match=r"backward\(create_graph=True\) builds gradients as new graph-connected"):
        opt.step()
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))


@pytest.mark.filterwarnings(CREATE_GRAPH_WARNING)
def test_create_graph_is_listed_when_the_new_gradients_are_not_graph_connected():
    """A loss linear in a layer's output leaves plain new gradients: create_graph is still named."""
    model = nn.Linear(3, 2)
    params = ContiguousParams(model.parameters())
    model(torch.randn(4, 3)).sum().backward(create_graph=True)
    assert not any(p.grad.requires_grad for p in model.parameters())  # so no graph to recognise it by
    with pytest.raises(InvalidBufferError, match=r"outside the flat gradient buffer.*backward\(create_graph=True\)"):
        params.assert_buffer_is_valid()


def test_gradient_penalty_as_the_create_graph_message_advises_trains_correctly():
    """The advice: torch.autograd.grad(..., create_graph=True) for the penalty, backward() without it."""
    def penalised(model, opt):
        for x, y in batches():
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
            (loss + 0.1 * sum(g.pow(2).sum() for g in grads)).backward()
            opt.step()

    ref, model = twin()
    params = ContiguousParams(model.parameters())
    penalised(ref, torch.optim.Adam(ref.parameters(), lr=1e-2))
    penalised(model, torch.optim.Adam(params.contiguous(), lr=1e-2))
    assert params.buffer_is_valid()
    assert_same_params(ref, model)


# -- construction: groups, frozen parameters, dtypes, bad input ---------------------------

def test_parameter_groups_keep_their_options():
    ref, model = twin()
    groups = lambda m: [  # noqa: E731
        {"params": list(m[0].parameters()) + list(m[1].parameters()), "lr": 1e-3, "weight_decay": 0.0},
        {"params": list(m[5].parameters()) + list(m[7].parameters()), "lr": 1e-2, "weight_decay": 0.5},
    ]
    ref_opt = torch.optim.AdamW(groups(ref), foreach=False)
    params = ContiguousParams(groups(model))
    flat_groups = params.contiguous()
    assert [g["lr"] for g in flat_groups] == [1e-3, 1e-2]
    assert [g["weight_decay"] for g in flat_groups] == [0.0, 0.5]
    assert all(isinstance(p, FlatParameter) for g in flat_groups for p in g["params"])
    train(ref, ref_opt, ref.parameters())
    train(model, torch.optim.AdamW(flat_groups), params.flat_parameters())
    assert_same_params(ref, model)
    assert len(params.param_buffers) == 1  # both groups are slices of the one float32 buffer
    originals = params.original()
    assert [len(g["params"]) for g in originals] == [3, 4] and originals[1]["lr"] == 1e-2


@pytest.mark.parametrize("grouped", [False, True], ids=["list", "groups"])
def test_named_parameters_train_exactly_like_parameters(grouped):
    """model.named_parameters(), a generator read once, alone or in group dicts, as torch.optim takes it."""
    def wrap(model, get):
        if not grouped:
            return ContiguousParams(get(model))
        return ContiguousParams([{"params": get(model[0]), "lr": 1e-3},
                                 {"params": get(model[5]), "lr": 1e-2, "weight_decay": 0.5}])

    plain_model, named_model = twin()
    plain = wrap(plain_model, nn.Module.parameters)
    named = wrap(named_model, nn.Module.named_parameters)
    assert named.num_tensors == plain.num_tensors
    originals = named.original() if not grouped else [p for g in named.original() for p in g["params"]]
    wanted = list(named_model.parameters()) if not grouped else [*named_model[0].parameters(), *named_model[5].parameters()]
    assert len(originals) == len(wanted) and all(a is b for a, b in zip(originals, wanted))
    plain_losses = train(plain_model, torch.optim.AdamW(plain.contiguous()), plain.flat_parameters())
    named_losses = train(named_model, torch.optim.AdamW(named.contiguous()), named.flat_parameters())
    assert named_losses == plain_losses
    assert_same_params(plain_model, named_model, atol=0, rtol=0)


def test_messages_use_the_names_from_named_parameters():
    model = small_net()
    params = ContiguousParams(model.named_parameters())
    model[0].weight.grad = torch.zeros_like(model[0].weight)
    assert "(first: parameter '0.weight', shape (8, 3, 3, 3))" in params.problem()
    model[5].bias.data = model[5].bias.data.clone()
    assert "(first: parameter '5.bias', shape (10,))" in params.problem()
    with pytest.raises(ValueError, match="parameter 'weight' is uninitialised"):
        ContiguousParams(nn.LazyLinear(3).named_parameters())


def test_mixing_named_and_plain_parameters_is_a_clear_error():
    lin = nn.Linear(2, 2)
    other = nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"the parameter list mixes \(name, parameter\) pairs with bare parameters"):
        ContiguousParams([("weight", lin.weight), lin.bias])
    with pytest.raises(TypeError, match="parameter group 1 mixes"):
        ContiguousParams([{"params": lin.named_parameters()}, {"params": [other.weight, ("bias", other.bias)]}])
    with pytest.raises(TypeError, match=r"not a \(name, parameter\) pair"):
        ContiguousParams([(lin.weight, "weight")])


def test_frozen_parameters_are_left_alone():
    ref, model = twin()
    for m in (ref, model):
        m[0].requires_grad_(False)
    frozen_storage = model[0].weight.data_ptr()
    params = ContiguousParams(model.parameters())
    assert params.num_tensors == 6
    assert model[0].weight.data_ptr() == frozen_storage  # not copied into the buffer
    assert all(p is not model[0].weight for p in params.original())
    train(ref, torch.optim.Adam([p for p in ref.parameters() if p.requires_grad], lr=1e-2))
    train(model, torch.optim.Adam(params.contiguous(), lr=1e-2))
    assert_same_params(ref, model)
    assert model[0].weight.grad is None


def frozen_first_layer(model: nn.Module) -> nn.Module:
    model[0].requires_grad_(False)  # the conv (the "backbone"); BatchNorm and the head train
    return model


def wrapped_frozen_then_unfrozen():
    """Gradual unfreezing: two Adam steps with the conv frozen, then the conv unfrozen."""
    model = frozen_first_layer(small_net())
    wrapper = ContiguousParams(model.parameters())
    opt = torch.optim.Adam(wrapper.contiguous(), lr=1e-2)
    train(model, opt, data=batches(2))
    model[0].requires_grad_(True)
    return model, wrapper, opt


def test_unfreezing_a_parameter_wrapped_as_frozen_is_caught_by_name():
    """Gradual unfreezing: the unfrozen parameter is not in the buffer, so step() must not go on silently."""
    model = frozen_first_layer(small_net())
    model[1].requires_grad_(False)  # BatchNorm frozen too, and it stays frozen
    params = ContiguousParams(model.named_parameters())
    opt = torch.optim.Adam(params.contiguous(), lr=1e-2)
    train(model, opt, data=batches(2))
    model[0].requires_grad_(True)
    assert not params.buffer_is_valid()
    one_backward(model)
    assert model[0].weight.grad is not None  # autograd gives it a gradient no optimizer reads
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(InvalidBufferError, match=(
            r"1 of 3 parameters that were frozen .* now require grad \(first: parameter '0\.weight', "
            r"shape \(8, 3, 3, 3\)\).*build ContiguousParams and the optimizer again.*per-tensor optimizer")):
        opt.step()
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    unnamed_model = frozen_first_layer(small_net())
    unnamed = ContiguousParams(unnamed_model.parameters())
    unnamed_model[0].requires_grad_(True)
    assert "(first: parameter 0 of the list, shape (8, 3, 3, 3))" in unnamed.problem()


def test_after_unfreezing_a_new_wrapper_trains_like_a_per_tensor_optimizer():
    """The message's first fix: ContiguousParams and optimizer built again take over, bit for bit."""
    model, _, old_opt = wrapped_frozen_then_unfrozen()
    with pytest.raises(InvalidBufferError, match="now require grad"):
        train(model, old_opt, data=batches(1))
    ref = small_net()
    ref.load_state_dict(model.state_dict())  # the same point, for a per-tensor optimizer from here on
    unfrozen_at = model[0].weight.detach().clone()
    new = ContiguousParams(model.parameters())
    assert new.num_tensors == 7 and new.buffer_is_valid()
    data = batches(4)
    train(ref, torch.optim.Adam(ref.parameters(), lr=1e-2), data=data)
    train(model, torch.optim.Adam(new.contiguous(), lr=1e-2), data=data)
    assert_same_params(ref, model, atol=0, rtol=0)
    assert not torch.equal(unfrozen_at, model[0].weight)  # the unfrozen conv did train
    with pytest.raises(InvalidBufferError, match="no longer live in the flat buffer"):
        old_opt.step()  # the old wrapper's parameters moved to the new one


def test_unfrozen_parameters_added_as_a_new_wrapper_are_taken_over():
    """Wrapping only the unfrozen parameters and add_param_group: the first wrapper stops reporting them."""
    model, head, opt = wrapped_frozen_then_unfrozen()
    backbone = ContiguousParams(model[0].parameters())
    opt.add_param_group({"params": backbone.contiguous()})
    assert head.buffer_is_valid() and backbone.buffer_is_valid()
    start = model[0].weight.detach().clone()
    train(model, opt, data=batches(2))
    assert not torch.equal(start, model[0].weight)


def test_parameters_that_stay_frozen_cause_no_error():
    """Frozen at wrapping and at every step: valid, never moved, never given a gradient."""
    model = frozen_first_layer(small_net())
    params = ContiguousParams(model.named_parameters())
    opt = torch.optim.AdamW(params.contiguous(), lr=1e-2, weight_decay=0.5)
    start = model[0].weight.detach().clone()
    train(model, opt)
    model[0].requires_grad_(True)  # unfrozen for a moment between steps, frozen again before the next
    model[0].requires_grad_(False)
    train(model, opt, data=batches(2))
    params.assert_buffer_is_valid()
    assert torch.equal(start, model[0].weight) and model[0].weight.grad is None


def test_freezing_a_wrapped_parameter_is_not_reported_and_rewrapping_leaves_it_out():
    """Documented: frozen after wrapping, it stays in the buffer with a zero gradient, so AdamW's
    momentum and weight decay keep moving it; a new wrapper built after freezing leaves it out."""
    model = small_net()
    params = ContiguousParams(model.parameters())
    opt = torch.optim.AdamW(params.contiguous(), lr=1e-2, weight_decay=0.5)
    train(model, opt, data=batches(2))
    model[0].requires_grad_(False)
    frozen = model[0].weight.detach().clone()
    train(model, opt, data=batches(2))
    assert params.buffer_is_valid()
    assert not torch.equal(frozen, model[0].weight)  # moved although frozen: momentum and decay
    new = ContiguousParams(model.parameters())
    assert new.num_tensors == 6
    frozen = model[0].weight.detach().clone()
    train(model, torch.optim.AdamW(new.contiguous(), lr=1e-2, weight_decay=0.5), data=batches(2))
    assert torch.equal(frozen, model[0].weight)


def test_one_buffer_per_device_and_dtype():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).double(), nn.Linear(4, 4))
    params = ContiguousParams(model.parameters())
    assert sorted(str(k[1]) for k in params.param_buffers) == ["torch.float32", "torch.float64"]
    flats = params.contiguous()
    assert len(flats) == 2 and {f.dtype for f in flats} == {torch.float32, torch.float64}
    f32 = params.param_buffers[(torch.device("cpu"), torch.float32)]
    for p in (*model[0].parameters(), *model[2].parameters()):
        assert p.untyped_storage().data_ptr() == f32.untyped_storage().data_ptr()


def test_parameters_are_aligned_and_padding_stays_zero():
    model = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 7), nn.Linear(7, 2))  # odd sizes
    params = ContiguousParams(model.parameters())
    assert all(p.data_ptr() % 64 == 0 and p.grad.data_ptr() % 64 == 0 for p in model.parameters())
    opt = torch.optim.AdamW(params.contiguous(), lr=0.1, weight_decay=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(2, 3)).sum().backward()
        opt.step()
    buf = params.param_buffers[(torch.device("cpu"), torch.float32)]
    used = torch.zeros(buf.numel(), dtype=torch.bool)
    for p in model.parameters():
        start = (p.data_ptr() - buf.data_ptr()) // 4
        used[start:start + p.numel()] = True
    assert used.sum() == params.num_parameters
    assert torch.all(buf[~used] == 0)


def test_channels_last_model_stays_channels_last():
    ref, model = twin()
    for m in (ref, model):
        m.to(memory_format=torch.channels_last)
    params = ContiguousParams(model.parameters())
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert model[0].weight.grad.stride() == model[0].weight.stride()
    train(ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9))
    train(model, torch.optim.SGD(params.contiguous(), lr=0.1, momentum=0.9))
    assert_same_params(ref, model)


def test_existing_gradients_are_kept():
    model = small_net()
    one_backward(model)
    grads = [p.grad.clone() for p in model.parameters()]
    ContiguousParams(model.parameters())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))


def test_a_consumed_parameter_generator_is_named_as_such():
    model = nn.Linear(2, 2)
    params = model.parameters()
    torch.optim.SGD(params, lr=0.1)  # reads the generator to its end
    with pytest.raises(ValueError, match="empty parameter list: the iterator yielded nothing.*already consumed"):
        ContiguousParams(params)
    group = (p for p in model.parameters())
    list(group)
    with pytest.raises(ValueError, match="parameter group 0 has no parameters: .*already consumed"):
        ContiguousParams([{"params": group, "lr": 0.1}])
    with pytest.raises(ValueError, match="empty parameter list$"):  # a list is simply empty
        ContiguousParams([])


def test_bad_input_gives_clear_errors():
    with pytest.raises(ValueError, match="empty parameter list"):
        ContiguousParams([])
    with pytest.raises(ValueError, match="empty parameter list"):
        ContiguousParams(iter([]))
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="all 2 parameters are frozen"):
        ContiguousParams(frozen.parameters())
    lin = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="more than once"):
        ContiguousParams([lin.weight, lin.weight])
    with pytest.raises(TypeError, match="single Parameter"):
        ContiguousParams(lin.weight)
    with pytest.raises(TypeError, match="not a tensor"):
        ContiguousParams([lin.weight, 3])
    params = ContiguousParams(lin.parameters())
    with pytest.raises(ValueError, match="already a flat buffer"):
        ContiguousParams(params.contiguous())
    with pytest.raises(ValueError, match="lazy module"):
        ContiguousParams(nn.LazyLinear(3).parameters())


@pytest.mark.parametrize("parameters,where", [(None, "got None"), (3, "got int"),
                                              ([{"params": None}], "parameter group 0 .*got None")])
def test_something_that_is_not_an_iterable_of_parameters_is_a_clear_type_error(parameters, where):
    with pytest.raises(TypeError, match=rf"{where}.*model\.parameters\(\)"):
        ContiguousParams(parameters)


@pytest.mark.parametrize("align_bytes,error,message", [
    (0, ValueError, "power of two"), (-64, ValueError, "power of two"), (48, ValueError, "power of two"),
    (3, ValueError, "power of two"), (2**36, ValueError, "at most 4096"), (8192, ValueError, "at most 4096"),
    (True, TypeError, "an int, got True"), (64.0, TypeError, "an int, got 64.0"), ("64", TypeError, "an int"),
])
def test_bad_align_bytes_is_refused_before_anything_moves(align_bytes, error, message):
    model = nn.Linear(3, 5)
    before = [p.data_ptr() for p in model.parameters()]
    with pytest.raises(error, match=f"align_bytes must be .*{message}"):
        ContiguousParams(model.parameters(), align_bytes=align_bytes)
    assert [p.data_ptr() for p in model.parameters()] == before  # refused before wrapping anything


@pytest.mark.parametrize("align_bytes", [1, 2, 16, 64, 4096])
def test_every_allowed_align_bytes_aligns_offsets_within_the_buffer(align_bytes):
    model = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 7).half(), nn.Linear(7, 2))  # odd sizes, two dtypes
    params = ContiguousParams(model.parameters(), align_bytes=align_bytes)
    for p in model.parameters():
        buf = params.param_buffers[(p.device, p.dtype)]
        offset = p.data_ptr() - buf.data_ptr()
        assert offset % max(align_bytes, p.element_size()) == 0


def _tied_by_memory(kind: str) -> list[nn.Parameter]:
    a = nn.Parameter(torch.randn(4, 3))
    if kind == "alias":  # tied weights built as two Parameter objects over one tensor
        return [a, nn.Parameter(a.data)]
    if kind == "row-view":
        return [a, nn.Parameter(a.data[1])]
    if kind == "transposed":
        return [nn.Parameter(a.data.t()), a]
    return [a, nn.Parameter(a.data, requires_grad=False)]  # "frozen-alias": it would stop seeing a's updates


@pytest.mark.parametrize("kind", ["alias", "row-view", "transposed", "frozen-alias"])
def test_parameters_sharing_memory_are_refused_instead_of_untied(kind):
    tied = _tied_by_memory(kind)
    before = [p.data_ptr() for p in tied]
    with pytest.raises(ValueError, match=r"share memory.*copying them into the flat buffer would untie them"):
        ContiguousParams(tied)
    assert [p.data_ptr() for p in tied] == before  # still tied: nothing was moved
    named = [("encoder.weight", tied[0]), ("decoder.weight", tied[1])]
    with pytest.raises(ValueError, match="parameter 'encoder.weight' and parameter 'decoder.weight' share memory"):
        ContiguousParams(named)
    with pytest.raises(ValueError, match="share memory"):  # across groups too
        ContiguousParams([{"params": [tied[0]]}, {"params": [tied[1]], "lr": 0.1}])


def test_disjoint_parameters_of_one_storage_are_wrapped():
    """Parameters that are separate pieces of one tensor (as those of an earlier ContiguousParams
    are) share no element, so copying them apart unties nothing: wrapping them again is the fix
    the conversion and unfreezing messages give."""
    ref, model = twin()
    first = ContiguousParams(model.parameters())
    again = ContiguousParams(model.parameters())
    assert again.buffer_is_valid() and not first.buffer_is_valid()
    train(ref, torch.optim.Adam(ref.parameters(), lr=1e-2))
    train(model, torch.optim.Adam(again.contiguous(), lr=1e-2))
    assert_same_params(ref, model, atol=0, rtol=0)


def test_passing_the_wrapper_to_an_optimizer_is_a_clear_error():
    params = ContiguousParams(nn.Linear(2, 2).parameters())
    with pytest.raises(TypeError, match=r"pass params\.contiguous\(\) to the optimizer"):
        torch.optim.Adam(params)


def test_clip_grad_norm_on_flat_view_equals_per_parameter_clipping():
    ref, model = twin()
    params = ContiguousParams(model.parameters())
    for m in (ref, model):
        one_backward(m)
    for norm_type in (2.0, 1.0, float("inf")):
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.1, norm_type=norm_type)
        norm = torch.nn.utils.clip_grad_norm_(params.contiguous(), 0.1, norm_type=norm_type)
        torch.testing.assert_close(norm, ref_norm, rtol=1e-6, atol=0)
        for pr, p in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(p.grad, pr.grad, rtol=1e-6, atol=1e-9)


def test_optimizer_state_dict_round_trips():
    """Checkpoint after 3 steps, resume in fresh objects, 3 more: same as 6 uninterrupted steps."""
    data = batches(6)
    straight, _ = twin()
    p_straight = ContiguousParams(straight.parameters())
    train(straight, torch.optim.Adam(p_straight.contiguous(), lr=1e-2), data=data)

    first, _ = twin()
    p_first = ContiguousParams(first.parameters())
    opt_first = torch.optim.Adam(p_first.contiguous(), lr=1e-2)
    train(first, opt_first, data=data[:3])
    model_state, opt_state = copy.deepcopy(first.state_dict()), copy.deepcopy(opt_first.state_dict())

    resumed = small_net()
    resumed.load_state_dict(model_state)
    p_resumed = ContiguousParams(resumed.parameters())
    opt_resumed = torch.optim.Adam(p_resumed.contiguous(), lr=1e-2)
    opt_resumed.load_state_dict(opt_state)
    train(resumed, opt_resumed, data=data[3:])
    assert_same_params(straight, resumed, atol=0, rtol=0)


def test_flat_parameter_deepcopy_is_unlinked():
    params = ContiguousParams(nn.Linear(2, 2).parameters())
    flat = params.contiguous()[0]
    clone = copy.deepcopy(flat)
    assert isinstance(clone, FlatParameter) and torch.equal(clone, flat)
    clone.grad = None
    assert clone.grad is None and flat.grad is not None


# -- DistributedDataParallel, gloo, 2 processes ---------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))  # same init on every rank
        params = ContiguousParams(model.parameters())  # after .to(device), before DDP
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.Adam(params.contiguous(), lr=1e-2)
        gen = torch.Generator().manual_seed(7)
        for _ in range(STEPS):
            x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
            opt.zero_grad()
            shard = slice(rank * 4, rank * 4 + 4)  # each rank sees half of the global batch
            nn.functional.cross_entropy(ddp(x[shard]), y[shard]).backward()
            torch.nn.utils.clip_grad_norm_(params.contiguous(), 0.5)
            opt.step()
        params.assert_buffer_is_valid()
        out[rank] = [p.detach().clone() for p in model.parameters()]
    finally:
        dist.destroy_process_group()


def test_distributed_data_parallel_gloo_two_processes():
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_ddp_worker, args=(2, _free_port(), out), nprocs=2, join=True)
        results = dict(out)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(7)
    for _ in range(STEPS):
        x, y = torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        opt.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()  # the full batch, one process
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        opt.step()
    for rank in (0, 1):
        for got, want in zip(results[rank], ref.parameters()):
            torch.testing.assert_close(got, want.detach(), atol=1e-5, rtol=1e-4)


# -- the benchmark (benchmarks/bench_contiguous.py) ----------------------------------------

def test_benchmark_pairs_the_variants_per_round_and_skips_what_cannot_run(monkeypatch):
    """One process measures a class (asv's setup_cache) and its track_* processes report from
    that cache: a variant that cannot run here is NaN (asv: skipped), every ratio and
    bandwidth is of one round, never of medians."""
    from benchmarks import bench_contiguous as bench  # noqa: PLC0415
    from speedbench.measure import workloads  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "contiguous_params", None)  # as where it is not installed
    for cls in (bench.AdamStep, bench.OptimizerStep, bench.Iteration):
        monkeypatch.setattr(cls, "params", (["mlp"], bench.VARIANTS))
        monkeypatch.setattr(cls, "pairs", 2)
        monkeypatch.setattr(cls, "warmup", 0)
    adam = bench.AdamStep()
    cache = adam.measure_all()
    assert cache[("mlp", "original")][0] == "skip"
    for track in (adam.track_seconds, adam.track_speedup, adam.track_step_bandwidth, adam.track_fraction_of_floor):
        assert math.isnan(track(cache, "mlp", "original"))
    assert math.isnan(adam.track_speedup(cache, "mlp", "forloop"))  # the baseline's own ratio
    forloop = adam.track_seconds(cache, "mlp", "forloop")["samples"]
    flat = adam.track_seconds(cache, "mlp", "speedlib")["samples"]
    rounds = adam.builds * math.ceil(2 / adam.builds)  # 2 rounds asked, spread over the CPU profile's builds
    assert adam.builds == 3 and len(forloop) == len(flat) == rounds == 3 and min(forloop + flat) > 0
    assert adam.track_speedup(cache, "mlp", "speedlib")["samples"] == pytest.approx([a / b for a, b in zip(forloop, flat)])
    nbytes = bench.ADAM_BYTES_PER_PARAM * sum(p.numel() for p in workloads.get("mlp").model().parameters())
    bandwidth = adam.track_step_bandwidth(cache, "mlp", "speedlib")["samples"]
    assert bandwidth == pytest.approx([nbytes / s / 1e9 for s in flat])
    floor = adam.result(cache, *bench._FLOOR)
    assert adam.track_fraction_of_floor(cache, "mlp", "speedlib")["samples"] == pytest.approx(
        [100 * b * 1e9 / floor for b in bandwidth])

    for cls in (bench.OptimizerStep, bench.Iteration):
        cache = cls().measure_all()
        assert {v: cache[("mlp", v)][0] for v in bench.VARIANTS} == {**dict.fromkeys(bench.VARIANTS, "ok"), "original": "skip"}
        assert all(len(s) == rounds and min(s) > 0 for s in cache[("mlp", "forloop")][1].values())

    memory = bench.IterationMemory()
    monkeypatch.setattr(bench.IterationMemory, "params", (["mlp"], ["speedlib"]))
    peak = memory.track_peak_memory(memory.measure_all(), "mlp", "speedlib")
    assert peak > 0 if torch.cuda.is_available() else math.isnan(peak)


# -- GPU ----------------------------------------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_equivalent_on_gpu_with_fused_optimizer(name):
    ref, model = twin(device="cuda")
    data = batches(device="cuda")
    params = ContiguousParams(model.parameters())
    train(ref, OPTIMIZERS[name](ref.parameters(), foreach=False), ref.parameters(), data=data)
    train(model, OPTIMIZERS[name](params.contiguous(), fused=True), params.contiguous(), data=data)
    assert_same_params(ref, model, atol=1e-5, rtol=1e-4)
    assert params.buffer_is_valid()
