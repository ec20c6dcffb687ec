"""What the ContiguousParams tests share (test_contiguous, test_contiguous_hooks,
test_contiguous_checks): a small net with the shapes real models have, its twin for a
per-tensor optimizer, the batches and loop they train on, and one backward of a wrapped model."""

from __future__ import annotations

import copy

import torch
from torch import nn

from speedlib import ContiguousParams

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
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, atol=atol, rtol=rtol, msg=lambda m, name=name: f"{name}: {m}")


OPTIMIZERS = {
    "sgd-momentum": lambda ps, **kw: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3, **kw),
    "adam": lambda ps, **kw: torch.optim.Adam(ps, lr=1e-2, **kw),
    "adamw": lambda ps, **kw: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, **kw),
}


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
