"""Mixed precision: one training step per precision policy, with and without channels_last.

Variants (speedlib.amp policies):
  fp32                strict float32, TF32 off (the baseline)
  tf32                TF32 Tensor Core maths in matmuls and convolutions
  fp16 / bf16         autocast (fp16 with a GradScaler)
  fp16_channels_last  the same, model and input in channels_last memory format
  bf16_channels_last  (the Tuning Guide's recipe for convolutional networks)
Workloads: ResNet-50 (batch 64 at 224 x 224 on GPUs, 2 at 64 x 64 on CPUs) and the
transformer (6 blocks, 256 tokens on GPUs, 32 on CPUs); channels_last applies to 4-D
activations only, so the transformer skips those variants, and CPUs skip fp16 (no fast
fp16 kernels there; see FP16_ON_CPU). cuDNN's autotuner is on for every
variant (it is measured on its own in bench_tuning). A step is zero_grad + forward + loss
under the policy + backward + SGD step (momentum 0.9).

Metrics: `TrainingStep.track_seconds` (every variant's step, the variants taking turns in
one process) and `TrainingStep.track_speedup` (fp32 / variant per round: the headline);
`PeakMemory.track_peak_memory` (GPUs, exact). The project's target: bf16_channels_last >= 3x
fp32 on ResNet-50 on H100/H200.
"""

from __future__ import annotations

from benchmarks import common

VARIANTS = ["fp32", "tf32", "fp16", "bf16", "fp16_channels_last", "bf16_channels_last"]
WORKLOADS = ["resnet50", "transformer"]
PAIRS = common.pick(cpu=15, gpu=30)
# On CPUs, three fresh builds of five rounds (benchmarks/common.py, Paired.builds): ResNet-50's
# bf16_channels_last ratio moved 1.07x-1.13x between builds on the 2-core VM.
BUILDS = common.pick(cpu=3, gpu=1)
# fp16 autocast has no fast kernels on CPUs: on the 2-core VM its steps took 0.8-3.4 s for
# ResNet-50 and 5 s for the transformer (0.03x-0.16x fp32), more than all other variants'
# rounds together, and nobody trains in fp16 on a CPU (GradScaler exists for GPUs). The
# fp16 variants are measured on GPUs only; CPUs spend the time on rounds of the others.
FP16_ON_CPU = "fp16 autocast is measured on GPUs only: CPUs have no fast fp16 kernels (0.03x-0.16x fp32 on the 2-core VM)"


class _Trainer:
    def __init__(self, workload: str, variant: str):
        import torch  # noqa: PLC0415 - in the measuring process only (benchmarks.common)

        from speedbench import measure, workloads  # noqa: PLC0415

        Precision = common.technique("amp").Precision
        policy, _, layout = variant.partition("_")
        dev = measure.device()
        if policy == "fp16" and dev.type == "cpu":
            raise NotImplementedError(FP16_ON_CPU)
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
        torch.backends.cudnn.benchmark = True  # every variant autotuned; measured on its own in bench_tuning

    def step(self) -> None:
        self.precision.step(self.model, self.optimizer, self.loss_fn, self.x, self.y)


class TrainingStep(common.Paired):
    """All six policies of one workload taking turns; fp32 is the baseline."""

    params = (WORKLOADS, VARIANTS)
    param_names = ["workload", "variant"]
    baseline = "fp32"
    pairs = PAIRS
    builds = BUILDS
    timeout = 1800  # setup_cache: every workload's variants

    def setup_cache(self):
        return self.measure_all()

    def steps(self, workload: str):
        trainers = {}
        for variant in VARIANTS:
            try:
                trainers[variant] = _Trainer(workload, variant)
            except NotImplementedError:
                continue  # channels_last on a 3-D workload, fp16 on a CPU: that variant does not apply
        return next(iter(trainers.values())).device, {v: t.step for v, t in trainers.items()}


class PeakMemory(common.Measured):
    params = (WORKLOADS, VARIANTS)
    param_names = ["workload", "variant"]
    timeout = 1800

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, workload: str, variant: str) -> int:
        common.gpu_only("peak device memory")
        from speedbench import measure  # noqa: PLC0415

        trainer = _Trainer(workload, variant)
        for _ in range(3):  # cuDNN algorithm choice, optimizer state, allocator pools, scaler
            trainer.step()
        return measure.peak_memory(trainer.step, trainer.device)

    def track_peak_memory(self, cache, workload: str, variant: str) -> int:
        return self.result(cache, workload, variant)  # common.SKIP off GPUs

    track_peak_memory.unit = "bytes"
