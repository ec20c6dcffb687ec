"""Mixed precision: one training step per precision policy, with and without channels_last.

Variants (speedlib.amp policies):
  fp32                strict float32, TF32 off (the baseline)
  tf32                TF32 Tensor Core maths in matmuls and convolutions
  fp16 / bf16         autocast (fp16 with a GradScaler)
  fp16_channels_last  the same, model and input in channels_last memory format
  bf16_channels_last  (the Tuning Guide's recipe for convolutional networks)
Workloads: ResNet-50 (batch 64 at 224 x 224 on GPUs, 2 at 64 x 64 on CPUs) and the
transformer (6 blocks, 256 tokens on GPUs, 32 on CPUs); channels_last applies to 4-D
activations only, so the transformer skips those variants. cuDNN's autotuner is on for every
variant (it is measured on its own in bench_tuning). A step is zero_grad + forward + loss
under the policy + backward + SGD step (momentum 0.9).

Metrics: `time_step`; `PeakMemory.track_peak_memory` (GPUs). The project's target:
bf16_channels_last >= 3x fp32 on ResNet-50 on H100/H200.
"""

from __future__ import annotations

import torch

from speedlib import measure, workloads

VARIANTS = ["fp32", "tf32", "fp16", "bf16", "fp16_channels_last", "bf16_channels_last"]
WORKLOADS = ["resnet50", "transformer"]
_ON_GPU = measure.device().type == "cuda"
# CPUs without native fp16/bf16 maths take seconds per autocast step (the transformer about
# eight): one warm-up step and a 10-second sampling budget keep the CPU suite short.
_TIMING = {"repeat": (3, 10, 20.0), "rounds": 2, "warm": 3} if _ON_GPU else {"repeat": (2, 8, 10.0), "rounds": 1, "warm": 1}


class _Trainer:
    def __init__(self, workload: str, variant: str):
        try:
            from speedlib.amp import Precision  # noqa: PLC0415
        except ImportError as e:  # a commit before the technique existed
            raise NotImplementedError(f"speedlib has no amp module here: {e}") from e
        policy, _, layout = variant.partition("_")
        dev = measure.device()
        wl = workloads.get(workload, dev)
        self.model = wl.model(dev)
        self.x, self.y = wl.batch(dev)
        if layout == "channels_last":
            if self.x.dim() != 4:
                raise NotImplementedError(f"channels_last needs 4-D activations; {workload} has {self.x.dim()}-D inputs")
            self.model = self.model.to(memory_format=torch.channels_last)
            self.x = self.x.contiguous(memory_format=torch.channels_last)
        self.loss_fn, self.device = wl.loss, dev
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.precision = Precision(policy, dev.type)
        torch.backends.cudnn.benchmark = True
        for _ in range(_TIMING["warm"]):  # cuDNN algorithm choice, optimizer state, allocator pools, scaler
            self.step()
        measure.synchronize(dev)

    def step(self) -> None:
        self.precision.step(self.model, self.optimizer, self.loss_fn, self.x, self.y)


_trainers: dict[tuple[str, str], _Trainer] = {}


def _trainer(workload: str, variant: str) -> _Trainer:
    key = (workload, variant)
    if key not in _trainers:
        _trainers.clear()
        _trainers[key] = _Trainer(workload, variant)
    return _trainers[key]


class TrainingStep:
    params = (WORKLOADS, VARIANTS)
    param_names = ["workload", "variant"]
    timer = staticmethod(measure.timer)
    timeout = 900
    warmup_time = 0  # the trainer has run its warm-up steps already
    repeat, rounds = _TIMING["repeat"], _TIMING["rounds"]

    def setup(self, workload: str, variant: str) -> None:
        self.trainer = _trainer(workload, variant)

    def time_step(self, workload: str, variant: str) -> None:
        self.trainer.step()


class PeakMemory:
    params = (WORKLOADS, VARIANTS)
    param_names = ["workload", "variant"]
    timeout = 900
    rounds = 1

    def setup(self, workload: str, variant: str) -> None:
        if not _ON_GPU:
            raise NotImplementedError("peak device memory is tracked on GPUs only")
        self.trainer = _trainer(workload, variant)

    def track_peak_memory(self, workload: str, variant: str) -> int:
        return measure.peak_memory(self.trainer.step, self.trainer.device)

    track_peak_memory.unit = "bytes"
