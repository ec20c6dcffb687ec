"""The Tuning Guide's knobs: each one on must give what it gives off (bitwise where the maths
allows), and the traps each one hides must be handled."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from benchmarks import bench_tuning as bench
from benchmarks import common
from speedbench.measure import instruments, workloads
from speedbench.report import TECHNIQUES
from speedlib import amp, tuning

HAS_CUDA = torch.cuda.is_available()
REPO = Path(__file__).resolve().parents[1]
needs_cuda = pytest.mark.gpu(reason="needs a CUDA GPU; the CPU tests above cover the logic")


def _cnn(bias: bool = False) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=bias), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1, bias=bias), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Dropout(0.2), nn.Linear(32, 10))


def _batch(n: int = 8, seed: int = 1, hw: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, hw, hw, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_same(a: dict, b: dict, **tol) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if tol:
            torch.testing.assert_close(a[k], b[k], **tol, msg=lambda m, k=k: f"{k}: {m}")
        else:
            assert torch.equal(a[k], b[k]), k


# --- data_loader -------------------------------------------------------------------------

def test_knobs_name_off_as_the_baseline():
    assert all(v[0] == TECHNIQUES["tuning"].baseline for v in tuning.KNOBS.values() if v)


def test_workers_give_the_same_batches_as_the_main_process():
    data = tuning.SyntheticImages(n=4, size=48, crop=32, length=12)
    x0, y0 = data[5]
    assert x0.shape == (3, 32, 32) and x0.dtype == torch.float32 and -3 < x0.mean() < 3
    assert torch.equal(data[5][0], x0), "an item must not depend on when it is read"
    assert not torch.equal(data[1][0], data[5][0]), "items 1 and 5 share a JPEG but not the augmentation"
    main = list(tuning.loader(data, 5, "off"))
    workers = list(tuning.loader(data, 5, "workers", workers=2))
    assert [len(y) for _, y in main] == [5, 5, 2]
    for (a, ya), (b, yb) in zip(main, workers, strict=True):
        assert torch.equal(a, b) and torch.equal(ya, yb)


def test_data_loader_errors():
    data = tuning.SyntheticImages(n=2, size=16, crop=8)
    with pytest.raises(IndexError):
        data[2]
    with pytest.raises(ValueError, match="size >= crop"):
        tuning.SyntheticImages(n=2, size=8, crop=16)
    with pytest.raises(ValueError, match="unknown data_loader variant"):
        tuning.loader(data, 2, "fast")
    with pytest.raises(ValueError, match="workers must be >= 1"):
        tuning.loader(data, 2, "workers", workers=0)
    if not HAS_CUDA:
        with pytest.raises(ValueError, match="pin_memory needs a CUDA device"):
            tuning.loader(data, 2, "pin_memory")


@needs_cuda
def test_pinned_batches_are_pinned_and_equal():
    data = tuning.SyntheticImages(n=4, size=48, crop=32, length=8)
    plain, pinned = tuning.loader(data, 4, "off"), tuning.loader(data, 4, "workers_pin_memory")
    for (a, ya), (b, yb) in zip(plain, pinned, strict=True):
        assert b.is_pinned() and torch.equal(a, b) and torch.equal(ya, yb)


# --- inference ---------------------------------------------------------------------------

def test_evaluation_modes_give_bitwise_equal_outputs_and_keep_no_activations():
    model, (x, _) = _cnn().eval(), _batch()
    outs = {v: tuning.evaluate(model, x, v) for v in tuning.KNOBS["inference"]}
    assert all(torch.equal(outs["off"], o) for o in outs.values())
    assert outs["off"].grad_fn is not None and outs["no_grad"].grad_fn is None and outs["inference_mode"].is_inference()
    params = list(model.parameters())
    assert instruments.saved_tensor_bytes(lambda: tuning.evaluate(model, x, "off"), params) > 0
    for v in ("no_grad", "inference_mode"):
        assert instruments.saved_tensor_bytes(lambda v=v: tuning.evaluate(model, x, v), params) == 0
    with pytest.raises(ValueError, match="unknown inference variant"):
        tuning.evaluate(model, x, "fast")


# --- conv_bias ---------------------------------------------------------------------------

def _biased_pair(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    """A CNN with non-zero conv biases and non-trivial running statistics, and a copy."""
    torch.manual_seed(seed)
    model = _cnn(bias=True)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Conv2d):
                m.bias.uniform_(-2, 2)
    model.train()
    for s in range(3):
        model(_batch(seed=10 + s)[0])
    return model, copy.deepcopy(model)


def _train(model: nn.Module, steps: int = 4) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for s in range(steps):
        x, y = _batch(seed=20 + s)
        torch.manual_seed(s)  # the same dropout mask for both models
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def test_removing_conv_bias_keeps_train_and_eval_outputs():
    original, stripped = _biased_pair()
    assert tuning.remove_conv_bias(stripped) == ["0", "3"]
    assert all(m.bias is None for m in stripped.modules() if isinstance(m, nn.Conv2d))
    assert len(list(stripped.parameters())) == len(list(original.parameters())) - 2
    x, _ = _batch(seed=3)
    for mode in ("eval", "train"):
        getattr(original, mode)(), getattr(stripped, mode)()
        torch.manual_seed(0)
        a = original(x)
        torch.manual_seed(0)
        b = stripped(x)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=f"{mode} mode")
    # Training on: the folded running mean keeps following the same statistics.
    _train(original), _train(stripped)
    original.eval(), stripped.eval()
    torch.testing.assert_close(stripped(x), original(x), rtol=1e-4, atol=1e-4)


def test_without_the_fold_eval_outputs_would_shift():
    """The trap the fold avoids: dropping the bias alone changes evaluation."""
    original, naive = _biased_pair()
    for m in naive.modules():
        if isinstance(m, nn.Conv2d):
            m.register_parameter("bias", None)
    x, _ = _batch(seed=3)
    assert not torch.allclose(naive.eval()(x), original.eval()(x), atol=1e-3)


class _Branchy(nn.Module):
    """Pairs fx must not touch: a conv whose output is also used elsewhere, a conv called
    twice, and a norm over a different width; plus one clean pair in a Sequential."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Conv2d(3, 3, 1)
        self.bn_shared = nn.BatchNorm2d(3)
        self.reused = nn.Conv2d(3, 3, 1)
        self.bn_reused = nn.BatchNorm2d(3)
        self.clean = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))

    def forward(self, x):
        h = self.shared(x)
        x = self.bn_shared(h) + h
        x = self.bn_reused(self.reused(self.reused(x)))
        return self.clean(x)


class _Untraceable(_Branchy):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: fx cannot trace this
            x = -x
        return super().forward(x)


@pytest.mark.parametrize("cls", [_Branchy, _Untraceable])
def test_conv_bias_is_removed_only_where_the_norm_cancels_it(cls):
    model = cls()
    assert tuning.remove_conv_bias(model) == ["clean.0"]
    assert model.shared.bias is not None and model.reused.bias is not None


# --- zero_grad ---------------------------------------------------------------------------

def _train_clearing(variant: str, frozen_branch: bool) -> dict:
    torch.manual_seed(0)
    model = nn.ModuleDict({"used": nn.Linear(6, 4), "unused": nn.Linear(6, 4)})
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for s in range(4):
        x = torch.randn(5, 6, generator=torch.Generator().manual_seed(s))
        loss = model["used"](x).square().mean()
        if not frozen_branch or s == 0:  # the unused branch gets a gradient in step 0 only
            loss = loss + model["unused"](x).square().mean()
        tuning.clear_grads(list(model.parameters()), variant)
        loss.backward()
        opt.step()
    return _state(model)


def test_grad_none_trains_bitwise_like_zeroing():
    _assert_same(_train_clearing("on", False), _train_clearing("off", False))


def test_grad_none_differs_only_for_parameters_without_gradients():
    """The guide's "slightly different numerical behavior": Adam keeps stepping a zeroed
    gradient (its moments decay) but skips a None one."""
    on, off = _train_clearing("on", True), _train_clearing("off", True)
    assert torch.equal(on["used.weight"], off["used.weight"])
    assert not torch.equal(on["unused.weight"], off["unused.weight"])
    with pytest.raises(ValueError, match="unknown zero_grad variant"):
        tuning.clear_grads([], "maybe")


# --- fused_pointwise ---------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["torchscript", "compile"])
def test_fused_gelu_matches_eager_values_and_gradients(variant):
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 3
    xs = [x.clone().requires_grad_() for _ in range(2)]
    eager, fused = tuning.pointwise("off")(xs[0]), tuning.pointwise(variant)(xs[1])
    eager.sum().backward(), fused.sum().backward()
    # The compiler may contract a*b+c into one fma: one rounding less, not bitwise equal.
    torch.testing.assert_close(fused, eager, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(eager, F.gelu(x), rtol=1e-4, atol=1e-4)  # and it is GELU


def test_pointwise_rejects_unknown_variants():
    with pytest.raises(ValueError, match="unknown fused_pointwise variant"):
        tuning.pointwise("triton")


# --- channels_last and cuDNN -------------------------------------------------------------

def _step_outputs(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict]:
    out = model(x)
    F.cross_entropy(out, y).backward()
    return out, {n: p.grad for n, p in model.named_parameters()}


def test_channels_last_gives_the_same_outputs_and_gradients():
    torch.manual_seed(0)
    model, (x, y) = _cnn().train(), _batch(hw=12)
    other = copy.deepcopy(model)
    other, xc = tuning.to_channels_last(other, x)
    assert xc.is_contiguous(memory_format=torch.channels_last) and torch.equal(xc, x)
    torch.manual_seed(1)
    a, ga = _step_outputs(model, x, y)
    torch.manual_seed(1)
    b, gb = _step_outputs(other, xc, y)
    # Different convolution kernels sum in a different order: equal to float32 rounding.
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    _assert_same(gb, ga, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="4-D"):
        tuning.to_channels_last(model, torch.zeros(2, 3, 4))


def test_cudnn_benchmark_flag_is_restored_even_on_error():
    before = torch.backends.cudnn.benchmark
    with tuning.cudnn_benchmark(not before):
        assert torch.backends.cudnn.benchmark is (not before)
    assert torch.backends.cudnn.benchmark is before
    with pytest.raises(RuntimeError), tuning.cudnn_benchmark(not before):
        raise RuntimeError("boom")
    assert torch.backends.cudnn.benchmark is before


@needs_cuda
def test_cudnn_autotuner_and_channels_last_on_gpu():
    """TF32 off: cuDNN convolutions run in TF32 by default (10-bit mantissa), where two
    kernels (NCHW vs NHWC, heuristic vs autotuned) differ by about 1e-3 relative, far more
    than float32 rounding; the knobs under test are the memory format and the autotuner."""
    torch.manual_seed(0)
    model, (x, y) = _cnn().cuda().train(), (t.cuda() for t in _batch(hw=12))
    other = copy.deepcopy(model)
    other, xc = tuning.to_channels_last(other, x)
    with amp.tf32(False):
        with tuning.cudnn_benchmark(False):
            torch.manual_seed(1)
            a, ga = _step_outputs(model, x, y)
        with tuning.cudnn_benchmark(True):
            torch.manual_seed(1)
            b, gb = _step_outputs(other, xc, y)
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    _assert_same(gb, ga, rtol=1e-3, atol=1e-4)


# --- sync and retained_graph -------------------------------------------------------------

def _meter_setup(device: str = "cpu", train: bool = True, steps: int = 4):
    """The model, optimizer and batches made on `device` first, and the epoch as a function
    of the meter mode: a sync count of the epoch then sees no host-to-device copies."""
    torch.manual_seed(0)
    model = _cnn().to(device).train(train)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = [tuple(t.to(device) for t in _batch(seed=s)) for s in range(steps)]

    def epoch(mode: str) -> tuning.RunningLoss:
        meter = tuning.RunningLoss(mode)
        for x, y in batches:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            if train:
                opt.zero_grad()
                loss.backward()
                opt.step()
            meter.update(loss, logits, y)
        return meter

    return epoch


def _meter_epoch(mode: str, device: str = "cpu", train: bool = True, steps: int = 4) -> tuning.RunningLoss:
    return _meter_setup(device, train, steps)(mode)


def test_device_meter_equals_item_meter_bitwise():
    item, device = _meter_epoch("item"), _meter_epoch("device")
    assert isinstance(device.total, torch.Tensor) and device.total.grad_fn is None
    assert device.total.dtype == torch.float64, "float32 sums would round where Python floats do not"
    assert item.value() == device.value() and item.samples == device.samples == 32
    assert 0 <= item.value()[1] <= 32 and item.value()[0] > 0
    with pytest.raises(ValueError, match="unknown RunningLoss mode"):
        tuning.RunningLoss("lazy")


def test_keeping_the_loss_tensor_retains_every_evaluation_step():
    """Without a backward to free them, `total += loss` keeps all activations of all steps."""
    retained = {}
    for mode in ("graph", "device"):
        meters = []
        retained[mode] = instruments.saved_tensor_bytes(
            lambda mode=mode, meters=meters: meters.append(_meter_epoch(mode, train=False, steps=3)),
            alive_after=True)
    assert retained["device"] == 0
    assert retained["graph"] > 3 * 8 * 8 * 8 * 8 * 4, "at least one activation map per step"
    per_step = {n: instruments.saved_tensor_bytes(lambda n=n: _meter_epoch("graph", train=False, steps=n).total,
                                              alive_after=True) for n in (2, 4)}
    assert per_step[4] == 2 * per_step[2], "growth is linear in the number of steps"


def test_keeping_the_loss_tensor_in_training_keeps_the_graph():
    assert _meter_epoch("graph").total.grad_fn is not None
    assert _meter_epoch("graph").value() == pytest.approx(_meter_epoch("device").value(), rel=1e-12)


def test_count_syncs_counts_torch_sync_warnings_and_restores_the_mode(monkeypatch):
    """The CPU side of count_syncs: torch's debug mode is stood in for, the counting is real."""
    modes = ["default"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)

    def fn():
        for _ in range(3):
            warnings.warn(instruments.SYNC_WARNING + " (Triggered internally at ...)", UserWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)

    assert instruments.count_syncs(fn) == 3
    assert modes == ["default", "warn", 0]
    with pytest.raises(KeyError):
        instruments.count_syncs(lambda: {}["x"])
    assert modes[-1] == 0


def test_count_syncs_needs_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NotImplementedError, match="CUDA"):
        instruments.count_syncs(lambda: None)


class _WouldSync(TorchDispatchMode):
    """On CPU, the operations that make the host wait for a GPU: reading a value (.item())
    and copies between devices (blocking .to(device), as for pageable host memory)."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        devices = {t.device for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)}
        if func is torch.ops.aten._local_scalar_dense.default or len(devices) > 1:
            self.calls.append(str(func))
        return out


def test_the_counted_epoch_holds_the_meter_and_no_copies():
    """What the GPU sync test counts, checked on CPU: the device meter's epoch makes none of
    the operations that wait, the .item() meter two per step, and setting up makes the
    copies (the meta device stands in for the GPU), outside the counted epoch."""
    counts = {}
    for mode in ("item", "device"):
        epoch = _meter_setup("cpu")
        with _WouldSync() as seen:
            epoch(mode)
        counts[mode] = len(seen.calls)
    assert counts == {"item": 8, "device": 0}
    with _WouldSync() as setup:
        epoch = _meter_setup("meta")
    with _WouldSync() as counted:
        epoch("device")
    assert setup.calls and not counted.calls, counted.calls


@needs_cuda
def test_device_meter_never_waits_for_the_gpu():
    _meter_setup("cuda")("device")  # first use of cuDNN and cuBLAS (handles, workspaces) outside the count
    syncs, meters = {}, {}
    for mode in ("item", "device"):
        epoch = _meter_setup("cuda")  # model and batch copies wait too: made before counting
        syncs[mode] = instruments.count_syncs(lambda mode=mode, epoch=epoch: meters.update({mode: epoch(mode)}))
    # "item" waits twice per step (loss and hits); the training itself never waits.
    assert syncs == {"item": 8, "device": 0}
    assert instruments.count_syncs(meters["device"].value) == 2  # the loss and the hits, once


# --- create_on_device --------------------------------------------------------------------

@pytest.mark.parametrize("factory,kwargs", [(torch.zeros, {}), (torch.full, None), (torch.arange, {})])
def test_deterministic_factories_give_the_same_tensor_both_ways(factory, kwargs):
    dev = instruments.device()
    args = {"fill_value": 2.5} if kwargs is None else kwargs
    shape = (7,) if factory is torch.arange else (3, 5)
    if factory is torch.full:
        on = tuning.new_tensor(lambda *s, **k: torch.full(s, **k), shape, dev, "on", **args)
        off = tuning.new_tensor(lambda *s, **k: torch.full(s, **k), shape, dev, "off", **args)
    else:
        on, off = (tuning.new_tensor(factory, shape, dev, v, **args) for v in ("on", "off"))
    assert on.device == off.device and on.device.type == dev.type  # "cuda" names cuda:0 but is not equal to it
    assert torch.equal(on, off)
    with pytest.raises(ValueError, match="unknown create_on_device variant"):
        tuning.new_tensor(torch.zeros, (1,), dev, "auto")


# --- preallocate -------------------------------------------------------------------------

def _variable_length_training(prealloc: bool, device: str = "cpu") -> tuple[dict, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3),
                          nn.Linear(32, 4)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(5)
    if prealloc:
        longest = torch.randn(64, 16, generator=torch.Generator().manual_seed(9)).to(device)
        tuning.preallocate(model, F.cross_entropy, longest, torch.zeros(64, dtype=torch.long, device=device))
    for n in (9, 40, 3, 64, 17):
        x, y = torch.randn(n, 16, generator=gen).to(device), torch.randint(0, 4, (n,), generator=gen).to(device)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return _state(model), torch.rand(1, device=device)


def test_preallocation_leaves_training_bitwise_unchanged():
    (with_pre, rng_after), (without, rng_plain) = _variable_length_training(True), _variable_length_training(False)
    _assert_same(with_pre, without)  # BatchNorm statistics and num_batches_tracked included
    assert torch.equal(rng_after, rng_plain), "dropout's RNG must be where it would have been"


@needs_cuda
def test_preallocation_stops_reallocation_on_gpu():
    """New allocator segments (cudaMalloc calls) during variable-length training, from an
    emptied cache, with and without pre-allocation; everything else is the same in both, so
    what either legitimately allocates (a library's workspace on first use, say) cancels.
    Not asserted to be 0: the batch changes size every step, and the allocator's best-fit
    splitting of cached blocks can leave a request without one free block big enough while
    the cache holds enough in total. That fragmentation is not what pre-allocation promises
    to remove; a missing pre-allocation costs a segment per large activation and gradient."""
    _variable_length_training(True, "cuda")  # the CUDA context, kernels and cuBLAS workspace

    def new_segments(prealloc: bool) -> int:
        instruments.release_cached_memory("cuda")  # first: both runs build the model in an empty cache
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no momentum: no state to allocate later
        if prealloc:
            tuning.preallocate(model, F.cross_entropy, torch.randn(4096, 1024, device="cuda"),
                               torch.zeros(4096, dtype=torch.long, device="cuda"))
        before = instruments.allocator_segments("cuda")
        for n in (512, 4096, 128, 2048, 4000):
            x, y = torch.randn(n, 1024, device="cuda"), torch.zeros(n, dtype=torch.long, device="cuda")
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return instruments.allocator_segments("cuda") - before

    without, with_pre = new_segments(False), new_segments(True)
    assert with_pre < without and with_pre <= 2, (with_pre, without)


# --- accumulation ------------------------------------------------------------------------

def _accumulated(micro: int, batch: int = 12, model=None) -> dict:
    torch.manual_seed(0)
    model = model or nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    for s in range(3):
        gen = torch.Generator().manual_seed(s)
        x, y = torch.randn(batch, 6, generator=gen), torch.randint(0, 3, (batch,), generator=gen)
        loss = tuning.accumulation_step(model, opt, F.cross_entropy, x, y, micro)
        assert loss.grad_fn is None
    return _state(model)


@pytest.mark.parametrize("micro,batch", [(4, 12), (3, 10), (10, 10)])
def test_accumulation_matches_the_full_batch(micro, batch):
    # Sums in another order: equal to float32 rounding, not bitwise.
    _assert_same(_accumulated(micro, batch), _accumulated(1, batch), rtol=1e-5, atol=1e-6)


def test_accumulation_rejects_bad_chunk_counts():
    with pytest.raises(ValueError, match="micro_batches"):
        _accumulated(13)


def test_no_sync_all_reduces_once_per_step_under_ddp(tmp_path):
    """DistributedDataParallel (gloo, one process): same parameters, 1 all-reduce per step
    instead of one per micro-batch. Counted through a communication hook."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)))
        calls = []

        def hook(state, bucket):
            calls.append(bucket.index())
            return default_hooks.allreduce_hook(None, bucket)

        ddp.register_comm_hook(None, hook)
        accumulated = _accumulated(4, model=ddp)
    finally:
        dist.destroy_process_group()
    _assert_same({k.removeprefix("module."): v for k, v in accumulated.items()}, _accumulated(1), rtol=1e-5, atol=1e-6)
    assert len(calls) == 3 * len(set(calls)), "one all-reduce per bucket per optimizer step"


# --- the benchmark -----------------------------------------------------------------------

def test_benchmark_module_imports_no_torch():
    """asv starts a process per benchmark and parameter set; those that only report what
    setup_cache measured, or skip, must not pay for importing torch."""
    code = ("import sys; import benchmarks.bench_tuning; "
            "print(sorted(m for m in ('torch', 'speedbench.measure.instruments', 'speedbench.measure.hardware') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of the benchmark")
def test_benchmark_skips_what_needs_a_gpu(monkeypatch):
    """A class's one measuring process records what cannot run here as skips, which its
    track_* methods report as NaN (asv: skipped); the plain asv class skips from setup."""
    for cls, method, params in ((bench.PeakMemory, "track_peak_memory", ("accumulation", "on")),
                                (bench.InferenceMemory, "track_peak_memory", ("off",)),
                                (bench.SyncCount, "track_syncs", ("off",)),
                                (bench.PreallocateSegments, "track_new_segments", ("on",)),
                                (bench.CreateOnDevice, "track_seconds", ("on",))):
        bench_ = cls()
        cache = bench_.measure_all()
        assert {status for status, _ in cache.values()} == {"skip"}, cls.__name__
        assert math.isnan(getattr(bench_, method)(cache, *params)), cls.__name__
    with pytest.raises(NotImplementedError):  # asv's skip where setup raises it
        bench.CudnnBenchmark().setup("on")

    # Pinned memory: those variants are left out, the others measured.
    monkeypatch.setattr(bench, "_IMAGES", {"n": 2, "size": 40, "crop": 32, "length": 8, "batch": 4})
    monkeypatch.setattr(bench.DataLoading, "params", (["off", "workers", "pin_memory"],))
    monkeypatch.setattr(bench, "WORKERS", 1)
    monkeypatch.setattr(bench.DataLoading, "pairs", 1)
    monkeypatch.setattr(bench.DataLoading, "warmup", 0)
    loading = bench.DataLoading()
    cache = loading.measure_all()
    assert cache[("pin_memory",)] == ("skip", "pin_memory does not apply to ()")
    assert math.isnan(loading.track_seconds(cache, "pin_memory"))
    assert loading.track_speedup(cache, "workers")["samples"][0] > 0


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of the benchmark")
def test_training_step_pairs_off_and_on_per_round(monkeypatch):
    """The headline: a knob's off and on steps take turns in one process, and each round's
    ratio is off / on of that round."""
    monkeypatch.setattr(bench.TrainingStep, "params", (["zero_grad"], bench.ON_OFF))
    monkeypatch.setattr(bench.TrainingStep, "pairs", 2)
    monkeypatch.setattr(bench.TrainingStep, "warmup", 0)
    steps = bench.TrainingStep()
    cache = steps.measure_all()
    assert math.isnan(steps.track_speedup(cache, "zero_grad", "off"))  # the baseline's own ratio
    off = steps.track_seconds(cache, "zero_grad", "off")["samples"]
    on = steps.track_seconds(cache, "zero_grad", "on")["samples"]
    ratios = steps.track_speedup(cache, "zero_grad", "on")["samples"]
    assert len(off) == len(on) == len(ratios) == 2 and min(off + on) > 0
    assert ratios == pytest.approx([a / b for a, b in zip(off, on, strict=True)])  # per round, never of medians


def test_benchmark_off_model_has_a_bias_before_every_norm():
    model = bench._add_conv_bias(nn.Sequential(nn.Conv2d(3, 4, 1, bias=False), nn.BatchNorm2d(4)))
    assert model[0].bias is not None and not model[0].bias.any()
    assert tuning.remove_conv_bias(model) == ["0"]


def test_cudnn_autotuner_is_timed_in_separate_processes_only():
    """cuDNN plans are cached per process under a key without the autotuner flag, so in one
    process the first trainer to meet a shape picks the plan for both variants: the knob
    is an asv class of its own (a process per variant), never in a one-process class."""
    assert "cudnn_benchmark" in bench.STEP_KNOBS
    for cls in (bench.TrainingStep, bench.PeakMemory):
        assert sorted(cls.params[0]) == sorted(k for k in bench.STEP_KNOBS if k != "cudnn_benchmark"), cls.__name__
    assert not issubclass(bench.CudnnBenchmark, common.Measured) and not hasattr(bench.CudnnBenchmark, "setup_cache")
    assert bench.CudnnBenchmark.params == bench.ON_OFF and callable(bench.CudnnBenchmark.time_step)
    assert "Not paired" in bench.CudnnBenchmark.__doc__


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of the benchmark")
@pytest.mark.parametrize("knob", ["zero_grad", "channels_last"])
def test_the_benchmarks_plain_off_step_trains_as_the_speedlib_path_did(knob):
    """"off" moved from speedlib.tuning.clear_grads to a loop written with torch alone (issue
    40): zero-filled gradients for zero_grad's off, None for the others, so the same
    parameters, bitwise, as stepping with clear_grads did."""
    plain, before = bench._Trainer(knob, "off"), bench._Trainer(knob, "off")
    for _ in range(3):
        plain.step()
        tuning.clear_grads(before.params, "off" if knob == "zero_grad" else "on")
        before.loss_fn(before.model(before.x), before.y).backward()
        before.optimizer.step()
    start = bench._Trainer(knob, "off").model.state_dict()
    got, expected = plain.model.state_dict(), before.model.state_dict()
    assert any(not torch.equal(start[k], v) for k, v in expected.items())  # it trained
    assert all(torch.equal(got[k], v) for k, v in expected.items())


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of the benchmark")
def test_the_benchmarks_plain_item_meter_sums_as_running_loss_did():
    """Sync's "off" meter moved from RunningLoss("item") to .item() calls written with torch
    alone: the same loss sum and correct count over the same epoch."""
    plain = bench._mlp_epoch("off")()
    meter = tuning.RunningLoss("item")
    wl = workloads.get("mlp", "cpu")
    model, (x, y) = wl.torch_model(), wl.batch()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(20):
        opt.zero_grad()
        logits = model(x)
        loss = wl.loss(logits, y)
        loss.backward()
        opt.step()
        meter.update(loss, logits, y)
    assert plain == meter.value() and plain[0] > 0
    assert bench._mlp_epoch("on")() == plain  # the device meter ("on"): the same sums, kept on the device
