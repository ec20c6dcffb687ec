"""DistributedDataParallel vs DataParallel vs one process (speedlib.parallel).

Weak scaling: every rank (or device) gets the same batch, so a world of N trains on N
times the samples per step. GPUs: ResNet-50, 64 images of 224 x 224 per device; CPUs: the
100-layer MLP, 32 samples per rank (gloo, the cores shared between ranks). Each
measurement is one launch: `speedlib.parallel.run` with 10 timed steps after warm-up; the
step time is the median over steps of the slowest rank.

  Step.track_step                 seconds per step, per world size and mode
  Throughput.track_samples_per_second
  Scaling.track_scaling_efficiency  DDP samples/s at N ranks over N x one process's,
                                  both measured in the same benchmark process
  NoSync.track_step / NoSyncAllReduces.track_allreduces: DDP on 2 ranks with 4 micro-
                                  batches per step, all-reducing every micro-batch ("off")
                                  or only the last (`no_sync`, "on")

World sizes beyond the machine (GPUs, or cores on a CPU) are skipped with that reason, as
is DataParallel without CUDA. Nothing here touches CUDA at import time.
"""

from __future__ import annotations

import os

import torch

from speedbench import measure

_ON_GPU = measure.device().type == "cuda"
# device_count() asks the driver without creating a CUDA context.
_GPUS = torch.cuda.device_count() if _ON_GPU else 0
WORLDS = sorted({1, 2, _GPUS}) if _GPUS > 2 else [1, 2]
MODES = ["single", "dataparallel", "ddp"]
_SETUP = {"workload": "resnet50", "per_rank": 64, "steps": 10, "warmup": 3} if _ON_GPU else \
    {"workload": "mlp", "per_rank": 32, "steps": 10, "warmup": 2}
_TIMEOUT = 300.0


def _config(mode: str, world: int, **options):
    try:
        from speedlib.parallel import RunConfig  # noqa: PLC0415
    except ImportError as e:  # a commit before the technique existed
        raise NotImplementedError(f"speedlib has no parallel module here: {e}") from e
    if mode == "single" and world != 1:
        raise NotImplementedError("one process is world size 1")
    if mode == "dataparallel" and not _ON_GPU:
        raise NotImplementedError("DataParallel splits batches over CUDA devices; on a CPU it only calls the module")
    have = _GPUS if _ON_GPU else (os.cpu_count() or 1)
    if world > have:
        raise NotImplementedError(f"world size {world} needs {world} {'GPUs' if _ON_GPU else 'cores'}; this machine has {have}")
    return RunConfig(mode=mode, world_size=world, workload=_SETUP["workload"], batch=_SETUP["per_rank"] * world,
                     steps=_SETUP["steps"], warmup=_SETUP["warmup"], device="cuda" if _ON_GPU else "cpu", **options)


def _run(config):
    from speedlib import parallel  # noqa: PLC0415

    return parallel.run(config, timeout=_TIMEOUT)


class _Launch:
    """One launch per measurement; the grid is world size x mode."""

    params = (WORLDS, MODES)
    param_names = ["world", "variant"]
    timeout = 900
    rounds = 1

    def setup(self, world: int, variant: str) -> None:
        self.config = _config(variant, world)


class Step(_Launch):
    def track_step(self, world: int, variant: str) -> float:
        return _run(self.config).step_seconds

    track_step.unit = "seconds"


class Throughput(_Launch):
    def track_samples_per_second(self, world: int, variant: str) -> float:
        return _run(self.config).samples_per_second

    track_samples_per_second.unit = "samples/s"


class Scaling:
    params = [w for w in WORLDS if w > 1]
    param_names = ["world"]
    timeout = 900
    rounds = 1

    def setup(self, world: int) -> None:
        self.configs = _config("single", 1), _config("ddp", world)

    def track_scaling_efficiency(self, world: int) -> float:
        one, many = (_run(c).samples_per_second for c in self.configs)
        return 100.0 * many / (world * one)

    track_scaling_efficiency.unit = "% of linear scaling"


_NO_SYNC = {"off": False, "on": True}


class NoSync:
    params = ["off", "on"]
    param_names = ["variant"]
    timeout = 900
    rounds = 1

    def setup(self, variant: str) -> None:
        self.config = _config("ddp", 2, micro_batches=4, no_sync=_NO_SYNC[variant])

    def track_step(self, variant: str) -> float:
        return _run(self.config).step_seconds

    track_step.unit = "seconds"


class NoSyncAllReduces:
    params = ["off", "on"]
    param_names = ["variant"]
    timeout = 900
    rounds = 1

    def setup(self, variant: str) -> None:
        self.config = _config("ddp", 2, micro_batches=4, no_sync=_NO_SYNC[variant], count_allreduces=True)

    def track_allreduces(self, variant: str) -> float:
        """Bucket all-reduces per optimizer step (rank 0)."""
        result = _run(self.config)
        return result.allreduces[0] / self.config.steps

    track_allreduces.unit = "all-reduces"
