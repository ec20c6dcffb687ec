"""Flat-buffer parameters against per-tensor optimizers and the original package.

Variants, all torch.optim.Adam with the same hyper-parameters:
  forloop   per-tensor parameters, foreach=False (one kernel chain per tensor)
  foreach   per-tensor parameters, foreach=True (multi-tensor kernels)
  fused     per-tensor parameters, fused=True
  speedlib  speedlib.ContiguousParams flat buffer, fused=True (its recommended setup)
  original  contiguous_params 1.0.0 flat buffer, Adam's defaults as in its README;
            skipped when the package is not installed

The step alone overstates the gain, so the whole iteration is timed too, and the Adam step
is also timed on its own (the part the flat buffer speeds up) and as achieved bandwidth. Workloads run at
their `full` size on GPUs and `small` size on CPUs (the parameters, and so the step, are
the same at both sizes). Nothing here touches CUDA at import time.

Which rows make the GPU headline, and why: ResNet-50's `AdamBandwidth` (50 steps back to
back between two synchronisations, as the host runs ahead of the GPU in training) and its
`time_adam_step`. The MLP's whole Adam step is 1.7M parameters x 28 bytes = 46 MB, about
15 us of HBM traffic on an H100: less than one synchronisation around a timed sample plus
the flat buffer's check before each step (O(tensors) host work, tens of microseconds). Its
per-sample times on a GPU therefore measure launch and host overhead, which is what the
original package's 100 x Linear benchmark was about, but not the bandwidth the flat buffer
buys; ResNet-50 moves 0.7 GB per step, so there the kernels dominate.
"""

from __future__ import annotations

import time

import torch

from speedbench import measure, workloads

VARIANTS = ["forloop", "foreach", "fused", "speedlib", "original"]
WORKLOADS = ["mlp", "resnet50"]
MAX_NORM = 1.0
LR = 1e-3
# Adam reads param, grad, exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq:
# 7 fp32 accesses = 28 bytes per parameter, the least any implementation can move.
ADAM_BYTES_PER_PARAM = 28


class _Trainer:
    """One model + optimizer set up the way a variant's user would write it."""

    def __init__(self, workload: str, variant: str):
        dev = measure.device()
        wl = workloads.get(workload, dev)
        self.device = dev
        self.model = wl.model(dev)
        self.loss_fn = wl.loss
        self.x, self.y = wl.batch(dev)
        self.num_params = sum(p.numel() for p in self.model.parameters())
        # The original package loses its flat gradient under the default
        # zero_grad(set_to_none=True) and silently stops training; time the loop its
        # README intends instead of a loop that does nothing.
        self.set_to_none = variant != "original"
        self.clip_foreach = None if variant != "forloop" else False
        if variant in ("forloop", "foreach", "fused"):
            params = list(self.model.parameters())
            flags = {"forloop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
            self.optimizer = torch.optim.Adam(params, lr=LR, **flags[variant])
            self.clip_params = params
        elif variant == "speedlib":
            try:
                from speedlib import ContiguousParams  # noqa: PLC0415
            except ImportError as e:  # a commit before the technique existed
                raise NotImplementedError(f"speedlib has no ContiguousParams here: {e}") from e
            flat = ContiguousParams(self.model.parameters())
            self.optimizer = torch.optim.Adam(flat.contiguous(), lr=LR, fused=True)
            self.clip_params = flat.contiguous()
        elif variant == "original":
            try:
                from contiguous_params import ContiguousParams  # noqa: PLC0415
            except ImportError as e:
                raise NotImplementedError("contiguous_params is not installed") from e
            flat = ContiguousParams(self.model.parameters())
            self.optimizer = torch.optim.Adam(flat.contiguous(), lr=LR)
            self.clip_params = flat.contiguous()
        else:
            raise ValueError(f"unknown variant {variant!r}")
        self.iteration()  # real gradients, optimizer state allocated, kernels warmed up
        measure.synchronize(dev)

    def step(self) -> None:
        """What the optimizer side of an iteration costs: clip, step, zero.

        zero_grad(set_to_none=False) for every variant here, so every timed call steps on
        real gradient tensors; the default zero_grad is timed in `iteration`.
        """
        torch.nn.utils.clip_grad_norm_(self.clip_params, MAX_NORM, foreach=self.clip_foreach)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)

    def iteration(self) -> None:
        self.optimizer.zero_grad(set_to_none=self.set_to_none)
        loss = self.loss_fn(self.model(self.x), self.y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.clip_params, MAX_NORM, foreach=self.clip_foreach)
        self.optimizer.step()

    def adam_bandwidth(self) -> float:
        """Achieved bytes/s of Adam steps alone, back to back between two synchronisations
        (as in training, where the host runs ahead of the GPU)."""
        steps = 50 if self.device.type == "cuda" else 3
        measure.synchronize(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            self.optimizer.step()
        measure.synchronize(self.device)
        elapsed = time.perf_counter() - start
        return steps * ADAM_BYTES_PER_PARAM * self.num_params / elapsed


# asv_runner >= 0.3 runs setup before every timed call, so the expensive state lives in a
# per-process cache rather than in setup itself.
_trainers: dict[tuple[str, str], _Trainer] = {}


def _trainer(workload: str, variant: str) -> _Trainer:
    key = (workload, variant)
    if key not in _trainers:
        _trainers.clear()  # one model at a time: ResNet-50 states add up on small machines
        _trainers[key] = _Trainer(workload, variant)
    return _trainers[key]


class OptimizerStep:
    """Clip + Adam step + zero_grad, and the whole training iteration around it."""

    params = (WORKLOADS, VARIANTS)
    param_names = ["workload", "variant"]
    timer = staticmethod(measure.timer)
    timeout = 600
    # Adam moves the parameters; results stay comparable because timing does not depend
    # on their values.

    def setup(self, workload: str, variant: str) -> None:
        self.trainer = _trainer(workload, variant)

    def time_step(self, workload: str, variant: str) -> None:
        self.trainer.step()

    def time_adam_step(self, workload: str, variant: str) -> None:
        """The Adam step alone: what the flat buffer is meant to speed up."""
        self.trainer.optimizer.step()

    def time_iteration(self, workload: str, variant: str) -> None:
        self.trainer.iteration()


class AdamBandwidth:
    """Achieved memory traffic of the Adam step against the 28-bytes-per-parameter floor."""

    params = (WORKLOADS, VARIANTS)
    param_names = ["workload", "variant"]
    timeout = 600

    def setup(self, workload: str, variant: str) -> None:
        self.trainer = _trainer(workload, variant)

    def track_step_bandwidth(self, workload: str, variant: str) -> float:
        return self.trainer.adam_bandwidth() / 1e9

    track_step_bandwidth.unit = "GB/s"

    def track_fraction_of_floor(self, workload: str, variant: str) -> float:
        """Adam step bandwidth over this device's measured streaming bandwidth, both from this process."""
        floor = measure.memory_bandwidth(self.trainer.device)
        return 100.0 * self.trainer.adam_bandwidth() / floor

    track_fraction_of_floor.unit = "% of memory bandwidth"


class IterationMemory:
    """Peak GPU memory of one training iteration: the flat buffers must not cost extra."""

    params = (WORKLOADS, VARIANTS)
    param_names = ["workload", "variant"]
    timeout = 600

    def setup(self, workload: str, variant: str) -> None:
        if measure.device().type != "cuda":
            raise NotImplementedError("peak device memory is tracked on GPUs only")
        self.trainer = _trainer(workload, variant)

    def track_peak_memory(self, workload: str, variant: str) -> int:
        return measure.peak_memory(self.trainer.iteration, self.trainer.device)

    track_peak_memory.unit = "bytes"
