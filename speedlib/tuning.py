"""The Performance Tuning Guide's knobs, each the same code with the knob on or off.

KNOBS names every knob and its variants; "off" is always the code as most people write
it, and the baseline the benchmarks compare against. Mixed precision lives in
speedlib.amp, activation checkpointing in speedlib.checkpoint and DistributedDataParallel in
speedlib.parallel; this module holds the rest:

  data_loader        DataLoader workers and pinned memory, on a JPEG dataset with real
                     decode and augmentation cost (SyntheticImages, loader)
  inference          torch.no_grad / torch.inference_mode for evaluation (evaluate)
  conv_bias          no conv bias directly before BatchNorm (remove_conv_bias)
  zero_grad          grad = None instead of zero-filled gradients (clear_grads)
  fused_pointwise    one GELU, eager vs TorchScript vs torch.compile (pointwise)
  channels_last      NHWC memory format for convolutional networks (to_channels_last)
  cudnn_benchmark    cuDNN's autotuner (cudnn_benchmark)
  sync               a loss/accuracy meter that never waits for the GPU (RunningLoss)
  create_on_device   factories called with device= rather than .to(device) (new_tensor)
  preallocate        one max-length forward/backward before variable-length training
  accumulation       gradient accumulation over micro-batches, `no_sync` under DDP
  retained_graph     keeping `loss` instead of `loss.item()` (RunningLoss("graph"))
  batch_size         throughput against batch size, an allocation failure ends the curve
                     (a measurement, so the curve is the harness's: speedbench.measure.batch_curve)
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from itertools import pairwise

import torch
from torch import nn

__all__ = ["KNOBS", "SyntheticImages", "loader", "evaluate", "remove_conv_bias", "clear_grads", "pointwise",
           "gelu", "to_channels_last", "cudnn_benchmark", "RunningLoss", "new_tensor", "preallocate",
           "accumulation_step"]

KNOBS: dict[str, tuple[str, ...]] = {
    "data_loader": ("off", "workers", "pin_memory", "workers_pin_memory"),
    "inference": ("off", "no_grad", "inference_mode"),
    "conv_bias": ("off", "on"),
    "zero_grad": ("off", "on"),
    "fused_pointwise": ("off", "torchscript", "compile"),
    "channels_last": ("off", "on"),
    "cudnn_benchmark": ("off", "on"),
    "sync": ("off", "on"),
    "create_on_device": ("off", "on"),
    "preallocate": ("off", "on"),
    "accumulation": ("off", "on"),
    "retained_graph": ("off", "on"),
    "batch_size": (),  # a curve, not an on/off switch
}

_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
_STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def _encode_jpeg(img: torch.Tensor) -> bytes:
    from PIL import Image  # noqa: PLC0415 - optional (speedlib needs torch alone); Pillow comes with torchvision

    buf = io.BytesIO()
    Image.fromarray(img.permute(1, 2, 0).numpy()).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _decode_jpeg(data: bytes) -> torch.Tensor:
    """JPEG bytes -> uint8 (3, H, W), through Pillow as torchvision's ImageFolder does."""
    from PIL import Image  # noqa: PLC0415 - optional (speedlib needs torch alone); Pillow comes with torchvision
    from torchvision.transforms.v2 import functional as F  # noqa: PLC0415 - optional, and heavy to import

    with Image.open(io.BytesIO(data)) as img:
        return F.pil_to_tensor(img.convert("RGB"))


class SyntheticImages(torch.utils.data.Dataset):
    """`n` random JPEG images (size x size), decoded and augmented on every access.

    The JPEG bytes are made once; each item pays for a decode, a random resized crop to
    `crop`, a random flip and normalisation, as an ImageNet pipeline does. The augmentation
    draws from a generator seeded by (seed, index), so an item is the same in the main
    process and in any worker: the knob can change speed, never the data.
    `length` repeats the images to make an epoch longer without more encoding.
    """

    def __init__(self, n: int = 32, size: int = 256, crop: int = 224, length: int | None = None, seed: int = 0):
        if n < 1 or crop < 1 or size < crop:
            raise ValueError(f"need n >= 1 and size >= crop >= 1, got n={n}, size={size}, crop={crop}")
        gen = torch.Generator().manual_seed(seed)
        # Smooth colour fields plus noise compress like photographs, not like pure noise.
        coarse = torch.rand(n, 3, 8, 8, generator=gen)
        smooth = nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
        noisy = (smooth * 200 + torch.rand(n, 3, size, size, generator=gen) * 55).to(torch.uint8)
        self.jpegs = [_encode_jpeg(img) for img in noisy]
        self.labels = torch.randint(0, 1000, (n,), generator=gen)
        self.crop, self.seed, self.length = crop, seed, length or n

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from torchvision.transforms.v2 import functional as F  # noqa: PLC0415 - optional, and heavy to import

        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} images")
        img = _decode_jpeg(self.jpegs[index % len(self.jpegs)])
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        h, w = img.shape[-2:]
        side = int(min(h, w) * (0.35 + 0.65 * torch.rand((), generator=gen).item()))
        top = int(torch.randint(0, h - side + 1, (), generator=gen))
        left = int(torch.randint(0, w - side + 1, (), generator=gen))
        img = F.resized_crop(img, top, left, side, side, [self.crop, self.crop], antialias=True)
        if torch.rand((), generator=gen) < 0.5:
            img = img.flip(-1)
        return (img.float() / 255 - _MEAN) / _STD, int(self.labels[index % len(self.labels)])


def loader(dataset: torch.utils.data.Dataset, batch_size: int, variant: str = "off", workers: int = 2,
           **kwargs) -> torch.utils.data.DataLoader:
    """A DataLoader for one `data_loader` variant; the batches are the same in all four.

    workers: the worker count of the variants that use workers (persistent, so an epoch
    does not pay for starting them). pin_memory needs CUDA: pinned batches are what make
    `.to(device, non_blocking=True)` asynchronous.
    """
    if variant not in KNOBS["data_loader"]:
        raise ValueError(f"unknown data_loader variant {variant!r}; choose one of {KNOBS['data_loader']}")
    use_workers, pin = variant in ("workers", "workers_pin_memory"), variant.endswith("pin_memory")
    if pin and not torch.cuda.is_available():
        raise ValueError("pin_memory needs a CUDA device (pinned memory is page-locked for DMA to a GPU)")
    if use_workers and workers < 1:
        raise ValueError(f"workers must be >= 1 for variant {variant!r}, got {workers}")
    n = workers if use_workers else 0
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=n, pin_memory=pin,
                                       persistent_workers=n > 0, **kwargs)


def evaluate(model: nn.Module, x: torch.Tensor, variant: str = "no_grad") -> torch.Tensor:
    """model(x) for evaluation: "off" records autograd history (and keeps every activation
    until the output dies), "no_grad" does not, "inference_mode" also skips version counters
    and view tracking (its outputs cannot be used in autograd later)."""
    if variant not in KNOBS["inference"]:
        raise ValueError(f"unknown inference variant {variant!r}; choose one of {KNOBS['inference']}")
    context = {"off": contextlib.nullcontext, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}
    with context[variant]():
        return model(x)


_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _conv_norm_pairs(model: nn.Module) -> list[tuple[str, str]]:
    """(conv, norm) module names where the norm's only input is the conv's only use.

    Traced with torch.fx so that pairs inside custom forward()s count; a model fx cannot
    trace (data-dependent control flow) falls back to neighbours inside nn.Sequential.
    """
    modules = dict(model.named_modules())
    try:
        graph = torch.fx.symbolic_trace(model).graph
    except Exception:  # noqa: BLE001 - tracing runs the model's own forward on proxies, which can raise anything
        return [(f"{name}.{a}".lstrip("."), f"{name}.{b}".lstrip("."))
                for name, m in model.named_modules() if isinstance(m, nn.Sequential)
                for (a, conv), (b, norm) in pairwise(m.named_children())
                if isinstance(conv, _CONVS) and isinstance(norm, nn.modules.batchnorm._BatchNorm)]
    calls = Counter(n.target for n in graph.nodes if n.op == "call_module")
    pairs = []
    for node in graph.nodes:
        if node.op != "call_module" or not isinstance(modules[node.target], nn.modules.batchnorm._BatchNorm):
            continue
        src = node.args[0]
        if (isinstance(src, torch.fx.Node) and src.op == "call_module" and isinstance(modules[src.target], _CONVS)
                and len(src.users) == 1 and calls[src.target] == 1 and calls[node.target] == 1):
            pairs.append((src.target, node.target))
    return pairs


def remove_conv_bias(model: nn.Module) -> list[str]:
    """Drop the bias of every convolution whose output goes straight into BatchNorm.

    In training mode BatchNorm subtracts the batch mean, which cancels a per-channel bias;
    but its running mean has absorbed the bias, so evaluation would shift by it. The bias is
    therefore folded into running_mean (running_var does not depend on a shift), and both
    modes give the same outputs, now and after further training. Call it before building
    the optimizer: the removed biases leave the model's parameters. Returns the names of
    the convolutions changed.
    """
    modules = dict(model.named_modules())
    changed = []
    for conv_name, norm_name in _conv_norm_pairs(model):
        conv, norm = modules[conv_name], modules[norm_name]
        if conv.bias is None or conv.out_channels != norm.num_features:
            continue
        with torch.no_grad():
            if norm.running_mean is not None:
                norm.running_mean -= conv.bias.to(norm.running_mean.dtype)
        conv.register_parameter("bias", None)
        changed.append(conv_name)
    return changed


def clear_grads(params: Sequence[torch.Tensor], variant: str = "on") -> None:
    """Clear gradients before the next backward. "off": fill them with zeros (a memset per
    tensor, and backward then adds into them); "on": set them to None (backward assigns).
    Both give the same training unless a parameter gets no gradient: optimizers skip a
    None gradient but step with a zero one (Adam's moments still decay)."""
    if variant not in KNOBS["zero_grad"]:
        raise ValueError(f"unknown zero_grad variant {variant!r}; choose 'off' or 'on'")
    for p in params:
        if variant == "on":
            p.grad = None
        elif p.grad is not None:
            p.grad.detach_().zero_()


def gelu(x: torch.Tensor) -> torch.Tensor:
    """The Tuning Guide's example: GELU from five pointwise operations (five kernels eagerly)."""
    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


def pointwise(variant: str = "off") -> Callable[[torch.Tensor], torch.Tensor]:
    """`gelu` eager ("off"), scripted ("torchscript": the guide's fuser, deprecated in
    recent PyTorch) or compiled ("compile": TorchInductor; compiles on first call)."""
    if variant == "off":
        return gelu
    if variant == "torchscript":
        with warnings.catch_warnings():  # measured on purpose: the guide recommends it
            warnings.filterwarnings("ignore", message=".*torch.jit.script.*deprecated", category=DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*torch.jit.script.*deprecated", category=FutureWarning)
            return torch.jit.script(gelu)
    if variant == "compile":
        return torch.compile(gelu)
    raise ValueError(f"unknown fused_pointwise variant {variant!r}; choose one of {KNOBS['fused_pointwise']}")


def to_channels_last(model: nn.Module, *inputs: torch.Tensor) -> tuple[nn.Module, ...]:
    """The model (in place) and 4-D inputs in channels_last (NHWC) memory format; the
    values are unchanged, only the strides, so cuDNN can pick NHWC Tensor Core kernels."""
    for x in inputs:
        if x.dim() != 4:
            raise ValueError(f"channels_last needs 4-D (N, C, H, W) inputs, got {x.dim()}-D")
    return (model.to(memory_format=torch.channels_last),
            *(x.contiguous(memory_format=torch.channels_last) for x in inputs))


@contextlib.contextmanager
def cudnn_benchmark(enabled: bool) -> Iterator[None]:
    """cuDNN's autotuner on or off, restored on exit. With it on, the first call per input
    shape times several convolution algorithms and later calls use the fastest: a win for
    fixed shapes, a cost for ever-changing ones. The algorithm may differ between runs, so
    results are reproducible only to rounding."""
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = enabled
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


class RunningLoss:
    """Sum of losses (and correct predictions) over an epoch, three ways.

      "item"   .item() every step: correct, but every call waits for the GPU to finish
      "graph"  `total += loss`: no wait, but `total` keeps every step's autograd graph alive
               (and, when no backward ran, every activation): memory grows each step
      "device" detached float64 sums on the device: no wait and no graph; `value()` syncs once

    "item" and "device" give bitwise equal results (both add the float32 losses in float64).
    """

    MODES = ("item", "graph", "device")

    def __init__(self, mode: str = "device"):
        if mode not in self.MODES:
            raise ValueError(f"unknown RunningLoss mode {mode!r}; choose one of {self.MODES}")
        self.mode = mode
        self.total: float | torch.Tensor = 0.0
        self.correct: int | torch.Tensor = 0
        self.samples = 0

    def update(self, loss: torch.Tensor, logits: torch.Tensor | None = None,
               target: torch.Tensor | None = None) -> None:
        hits = None if logits is None else (logits.argmax(dim=1) == target).sum()
        if self.mode == "item":
            self.total += loss.item()
            self.correct += 0 if hits is None else hits.item()
        elif self.mode == "graph":
            self.total = self.total + loss.double()
            self.correct = self.correct + (0 if hits is None else hits)
        else:
            self.total = self.total + loss.detach().double()
            self.correct = self.correct + (0 if hits is None else hits)
        self.samples += 0 if target is None else target.shape[0]

    def value(self) -> tuple[float, int]:
        """(loss sum, correct predictions) as Python numbers: the one synchronisation."""
        total = self.total.item() if isinstance(self.total, torch.Tensor) else self.total
        correct = self.correct.item() if isinstance(self.correct, torch.Tensor) else self.correct
        return float(total), int(correct)


def new_tensor(factory: Callable[..., torch.Tensor], shape: Sequence[int], device: torch.device | str,
               variant: str = "on", **kwargs) -> torch.Tensor:
    """factory(shape, device=device) ("on") or factory(shape).to(device) ("off": fills host
    memory, then copies it over PCIe). Random factories draw from the device's generator
    when "on", so the values differ from the host's; zeros, ones, full, arange do not."""
    if variant not in KNOBS["create_on_device"]:
        raise ValueError(f"unknown create_on_device variant {variant!r}; choose 'off' or 'on'")
    if variant == "on":
        return factory(*shape, device=device, **kwargs)
    return factory(*shape, **kwargs).to(device)


def preallocate(model: nn.Module, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor) -> None:
    """The guide's pre-allocation: one forward and backward on the longest batch, no
    optimizer step, so the caching allocator holds blocks big enough for every later batch.

    Nothing of it reaches training: BatchNorm statistics and every other buffer are put
    back, the RNG states (CPU and CUDA, used by dropout) are restored, and the gradients
    are set to None.
    """
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    devices = [x.device] if x.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        loss_fn(model(x), y).backward()
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    for p in model.parameters():
        p.grad = None


def accumulation_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable, x: torch.Tensor,
                      y: torch.Tensor, micro_batches: int = 1, no_sync: bool = True) -> torch.Tensor:
    """One optimizer step on the batch (x, y), in `micro_batches` chunks ("off": 1).

    Each chunk's loss is weighted by its share of the batch, so uneven chunks still average
    to the full batch's mean loss. Under DistributedDataParallel the first chunks run in
    `no_sync()`, so gradients are all-reduced once per step, not once per chunk (no_sync=False
    all-reduces after every chunk: the same result, for measuring the saving). Returns the
    batch's loss (detached; no synchronisation). BatchNorm sees micro-batch statistics, so
    only models without batch-dependent layers give the full batch's result exactly.
    """
    if micro_batches < 1 or micro_batches > x.shape[0]:
        raise ValueError(f"micro_batches must be in 1..{x.shape[0]} (the batch size), got {micro_batches}")
    optimizer.zero_grad(set_to_none=True)
    chunks = list(zip(x.tensor_split(micro_batches), y.tensor_split(micro_batches), strict=True))
    total = x.new_zeros((), dtype=torch.float32)
    for i, (xc, yc) in enumerate(chunks):
        last = i == len(chunks) - 1
        skip = no_sync and not last and hasattr(model, "no_sync")
        context = model.no_sync() if skip else contextlib.nullcontext()
        with context:
            loss = loss_fn(model(xc), yc) * (xc.shape[0] / x.shape[0])
            loss.backward()
        total += loss.detach().float()
    optimizer.step()
    return total
