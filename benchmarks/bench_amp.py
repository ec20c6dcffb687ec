"""Mixed precision: one training step per precision policy, with and without channels_last.

Variants, plain PyTorch (written below with torch alone, never a speedlib code path):
  fp32                strict float32, TF32 off for matmuls and cuDNN convolutions (the
                      baseline; the Tuning Guide's and the claims table's)
  default             PyTorch's own default: cuDNN convolutions in TF32
                      (torch.backends.cudnn.allow_tf32 = True), matmuls in float32
                      (torch.backends.cuda.matmul.allow_tf32 = False). GPUs only: on CPUs
                      TF32 does not exist and PyTorch's default is fp32 itself (see DEFAULT_ON_CPU)
speedlib.amp policies (speedlib.amp.Precision):
  tf32                TF32 Tensor Core maths in matmuls and convolutions
  fp16 / bf16         autocast (fp16 with a GradScaler)
  fp16_channels_last  the same, model and input in channels_last memory format
  bf16_channels_last  (the Tuning Guide's recipe for convolutional networks)
Both plain variants set the two TF32 flags at the start of every step: the variants take
turns in one process, and the flags are process-wide.
Workloads: ResNet-50 (batch 64 at 224 x 224 on GPUs, 2 at 64 x 64 on CPUs) and the
transformer (6 blocks, 256 tokens on GPUs, 32 on CPUs); channels_last applies to 4-D
activations only, so the transformer skips those variants, and CPUs skip fp16 (no fast
fp16 kernels there; see FP16_ON_CPU). cuDNN's autotuner is on for every
variant (it is measured on its own in bench_tuning). A step is zero_grad + forward + loss
under the policy + backward + SGD step (momentum 0.9).

Metrics: `TrainingStep.track_seconds` (every variant's step, the variants taking turns in
one process) and `TrainingStep.track_speedup` (fp32 / variant per round; the headline leads
with default / variant on GPUs, from the same rounds' seconds: speedbench.report.headline);
`PeakMemory.track_peak_memory` (GPUs, exact). The project's target: bf16_channels_last >= 3x
fp32 on ResNet-50 on H100/H200.
"""

from __future__ import annotations

from benchmarks import common

# The variants written with torch alone in this module (tests/test_baselines.py runs their
# steps and fails on any speedlib code); the others are speedlib.amp's policies.
PLAIN_PYTORCH = ("fp32", "default")
VARIANTS = ["fp32", "default", "tf32", "fp16", "bf16", "fp16_channels_last", "bf16_channels_last"]
WORKLOADS = ["resnet50", "transformer"]
PAIRS = common.pick(cpu=15, gpu=30)
# On CPUs, three fresh builds of five rounds (benchmarks/common.py, Paired.builds): ResNet-50's
# bf16_channels_last ratio moved 1.07x-1.13x between builds on the 2-core VM.
BUILDS = common.pick(cpu=3, gpu=1)
# fp16 autocast has no fast kernels on CPUs: on the 2-core VM its steps took 0.8-3.4 s for
# ResNet-50 and 5 s for the transformer (0.03x-0.16x fp32), more than all other variants'
# rounds together, and nobody trains in fp16 on a CPU (GradScaler exists for GPUs). The
# fp16 variants are measured on GPUs only; CPUs spend the time on rounds of the others.
FP16_ON_CPU = ("fp16 autocast is measured on GPUs only: CPUs have no fast fp16 kernels "
               "(0.03x-0.16x fp32 on the 2-core VM)")
# TF32 is a Tensor Core format: on a CPU both flags change nothing, so `default` would run
# fp32's maths again and cost CPU minutes for a ratio of 1.
DEFAULT_ON_CPU = ("default (cuDNN TF32 convolutions, float32 matmuls) is measured on GPUs only: on CPUs TF32 does "
                  "not exist and PyTorch's default is strict fp32, the fp32 variant")


def _runs_here(variant: str, dev) -> None:
    """Skip (NotImplementedError) a variant this kind of device does not measure."""
    if dev.type == "cpu" and variant.startswith("fp16"):
        raise NotImplementedError(FP16_ON_CPU)
    if dev.type == "cpu" and variant == "default":
        raise NotImplementedError(DEFAULT_ON_CPU)


class _Trainer:
    """One model, batch and optimizer, stepped the way `variant` says."""

    def __init__(self, workload: str, variant: str):
        import torch  # noqa: PLC0415 - in the measuring process only (benchmarks.common)

        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only
        from speedbench.measure import workloads  # noqa: PLC0415 - torch: the measuring process only

        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose one of {VARIANTS}")
        policy, _, layout = variant.partition("_")
        # first: a commit without speedlib.amp skips its policies before building a model
        amp = None if variant in PLAIN_PYTORCH else common.technique("amp")
        dev = measure.device()
        wl = workloads.get(workload, dev)
        self.model = wl.torch_model(dev)  # torch.nn / torchvision classes only: the same for every variant
        self.x, self.y = wl.batch(dev)
        if layout == "channels_last":
            if self.x.dim() != 4:
                raise NotImplementedError(f"channels_last needs 4-D activations; {workload} has "
                                          f"{self.x.dim()}-D inputs")
            self.model = self.model.to(memory_format=torch.channels_last)
            self.x = self.x.contiguous(memory_format=torch.channels_last)
        self.loss_fn, self.device = wl.loss, dev
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        torch.backends.cudnn.benchmark = True  # every variant autotuned; measured on its own in bench_tuning
        if variant in PLAIN_PYTORCH:
            self.cudnn_tf32 = variant == "default"  # cuDNN's own default; fp32 turns it off
            self.step = self._torch_step
        else:
            self.precision = amp.Precision(policy, dev.type)
            self.step = self._speedlib_step

    def _torch_step(self) -> None:
        """fp32 and default, as a user writes them with torch alone."""
        import torch  # noqa: PLC0415 - torch: the measuring process only

        # Set every step: the other variants take turns in this process, and the flags are global.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = self.cudnn_tf32
        self.optimizer.zero_grad(set_to_none=True)
        self.loss_fn(self.model(self.x), self.y).backward()
        self.optimizer.step()

    def _speedlib_step(self) -> None:
        self.precision.step(self.model, self.optimizer, self.loss_fn, self.x, self.y)


class TrainingStep(common.Paired):
    """Every variant of one workload taking turns; fp32, plain PyTorch, is the baseline and
    default, PyTorch's own default, the headline's lead on GPUs."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (WORKLOADS, VARIANTS)
    param_names = ["workload", "variant"]
    baseline = "fp32"
    pairs = PAIRS
    builds = BUILDS
    timeout = 1800  # setup_cache: every workload's variants

    def setup_cache(self):
        return self.measure_all()

    def measure_all(self) -> dict:
        self.skipped: dict[tuple, str] = {}
        out = super().measure_all()
        for key, why in self.skipped.items():  # the variant's own reason, not "does not apply"
            if out.get(key, ("",))[0] == "skip":
                out[key] = ("skip", why)
        return out

    def steps(self, workload: str):
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        dev, trainers = measure.device(), {}
        skipped = vars(self).setdefault("skipped", {})  # (measure_all starts it afresh)
        for variant in VARIANTS:
            try:
                _runs_here(variant, dev)
                trainers[variant] = _Trainer(workload, variant)
            except NotImplementedError as e:  # channels_last on a 3-D workload, fp16 on a CPU, ...
                skipped[(workload, variant)] = str(e)
        return dev, {v: t.step for v, t in trainers.items()}


class PeakMemory(common.Measured):
    version = "1"  # bumped when what it measures changes: benchmarks/versions.json
    params = (WORKLOADS, VARIANTS)
    param_names = ["workload", "variant"]
    timeout = 1800

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, workload: str, variant: str) -> int:
        common.gpu_only("peak device memory")
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        _runs_here(variant, measure.device())
        trainer = _Trainer(workload, variant)
        for _ in range(3):  # cuDNN algorithm choice, optimizer state, allocator pools, scaler
            trainer.step()
        return measure.peak_memory(trainer.step, trainer.device)

    def track_peak_memory(self, cache, workload: str, variant: str) -> int:
        return self.result(cache, workload, variant)  # common.SKIP off GPUs

    track_peak_memory.unit = "bytes"
