"""Flat-buffer parameters against per-tensor optimizers and the original package.

Variants, all torch.optim.Adam with the same hyper-parameters:
  forloop   per-tensor parameters, foreach=False (one kernel chain per tensor; the baseline)
  foreach   per-tensor parameters, foreach=True (multi-tensor kernels)
  fused     per-tensor parameters, fused=True
  speedlib  speedlib.ContiguousParams flat buffer, fused=True (its recommended setup)
  original  contiguous_params 1.0.0 flat buffer, Adam's defaults as in its README;
            skipped when the package is not installed
forloop, foreach and fused are plain PyTorch, written below with torch alone (the baseline
and PyTorch's own alternatives); speedlib is speedlib's code path, original the package's.
One piece of speedlib does run beside them: the speedlib variant's ContiguousParams installs
speedlib's process-wide optimizer step pre-hook (speedlib/_contiguous_hooks.py), which from
then on runs before every optimizer step in the process, theirs included (torch has no
per-optimizer opt-out): a tuple of group sizes and a weak-dictionary lookup that finds no
flat buffer. Taking turns in one process costs the baselines that much.

The step alone overstates the gain, so three things are timed, each in a class of its own
whose five variants take turns in one process (benchmarks.common.Paired):
  AdamStep       optimizer.step() alone: the part the flat buffer speeds up
  OptimizerStep  clip_grad_norm_ + step + zero_grad(set_to_none=False)
  Iteration      zero_grad + forward + loss + backward + clip + step
Workloads run at their `full` size on GPUs and `small` size on CPUs (the parameters, and so
the step, are the same at both sizes).

Metrics: every class reports `track_seconds` (each variant's seconds per step, one sample
per round) and `track_speedup` (forloop / variant per round). AdamStep also reports
`track_step_bandwidth` (Adam's 28 bytes per parameter over its time per round, GB/s) and
`track_fraction_of_floor` (that over the streaming bandwidth measured in the same process,
%). `IterationMemory.track_peak_memory`: peak GPU memory of one iteration (GPUs, exact):
the flat buffers must not cost extra.

Which rows make the GPU headline, and why: ResNet-50's `AdamStep` (track_speedup and
track_fraction_of_floor), its samples 50 steps back to back between two synchronisations,
as the host runs ahead of the GPU in training. The MLP's whole Adam step is 1.7M parameters
x 28 bytes = 46 MB, about 15 us of HBM traffic on an H100: less than one synchronisation
around a timed sample plus the flat buffer's check before each step (O(tensors) host work,
tens of microseconds). Its times on a GPU therefore measure launch and host overhead, which
is what the original package's 100 x Linear benchmark was about, but not the bandwidth the
flat buffer buys; ResNet-50 moves 0.7 GB per step, so there the kernels dominate.
"""

from __future__ import annotations

from benchmarks import common

# The variants written with torch alone in this module (tests/test_baselines.py runs their
# steps and fails on any speedlib code).
PLAIN_PYTORCH = ("forloop", "foreach", "fused")
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
        import torch  # noqa: PLC0415 - in the measuring process only (benchmarks.common)

        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only
        from speedbench.measure import workloads  # noqa: PLC0415 - torch: the measuring process only

        dev = measure.device()
        wl = workloads.get(workload, dev)
        self.device = dev
        self.model = wl.torch_model(dev)  # torch.nn / torchvision classes only: the same for every variant
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
            flat = common.technique("contiguous").ContiguousParams(self.model.parameters())
            self.optimizer = torch.optim.Adam(flat.contiguous(), lr=LR, fused=True)
            self.clip_params = flat.contiguous()
        elif variant == "original":
            try:
                from contiguous_params import ContiguousParams  # noqa: PLC0415 - optional (the original package): its absence is a skip
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
        import torch  # noqa: PLC0415 - torch: the measuring process only

        torch.nn.utils.clip_grad_norm_(self.clip_params, MAX_NORM, foreach=self.clip_foreach)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)

    def iteration(self) -> None:
        import torch  # noqa: PLC0415 - torch: the measuring process only

        self.optimizer.zero_grad(set_to_none=self.set_to_none)
        loss = self.loss_fn(self.model(self.x), self.y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.clip_params, MAX_NORM, foreach=self.clip_foreach)
        self.optimizer.step()


def _turns(workload: str, timed) -> tuple:
    """(device, {variant: timed(trainer)}, parameters) for every variant that can run
    here, all alive at once so that they can take turns."""
    trainers = {}
    for variant in VARIANTS:
        try:
            trainers[variant] = _Trainer(workload, variant)
        except NotImplementedError:
            continue  # no contiguous_params, or no speedlib.contiguous in this commit: skipped
    if not trainers:
        raise NotImplementedError(f"no variant of {workload} can run here")
    first = next(iter(trainers.values()))
    return first.device, {v: timed(t) for v, t in trainers.items()}, first.num_params


class _Grid:
    """What the three timed classes share: both workloads, the five variants taking turns
    on each, forloop the baseline."""

    params = (WORKLOADS, VARIANTS)
    param_names = ["workload", "variant"]
    baseline = "forloop"
    # On CPUs the rounds are spread over three fresh builds of the five trainers
    # (benchmarks/common.py, Paired.builds): the per-tensor loop's speed depends on where its
    # 161 x 4 tensors landed in memory, which one build cannot sample.
    builds = common.pick(cpu=3, gpu=1)
    timeout = 1200  # setup_cache: both workloads' variants


class AdamStep(_Grid, common.Paired):
    """optimizer.step() alone: what the flat buffer is meant to speed up. Adam moves the
    parameters; the times stay comparable because they do not depend on the values."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    # 50 steps back to back between two synchronisations on GPUs, as in training where the
    # host runs ahead of the GPU (one MLP step is microseconds there); 3 on CPUs, where a
    # step takes milliseconds and every round costs all five variants.
    number = common.pick(cpu=3, gpu=50)

    def setup_cache(self):
        return self.measure_all()

    def steps(self, workload: str):
        dev, steps, num_params = _turns(workload, lambda t: t.optimizer.step)
        # The bandwidth metrics need the parameter count in the track_* processes, which
        # build no model; every variant has the same parameters.
        self._bytes[workload] = ADAM_BYTES_PER_PARAM * num_params
        return dev, steps

    def measure_all(self) -> dict:
        from speedbench import measure  # noqa: PLC0415 - torch, in the measuring process only

        self._bytes = {}
        try:  # the streaming floor, once, in the process that times the steps
            floor = ("ok", measure.memory_bandwidth(measure.device()))
        except Exception as e:  # noqa: BLE001 - only track_fraction_of_floor depends on it
            floor = ("fail", f"memory bandwidth: {e!r}")
        out = super().measure_all()
        out[_FLOOR] = floor
        out.update({(_BYTES, w): ("ok", n) for w, n in self._bytes.items()})
        return out

    def _bandwidths(self, cache, workload: str, variant: str):
        """Achieved bytes/s per round, or SKIP."""
        times = self.result(cache, workload, variant)
        if times is common.SKIP:
            return common.SKIP
        nbytes = self.result(cache, _BYTES, workload)
        return [nbytes / seconds for seconds in times[variant]]

    def track_step_bandwidth(self, cache, workload: str, variant: str):
        per_round = self._bandwidths(cache, workload, variant)
        if per_round is common.SKIP:
            return common.SKIP
        return {"samples": [b / 1e9 for b in per_round], "number": 1}

    track_step_bandwidth.unit = "GB/s"

    def track_fraction_of_floor(self, cache, workload: str, variant: str):
        """Adam step bandwidth over this device's measured streaming bandwidth, both from
        the measuring process."""
        per_round = self._bandwidths(cache, workload, variant)
        if per_round is common.SKIP:
            return common.SKIP
        floor = self.result(cache, *_FLOOR)
        return {"samples": [100.0 * b / floor for b in per_round], "number": 1}

    track_fraction_of_floor.unit = "% of memory bandwidth"


# AdamStep's cache keys beside its (workload, variant) entries.
_FLOOR = ("memory bandwidth",)
_BYTES = "adam bytes per step"


class OptimizerStep(_Grid, common.Paired):
    """Clip + Adam step + zero_grad: what the optimizer side of an iteration costs."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    number = common.pick(cpu=1, gpu=20)  # an MLP step is well under a millisecond on GPUs

    def setup_cache(self):
        return self.measure_all()

    def steps(self, workload: str):
        dev, steps, _ = _turns(workload, lambda t: t.step)
        return dev, steps


class Iteration(_Grid, common.Paired):
    """The whole training iteration around the optimizer step."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    number = common.pick(cpu=1, gpu=3)  # the MLP's iteration is about a millisecond on GPUs

    def setup_cache(self):
        return self.measure_all()

    def steps(self, workload: str):
        dev, steps, _ = _turns(workload, lambda t: t.iteration)
        return dev, steps


class IterationMemory(common.Measured):
    """Peak GPU memory of one training iteration: the flat buffers must not cost extra."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (WORKLOADS, VARIANTS)
    param_names = ["workload", "variant"]
    timeout = 1200

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, workload: str, variant: str) -> int:
        common.gpu_only("peak device memory")
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        trainer = _Trainer(workload, variant)  # its first iteration allocated the optimizer state
        return measure.peak_memory(trainer.iteration, trainer.device)

    def track_peak_memory(self, cache, workload: str, variant: str) -> int:
        return self.result(cache, workload, variant)  # common.SKIP off GPUs

    track_peak_memory.unit = "bytes"
