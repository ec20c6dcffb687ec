"""The standard workloads every technique is measured on.

Each workload has a `small` size that runs on a 2-core CPU in seconds and the `full` size
used on GPUs; `default_size(device)` picks between them so that CPU and GPU results of the
same benchmark differ only by the machine, which the result's machine name records.
The parameters of a model (what an optimizer step touches) are the same at both sizes;
only the batch that forward and backward see is smaller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Workload", "WORKLOADS", "get", "default_size", "mlp", "resnet50"]

SIZES = ("small", "full")


@dataclass(frozen=True)
class Workload:
    """A model, a batch shape and a loss: everything one training iteration needs."""

    name: str
    size: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    num_classes: int

    def model(self, device: torch.device | str = "cpu", seed: int = 0) -> nn.Module:
        """A freshly initialised model; the same `seed` gives the same weights on every device."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = self.build()
        return model.to(device)

    def batch(self, device: torch.device | str = "cpu", seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """A fixed synthetic (input, target) batch, generated on the CPU so it is device-independent."""
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(self.input_shape, generator=gen)
        y = torch.randint(0, self.num_classes, (self.input_shape[0],), generator=gen)
        return x.to(device), y.to(device)

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target)


def _mlp_model(layers: int = 100, width: int = 128) -> nn.Module:
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))


def _resnet50_model() -> nn.Module:
    # Imported here: torchvision is heavy and only this workload needs it.
    import torchvision  # noqa: PLC0415

    return torchvision.models.resnet50(weights=None)


def mlp(size: str = "full") -> Workload:
    """The contiguous_params package's own benchmark: 100 x Linear(128, 128) at batch 1.

    It is already tiny, so both sizes are the original; it stresses per-tensor overhead
    (200 parameter tensors of at most 64 KiB each).
    """
    _check_size(size)
    return Workload("mlp", size, _mlp_model, (1, 128), 128)


def resnet50(size: str = "full") -> Workload:
    """torchvision ResNet-50 (25.6M parameters in 161 tensors).

    full: batch 64 at 224 x 224 (ImageNet training); small: batch 2 at 64 x 64.
    """
    _check_size(size)
    shape = (64, 3, 224, 224) if size == "full" else (2, 3, 64, 64)
    return Workload("resnet50", size, _resnet50_model, shape, 1000)


WORKLOADS: dict[str, Callable[[str], Workload]] = {"mlp": mlp, "resnet50": resnet50}


def _check_size(size: str) -> None:
    if size not in SIZES:
        raise ValueError(f"unknown workload size {size!r}; expected one of {SIZES}")


def default_size(device: torch.device | str) -> str:
    """`full` on GPUs, `small` everywhere else."""
    return "full" if torch.device(device).type == "cuda" else "small"


def get(name: str, device: torch.device | str = "cpu", size: str | None = None) -> Workload:
    """The workload called `name`, at `size` or the default size for `device`."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; expected one of {sorted(WORKLOADS)}")
    return WORKLOADS[name](size or default_size(device))
