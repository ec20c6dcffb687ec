"""speedlib.ContiguousParams: equivalence with per-tensor optimizers, and every trap of the original.

Here: training against per-tensor optimizers and the original contiguous_params package, the
conversions and gradient replacements that invalidate a flat buffer (caught, with what to do),
groups, frozen parameters, dtypes, checkpoints, two gloo ranks, the benchmark
(benchmarks/bench_contiguous.py) and the GPU. Beside them: test_contiguous_hooks.py (gradients
set to None re-attached, Lightning's loops; speedlib/contiguous/hooks.py) and
test_contiguous_checks.py (the arguments refused before anything moves; speedlib/contiguous/checks.py).
"""

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
from contiguous_bits import (
    OPTIMIZERS,
    STEPS,
    assert_same_params,
    batches,
    one_backward,
    small_net,
    train,
    twin,
    wrapped,
)
from torch import nn

from benchmarks import bench_contiguous as bench
from speedbench.measure import workloads
from speedlib import ContiguousParams, FlatParameter, InvalidBufferError

requires_cuda = pytest.mark.gpu(reason="needs a CUDA GPU; the CPU variant of this test covers the logic")


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
    assert all(torch.equal(a, p) for a, p in zip(after_first, model.parameters(), strict=True))


def _keep_gradients(optimizer):
    """The original package's loop: gradients zeroed in place, never set to None."""
    optimizer.zero_grad(set_to_none=False)


def test_matches_original_package_on_its_intended_loop():
    """Drop-in: same API, same result as contiguous_params with zero_grad(set_to_none=False)."""
    original = pytest.importorskip("contiguous_params", reason="contiguous_params is not installed")
    ours_model, theirs_model = twin()
    ours = ContiguousParams(ours_model.parameters())
    theirs = original.ContiguousParams(theirs_model.parameters())
    train(theirs_model, torch.optim.Adam(theirs.contiguous(), lr=1e-2), theirs.contiguous(), zero=_keep_gradients)
    train(ours_model, torch.optim.Adam(ours.contiguous(), lr=1e-2), ours.contiguous(), zero=_keep_gradients)
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
    data = batches(6)
    theirs, _ = twin()
    theirs_params = original.ContiguousParams(theirs.parameters())
    theirs_opt = torch.optim.Adam(theirs_params.contiguous(), lr=1e-2)
    train(theirs, theirs_opt, data=data[:3], zero=_keep_gradients)
    model_state, opt_state = copy.deepcopy(theirs.state_dict()), copy.deepcopy(theirs_opt.state_dict())
    train(theirs, theirs_opt, data=data[3:], zero=_keep_gradients)

    ours = small_net()
    ours.load_state_dict(model_state)
    params = ContiguousParams(ours.parameters(), align_bytes=1)
    opt = torch.optim.Adam(params.contiguous(), lr=1e-2)
    opt.load_state_dict(opt_state)
    train(ours, opt, data=data[3:])
    assert_same_params(theirs, ours, atol=0, rtol=0)


# -- invalidation is caught, with a message that says what happened and how to fix it ----

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
    with pytest.raises(InvalidBufferError,
                       match=r"backward\(create_graph=True\) builds gradients as new graph-connected"):
        opt.step()
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


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


# -- construction: groups, frozen parameters, dtypes --------------------------------------

def test_parameter_groups_keep_their_options():
    ref, model = twin()

    def groups(m):
        return [
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
    wanted = (list(named_model.parameters()) if not grouped
              else [*named_model[0].parameters(), *named_model[5].parameters()])
    assert len(originals) == len(wanted) and all(a is b for a, b in zip(originals, wanted, strict=True))
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
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
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
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))


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
        for pr, p in zip(ref.parameters(), model.parameters(), strict=True):
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
        for got, want in zip(results[rank], ref.parameters(), strict=True):
            torch.testing.assert_close(got, want.detach(), atol=1e-5, rtol=1e-4)


# -- the benchmark (benchmarks/bench_contiguous.py) ----------------------------------------

def test_benchmark_pairs_the_variants_per_round_and_skips_what_cannot_run(monkeypatch):
    """One process measures a class (asv's setup_cache) and its track_* processes report from
    that cache: a variant that cannot run here is NaN (asv: skipped), every ratio and
    bandwidth is of one round, never of medians."""
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
    assert adam.track_speedup(cache, "mlp", "speedlib")["samples"] == pytest.approx(
        [a / b for a, b in zip(forloop, flat, strict=True)])
    nbytes = bench.ADAM_BYTES_PER_PARAM * sum(p.numel() for p in workloads.get("mlp").model().parameters())
    bandwidth = adam.track_step_bandwidth(cache, "mlp", "speedlib")["samples"]
    assert bandwidth == pytest.approx([nbytes / s / 1e9 for s in flat])
    floor = adam.result(cache, *bench._FLOOR)
    assert adam.track_fraction_of_floor(cache, "mlp", "speedlib")["samples"] == pytest.approx(
        [100 * b * 1e9 / floor for b in bandwidth])

    for cls in (bench.OptimizerStep, bench.Iteration):
        cache = cls().measure_all()
        assert ({v: cache[("mlp", v)][0] for v in bench.VARIANTS}
                == {**dict.fromkeys(bench.VARIANTS, "ok"), "original": "skip"})
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
