"""The Tuning Guide's knobs, each timed on and off in the same run (speedlib.tuning).

Every variant "off" is the baseline; everything not being measured stays at PyTorch's
defaults (cuDNN autotuner off, NCHW, gradients set to None, float32 with cuDNN's default
TF32), so each comparison changes one thing.

  TrainingStep.time_step, PeakMemory.track_peak_memory (GPUs), PairedStep.track_speedup
  (off and on taking turns in one process: the ratio, immune to drift between processes):
  a ResNet-50 training step
      conv_bias        off: a bias on every convolution before BatchNorm; on: none (torchvision)
      zero_grad        off: zero-filled gradients; on: grad = None
      channels_last    off: NCHW; on: NHWC model and input
      cudnn_benchmark  off/on: cuDNN's autotuner (GPUs only; not in PairedStep, see there)
      accumulation     off: one batch; on: the same batch in 4 micro-batches (2 on CPUs)
  Inference.time_forward, InferenceMemory.track_peak_memory (GPUs): ResNet-50 evaluation
      with autograd on ("off"), under no_grad, under inference_mode
  DataLoading.time_epoch: an epoch of SyntheticImages (JPEG decode, random resized crop,
      flip, normalise; 256 -> 224 pixels) copied to the device, with workers and/or pinned memory (pinning
      needs a GPU)
  FusedPointwise.time_gelu: forward + backward of the guide's GELU, eager / TorchScript /
      torch.compile; CompileTime.track_compile_seconds: the first call, compiler caches off
  Sync.time_epoch, SyncCount.track_syncs (GPUs): 20 training steps of the 100-layer MLP
      with a loss/accuracy meter that calls .item() every step ("off") or stays on device
  CreateOnDevice.time_create (GPUs): torch.rand(2^26) on the host then .to() vs on device
  Preallocate.time_epoch, PreallocateSegments.track_new_segments (GPUs): the transformer
      over variable sequence lengths from an emptied allocator cache, with and without a
      max-length pre-allocation pass (its cost included in the time)
  RetainedGraph.track_retained_bytes: activation bytes still alive after 8 evaluation
      steps (4 on GPUs) that sum `loss` ("off") rather than a detached value (any device, exact)
  BatchSize.track_throughput: samples/s of a ResNet-50 training step per batch size; a
      batch whose allocations fail (torch's out-of-memory error, or cuDNN's, cuBLAS's, ...
      own) is skipped with the error's short text: the end of the curve

Nothing here touches CUDA at import time.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from speedbench import measure, paired, workloads

_ON_GPU = measure.device().type == "cuda"
_TIMING = {"repeat": (3, 10, 20.0), "rounds": 2, "warm": 3} if _ON_GPU else {"repeat": (2, 8, 10.0), "rounds": 1, "warm": 1}
ON_OFF = ["off", "on"]
STEP_KNOBS = ["conv_bias", "zero_grad", "channels_last", "cudnn_benchmark", "accumulation"]
MICRO_BATCHES = 4 if _ON_GPU else 2
BATCHES = [32, 64, 128, 256, 512, 1024, 2048] if _ON_GPU else [1, 2, 4, 8]


def _tuning():
    try:
        from speedlib import tuning  # noqa: PLC0415
    except ImportError as e:  # a commit before the technique existed
        raise NotImplementedError(f"speedlib has no tuning module here: {e}") from e
    return tuning


def _add_conv_bias(model: nn.Module) -> nn.Module:
    """The "off" model: every bias-free convolution gets a (zero) bias, as nn.Conv2d's
    default would have given it; torchvision's ResNet-50 leaves them out already."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d) and m.bias is None:
            m.bias = nn.Parameter(torch.zeros(m.out_channels, device=m.weight.device))
    return model


class _Trainer:
    """A ResNet-50 (or `workload`) training step with one knob set; the rest at defaults."""

    def __init__(self, knob: str, variant: str, workload: str = "resnet50", batch: int | None = None):
        tuning = self.tuning = _tuning()
        dev = self.device = measure.device()
        on = variant == "on"
        if knob == "cudnn_benchmark" and not _ON_GPU:
            raise NotImplementedError("cuDNN's autotuner exists on CUDA devices only")
        wl = workloads.get(workload, dev)
        wl = wl.with_batch(batch) if batch else wl
        self.model = wl.model(dev)
        self.x, self.y = wl.batch(dev)
        if knob == "conv_bias" and not on:
            _add_conv_bias(self.model)
        if knob == "channels_last" and on:
            self.model, self.x = tuning.to_channels_last(self.model, self.x)
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.SGD(self.params, lr=0.01, momentum=0.9)
        self.loss_fn = wl.loss
        self.clear = "off" if knob == "zero_grad" and not on else "on"
        self.micro = MICRO_BATCHES if knob == "accumulation" and on else 1
        self.autotune = knob == "cudnn_benchmark" and on
        for _ in range(_TIMING["warm"]):  # autotuning, optimizer state, allocator pools
            self.step()
        measure.synchronize(dev)

    def step(self) -> None:
        tuning = self.tuning
        # Set per step, so that the flag of whatever ran before in this process does not leak in.
        torch.backends.cudnn.benchmark = self.autotune
        if self.micro > 1:
            tuning.accumulation_step(self.model, self.optimizer, self.loss_fn, self.x, self.y, self.micro)
            return
        tuning.clear_grads(self.params, self.clear)
        self.loss_fn(self.model(self.x), self.y).backward()
        self.optimizer.step()


_cache: dict[tuple, object] = {}


def _cached(key: tuple, build):
    """One expensive object per process (asv_runner runs setup before every timed call)."""
    if key not in _cache:
        _cache.clear()
        _cache[key] = build()
    return _cache[key]


class _Timed:
    """asv settings shared by the time_* benchmarks (a base class without benchmarks of its own)."""

    timer = staticmethod(measure.timer)  # waits for the GPU before reading the clock
    timeout = 600
    warmup_time = 0  # setup has warmed up already
    repeat, rounds = _TIMING["repeat"], _TIMING["rounds"]


class TrainingStep(_Timed):
    params = (STEP_KNOBS, ON_OFF)
    param_names = ["knob", "variant"]
    timeout = 900

    def setup(self, knob: str, variant: str) -> None:
        self.trainer = _cached(("step", knob, variant), lambda: _Trainer(knob, variant))

    def time_step(self, knob: str, variant: str) -> None:
        self.trainer.step()


PAIRS = 20 if _ON_GPU else 10
PAIRED_KNOBS = [k for k in STEP_KNOBS if k != "cudnn_benchmark"]


class PairedStep:
    """A knob's off and on trainers in one process, taking turns step by step (off first on
    even rounds, on first on odd ones), so drift of a shared machine between processes and
    over time hits both alike: the speedup is the Hodges-Lehmann estimate of off / on over
    the rounds' pairs (speedbench.paired).

    cudnn_benchmark is not paired: PyTorch caches each convolution's cuDNN plan per process
    (per thread), keyed by shapes, layout, dtype, deterministic and TF32 but not by the
    autotuner flag, and looks the cache up before reading the flag. Whichever trainer meets
    a shape first fixes the plan for both: "off", built first, caches the heuristics' plans
    and "on" never autotunes (built the other way round, "off" would run autotuned plans),
    so the ratio would be 1 by construction. TrainingStep and PeakMemory run each variant in
    a process of its own, where the flag decides.
    """

    params = PAIRED_KNOBS
    param_names = ["knob"]
    timeout = 900
    rounds = 1

    def setup(self, knob: str) -> None:
        self.pair = _cached(("paired", knob), lambda: {v: _Trainer(knob, v) for v in ON_OFF})

    def track_speedup(self, knob: str) -> float:
        def timed(variant: str):
            def one_step() -> float:
                start = measure.timer()
                self.pair[variant].step()
                return measure.timer() - start
            return one_step

        # setup built and warmed both trainers; speedbench.paired says why this estimate.
        times = paired.take_turns({v: timed(v) for v in ON_OFF}, rounds=PAIRS, warmup=0)
        return paired.paired_ratio(times["off"], times["on"]).ratio

    track_speedup.unit = "x"


class PeakMemory:
    params = (STEP_KNOBS, ON_OFF)
    param_names = ["knob", "variant"]
    timeout = 900
    rounds = 1

    def setup(self, knob: str, variant: str) -> None:
        if not _ON_GPU:
            raise NotImplementedError("peak device memory is tracked on GPUs only")
        self.trainer = _cached(("step", knob, variant), lambda: _Trainer(knob, variant))

    def track_peak_memory(self, knob: str, variant: str) -> int:
        return measure.peak_memory(self.trainer.step, self.trainer.device)

    track_peak_memory.unit = "bytes"


INFERENCE = ["off", "no_grad", "inference_mode"]


def _eval_model():
    dev = measure.device()
    wl = workloads.get("resnet50", dev)
    model = wl.model(dev).eval()
    x, _ = wl.batch(dev)
    return model, x


class Inference(_Timed):
    params = INFERENCE
    param_names = ["variant"]

    def setup(self, variant: str) -> None:
        self.tuning = _tuning()
        self.model, self.x = _cached(("eval",), _eval_model)
        for _ in range(_TIMING["warm"]):
            self.tuning.evaluate(self.model, self.x, variant)

    def time_forward(self, variant: str) -> None:
        self.tuning.evaluate(self.model, self.x, variant)


class InferenceMemory:
    params = INFERENCE
    param_names = ["variant"]
    timeout = 600
    rounds = 1

    def setup(self, variant: str) -> None:
        if not _ON_GPU:
            raise NotImplementedError("peak device memory is tracked on GPUs only")
        self.tuning = _tuning()
        self.model, self.x = _cached(("eval",), _eval_model)

    def track_peak_memory(self, variant: str) -> int:
        # Keep the output alive through the measurement, as an evaluation loop does.
        return measure.peak_memory(lambda: self.tuning.evaluate(self.model, self.x, variant), self.x.device)

    track_peak_memory.unit = "bytes"


# ImageNet-sized images (256 -> 224): 128 per epoch in batches of 32 on GPUs, 64 in batches
# of 16 on CPUs; a decode + augment takes about 10 ms each, so an epoch in the main process
# is about a second and the loading, not the copy, decides the time.
_IMAGES = {"n": 32, "size": 256, "crop": 224, "length": 128 if _ON_GPU else 64, "batch": 32 if _ON_GPU else 16}
WORKERS = min(8, os.cpu_count() or 1)


class DataLoading(_Timed):
    params = ["off", "workers", "pin_memory", "workers_pin_memory"]
    param_names = ["variant"]
    repeat, rounds = (3, 10, 30.0), 1

    def setup(self, variant: str) -> None:
        tuning = _tuning()
        if "pin_memory" in variant and not _ON_GPU:
            raise NotImplementedError("pinned memory needs a CUDA device")
        self.device = measure.device()

        def build():
            size = {k: v for k, v in _IMAGES.items() if k != "batch"}
            data = tuning.SyntheticImages(**size)
            loader = tuning.loader(data, _IMAGES["batch"], variant, workers=WORKERS)
            self._epoch_of(loader)  # starts the persistent workers
            return loader

        self.loader = _cached(("loader", variant), build)

    def _epoch_of(self, loader) -> None:
        for x, y in loader:
            x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def time_epoch(self, variant: str) -> None:
        self._epoch_of(self.loader)


_GELU_SIZE = 1 << 26 if _ON_GPU else 1 << 22


class FusedPointwise(_Timed):
    params = ["off", "torchscript", "compile"]
    param_names = ["variant"]

    def setup(self, variant: str) -> None:
        tuning = _tuning()

        def build():
            x = torch.randn(_GELU_SIZE, device=measure.device(), requires_grad=True)
            fn = tuning.pointwise(variant)
            for _ in range(3):  # TorchScript's profiling executor fuses after a few calls
                fn(x).sum().backward()
            return fn, x

        self.fn, self.x = _cached(("gelu", variant), build)

    def time_gelu(self, variant: str) -> None:
        self.fn(self.x).sum().backward()


class CompileTime:
    params = ["torchscript", "compile"]
    param_names = ["variant"]
    timeout = 600
    rounds = 1

    def setup(self, variant: str) -> None:
        self.tuning = _tuning()
        self.x = torch.randn(_GELU_SIZE, device=measure.device(), requires_grad=True)

    def track_compile_seconds(self, variant: str) -> float:
        import torch._dynamo  # noqa: PLC0415
        import torch._inductor.config  # noqa: PLC0415

        torch._dynamo.reset()
        torch._inductor.config.force_disable_caches = True  # what a first run on a new machine pays

        def first_calls():
            fn = self.tuning.pointwise(variant)
            for _ in range(3):  # as many calls as FusedPointwise warms up with
                fn(self.x).sum().backward()

        return measure.best_seconds(first_calls, self.x.device, 1)

    track_compile_seconds.unit = "seconds"


def _mlp_epoch(mode: str):
    """20 training steps of the 100-layer MLP with a RunningLoss meter, then its value."""
    tuning = _tuning()
    dev = measure.device()
    wl = workloads.get("mlp", dev)
    model = wl.model(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = wl.batch(dev)

    def epoch():
        meter = tuning.RunningLoss(mode)
        for _ in range(20):
            opt.zero_grad()
            logits = model(x)
            loss = wl.loss(logits, y)
            loss.backward()
            opt.step()
            meter.update(loss, logits, y)
        return meter.value()

    epoch()
    return epoch


_METER = {"off": "item", "on": "device"}


class Sync(_Timed):
    params = ON_OFF
    param_names = ["variant"]

    def setup(self, variant: str) -> None:
        self.epoch = _cached(("sync", variant), lambda: _mlp_epoch(_METER[variant]))

    def time_epoch(self, variant: str) -> None:
        self.epoch()


class SyncCount:
    params = ON_OFF
    param_names = ["variant"]
    timeout = 600
    rounds = 1

    def setup(self, variant: str) -> None:
        if not _ON_GPU:
            raise NotImplementedError("synchronisations are counted on CUDA devices only")
        self.epoch = _cached(("sync", variant), lambda: _mlp_epoch(_METER[variant]))

    def track_syncs(self, variant: str) -> int:
        return measure.count_syncs(self.epoch)

    track_syncs.unit = "syncs"


class CreateOnDevice(_Timed):
    params = ON_OFF
    param_names = ["variant"]

    def setup(self, variant: str) -> None:
        self.tuning = _tuning()
        if not _ON_GPU:
            raise NotImplementedError("on a CPU the host is the device: nothing to copy")
        self.device = measure.device()
        self.time_create(variant)

    def time_create(self, variant: str) -> None:
        self.tuning.new_tensor(torch.rand, (1 << 26,), self.device, variant)


def _lengths(max_len: int) -> list[int]:
    """A fixed, shuffled mix of short and long sequences, ending before the longest."""
    gen = torch.Generator().manual_seed(0)
    return [max(4, int(max_len * f)) for f in torch.rand(12, generator=gen).tolist()] + [max_len]


class _VariableLengthTraining:
    def __init__(self):
        dev = self.device = measure.device()
        self.wl = workloads.get("transformer", dev)
        self.model = self.wl.model(dev)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.x, self.y = self.wl.batch(dev)  # the longest batch; shorter ones are prefixes
        self.lengths = _lengths(self.x.shape[1])
        self.tuning = _tuning()

    def prepare(self, variant: str) -> None:
        """Empty the allocator cache, then pre-allocate when "on"."""
        measure.release_cached_memory(self.device)
        if variant == "on":
            self.tuning.preallocate(self.model, self.wl.loss, self.x, self.y)

    def train(self) -> None:
        for n in self.lengths:
            self.optimizer.zero_grad()
            self.wl.loss(self.model(self.x[:, :n]), self.y).backward()
            self.optimizer.step()

    def epoch(self, variant: str) -> None:
        """Train over the lengths from an emptied allocator cache (pre-allocating first when "on")."""
        self.prepare(variant)
        self.train()


class Preallocate(_Timed):
    params = ON_OFF
    param_names = ["variant"]
    repeat, rounds = (2, 6, 20.0), 1

    def setup(self, variant: str) -> None:
        _tuning()
        self.training = _cached(("prealloc",), _VariableLengthTraining)
        self.training.epoch(variant)

    def time_epoch(self, variant: str) -> None:
        self.training.epoch(variant)


class PreallocateSegments:
    params = ON_OFF
    param_names = ["variant"]
    timeout = 600
    rounds = 1

    def setup(self, variant: str) -> None:
        _tuning()
        if not _ON_GPU:
            raise NotImplementedError("allocator segments are counted on CUDA only")
        self.training = _cached(("prealloc",), _VariableLengthTraining)
        self.training.epoch(variant)

    def track_new_segments(self, variant: str) -> int:
        """cudaMalloc calls after the pre-allocation pass (or from the start when "off")."""
        self.training.prepare(variant)
        before = measure.allocator_segments(self.training.device)
        self.training.train()
        return measure.allocator_segments(self.training.device) - before

    track_new_segments.unit = "segments"


RETAINED_STEPS = 4 if _ON_GPU else 8  # a ResNet-50 step at batch 64 keeps about 5 GB alive


class RetainedGraph:
    params = ON_OFF
    param_names = ["variant"]
    timeout = 600
    rounds = 1

    def setup(self, variant: str) -> None:
        self.tuning = _tuning()
        self.model, self.x = _cached(("eval",), _eval_model)
        self.y = torch.zeros(self.x.shape[0], dtype=torch.long, device=self.x.device)

    def track_retained_bytes(self, variant: str) -> int:
        """Saved activations still alive after RETAINED_STEPS evaluation steps (autograd left on, as in a
        validation loop that forgot no_grad) that add each loss to a running total."""
        meter = self.tuning.RunningLoss("graph" if variant == "off" else "device")

        def loop():
            for _ in range(RETAINED_STEPS):
                meter.update(nn.functional.cross_entropy(self.model(self.x), self.y))

        return measure.saved_tensor_bytes(loop, exclude=[*self.model.parameters(), self.x], alive_after=True)

    track_retained_bytes.unit = "bytes"


class BatchSize:
    params = BATCHES
    param_names = ["batch"]
    timeout = 900
    rounds = 1

    def setup(self, batch: int) -> None:
        tuning = _tuning()
        dev = measure.device()

        def make_step(b: int):
            return _Trainer("batch_size", "defaults", batch=b).step

        point = _cached(("batch", batch), lambda: tuning.batch_size_curve(make_step, [batch], dev, repeats=3)[0])
        if point.status == "oom":
            raise NotImplementedError(f"batch {batch} does not fit, the end of the curve here: {point.reason}")
        self.point = point

    def track_throughput(self, batch: int) -> float:
        return self.point.samples_per_second

    track_throughput.unit = "samples/s"
