"""Activation checkpointing: what each variant saves and what it costs.

Variants (speedbench.workloads.set_checkpointing), all on the same model object:
  none           nothing recomputed (the baseline)
  reentrant      torch.utils.checkpoint(use_reentrant=True) on each segment
  non_reentrant  torch.utils.checkpoint(use_reentrant=False) on the same segments
  speedlib       speedlib.checkpoint (explicit parameters) on the same segments
  sequential     torch.utils.checkpoint.checkpoint_sequential over the feature stack

A segment is a DenseNet layer's bottleneck (concatenation + BN + ReLU + 1x1 conv, the
efficient-DenseNet scheme) or a transformer block. A training step is zero_grad, forward,
backward and an SGD step (Nesterov momentum 0.9, weight decay 1e-4: DenseNet's recipe).

Metrics:
  time_step                    one training step
  track_saved_activations      bytes autograd keeps for backward after the forward pass,
                               parameters excluded (exact, any device). It does not see the
                               rerun's own peak, which is large for coarse segments
                               (sequential): peak memory does.
  PeakMemory.track_peak_memory peak GPU memory of a whole step (the source's "Memory")
  track_peak_activation_memory the same minus what was allocated before the step
                               (parameters, optimizer state, last step's gradients)
  DataParallelStep / DistributedStep: two or more GPUs only, the source's 2-GPU rows
                               (DistributedStep runs speedlib.parallel: SGD, momentum 0.9).

Batch sizes are parameters: 64 and 256 on GPUs (the source's table), 4 and 16 on CPUs
(DenseNet-BC-100 at 16 already takes about a second a step on two cores). Nothing here touches
CUDA at import time.
"""

from __future__ import annotations


import torch

from speedbench import measure, workloads

VARIANTS = ["none", "reentrant", "non_reentrant", "speedlib", "sequential"]
WORKLOADS = ["densenet_bc", "densenet121", "transformer"]
# Which machine this is decides the batch sizes (asv spawns a process per parameter
# combination, so combinations a machine would only skip still cost a second each).
# measure.device() asks whether CUDA exists without creating a context.
_ON_GPU = measure.device().type == "cuda"
BATCHES = [64, 256] if _ON_GPU else [4, 16]
# One round of a few samples on CPUs, where a step takes up to two seconds and the suite
# must stay short; GPU steps are fast enough for asv's two rounds.
_TIMING = {"repeat": (3, 10, 20.0), "rounds": 2} if _ON_GPU else {"repeat": (3, 5, 8.0), "rounds": 1}


def _check_variant(variant: str) -> None:
    try:
        from speedlib import checkpoint  # noqa: F401, PLC0415
    except ImportError as e:  # a commit before the technique existed
        raise NotImplementedError(f"speedlib has no checkpoint module here: {e}") from e
    if variant not in getattr(workloads, "CHECKPOINT_VARIANTS", ()):
        raise NotImplementedError(f"this commit's workloads have no checkpoint variant {variant!r}")


def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)


class _Trainer:
    """One model, batch and optimizer for a (workload, variant, batch), warmed up."""

    def __init__(self, workload: str, variant: str, batch: int, data_parallel: bool = False):
        dev = measure.device()
        _check_variant(variant)
        wl = workloads.get(workload, dev).with_batch(batch)
        self.device, self.loss_fn = dev, wl.loss
        self.model = workloads.set_checkpointing(wl.model(dev), variant)
        if data_parallel:
            self.model = torch.nn.DataParallel(self.model)
        self.optimizer = _optimizer(self.model)
        self.x, self.y = wl.batch(dev)
        try:
            for _ in range(2):  # optimizer state, cuDNN algorithm choice, allocator pools
                self.step()
        except torch.OutOfMemoryError as e:
            self.model = self.optimizer = None
            torch.cuda.empty_cache()
            raise NotImplementedError(f"{workload} with {variant} does not fit at batch {batch}: {e}") from e
        measure.synchronize(dev)

    def forward_loss(self) -> torch.Tensor:
        return self.loss_fn(self.model(self.x), self.y)

    def step(self) -> None:
        self.optimizer.zero_grad()
        self.forward_loss().backward()
        self.optimizer.step()


# asv_runner >= 0.3 runs setup before every timed call: keep the trainer per process.
_trainers: dict[tuple, _Trainer] = {}


def _trainer(*key) -> _Trainer:
    if key not in _trainers:
        _trainers.clear()  # one model at a time: activations of big batches add up
        _trainers[key] = _Trainer(*key)
    return _trainers[key]


class TrainingStep:
    """Time of one training step per variant."""

    params = (WORKLOADS, VARIANTS, BATCHES)
    param_names = ["workload", "variant", "batch"]
    timer = staticmethod(measure.timer)
    timeout = 900
    warmup_time = 0  # the trainer has run two steps already
    repeat, rounds = _TIMING["repeat"], _TIMING["rounds"]

    def setup(self, workload: str, variant: str, batch: int) -> None:
        self.trainer = _trainer(workload, variant, batch)

    def time_step(self, workload: str, variant: str, batch: int) -> None:
        self.trainer.step()


class ActivationMemory:
    """What each variant keeps for backward (exact, any device)."""

    params = (WORKLOADS, VARIANTS, BATCHES)
    param_names = ["workload", "variant", "batch"]
    timeout = 900
    rounds = 1  # exact counts: a second round would only repeat them

    def setup(self, workload: str, variant: str, batch: int) -> None:
        self.trainer = _trainer(workload, variant, batch)

    def track_saved_activations(self, workload: str, variant: str, batch: int) -> int:
        t = self.trainer
        return measure.saved_tensor_bytes(t.forward_loss, exclude=list(t.model.parameters()))

    track_saved_activations.unit = "bytes"


class PeakMemory:
    """Peak GPU memory of a training step, whole and above what was allocated before it."""

    params = (WORKLOADS, VARIANTS, BATCHES)
    param_names = ["workload", "variant", "batch"]
    timeout = 900
    rounds = 1

    def setup(self, workload: str, variant: str, batch: int) -> None:
        if measure.device().type != "cuda":  # in setup, so asv records a skip, not a failure
            raise NotImplementedError("peak device memory is tracked on GPUs only")
        self.trainer = _trainer(workload, variant, batch)

    def track_peak_memory(self, workload: str, variant: str, batch: int) -> int:
        return measure.peak_memory(self.trainer.step, self.trainer.device)

    track_peak_memory.unit = "bytes"

    def track_peak_activation_memory(self, workload: str, variant: str, batch: int) -> int:
        return measure.peak_memory(self.trainer.step, self.trainer.device, above_start=True)

    track_peak_activation_memory.unit = "bytes"


# --- two or more GPUs: the source's DataParallel rows, and DistributedDataParallel ------

PARALLEL_WORKLOAD = "densenet_bc"  # the source's 2-GPU table is DenseNet-BC-100
PARALLEL_BATCHES = [64, 256]  # global batch, split across the GPUs


def _need_gpus() -> int:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        raise NotImplementedError(f"data parallelism needs two or more GPUs; this machine has {count}")
    return count


class DataParallelStep:
    """nn.DataParallel over every GPU: the setting where reentrant checkpoint was slow."""

    params = (VARIANTS, PARALLEL_BATCHES)
    param_names = ["variant", "batch"]
    timer = staticmethod(measure.timer)
    timeout = 900
    warmup_time = 0
    repeat, rounds = _TIMING["repeat"], _TIMING["rounds"]

    def setup(self, variant: str, batch: int) -> None:
        _need_gpus()
        self.trainer = _trainer(PARALLEL_WORKLOAD, variant, batch, True)

    def time_step(self, variant: str, batch: int) -> None:
        self.trainer.step()


class DistributedStep:
    """DistributedDataParallel, one process per GPU (NCCL), through speedlib.parallel: the
    median step time of the slowest rank."""

    params = (VARIANTS, PARALLEL_BATCHES)
    param_names = ["variant", "batch"]
    timeout = 900

    def setup(self, variant: str, batch: int) -> None:
        self.world = _need_gpus()
        _check_variant(variant)
        try:
            from speedlib import parallel  # noqa: PLC0415
        except ImportError as e:  # a commit before the launcher existed
            raise NotImplementedError(f"speedlib has no parallel module here: {e}") from e
        self.parallel = parallel

    def track_step_time(self, variant: str, batch: int) -> float:
        return self.parallel.run(self.parallel.RunConfig(
            mode="ddp", world_size=self.world, workload=PARALLEL_WORKLOAD, batch=batch, checkpoint=variant,
            steps=10, warmup=1, device="cuda")).step_seconds

    track_step_time.unit = "seconds"
