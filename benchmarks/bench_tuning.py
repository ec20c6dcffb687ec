"""The Tuning Guide's knobs, each timed on and off in the same run (speedlib.tuning).

Every variant "off" is the baseline, plain PyTorch: written in this module with torch alone
(never through speedlib.tuning), the code as most people write it. The other variants ("on",
no_grad, inference_mode, workers, pin_memory, torchscript, compile) go through speedlib.tuning.
Everything not being measured stays at PyTorch's defaults (cuDNN autotuner off, NCHW,
gradients set to None, float32 with cuDNN's default TF32), so each comparison changes one
thing. The DataLoading variants share one dataset, speedlib.tuning.SyntheticImages (the
workload, not a variant's code). Time comparisons take turns in one process
(benchmarks.common.Paired): `track_seconds` is every variant's seconds per step, one sample
per round, and `track_speedup` off / variant per round (> 1: the knob helps).

  TrainingStep.track_seconds, TrainingStep.track_speedup (the headline),
  PeakMemory.track_peak_memory (GPUs): a ResNet-50 training step
      conv_bias        off: a bias on every convolution before BatchNorm; on: none (torchvision)
      zero_grad        off: zero-filled gradients; on: grad = None
      channels_last    off: NCHW; on: NHWC model and input
      accumulation     off: one batch; on: the same batch in 4 micro-batches (2 on CPUs)
  CudnnBenchmark.time_step, CudnnBenchmark.track_peak_memory (GPUs): the same step with
      cuDNN's autotuner off/on, each variant in a process of its own (not paired: see there)
  Inference.track_seconds/track_speedup, InferenceMemory.track_peak_memory (GPUs):
      ResNet-50 evaluation with autograd on ("off"), under no_grad, under inference_mode
  DataLoading.track_seconds/track_speedup: an epoch of SyntheticImages (JPEG decode,
      random resized crop, flip, normalise; 256 -> 224 pixels) copied to the device, with
      workers and/or pinned memory (pinning needs a GPU)
  FusedPointwise.track_seconds/track_speedup: forward + backward of the guide's GELU, eager
      ("off") / TorchScript / torch.compile; CompileTime.track_compile_seconds: the first
      calls, compiler caches off
  Sync.track_seconds/track_speedup, SyncCount.track_syncs (GPUs): 20 training steps of the
      100-layer MLP with a loss/accuracy meter that calls .item() every step ("off") or
      stays on device
  CreateOnDevice.track_seconds/track_speedup (GPUs): torch.rand(2^26) on the host then
      .to() ("off") vs on device
  Preallocate.track_seconds/track_speedup, PreallocateSegments.track_new_segments (GPUs):
      the transformer over variable sequence lengths from an emptied allocator cache,
      without ("off") and with a max-length pre-allocation pass (its cost included in the time)
  RetainedGraph.track_retained_bytes: activation bytes still alive after 8 evaluation
      steps (4 on GPUs) that sum `loss` ("off") rather than a detached value (any device, exact)
  BatchSize.track_throughput: samples/s of a ResNet-50 training step per batch size; a
      batch whose allocations fail (torch's out-of-memory error, or cuDNN's, cuBLAS's, ...
      own) is skipped with the error's short text: the end of the curve (larger batches
      are not tried)

Nothing here imports torch or touches CUDA at import time (benchmarks.common says why).
"""

from __future__ import annotations

import functools
import os

from benchmarks import common

# The variants written with torch alone in this module (tests/test_baselines.py runs their
# steps and fails on any speedlib code); BatchSize's curve steps the same plain code.
PLAIN_PYTORCH = ("off",)
ON_OFF = ["off", "on"]
STEP_KNOBS = ["conv_bias", "zero_grad", "channels_last", "cudnn_benchmark", "accumulation"]
# cudnn_benchmark cannot take turns with its "off" in one process (CudnnBenchmark says why).
PAIRED_KNOBS = [k for k in STEP_KNOBS if k != "cudnn_benchmark"]
MICRO_BATCHES = common.pick(cpu=2, gpu=4)
BATCHES = common.pick(cpu=[1, 2, 4, 8], gpu=[32, 64, 128, 256, 512, 1024, 2048])
# Steps run before anything is measured where no paired warm-up rounds do it (memory counts,
# the asv-timed CudnnBenchmark, the batch-size curve): autotuning, optimizer state, pools.
WARM = common.pick(cpu=1, gpu=3)


def _device():
    """The device to measure on, checked against the profile chosen without torch."""
    from speedbench import measure  # noqa: PLC0415 - in the measuring process only

    dev = measure.device()
    common.check_profile(dev)
    return dev


def _add_conv_bias(model):
    """The "off" model: every bias-free convolution gets a (zero) bias, as nn.Conv2d's
    default would have given it; torchvision's ResNet-50 leaves them out already."""
    import torch  # noqa: PLC0415 - torch: the measuring process only
    from torch import nn  # noqa: PLC0415 - torch: the measuring process only

    for m in model.modules():
        if isinstance(m, nn.Conv2d) and m.bias is None:
            m.bias = nn.Parameter(torch.zeros(m.out_channels, device=m.weight.device))
    return model


class _Trainer:
    """A ResNet-50 (or `workload`) training step with one knob set; the rest at defaults.
    "off" (and BatchSize's "defaults") steps with torch alone, "on" through speedlib.tuning."""

    def __init__(self, knob: str, variant: str, workload: str = "resnet50", batch: int | None = None):
        import torch  # noqa: PLC0415 - torch: the measuring process only

        from speedbench.measure import workloads  # noqa: PLC0415 - torch: the measuring process only

        on = variant == "on"
        tuning = self.tuning = common.technique("tuning") if on else None
        dev = self.device = _device()
        wl = workloads.get(workload, dev)
        wl = wl.with_batch(batch) if batch else wl
        self.model = wl.torch_model(dev)  # torch.nn / torchvision classes only: the same for every variant
        self.x, self.y = wl.batch(dev)
        if knob == "conv_bias" and not on:
            _add_conv_bias(self.model)
        if knob == "channels_last" and on:
            self.model, self.x = tuning.to_channels_last(self.model, self.x)
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.SGD(self.params, lr=0.01, momentum=0.9)
        self.loss_fn = wl.loss
        self.zero_filled = knob == "zero_grad" and not on
        self.micro = MICRO_BATCHES if knob == "accumulation" and on else 1
        self.autotune = knob == "cudnn_benchmark" and on
        self.cudnn = torch.backends.cudnn
        self.step = self._speedlib_step if on else self._torch_step

    def _torch_step(self) -> None:
        """The knob off, with torch alone: gradients set to None (zero-filled for zero_grad's
        off, as Module.zero_grad did before torch 2.0), one backward, one step."""
        self.cudnn.benchmark = self.autotune  # per step: the flag of whatever ran before must not leak in
        for p in self.params:
            if not self.zero_filled:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_().zero_()
        self.loss_fn(self.model(self.x), self.y).backward()
        self.optimizer.step()

    def _speedlib_step(self) -> None:
        tuning = self.tuning
        self.cudnn.benchmark = self.autotune
        if self.micro > 1:
            tuning.accumulation_step(self.model, self.optimizer, self.loss_fn, self.x, self.y, self.micro)
            return
        tuning.clear_grads(self.params, "on")
        self.loss_fn(self.model(self.x), self.y).backward()
        self.optimizer.step()

    def warmed(self) -> _Trainer:
        """After WARM steps: autotuning, optimizer state, allocator pools."""
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        for _ in range(WARM):
            self.step()
        measure.synchronize(self.device)
        return self


class TrainingStep(common.Paired):
    """A knob's off and on trainers taking turns step by step; "off", plain PyTorch, is the
    baseline."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (PAIRED_KNOBS, ON_OFF)
    param_names = ["knob", "variant"]
    baseline = "off"
    timeout = 1800  # setup_cache: every knob's pair

    def setup_cache(self):
        return self.measure_all()

    def steps(self, knob: str):
        trainers = {v: _Trainer(knob, v) for v in ON_OFF}
        return trainers["off"].device, {v: t.step for v, t in trainers.items()}


def _synchronised_clock() -> float:
    """asv timer: the clock read after the GPU has caught up (speedbench.measure.instruments.timer),
    imported on first use so that this module stays free of torch."""
    from speedbench import measure  # noqa: PLC0415 - loaded by setup already

    return measure.timer()


class CudnnBenchmark:
    """cuDNN's autotuner off and on, each variant timed by asv in a process of its own.

    Not paired: PyTorch caches each convolution's cuDNN plan per process (per thread),
    keyed by shapes, layout, dtype, deterministic and TF32 but not by the autotuner flag,
    and looks the cache up before reading the flag. Whichever trainer meets a shape first
    fixes the plan for both: "off", built first, caches the heuristics' plans and "on"
    never autotunes (built the other way round, "off" would run autotuned plans), so the
    ratio would be 1 by construction, and the memory the same. There is no API to empty
    that cache, so only separate processes measure what the flag decides: asv's own
    time_* benchmark (a process per variant and round) does that. GPUs only.
    """

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = ON_OFF
    param_names = ["variant"]
    timer = staticmethod(_synchronised_clock)
    timeout = 900
    warmup_time = 0  # setup has warmed up already
    repeat, rounds = (3, 10, 20.0), 2

    def setup(self, variant: str) -> None:
        common.gpu_only("cuDNN's autotuner")
        self.trainer = common.cached(("cudnn", variant), lambda: _Trainer("cudnn_benchmark", variant).warmed())

    def time_step(self, variant: str) -> None:
        self.trainer.step()

    def track_peak_memory(self, variant: str) -> int:
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        return measure.peak_memory(self.trainer.step, self.trainer.device)

    track_peak_memory.unit = "bytes"


class PeakMemory(common.Measured):
    """A warm step's peak device memory per knob and variant (GPUs; exact, so no pairing),
    "off" stepped with torch alone. cudnn_benchmark's is CudnnBenchmark.track_peak_memory,
    for the reason given there."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (PAIRED_KNOBS, ON_OFF)
    param_names = ["knob", "variant"]
    timeout = 1800

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, knob: str, variant: str) -> int:
        common.gpu_only("peak device memory")
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        trainer = _Trainer(knob, variant).warmed()
        return measure.peak_memory(trainer.step, trainer.device)

    def track_peak_memory(self, cache, knob: str, variant: str) -> int:
        return self.result(cache, knob, variant)  # common.SKIP off GPUs

    track_peak_memory.unit = "bytes"


INFERENCE = ["off", "no_grad", "inference_mode"]


def _eval_model():
    from speedbench.measure import workloads  # noqa: PLC0415 - torch: the measuring process only

    dev = _device()
    wl = workloads.get("resnet50", dev)
    model = wl.torch_model(dev).eval()
    x, _ = wl.batch(dev)
    return model, x


def _evaluation(model, x, variant: str):
    """One evaluation call: "off" is plain `model(x)` with autograd on; the others through
    speedlib.tuning.evaluate."""
    if variant == "off":
        return functools.partial(model, x)
    return functools.partial(common.technique("tuning").evaluate, model, x, variant)


class Inference(common.Paired):
    """One model and batch; evaluation with autograd on ("off", plain PyTorch), no_grad,
    inference_mode."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (INFERENCE,)
    param_names = ["variant"]
    baseline = "off"
    timeout = 900

    def setup_cache(self):
        return self.measure_all()

    def steps(self):
        common.technique("tuning")  # a commit without it skips the class
        model, x = _eval_model()
        return x.device, {v: _evaluation(model, x, v) for v in INFERENCE}


class InferenceMemory(common.Measured):
    version = "1"  # bumped when what it measures changes: benchmarks/versions.json
    params = (INFERENCE,)
    param_names = ["variant"]
    timeout = 600

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, variant: str) -> int:
        common.gpu_only("peak device memory")
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        common.technique("tuning")
        model, x = _eval_model()
        # Keep the output alive through the measurement, as an evaluation loop does.
        return measure.peak_memory(_evaluation(model, x, variant), x.device)

    def track_peak_memory(self, cache, variant: str) -> int:
        return self.result(cache, variant)

    track_peak_memory.unit = "bytes"


# ImageNet-sized images (256 -> 224): 128 per epoch in batches of 32 on GPUs, 64 in batches
# of 16 on CPUs; a decode + augment takes about 10 ms each, so an epoch in the main process
# is about a second and the loading, not the copy, decides the time.
_IMAGES = common.pick(cpu={"n": 32, "size": 256, "crop": 224, "length": 64, "batch": 16},
                      gpu={"n": 32, "size": 256, "crop": 224, "length": 128, "batch": 32})
WORKERS = min(8, os.cpu_count() or 1)
LOADING = ["off", "workers", "pin_memory", "workers_pin_memory"]


class DataLoading(common.Paired):
    """The loader variants taking turns, an epoch each; the persistent workers start in
    the warm-up round. "off" is plain `DataLoader(data, batch_size)`, torch's defaults."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (LOADING,)
    param_names = ["variant"]
    baseline = "off"
    timeout = 900

    def setup_cache(self):
        return self.measure_all()

    def steps(self):
        import torch  # noqa: PLC0415 - torch: the measuring process only

        tuning = common.technique("tuning")
        dev = _device()
        data = tuning.SyntheticImages(**{k: v for k, v in _IMAGES.items() if k != "batch"})
        # Pinned memory needs a CUDA device: those variants are left out (skipped) elsewhere.
        variants = [v for v in self.params[-1] if dev.type == "cuda" or "pin_memory" not in v]

        def epoch(loader) -> None:
            for x, y in loader:
                x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)

        def loader(variant: str):
            if variant == "off":  # num_workers=0, pin_memory=False: what DataLoader does unless told
                return torch.utils.data.DataLoader(data, batch_size=_IMAGES["batch"])
            return tuning.loader(data, _IMAGES["batch"], variant, workers=WORKERS)

        return dev, {v: functools.partial(epoch, loader(v)) for v in variants}


_GELU_SIZE = common.pick(cpu=1 << 22, gpu=1 << 26)


def _gelu(x):
    """The Tuning Guide's GELU from five pointwise operations, eager: the "off" variant, as
    its user writes it (speedlib.tuning.gelu is the same maths, which the other variants
    script or compile)."""
    import torch  # noqa: PLC0415 - torch: the measuring process only

    return x * 0.5 * (1.0 + torch.erf(x / 1.41421))


class FusedPointwise(common.Paired):
    """Forward + backward of GELU: eager ("off", plain PyTorch), TorchScript, torch.compile,
    taking turns."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (["off", "torchscript", "compile"],)
    param_names = ["variant"]
    baseline = "off"
    timeout = 1200

    def setup_cache(self):
        return self.measure_all()

    def steps(self):
        import torch  # noqa: PLC0415 - torch: the measuring process only

        tuning = common.technique("tuning")
        x = torch.randn(_GELU_SIZE, device=_device(), requires_grad=True)
        fns = {v: _gelu if v == "off" else tuning.pointwise(v) for v in self.params[-1]}

        def call(fn) -> None:
            fn(x).sum().backward()

        for fn in fns.values():
            for _ in range(3):  # TorchScript's profiling executor fuses after a few calls; compile compiles
                call(fn)
        return x.device, {v: functools.partial(call, fn) for v, fn in fns.items()}


class CompileTime(common.Timed):
    """The first calls of a freshly scripted or compiled GELU: what a first run pays."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (["torchscript", "compile"],)
    param_names = ["variant"]
    timeout = 1200

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, variant: str) -> float:
        import torch  # noqa: PLC0415 - torch: the measuring process only
        import torch._dynamo  # noqa: PLC0415 - torch: the measuring process only
        import torch._inductor.config  # noqa: PLC0415 - torch: the measuring process only

        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        tuning = common.technique("tuning")
        x = torch.randn(_GELU_SIZE, device=_device(), requires_grad=True)
        torch._dynamo.reset()
        saved = torch._inductor.config.force_disable_caches
        torch._inductor.config.force_disable_caches = True  # what a first run on a new machine pays

        def first_calls():
            fn = tuning.pointwise(variant)
            for _ in range(3):  # as many calls as FusedPointwise warms up with
                fn(x).sum().backward()

        try:
            return measure.best_seconds(first_calls, x.device, 1)
        finally:  # the process (a test's, say) goes on with its caches
            torch._inductor.config.force_disable_caches = saved

    def track_compile_seconds(self, cache, variant: str) -> float:
        return self.result(cache, variant)

    track_compile_seconds.unit = "seconds"


def _mlp_epoch(variant: str):
    """20 training steps of the 100-layer MLP with a loss/accuracy meter, then its value:
    "off" calls .item() every step (plain PyTorch, written here), "on" keeps
    speedlib.tuning.RunningLoss("device") sums on the device."""
    import torch  # noqa: PLC0415 - torch: the measuring process only

    from speedbench.measure import workloads  # noqa: PLC0415 - torch: the measuring process only

    tuning = common.technique("tuning")
    dev = _device()
    wl = workloads.get("mlp", dev)
    model = wl.torch_model(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = wl.batch(dev)

    def train_step():
        opt.zero_grad()
        logits = model(x)
        loss = wl.loss(logits, y)
        loss.backward()
        opt.step()
        return loss, logits

    def item_epoch():
        total, correct = 0.0, 0
        for _ in range(20):
            loss, logits = train_step()
            total += loss.item()  # waits for the GPU every step
            correct += (logits.argmax(dim=1) == y).sum().item()
        return total, correct

    def device_epoch():
        meter = tuning.RunningLoss("device")
        for _ in range(20):
            loss, logits = train_step()
            meter.update(loss, logits, y)
        return meter.value()

    return item_epoch if variant == "off" else device_epoch


class Sync(common.Paired):
    """An epoch with the .item() meter ("off") and with the on-device one, taking turns."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (ON_OFF,)
    param_names = ["variant"]
    baseline = "off"
    timeout = 900

    def setup_cache(self):
        return self.measure_all()

    def steps(self):
        return _device(), {v: _mlp_epoch(v) for v in ON_OFF}


class SyncCount(common.Measured):
    version = "1"  # bumped when what it measures changes: benchmarks/versions.json
    params = (ON_OFF,)
    param_names = ["variant"]
    timeout = 600

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, variant: str) -> int:
        common.gpu_only("synchronisations")
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        epoch = _mlp_epoch(variant)
        epoch()  # warm: cuBLAS handles, allocator pools
        return measure.count_syncs(epoch)

    def track_syncs(self, cache, variant: str) -> int:
        return self.result(cache, variant)

    track_syncs.unit = "syncs"


def _creations(dev) -> dict:
    """torch.rand(2^26) drawn on the host then copied ("off", plain PyTorch), or drawn on
    `dev` (speedlib.tuning.new_tensor)."""
    import torch  # noqa: PLC0415 - torch: the measuring process only

    tuning = common.technique("tuning")
    return {"off": lambda: torch.rand(1 << 26).to(dev),
            "on": functools.partial(tuning.new_tensor, torch.rand, (1 << 26,), dev, "on")}


class CreateOnDevice(common.Paired):
    """torch.rand(2^26) on the host, then copied ("off"), vs drawn on the device. GPUs only:
    on a CPU the host is the device, nothing to copy."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (ON_OFF,)
    param_names = ["variant"]
    baseline = "off"
    timeout = 600

    def setup_cache(self):
        return self.measure_all()

    def steps(self):
        common.gpu_only("creating on the device instead of copying")
        dev = _device()
        return dev, _creations(dev)


def _lengths(max_len: int) -> list[int]:
    """A fixed, shuffled mix of short and long sequences, ending before the longest."""
    import torch  # noqa: PLC0415 - torch: the measuring process only

    gen = torch.Generator().manual_seed(0)
    return [max(4, int(max_len * f)) for f in torch.rand(12, generator=gen).tolist()] + [max_len]


class _VariableLengthTraining:
    def __init__(self):
        import torch  # noqa: PLC0415 - torch: the measuring process only

        from speedbench.measure import workloads  # noqa: PLC0415 - torch: the measuring process only

        self.tuning = common.technique("tuning")
        dev = self.device = _device()
        self.wl = workloads.get("transformer", dev)
        self.model = self.wl.torch_model(dev)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.x, self.y = self.wl.batch(dev)  # the longest batch; shorter ones are prefixes
        self.lengths = _lengths(self.x.shape[1])

    def prepare(self, variant: str) -> None:
        """Empty the allocator cache, then pre-allocate when "on"."""
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

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


class Preallocate(common.Paired):
    """Epochs without ("off", plain PyTorch) and with pre-allocation taking turns on one
    model, the transformer built with torch alone: each starts from an emptied allocator
    cache, so neither inherits the other's blocks."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (ON_OFF,)
    param_names = ["variant"]
    baseline = "off"
    timeout = 900

    def setup_cache(self):
        return self.measure_all()

    def steps(self):
        training = _VariableLengthTraining()
        return training.device, {v: functools.partial(training.epoch, v) for v in ON_OFF}


class PreallocateSegments(common.Measured):
    """cudaMalloc segments of an epoch, without ("off", plain PyTorch) and with pre-allocation."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (ON_OFF,)
    param_names = ["variant"]
    timeout = 600

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, variant: str) -> int:
        """cudaMalloc calls after the pre-allocation pass (or from the start when "off")."""
        common.gpu_only("allocator segments")  # first: a CPU run skips without loading torch
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        training = _VariableLengthTraining()
        training.epoch(variant)  # warm: cuBLAS workspaces and handles are not the knob's
        training.prepare(variant)
        before = measure.allocator_segments(training.device)
        training.train()
        return measure.allocator_segments(training.device) - before

    def track_new_segments(self, cache, variant: str) -> int:
        return self.result(cache, variant)

    track_new_segments.unit = "segments"


RETAINED_STEPS = common.pick(cpu=8, gpu=4)  # a ResNet-50 step at batch 64 keeps about 5 GB alive


class RetainedGraph(common.Measured):
    version = "1"  # bumped when what it measures changes: benchmarks/versions.json
    params = (ON_OFF,)
    param_names = ["variant"]
    timeout = 600

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, variant: str) -> int:
        """Saved activations still alive after RETAINED_STEPS evaluation steps (autograd left on, as in a
        validation loop that forgot no_grad) that add each loss to a running total."""
        import torch  # noqa: PLC0415 - torch: the measuring process only
        from torch import nn  # noqa: PLC0415 - torch: the measuring process only

        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        tuning = common.technique("tuning")
        model, x = _eval_model()
        y = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)

        # The running total outlives the loop, as a validation loop's does.
        total = [0.0]
        meter = None if variant == "off" else tuning.RunningLoss("device")

        def loop():
            for _ in range(RETAINED_STEPS):
                loss = nn.functional.cross_entropy(model(x), y)
                if meter is None:  # "off", plain PyTorch: the loss tensor summed, each graph kept alive
                    total[0] = total[0] + loss.double()
                else:
                    meter.update(loss)

        return measure.saved_tensor_bytes(loop, exclude=[*model.parameters(), x], alive_after=True)

    def track_retained_bytes(self, cache, variant: str) -> int:
        return self.result(cache, variant)

    track_retained_bytes.unit = "bytes"


class BatchSize(common.Timed):
    """The throughput curve of PyTorch's defaults (a step written with torch alone),
    smallest batch first, in one process: the first batch that does not fit ends it, and
    the larger ones are skipped without being tried."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (BATCHES,)
    param_names = ["batch"]
    timeout = 1800

    def setup_cache(self):
        return self.measure_all()

    def measure_all(self) -> dict:
        self.end = None  # (the first batch that did not fit, why)
        return super().measure_all()

    def measure_one(self, batch: int) -> float:
        from speedbench.measure import batch_curve  # noqa: PLC0415 - the harness's timer; the step is the commit's

        common.technique("tuning")  # a commit from before the technique skips
        if self.end is not None:
            raise NotImplementedError(f"batch {batch} is past batch {self.end[0]}, which did not fit: {self.end[1]}")

        def make_step(b: int):
            return _Trainer("batch_size", "defaults", batch=b).warmed().step

        point = batch_curve.batch_size_curve(make_step, [batch], _device(), repeats=3)[0]
        if point.status == "oom":
            self.end = (batch, point.reason)
            raise NotImplementedError(f"batch {batch} does not fit, the end of the curve here: {point.reason}")
        return point.samples_per_second

    def track_throughput(self, cache, batch: int) -> float:
        return self.result(cache, batch)

    track_throughput.unit = "samples/s"
