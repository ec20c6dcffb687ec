"""Baselines are plain PyTorch, frozen: every variant a benchmark declares in PLAIN_PYTORCH
(every baseline among them) is written with torch alone in the benchmark and runs no speedlib
code, so a ratio against it cannot move with speedlib's commits.

The check is mechanical: each plain variant's step runs under a profiler that records every
Python function it enters whose code lies in the speedlib package; the list must be empty.
A speedlib variant's step, run the same way, must show speedlib's code (the check can fail).
The benchmarks run on the CPU profile here, at their small sizes, as the other benchmark
tests do; their code paths are the same on GPUs.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.modules.module import _global_parameter_registration_hooks
from torch.optim.optimizer import _global_optimizer_pre_hooks

import speedlib
import speedlib.tuning  # before any profile: its import is no variant's code
from benchmarks import bench_amp, bench_checkpoint, bench_parallel, bench_transfer, bench_tuning
from speedbench import techniques
from speedbench.measure import ddp_launch, workloads
from speedbench.measure.ddp_launch import LIBRARY, Recipe, RunConfig
from speedlib.amp import Precision
from speedlib.contiguous import hooks as contiguous_hooks

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# bench_dashboard times the viewer and has no variants.
WITHOUT_VARIANTS = {"dashboard"}
CUDA = torch.cuda.is_available()


def _module(technique: str):
    return importlib.import_module(f"benchmarks.bench_{technique}")


def _declared() -> dict[str, tuple[str, ...]]:
    """technique -> its benchmark module's PLAIN_PYTORCH, for every module that declares one."""
    out = {}
    for path in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        technique = path.stem.removeprefix("bench_")
        plain = getattr(_module(technique), "PLAIN_PYTORCH", None)
        if plain is not None:
            out[technique] = tuple(plain)
    return out


def speedlib_calls(fn, allowed: tuple[str, ...] = ()) -> list[str]:
    """The speedlib functions that `fn()` enters, as "file:qualified name" (the file's path under
    speedlib/), in order (every thread started meanwhile included), but for those whose name
    starts with one of `allowed` (DATASET, CONTIGUOUS_HOOK below, each with its reason)."""
    root = str(Path(speedlib.__file__).parent) + os.sep
    seen: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            name = f"{Path(frame.f_code.co_filename).relative_to(root).as_posix()}:{frame.f_code.co_qualname}"
            if not name.startswith(allowed):
                seen.append(name)

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return seen


# Process-wide hooks speedlib may install (speedlib/contiguous/hooks.py, on the first
# ContiguousParams): torch's registries of global optimizer and parameter-registration hooks.
_REGISTRIES = (_global_optimizer_pre_hooks, _global_parameter_registration_hooks)


def _speedlib_hooks() -> list[tuple[dict, object, object]]:
    return [(r, k, f) for r in _REGISTRIES for k, f in list(r.items())
            if getattr(f, "__module__", "").startswith("speedlib")]


@pytest.fixture(autouse=True)
def one_class_per_process(monkeypatch):
    """As asv measures every class in a process of its own, a test here starts without the
    process-wide hooks an earlier test's ContiguousParams installed (a speedlib variant built
    in the test installs them again, as in its class's process) and ends without its own."""
    earlier = _speedlib_hooks()
    for registry, key, _ in earlier:
        del registry[key]
    monkeypatch.setattr(contiguous_hooks, "_hooks_installed", False)
    yield
    for registry, key, _ in _speedlib_hooks():
        del registry[key]
    for registry, key, hook in earlier:
        registry[key] = hook


def _params_by_name(cls) -> dict[str, list]:
    """An asv class's parameters, {name: values}; a class with one parameter may list its
    values flat (bench_tuning.CudnnBenchmark), as asv allows."""
    names, params = getattr(cls, "param_names", ()), getattr(cls, "params", ())
    if len(names) == 1 and not all(isinstance(values, (list, tuple)) for values in params):
        params = [params]
    return dict(zip(names, params, strict=True))


def test_every_baseline_is_a_plain_variant_its_benchmark_declares():
    declared = _declared()
    missing = {p.stem.removeprefix("bench_") for p in (ROOT / "benchmarks").glob("bench_*.py")} - set(declared)
    assert missing == WITHOUT_VARIANTS, f"benchmarks without PLAIN_PYTORCH: {missing - WITHOUT_VARIANTS}"
    for technique, plain in declared.items():
        module = _module(technique)
        classes = [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__]
        variants = {v for c in classes for v in _params_by_name(c).get("variant", ())}
        # the report side's list (no torch there) is the benchmark's own, and names besides only
        # variants the module no longer has (kept for old results: Packing's index_select)
        report_side = set(techniques.TECHNIQUES[technique].plain)
        assert set(plain) <= report_side and not (report_side - set(plain)) & variants, technique
        for cls in classes:
            if getattr(cls, "baseline", ""):
                assert cls.baseline in plain, (f"{technique}.{cls.__name__}: baseline {cls.baseline!r} "
                                               "is not plain PyTorch")
    for name, t in techniques.TECHNIQUES.items():
        assert set(t.baselines) <= set(t.plain), name
        assert not set(t.former) & set(t.plain), name  # a former baseline is one that was a speedlib path


def test_a_baseline_chain_that_names_a_speedlib_variant_is_refused():
    with pytest.raises(ValueError, match=r"baselines \['pinned'\] are not plain PyTorch"):
        techniques.Technique("x", "pinned", "gather", plain=("torch_pinned",))


# --- the plain variants' steps run no speedlib code ---------------------------------------

# DataLoading's dataset, which every variant loads, is speedlib.tuning.SyntheticImages: the
# workload, not a variant's code (each item's JPEG decode and augmentation). It lives in the
# library, not the harness, so its cost can change with speedlib's commits for every variant
# alike; its methods and its decoder, and nothing else of speedlib, may run in that class's baseline.
DATASET = ("tuning.py:SyntheticImages.", "tuning.py:_decode_jpeg")

# bench_contiguous's speedlib variant builds a ContiguousParams, which installs speedlib's
# process-wide optimizer step pre-hook (speedlib/contiguous/hooks.py); from then on it runs
# before every optimizer step in the process, its plain variants' included, taking turns with
# it (torch has no per-optimizer opt-out): a tuple of group sizes and a weak-dictionary lookup
# per step that finds no flat buffer. A known speedlib cost the baselines pay there, said in
# the benchmark's docstring; nothing else of speedlib may run in them.
CONTIGUOUS_HOOK = ("contiguous/hooks.py:_check_before_step", "contiguous/hooks.py:_owners_of")

# (technique, class, configuration): the cheapest configuration of every paired class that
# runs on a CPU. GPU-only code paths are traced below through the functions that build them.
PAIRED = [
    ("contiguous", "AdamStep", ("mlp",)), ("contiguous", "OptimizerStep", ("mlp",)),
    ("contiguous", "Iteration", ("mlp",)),
    ("amp", "TrainingStep", ("resnet50",)),
    ("checkpoint", "TrainingStep", ("densenet_bc", 4)), ("checkpoint", "TrainingStep", ("transformer", 4)),
    ("tuning", "TrainingStep", ("conv_bias",)), ("tuning", "TrainingStep", ("zero_grad",)),
    ("tuning", "TrainingStep", ("channels_last",)), ("tuning", "TrainingStep", ("accumulation",)),
    ("tuning", "Inference", ()), ("tuning", "DataLoading", ()), ("tuning", "FusedPointwise", ()),
    ("tuning", "Sync", ()), ("tuning", "Preallocate", ()),
]

cpu_only = pytest.mark.skipif(CUDA, reason="runs the benchmarks' CPU profile (small sizes); the code paths are the "
                                           "same on GPUs")


def _cheap_compile(monkeypatch):
    """torch.compile as the identity: FusedPointwise's compile variant (speedlib's, never
    traced here) would otherwise compile for a minute on this CPU."""
    monkeypatch.setattr(torch, "compile", lambda fn, *a, **k: fn)


@cpu_only
@pytest.mark.parametrize("technique, name, config", PAIRED, ids=[f"{t}.{n}{c}" for t, n, c in PAIRED])
def test_plain_variants_run_no_speedlib_code(technique, name, config, monkeypatch):
    _cheap_compile(monkeypatch)
    module = _module(technique)
    bench = getattr(module, name)()
    bench._bytes = {}  # AdamStep's byte counts, which its measure_all starts
    _, steps = bench.steps(*config)
    plain = [v for v in steps if v in module.PLAIN_PYTORCH]
    assert getattr(module, name).baseline in plain  # never vacuous: the baseline itself is traced
    allowed = DATASET if name == "DataLoading" else CONTIGUOUS_HOOK if technique == "contiguous" else ()
    for variant in plain:
        assert speedlib_calls(steps[variant], allowed) == [], f"{technique}.{name}{config} {variant}"


@cpu_only
def test_the_check_sees_speedlib_code_in_a_speedlib_variant():
    """The same check fails where speedlib runs: a speedlib variant's step, and the baseline's
    step of the code before issue 40 (speedlib.amp.Precision("fp32"))."""
    trainer = bench_amp._Trainer("transformer", "bf16")
    assert "amp.py:Precision.step" in speedlib_calls(trainer.step)
    old = bench_amp._Trainer("transformer", "fp32")
    precision = Precision("fp32", "cpu")
    assert "amp.py:Precision.step" in speedlib_calls(
        lambda: precision.step(old.model, old.optimizer, old.loss_fn, old.x, old.y))


@cpu_only
def test_amps_default_runs_no_speedlib_code_on_cpu():
    """`default` is measured on GPUs only; its step is the same code on a CPU."""
    assert speedlib_calls(bench_amp._Trainer("transformer", "default").step) == []


@cpu_only
def test_create_on_devices_off_runs_no_speedlib_code():
    """CreateOnDevice runs on GPUs only; its "off" is built by the same function here."""
    assert speedlib_calls(bench_tuning._creations(torch.device("cpu"))["off"]) == []


@cpu_only
def test_the_tunings_unpaired_plain_measurements_run_no_speedlib_code():
    """BatchSize's step at PyTorch's defaults, and RetainedGraph's "off" measurement whole
    (speedlib.tuning imported first: its import is no variant's code)."""
    assert speedlib_calls(bench_tuning._Trainer("batch_size", "defaults", batch=1).step) == []
    retained = {}
    assert speedlib_calls(lambda: retained.update(off=bench_tuning.RetainedGraph().measure_one("off"))) == []
    assert retained["off"] > 0  # the loop kept its graphs alive: it ran


def _rank(config, recipe) -> list[str]:
    """speedlib code in one rank's training with `recipe` (speedbench.measure.ddp_launch.train), in
    this process; a DDP config joins a one-rank gloo group first."""
    if config.mode != "ddp":
        return speedlib_calls(lambda: ddp_launch.train(config, recipe=recipe))
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=0, world_size=1)
        try:
            return speedlib_calls(lambda: ddp_launch.train(config, recipe=recipe))
        finally:
            dist.destroy_process_group()


@cpu_only
def test_the_parallel_baselines_train_with_torch_alone():
    """single (the CPU baseline) and NoSync's off (DDP all-reducing every micro-batch) with
    bench_parallel's recipe; dataparallel is the same recipe's other branch (CUDA only)."""
    recipe = bench_parallel.torch_recipe()
    base = {"workload": "mlp", "batch": 8, "steps": 1, "warmup": 0}
    assert _rank(RunConfig(mode="single", **base), recipe) == []
    off = RunConfig(mode="ddp", world_size=1, micro_batches=4, no_sync=False, **base)
    assert _rank(off, recipe) == []
    assert "tuning.py:accumulation_step" in _rank(off, LIBRARY)  # speedlib's "on" path is seen


@cpu_only
@pytest.mark.parametrize("variant", ["none", "reentrant", "sequential"])
def test_the_distributed_checkpoint_baselines_train_with_torch_alone(variant):
    """DistributedStep's ranks (GPUs only) build the variant's model as the paired classes do
    and wrap and step it with bench_parallel's recipe; here one rank of it, in this process."""
    torch_only = bench_parallel.torch_recipe()
    recipe = Recipe(bench_checkpoint._ddp_model, torch_only.wrap, torch_only.step)
    config = RunConfig(mode="single", workload="transformer", batch=4, steps=1, warmup=0, checkpoint=variant)
    assert _rank(config, recipe) == []


@cpu_only
@pytest.mark.parametrize("name, config", [("Transfer", ("gather", "random")), ("Transfer", ("scatter", "sorted")),
                                          ("EmbeddingStep", ())])
def test_transfers_plain_variants_run_no_speedlib_code(name, config, monkeypatch):
    """On a small table (the CPU profile's 1M rows would build three 0.5 GB tables here)."""
    spec = workloads.EmbeddingBatch(rows=4096, dim=16, batch=512)
    monkeypatch.setattr(bench_transfer, "_spec", lambda: spec)
    monkeypatch.setattr(bench_transfer, "BATCH_BYTES", spec.batch * spec.dim * 4)
    monkeypatch.setattr(bench_transfer, "_tables", [])
    _, steps = getattr(bench_transfer, name)().steps(*config)
    plain = [v for v in steps if v in bench_transfer.PLAIN_PYTORCH]
    # a speedlib variant took turns with them
    assert getattr(bench_transfer, name).baseline in plain and "auto" in steps
    for variant in plain:
        assert speedlib_calls(steps[variant]) == [], f"transfer.{name}{config} {variant}"
    assert speedlib_calls(steps["auto"])  # the check sees speedlib's own path
