"""The standard workloads every technique is measured on.

Each workload has a `small` size that runs on a 2-core CPU in seconds and the `full` size
used on GPUs; `default_size(device)` picks between them so that CPU and GPU results of the
same benchmark differ only by the machine, which the result's machine name records.
The parameters of a model (what an optimizer step touches) are the same at both sizes;
only the batch that forward and backward see is smaller.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from speedlib import checkpoint as cp

__all__ = ["Workload", "WORKLOADS", "get", "default_size", "mlp", "resnet50", "densenet_bc", "densenet121",
           "transformer", "set_checkpointing", "CHECKPOINT_VARIANTS", "EmbeddingBatch", "embedding"]

SIZES = ("small", "full")


@dataclass(frozen=True)
class Workload:
    """A model, a batch shape and a loss: everything one training iteration needs."""

    name: str
    size: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    num_classes: int
    # The same architecture with torch.nn / torchvision classes only, where `build` adds
    # speedlib's checkpoint hooks: what the benchmarks' plain-PyTorch variants train.
    torch_build: Callable[[], nn.Module] | None = None

    def model(self, device: torch.device | str = "cpu", seed: int = 0) -> nn.Module:
        """A freshly initialised model; the same `seed` gives the same weights on every device."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = self.build()
        return model.to(device)

    def torch_model(self, device: torch.device | str = "cpu", seed: int = 0) -> nn.Module:
        """`model(device, seed)` built with torch alone: the same weights, no speedlib class in it."""
        return dataclasses.replace(self, build=self.torch_build or self.build).model(device, seed)

    def batch(self, device: torch.device | str = "cpu", seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """A fixed synthetic (input, target) batch, generated on the CPU so it is device-independent."""
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(self.input_shape, generator=gen)
        y = torch.randint(0, self.num_classes, (self.input_shape[0],), generator=gen)
        return x.to(device), y.to(device)

    def with_batch(self, batch: int) -> Workload:
        """The same workload at another batch size."""
        if batch < 1:
            raise ValueError(f"batch must be positive, got {batch}")
        return dataclasses.replace(self, input_shape=(batch, *self.input_shape[1:]))

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target)


def _mlp_model(layers: int = 100, width: int = 128) -> nn.Module:
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))


def _resnet50_model() -> nn.Module:
    # Imported here: torchvision is heavy and only this workload needs it.
    import torchvision  # noqa: PLC0415 - torchvision: optional, heavy, only for this workload

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


# --- DenseNets and a transformer: the checkpointing workloads ---------------------------
#
# Every checkpointable piece carries a `checkpoint_variant` attribute that
# `set_checkpointing` sets, so one model object runs every variant of the checkpoint
# benchmark and the state_dict never depends on the variant.

CHECKPOINT_VARIANTS = ("none", *cp.SEGMENT_VARIANTS[1:], "sequential")


@functools.cache
def _dense_layer_class() -> type[nn.Module]:
    # Built on first use: torchvision is heavy. torchvision's layer already separates the
    # bottleneck (concatenation + BN + ReLU + 1x1 conv) that efficient DenseNet checkpoints;
    # this subclass only chooses which checkpoint runs it.
    from torchvision.models import densenet  # noqa: PLC0415 - torchvision: optional, heavy, only for this workload

    class DenseLayer(densenet._DenseLayer):
        checkpoint_variant = "none"

        def call_checkpoint_bottleneck(self, inputs: list[torch.Tensor]) -> torch.Tensor:
            params = (*self.norm1.parameters(), *self.conv1.parameters())
            return cp.run_segment(self.checkpoint_variant, lambda *f: self.bn_function(list(f)), *inputs,
                                  params=params)

    return DenseLayer


def _densenet_for_checkpointing(model: nn.Module) -> nn.Module:
    """Make a torchvision DenseNet's layers and feature stack checkpointable, in place."""
    layer_cls = _dense_layer_class()
    for m in model.modules():
        if type(m) is layer_cls.__base__:  # torchvision's own layer
            m.__class__ = layer_cls
    model.features.__class__ = cp.CheckpointedSequential
    # speedlib's BatchNorm: each step counted once whichever checkpoint reruns the layer.
    return cp.convert_batchnorm(model)


def _torch_densenet_bc(depth: int, growth_rate: int) -> nn.Module:
    import torchvision  # noqa: PLC0415 - torchvision: optional, heavy, only for this workload

    layers = (depth - 4) // 6  # 3 blocks of bottleneck layers (2 convs each) + 4 other layers
    model = torchvision.models.DenseNet(growth_rate=growth_rate, block_config=(layers,) * 3,
                                        num_init_features=2 * growth_rate, bn_size=4, drop_rate=0.0,
                                        num_classes=10)
    # The CIFAR stem of DenseNet-BC: one 3x3 convolution at full resolution, no pooling.
    model.features.conv0 = nn.Conv2d(3, 2 * growth_rate, kernel_size=3, padding=1, bias=False)
    nn.init.kaiming_normal_(model.features.conv0.weight)
    del model.features.norm0, model.features.relu0, model.features.pool0
    return model


def _densenet_bc_model(depth: int, growth_rate: int, efficient: bool) -> nn.Module:
    model = _densenet_for_checkpointing(_torch_densenet_bc(depth, growth_rate))
    return set_checkpointing(model, "speedlib" if efficient else "none")


def _torch_densenet121() -> nn.Module:
    import torchvision  # noqa: PLC0415 - torchvision: optional, heavy, only for this workload

    return torchvision.models.densenet121(weights=None)


def _densenet121_model() -> nn.Module:
    return _densenet_for_checkpointing(_torch_densenet121())


class TransformerBlock(nn.TransformerEncoderLayer):
    """A pre-norm encoder block whose forward runs under its `checkpoint_variant`."""

    checkpoint_variant = "none"

    def forward(self, src: torch.Tensor) -> torch.Tensor:
        if self.checkpoint_variant == "none" or not torch.is_grad_enabled():
            return super().forward(src)
        return cp.run_segment(self.checkpoint_variant, super().forward, src, params=tuple(self.parameters()))


class _MeanPoolClassifier(nn.Module):
    def __init__(self, width: int, num_classes: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(x.mean(dim=1)))


def _transformer_model(layers: int = 6, width: int = 512, heads: int = 8, block: type = TransformerBlock,
                       stack: type = cp.CheckpointedSequential) -> nn.Module:
    blocks = [block(width, heads, 4 * width, dropout=0.1, batch_first=True, norm_first=True) for _ in range(layers)]
    # The input projection makes the first block's input require grad, as a token
    # embedding would: reentrant checkpoint drops the gradients of a segment whose inputs
    # do not (it warns "None of the inputs have requires_grad=True").
    return stack(nn.Linear(width, width), *blocks, _MeanPoolClassifier(width, 10))


# torch.nn's own classes: the same blocks and weights without the checkpoint hooks
_torch_transformer = functools.partial(_transformer_model, block=nn.TransformerEncoderLayer, stack=nn.Sequential)


def densenet_bc(size: str = "full", *, depth: int = 100, growth_rate: int = 12, efficient: bool = False) -> Workload:
    """The CIFAR DenseNet-BC of the efficient-DenseNet tables (depth 100, k = 12: 0.77M parameters).

    efficient=True checkpoints each layer's bottleneck (concatenation + BN + ReLU + 1x1
    conv) with speedlib's checkpoint; both settings have one state_dict layout, and
    `set_checkpointing` switches an existing model. full: batch 64 at 32 x 32 (the source's
    tables also use 256: `with_batch`); small: batch 16.
    """
    _check_size(size)
    if depth < 10 or (depth - 4) % 6:
        raise ValueError(f"DenseNet-BC depth must be 6n + 4 (n >= 1), got {depth}")
    if growth_rate < 1:
        raise ValueError(f"growth_rate must be positive, got {growth_rate}")
    shape = (64, 3, 32, 32) if size == "full" else (16, 3, 32, 32)
    build = functools.partial(_densenet_bc_model, depth, growth_rate, efficient)
    return Workload("densenet_bc", size, build, shape, 10, functools.partial(_torch_densenet_bc, depth, growth_rate))


def densenet121(size: str = "full") -> Workload:
    """torchvision DenseNet-121 (8.0M parameters). full: batch 64 at 224 x 224; small: batch 4 at 64 x 64."""
    _check_size(size)
    shape = (64, 3, 224, 224) if size == "full" else (4, 3, 64, 64)
    return Workload("densenet121", size, _densenet121_model, shape, 1000, _torch_densenet121)


def transformer(size: str = "full") -> Workload:
    """An input projection and 6 pre-norm encoder blocks, width 512, 8 heads, dropout 0.1
    (19.2M parameters), on random embeddings. full: batch 32 x 256 tokens; small: batch 4 x 32 tokens."""
    _check_size(size)
    shape = (32, 256, 512) if size == "full" else (4, 32, 512)
    return Workload("transformer", size, _transformer_model, shape, 10, _torch_transformer)


def set_checkpointing(model: nn.Module, variant: str) -> nn.Module:
    """Switch a workload model to one checkpoint variant (in place; returns `model`).

    none: nothing rerun. reentrant / non_reentrant: torch.utils.checkpoint per layer
    (DenseNet: each bottleneck; transformer: each block). speedlib: speedlib.checkpoint on
    the same segments. sequential: torch.utils.checkpoint.checkpoint_sequential over the
    model's feature stack in ceil(sqrt(n)) segments.
    """
    if variant not in CHECKPOINT_VARIANTS:
        raise ValueError(f"unknown checkpoint variant {variant!r}; expected one of {CHECKPOINT_VARIANTS}")
    found = False
    for m in model.modules():
        if isinstance(m, cp.CheckpointedSequential):
            m.checkpoint_variant = variant if variant == "sequential" else "none"
            found = True
        elif hasattr(m, "checkpoint_variant"):
            m.checkpoint_variant = "none" if variant == "sequential" else variant
            if hasattr(m, "memory_efficient"):  # torchvision's DenseNet layer only checkpoints when set
                m.memory_efficient = m.checkpoint_variant != "none"
            found = True
    if not found:
        raise ValueError(f"{type(model).__name__} has no checkpointable parts; use a densenet or transformer workload")
    return model


@dataclass(frozen=True)
class EmbeddingBatch:
    """A batch of row indices into a large embedding table (SpeedTorch's benchmark shape)."""

    rows: int
    dim: int
    batch: int

    def indices(self, order: str = "random", seed: int = 0) -> torch.Tensor:
        """`batch` int64 row indices on the CPU, drawn with repeats; 'sorted' sorts the same draw."""
        if order not in ("random", "sorted"):
            raise ValueError(f"order must be 'random' or 'sorted', got {order!r}")
        idx = torch.randint(0, self.rows, (self.batch,), generator=torch.Generator().manual_seed(seed))
        return idx.sort().values if order == "sorted" else idx


def embedding(size: str = "full") -> EmbeddingBatch:
    """131072 x 128 float32 rows from a 10M-row table (5.1 GB); 1M rows (512 MB) when small,
    still far larger than any CPU cache, so random rows still miss."""
    _check_size(size)
    return EmbeddingBatch(rows=10_000_000 if size == "full" else 1_000_000, dim=128, batch=131072)


WORKLOADS: dict[str, Callable[[str], Workload]] = {
    "mlp": mlp, "resnet50": resnet50, "densenet_bc": densenet_bc, "densenet121": densenet121,
    "transformer": transformer,
}


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
