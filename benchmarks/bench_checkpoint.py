"""Activation checkpointing: what each variant saves and what it costs.

Variants (speedlib.workloads.set_checkpointing), all on the same model object:
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
  DataParallelStep / DistributedStep: two or more GPUs only, the source's 2-GPU rows.

Batch sizes are parameters: 64 and 256 on GPUs (the source's table), 4 and 16 on CPUs
(DenseNet-BC-100 at 16 already takes about a second a step on two cores). Nothing here touches
CUDA at import time.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import torch

from speedlib import measure, workloads

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
    """DistributedDataParallel, one process per GPU (NCCL): median step time of rank 0."""

    params = (VARIANTS, PARALLEL_BATCHES)
    param_names = ["variant", "batch"]
    timeout = 900

    def setup(self, variant: str, batch: int) -> None:
        self.world = _need_gpus()
        _check_variant(variant)

    def track_step_time(self, variant: str, batch: int) -> float:
        out = ddp_run(self.world, PARALLEL_WORKLOAD, variant, batch, steps=10, device_type="cuda")
        return statistics.median(out["times"])

    track_step_time.unit = "seconds"


def _ddp_worker(rank: int, world: int, init_file: str, out_dir: str, workload: str, variant: str,
                batch: int, steps: int, device_type: str) -> None:
    import torch.distributed as dist  # noqa: PLC0415

    backend = "nccl" if device_type == "cuda" else "gloo"
    dev = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(1)  # the ranks share the host's cores
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        wl = workloads.get(workload, dev).with_batch(batch // world)
        model = workloads.set_checkpointing(wl.model(dev), variant)  # same seed: same weights on every rank
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if device_type == "cuda" else None)
        optimizer = _optimizer(ddp)
        x, y = wl.batch(dev, seed=rank)  # each rank its own shard of the global batch
        times = []
        for i in range(steps + 1):  # the first step warms up and is not timed
            measure.synchronize(dev)
            start = time.perf_counter()
            optimizer.zero_grad()
            wl.loss(ddp(x), y).backward()
            optimizer.step()
            measure.synchronize(dev)
            if i:
                times.append(time.perf_counter() - start)
        if rank == 0:
            state = {k: v.cpu() for k, v in model.state_dict().items()}
            torch.save({"times": times, "state": state}, os.path.join(out_dir, "rank0.pt"))
    finally:
        dist.destroy_process_group()


def ddp_run(world: int, workload: str, variant: str, batch: int, steps: int, device_type: str,
            timeout: float = 600.0) -> dict:
    """Train `steps` DDP steps in `world` spawned processes; rank 0's step times and final state.

    The global `batch` is split evenly across ranks. A rank that raises ends the run with
    its error; one that hangs past `timeout` seconds gets every rank terminated.
    """
    import torch.multiprocessing as mp  # noqa: PLC0415

    if batch % world:
        raise ValueError(f"global batch {batch} does not split evenly over {world} processes")
    with tempfile.TemporaryDirectory(prefix="speedlib-ddp-") as tmp:
        args = (world, os.path.join(tmp, "rendezvous"), tmp, workload, variant, batch, steps, device_type)
        ctx = mp.start_processes(_ddp_worker, args=args, nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=1.0):  # raises ProcessRaisedException if a rank failed
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError(f"DDP run did not finish within {timeout:.0f} s; all ranks killed")
        return torch.load(os.path.join(tmp, "rank0.pt"))
