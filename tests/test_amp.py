"""Precision policies: each one's loss curve against strict fp32, the scaler's overflow skip,
and padding that leaves the model's outputs unchanged."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from benchmarks import bench_amp as bench
from speedlib.amp import POLICIES, Precision, pad_linear, pad_to_multiple, tf32

HAS_CUDA = torch.cuda.is_available()
STEPS = 15
# Largest relative deviation of any step's loss from strict fp32 over STEPS steps. bfloat16
# keeps 8 mantissa bits, float16 11; a tf32 product keeps 10 (CUDA only: on CPUs the TF32
# flags change nothing, so tf32 must equal fp32 bitwise there).
TOLERANCE = {"cpu": {"tf32": 0.0, "fp16": 5e-3, "bf16": 2e-2},
             "cuda": {"tf32": 5e-3, "fp16": 5e-3, "bf16": 2e-2}}


def _model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 10))


def _loss_curve(policy: str, device: str) -> list[float]:
    torch.manual_seed(0)
    model = _model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 3, 16, 16, generator=gen).to(device)
    y = torch.randint(0, 10, (32,), generator=gen).to(device)
    precision = Precision(policy, device)
    return [precision.step(model, opt, F.cross_entropy, x, y).float().item() for _ in range(STEPS)]


def _check_curves(device: str) -> None:
    reference = _loss_curve("fp32", device)
    assert reference[-1] < 0.7 * reference[0], "the fp32 model must actually learn for the comparison to mean anything"
    for policy, tol in TOLERANCE[device].items():
        curve = _loss_curve(policy, device)
        worst = max(abs(a - b) / abs(b) for a, b in zip(curve, reference, strict=True))
        assert worst <= tol, f"{policy}: loss deviates {worst:.2e} from fp32 (tolerance {tol:.0e})"


def test_loss_curves_stay_near_fp32_on_cpu():
    _check_curves("cpu")


@pytest.mark.gpu(reason="needs a CUDA GPU; the CPU curves are checked above")
def test_loss_curves_stay_near_fp32_on_gpu():
    _check_curves("cuda")


def _fp16_setup(device: str = "cpu"):
    torch.manual_seed(0)
    model = nn.Linear(8, 4).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8, device=device), torch.randn(16, 4, device=device)
    return model, opt, x, y


def test_fp16_skips_a_step_with_overflowed_gradients_and_lowers_the_scale():
    model, opt, x, y = _fp16_setup()
    precision = Precision("fp16", "cpu", init_scale=1024.0)
    before = [p.detach().clone() for p in model.parameters()]
    precision.step(model, opt, lambda out, t: F.mse_loss(out, t) * float("inf"), x, y)
    assert precision.last_step_skipped()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert precision.scaler.get_scale() == 512.0
    precision.step(model, opt, F.mse_loss, x, y)
    assert not precision.last_step_skipped()
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_fp16_step_equals_unscaled_fp16_autocast_step():
    """The scaler multiplies and divides by a power of two: the update is the plain one."""
    model, opt, x, y = _fp16_setup()
    ref_model, ref_opt, _, _ = _fp16_setup()
    Precision("fp16", "cpu").step(model, opt, F.mse_loss, x, y)
    with torch.autocast("cpu", dtype=torch.float16):
        loss = F.mse_loss(ref_model(x), y)
    loss.backward()
    ref_opt.step()
    for a, b in zip(model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_scaler_state_round_trips():
    model, opt, x, y = _fp16_setup()
    precision = Precision("fp16", "cpu", init_scale=64.0)
    precision.step(model, opt, lambda out, t: F.mse_loss(out, t) * float("inf"), x, y)
    restored = Precision("fp16", "cpu")
    restored.load_state_dict(precision.state_dict())
    assert restored.scaler.get_scale() == 32.0
    with pytest.raises(ValueError, match="cannot load into 'bf16'"):
        Precision("bf16", "cpu").load_state_dict(precision.state_dict())


def test_policies_without_a_scaler_never_report_skips():
    for policy in ("fp32", "tf32", "bf16"):
        model, opt, x, y = _fp16_setup()
        precision = Precision(policy, "cpu")
        assert precision.scaler is None
        precision.step(model, opt, F.mse_loss, x, y)
        assert not precision.last_step_skipped()


def test_context_sets_autocast_and_tf32_as_the_policy_says():
    lin = nn.Linear(4, 4)
    for policy, dtype in (("fp32", torch.float32), ("tf32", torch.float32), ("fp16", torch.float16),
                          ("bf16", torch.bfloat16)):
        with Precision(policy, "cpu").context():
            assert lin(torch.randn(2, 4)).dtype == dtype
            assert torch.backends.cuda.matmul.allow_tf32 == (policy == "tf32")
            assert torch.backends.cudnn.allow_tf32 == (policy == "tf32")


def test_tf32_context_restores_the_flags_even_on_error():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with pytest.raises(RuntimeError):
        with tf32(not saved[0]):
            raise RuntimeError("boom")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == saved


def test_bad_arguments():
    with pytest.raises(ValueError, match="unknown precision policy 'fp8'"):
        Precision("fp8", "cpu")
    with pytest.raises(ValueError, match="device_type"):
        Precision("bf16", "mps")
    assert set(POLICIES) == {"fp32", "tf32", "fp16", "bf16"}


@pytest.mark.parametrize("init_scale,error,message", [
    (0, ValueError, "got 0"), (-1.0, ValueError, "got -1.0"), (math.nan, ValueError, "got nan"),
    (math.inf, ValueError, "got inf"), ("65536", TypeError, "got '65536'"), (True, TypeError, "got True"),
    (1e39, ValueError, "got 1e\\+39 .*float32's largest"),  # finite in Python, overflows GradScaler's float32
])
@pytest.mark.parametrize("policy", POLICIES)
def test_init_scale_must_be_a_positive_finite_number(policy, init_scale, error, message):
    """A zero scale zeroes every gradient and NaN or inf makes each look overflowed, so fp16
    would skip every step and never train; the other policies refuse it too, as a typo."""
    with pytest.raises(error, match=f"init_scale must be a positive finite number.*{message}"):
        Precision(policy, "cpu", init_scale=init_scale)
    assert Precision(policy, "cpu", init_scale=2).state_dict()["policy"] == policy


def test_pad_to_multiple():
    assert [pad_to_multiple(n) for n in (0, 1, 8, 9, 50257)] == [0, 8, 8, 16, 50264]
    assert pad_to_multiple(10, 64) == 64
    with pytest.raises(ValueError):
        pad_to_multiple(-1)
    with pytest.raises(ValueError):
        pad_to_multiple(5, 0)


@pytest.mark.parametrize("n,multiple,name", [(2.5, 8, "n"), (5, 2.5, "multiple"), ("9", 8, "n"), (True, 8, "n")])
def test_pad_to_multiple_refuses_what_is_not_an_integer(n, multiple, name):
    """2.5 used to come back as 8.0, a float where a size goes."""
    with pytest.raises(TypeError, match=f"{name} must be an integer, got {n if name == 'n' else multiple!r}"):
        pad_to_multiple(n, multiple)


@pytest.mark.parametrize("policy", ["fp16", "bf16"])
@pytest.mark.parametrize("state", ["x", None, [("policy", "fp16")]])
def test_load_state_dict_refuses_what_is_not_a_state_dict(policy, state):
    with pytest.raises(TypeError, match="state must be the dict that Precision.state_dict\\(\\) returns"):
        Precision(policy, "cpu").load_state_dict(state)


@pytest.mark.parametrize("scaler", ["x", None, {}], ids=["str", "none", "empty"])
def test_an_fp16_state_without_the_scaler_state_is_refused_by_name(scaler):
    precision = Precision("fp16", "cpu", init_scale=64.0)
    with pytest.raises(ValueError, match=r"state\['scaler'\] must be the GradScaler state"):
        precision.load_state_dict({"policy": "fp16", "scaler": scaler})
    with pytest.raises(ValueError, match=r"state\['scaler'\]"):
        precision.load_state_dict({"policy": "fp16"})
    assert precision.scaler.get_scale() == 64.0  # nothing loaded


@pytest.mark.parametrize("bias", [True, False])
def test_pad_linear_computes_the_same_outputs_and_gradients(bias):
    torch.manual_seed(0)
    linear = nn.Linear(13, 37, bias=bias)
    padded = pad_linear(linear)
    assert (padded.in_features, padded.out_features) == (16, 40)
    x = torch.randn(5, 13)
    out = linear(x)
    out_padded = padded(F.pad(x, (0, 3)))[:, :37]
    torch.testing.assert_close(out_padded, out, rtol=1e-6, atol=1e-6)
    out.square().sum().backward()
    out_padded.square().sum().backward()
    torch.testing.assert_close(padded.weight.grad[:37, :13], linear.weight.grad, rtol=1e-5, atol=1e-6)
    assert not padded.weight.grad[37:].any() and not padded.weight.grad[:, 13:].any()


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of the benchmark")
def test_benchmark_skips_what_cannot_run_and_pairs_the_rest(monkeypatch):
    """One process measures a class (setup_cache); its track_* processes report, and a
    NotImplementedError there is asv's skip, not a failure."""
    memory = bench.PeakMemory()
    assert math.isnan(memory.track_peak_memory(memory.measure_all(), "resnet50", "fp32"))  # asv: skipped
    steps = bench.TrainingStep()
    monkeypatch.setattr(bench.TrainingStep, "params", (["transformer"], bench.VARIANTS))
    monkeypatch.setattr(bench.TrainingStep, "pairs", 2)
    monkeypatch.setattr(bench.TrainingStep, "warmup", 0)
    monkeypatch.setattr(bench.TrainingStep, "builds", 1)
    cache = steps.measure_all()
    # each skip says its own reason, not only that the variant did not apply
    assert cache[("transformer", "bf16_channels_last")] == (
        "skip", "channels_last needs 4-D activations; transformer has 3-D inputs")
    # fp16 autocast has no fast CPU kernels: left to GPUs, a skip here, and the rest still pairs
    assert cache[("transformer", "fp16")] == ("skip", bench.FP16_ON_CPU)
    # on a CPU PyTorch's default precision is fp32 itself: measured on GPUs only
    assert cache[("transformer", "default")] == ("skip", bench.DEFAULT_ON_CPU)
    assert "PyTorch's default is strict fp32" in bench.DEFAULT_ON_CPU
    assert math.isnan(steps.track_seconds(cache, "transformer", "bf16_channels_last"))
    assert math.isnan(steps.track_speedup(cache, "transformer", "fp32"))
    fp32 = steps.track_seconds(cache, "transformer", "fp32")["samples"]
    bf16 = steps.track_seconds(cache, "transformer", "bf16")["samples"]
    ratios = steps.track_speedup(cache, "transformer", "bf16")["samples"]
    assert len(fp32) == len(bf16) == len(ratios) == 2 and min(fp32 + bf16) > 0
    assert ratios == pytest.approx([a / b for a, b in zip(fp32, bf16, strict=True)])  # per round, never of medians


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU behaviour of the benchmark")
def test_the_benchmarks_plain_fp32_and_default_steps_train_as_precision_fp32_did():
    """The baseline moved from speedlib.amp.Precision("fp32").step to a step written with torch
    alone (issue 40): the same maths and flags, so the same parameters, bitwise, after a few
    steps; `default` too on a CPU, where the TF32 flags change nothing."""
    before = bench._Trainer("resnet50", "fp32")
    precision = Precision("fp32", "cpu")
    plain = {v: bench._Trainer("resnet50", v) for v in bench.PLAIN_PYTORCH}
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        for _ in range(3):
            precision.step(before.model, before.optimizer, before.loss_fn, before.x, before.y)
            for trainer in plain.values():
                trainer.step()
        assert torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32  # default's, set last
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    expected = before.model.state_dict()
    assert any(not torch.equal(v, bench._Trainer("resnet50", "fp32").model.state_dict()[k])
               for k, v in expected.items())  # the steps trained: the comparison means something
    for variant, trainer in plain.items():
        got = trainer.model.state_dict()
        assert all(torch.equal(got[k], v) for k, v in expected.items()), variant
