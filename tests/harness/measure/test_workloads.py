"""speedbench.measure.workloads: sizes, determinism and the models the benchmarks rely on."""

from __future__ import annotations

import pytest
import torch

from speedbench.measure import workloads


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
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
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


def test_densenet_bc_100_is_the_papers_model_and_efficient_shares_its_layout():
    plain, efficient = workloads.densenet_bc("small"), workloads.densenet_bc("small", efficient=True)
    a, b = plain.model(seed=1), efficient.model(seed=1)
    # DenseNet-BC (L=100, k=12): 0.8M parameters in Huang et al.'s table.
    assert sum(p.numel() for p in a.parameters()) == 769_162
    assert a.state_dict().keys() == b.state_dict().keys()
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    b.load_state_dict(a.state_dict())  # weights move between the two settings
    layers = [m for m in b.modules() if hasattr(m, "memory_efficient")]
    assert len(layers) == 48 and all(m.memory_efficient and m.checkpoint_variant == "speedlib" for m in layers)
    assert a.features.conv0.kernel_size == (3, 3) and not hasattr(a.features, "pool0")  # CIFAR stem


def test_densenet_bc_validates_its_shape():
    with pytest.raises(ValueError, match="6n \\+ 4"):
        workloads.densenet_bc(depth=50)
    with pytest.raises(ValueError, match="growth_rate"):
        workloads.densenet_bc(growth_rate=0)
    small = workloads.densenet_bc("small", depth=16, growth_rate=4)
    assert sum(1 for m in small.model().modules() if hasattr(m, "memory_efficient")) == 6


def test_densenet121_and_transformer_sizes():
    assert sum(p.numel() for p in workloads.densenet121("small").model().parameters()) == 7_978_856
    full, small = workloads.transformer("full"), workloads.transformer("small")
    assert full.input_shape == (32, 256, 512) and small.input_shape[0] < 32
    assert sum(p.numel() for p in small.model().parameters()) == 19_183_114
    assert full.with_batch(8).input_shape == (8, 256, 512)
    with pytest.raises(ValueError, match="batch must be positive"):
        full.with_batch(0)


def test_set_checkpointing_switches_and_rejects():
    model = workloads.transformer("small").model()
    workloads.set_checkpointing(model, "sequential")
    assert model.checkpoint_variant == "sequential" and model[1].checkpoint_variant == "none"
    workloads.set_checkpointing(model, "reentrant")
    assert model.checkpoint_variant == "none" and model[1].checkpoint_variant == "reentrant"
    with pytest.raises(ValueError, match="unknown checkpoint variant 'magic'"):
        workloads.set_checkpointing(model, "magic")
    with pytest.raises(ValueError, match="no checkpointable parts"):
        workloads.set_checkpointing(workloads.mlp().model(), "speedlib")


def test_embedding_batch_sizes_and_orders():
    full, small = workloads.embedding("full"), workloads.embedding("small")
    assert (full.rows, full.dim, full.batch) == (10_000_000, 128, 131072)
    assert small.rows < full.rows and (small.dim, small.batch) == (128, 131072)
    idx = small.indices("random")
    assert idx.dtype == torch.int64 and idx.shape == (131072,) and 0 <= int(idx.min()) and int(idx.max()) < small.rows
    assert torch.equal(small.indices("sorted"), idx.sort().values)
    with pytest.raises(ValueError, match="order"):
        small.indices("reversed")
