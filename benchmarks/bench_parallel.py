"""DistributedDataParallel vs DataParallel vs one process (speedlib.parallel.wrap).

Variants, plain PyTorch (a `Recipe` for speedbench.measure.ddp_launch written below with torch alone:
torch's own classes, a step loop a user writes; never a speedlib code path):
  single        one process, the model itself (the baseline on CPUs, and of scaling)
  dataparallel  torch.nn.DataParallel over every device (the baseline on GPUs)
  off           NoSync's baseline: DDP all-reducing after every micro-batch, DDP's default
speedlib.parallel's (wrapped by speedlib.parallel.wrap, stepped by
speedlib.tuning.accumulation_step):
  ddp           DistributedDataParallel, one process per device
  on            NoSync: DDP inside no_sync() for all but the last micro-batch

Weak scaling: every rank (or device) gets the same batch, so a world of N trains on N
times the samples per step. GPUs: ResNet-50, 64 images of 224 x 224 per device; CPUs: the
100-layer MLP, 32 samples per rank (gloo, the cores shared between ranks). Each
measurement is one launch: `speedbench.measure.ddp_launch.run` with 10 timed steps after warm-up; the
step time is the median over steps of the slowest rank.

  Step.track_step                 seconds per step, per world size and mode
  Step.track_samples_per_second   the same runs' global batch over their step time
  Step.track_scaling_efficiency   DDP samples/s at N ranks over N x one process's (world
                                  > 1, ddp only), both runs from the same process
  NoSync.track_step / NoSync.track_allreduces: DDP on 2 ranks with 4 micro-batches per
                                  step, all-reducing every micro-batch ("off") or only the
                                  last (`no_sync`, "on"); the all-reduces are counted in a
                                  run of their own, as the counting hook replaces DDP's own

Each class measures all its parameter sets in one process (benchmarks.common.Measured).
The variants are not paired (taking turns over rounds, as the other modules' Paired
classes do): a run is a launch, 10-15 s for DDP on a shared CPU (processes spawned, torch
imported in each, the process group set up), so the 8 rounds a 99 % interval needs would
cost minutes per configuration; each run already times 10 steps after its warm-up.

World sizes beyond the machine (GPUs, or cores on a CPU) are skipped with that reason
before anything is launched, as is DataParallel without CUDA.
"""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks import common

# The variants written with torch alone in this module (tests/test_baselines.py runs their
# steps and fails on any speedlib code).
PLAIN_PYTORCH = ("single", "dataparallel", "off")


def _gpu_count() -> int:
    """GPUs this run may use, counted without torch (no CUDA context, and a process that
    only reports starts fast): $CUDA_VISIBLE_DEVICES's list, else the driver's under /proc.
    The measuring process checks it against torch.cuda.device_count()."""
    if not common.ON_GPU:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    return len(list(Path("/proc/driver/nvidia/gpus").glob("*")))


_GPUS = _gpu_count()
WORLDS = sorted({1, 2, _GPUS}) if _GPUS > 2 else [1, 2]
MODES = ["single", "dataparallel", "ddp"]
_SETUP = common.pick(cpu={"workload": "mlp", "per_rank": 32, "steps": 10, "warmup": 2},
                     gpu={"workload": "resnet50", "per_rank": 64, "steps": 10, "warmup": 3})
_TIMEOUT = 300.0  # one launch


def _check(mode: str, world: int) -> None:
    """Skip what this machine cannot run, before importing torch or launching anything."""
    if mode == "single" and world != 1:
        raise NotImplementedError("one process is world size 1")
    if mode == "dataparallel" and not common.ON_GPU:
        raise NotImplementedError("DataParallel splits batches over CUDA devices; on a CPU it only calls the module")
    have = _GPUS if common.ON_GPU else (os.cpu_count() or 1)
    if world > have:
        raise NotImplementedError(f"world size {world} needs {world} {'GPUs' if common.ON_GPU else 'cores'}; "
                                  f"this machine has {have}")


# --- the plain-PyTorch recipe: what the baselines run (speedbench.measure.ddp_launch.Recipe) ---------

def _torch_model(config, dev):
    """The workload's model as torch.nn and torchvision build it (the MLP, ResNet-50)."""
    from speedbench.measure import workloads  # noqa: PLC0415 - torch: the measuring process only

    if config.checkpoint != "none":
        raise ValueError("the plain recipe trains without checkpointing (bench_checkpoint has its own models)")
    return workloads.get(config.workload, dev).torch_model(dev, seed=config.seed)


def _torch_wrap(model, mode: str, device_ids=None, **ddp_options):
    """torch's own wrappers: none for one process, nn.DataParallel, DistributedDataParallel."""
    from torch import nn  # noqa: PLC0415 - torch: the measuring process only

    if mode == "single":
        return model
    if mode == "dataparallel":
        return nn.DataParallel(model, device_ids=device_ids)
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, **ddp_options)


def _torch_step(model, optimizer, loss_fn, x, y, micro_batches: int = 1, no_sync: bool = True):
    """One optimizer step over `micro_batches` chunks of (x, y), each chunk's loss weighted by
    its share of the batch; under DDP every backward all-reduces (DDP's default). Returns the
    batch's loss, detached."""
    import torch  # noqa: PLC0415 - torch: the measuring process only

    if no_sync and micro_batches > 1:
        raise ValueError("the plain recipe all-reduces after every micro-batch; no_sync is speedlib's variant")
    optimizer.zero_grad(set_to_none=True)
    total = x.new_zeros((), dtype=torch.float32)
    for xc, yc in zip(x.tensor_split(micro_batches), y.tensor_split(micro_batches), strict=True):
        loss = loss_fn(model(xc), yc) * (xc.shape[0] / x.shape[0])
        loss.backward()
        total += loss.detach().float()
    optimizer.step()
    return total


def torch_recipe():
    """The recipe of this module's plain-PyTorch variants (PLAIN_PYTORCH); bench_checkpoint's
    DistributedStep wraps and steps with it too."""
    return common.ddp_launch().Recipe(_torch_model, _torch_wrap, _torch_step)


def _recipe(variant: str):
    """The plain recipe for PLAIN_PYTORCH's variants, None (the launcher's default, speedlib's) else."""
    return torch_recipe() if variant in PLAIN_PYTORCH else None


def _config(mode: str, world: int, **options):
    _check(mode, world)
    RunConfig = common.ddp_launch().RunConfig
    return RunConfig(mode=mode, world_size=world, workload=_SETUP["workload"], batch=_SETUP["per_rank"] * world,
                     steps=_SETUP["steps"], warmup=_SETUP["warmup"], device="cuda" if common.ON_GPU else "cpu",
                     **options)


def _run(config, recipe=None):
    """One launch of `config`: with `recipe` (the plain one), else speedlib's."""
    import torch  # noqa: PLC0415 - in the measuring process only (benchmarks.common)

    from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

    common.check_profile(measure.device())
    if config.device == "cuda" and torch.cuda.device_count() < config.world_size:
        raise NotImplementedError(f"world size {config.world_size} needs {config.world_size} GPUs; torch sees "
                                  f"{torch.cuda.device_count()}")
    launch = common.ddp_launch()
    return launch.run(config, timeout=_TIMEOUT, recipe=recipe or launch.LIBRARY)


class Step(common.Timed):
    """The world size x mode grid, one launch each: single and dataparallel with torch alone
    (the baselines), ddp through speedlib.parallel."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (WORLDS, MODES)
    param_names = ["world", "variant"]
    timeout = 1800  # setup_cache: every launch of the grid

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, world: int, variant: str) -> dict:
        result = _run(_config(variant, world), _recipe(variant))
        return {"step": result.step_seconds, "samples_per_second": result.samples_per_second}

    def track_step(self, cache, world: int, variant: str) -> float:
        run = self.result(cache, world, variant)
        return run if run is common.SKIP else run["step"]

    track_step.unit = "seconds"

    def track_samples_per_second(self, cache, world: int, variant: str) -> float:
        run = self.result(cache, world, variant)
        return run if run is common.SKIP else run["samples_per_second"]

    track_samples_per_second.unit = "samples/s"

    def track_scaling_efficiency(self, cache, world: int, variant: str) -> float:
        if world == 1 or variant != "ddp":  # DDP's scaling from one process; 100 % by definition at 1
            return common.SKIP
        many, one = self.result(cache, world, variant), self.result(cache, 1, "single")
        if many is common.SKIP or one is common.SKIP:
            return common.SKIP
        return 100.0 * many["samples_per_second"] / (world * one["samples_per_second"])

    track_scaling_efficiency.unit = "% of linear scaling"


_NO_SYNC = {"off": False, "on": True}


class NoSync(common.Timed):
    """DDP on 2 ranks, 4 micro-batches per step, with speedlib's no_sync ("on") and without
    ("off": plain PyTorch, the baseline)."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = [list(_NO_SYNC)]
    param_names = ["variant"]
    timeout = 1800  # setup_cache: four launches

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, variant: str) -> dict:
        recipe = _recipe(variant)
        timed = _run(_config("ddp", 2, micro_batches=4, no_sync=_NO_SYNC[variant]), recipe)
        counted = _run(_config("ddp", 2, micro_batches=4, no_sync=_NO_SYNC[variant], count_allreduces=True), recipe)
        return {"step": timed.step_seconds, "allreduces": counted.allreduces[0] / counted.config.steps}

    def track_step(self, cache, variant: str) -> float:
        run = self.result(cache, variant)
        return run if run is common.SKIP else run["step"]

    track_step.unit = "seconds"

    def track_allreduces(self, cache, variant: str) -> float:
        """Bucket all-reduces per optimizer step (rank 0)."""
        run = self.result(cache, variant)
        return run if run is common.SKIP else run["allreduces"]

    track_allreduces.unit = "all-reduces"
