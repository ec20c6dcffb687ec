"""ContiguousParams' hooks (speedlib/contiguous/hooks.py): gradients that model.zero_grad() or an
optimizer's zero_grad(set_to_none=True) unlink are re-attached to the flat gradient, zeroed,
before backward accumulates into them or the step runs, so PyTorch Lightning's loops (zeroing
before training and inside each step's closure, gradient clipping) train like a per-tensor
optimizer; checked with a Lightning-style loop and, where installed, a real Lightning Trainer.
"""

from __future__ import annotations

import copy

import pytest
import torch
from contiguous_bits import (
    OPTIMIZERS,
    STEPS,
    assert_same_params,
    batches,
    in_grad_buffer,
    one_backward,
    small_net,
    twin,
    wrapped,
)
from torch import nn

from speedlib import ContiguousParams, InvalidBufferError

# -- gradients set to None are re-attached ---------------------------------------------------

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
    for pr, p in zip(ref.parameters(), model.parameters(), strict=True):
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
            def closure(m=m, x=x, y=y, step=step):
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
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
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
