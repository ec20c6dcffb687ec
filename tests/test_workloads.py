"""speedlib.workloads: sizes, determinism and the models the benchmarks rely on."""

from __future__ import annotations

import pytest
import torch

from speedlib import workloads


def test_mlp_is_the_original_benchmark_model():
    wl = workloads.get("mlp", "cpu")
    model = wl.model()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 100 and all(m.in_features == m.out_features == 128 for m in linears)
    assert wl.input_shape == (1, 128)


def test_resnet50_sizes_share_parameters():
    small, full = workloads.resnet50("small"), workloads.resnet50("full")
    assert full.input_shape == (64, 3, 224, 224) and small.input_shape[0] < 64
    n = sum(p.numel() for p in small.model().parameters())
    assert n == 25_557_032  # torchvision ResNet-50


def test_default_size_follows_the_device():
    assert workloads.default_size("cpu") == "small"
    assert workloads.default_size("cuda") == "full"
    assert workloads.get("resnet50", "cpu").size == "small"


def test_models_and_batches_are_deterministic():
    wl = workloads.get("mlp", "cpu")
    a, b = wl.model(seed=3), wl.model(seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    x1, y1 = wl.batch(seed=1)
    x2, y2 = wl.batch(seed=1)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    state = torch.random.get_rng_state()
    wl.model(seed=5)
    assert torch.equal(state, torch.random.get_rng_state())  # the caller's RNG is untouched


def test_small_resnet50_trains_one_step():
    wl = workloads.get("resnet50", "cpu")
    model = wl.model()
    x, y = wl.batch()
    loss = wl.loss(model(x), y)
    loss.backward()
    assert torch.isfinite(loss) and model.fc.weight.grad is not None


def test_bad_names_are_clear_errors():
    with pytest.raises(ValueError, match="unknown workload 'vgg'"):
        workloads.get("vgg")
    with pytest.raises(ValueError, match="unknown workload size 'huge'"):
        workloads.resnet50("huge")
