"""The suite's short names in the words a practitioner uses.

Benchmarks name their variants, knobs and metrics with identifiers (`forloop`, `on`,
`gather_fraction_of_floor`) because they are parameters and file keys. A reader of the
dashboard or of an exported table should not have to open the benchmark source to learn
that `forloop` is torch.optim.Adam(foreach=False) or what "on" means for the accumulation
knob. The identifiers stay in tables and links (they are what `speedlib run --bench`
selects); these words go beside them: in a glossary under each chart, in chart labels.

The definitions repeat the benchmark modules' docstrings (benchmarks/bench_<name>.py), which
remain the reference; tests/test_words.py checks that every variant and knob a benchmark
declares has its words here.
"""

from __future__ import annotations

__all__ = ["VARIANTS", "DEFAULTS", "KNOBS", "KNOB_CLASSES", "METRICS", "metric", "benchmark", "glossary"]

# Per technique: variant -> what it is. Each says whose code it runs: "plain PyTorch" (written
# with torch alone in the benchmark; every baseline is one, speedbench.techniques), speedlib's,
# or another package's.
VARIANTS: dict[str, dict[str, str]] = {
    "contiguous": {
        "forloop": "torch.optim.Adam(foreach=False), one kernel chain per tensor (plain PyTorch; the baseline)",
        "foreach": "torch.optim.Adam(foreach=True), multi-tensor kernels (plain PyTorch; what Adam picks by itself "
                   "on CUDA)",
        "fused": "torch.optim.Adam(fused=True) (plain PyTorch)",
        "speedlib": "speedlib.ContiguousParams: one flat buffer, Adam(fused=True) on it",
        "original": "the contiguous_params 1.0.0 package's flat buffer",
    },
    "transfer": {
        "torch_pageable": "plain PyTorch's pageable copy: a host table, table[idx].to(device); write-back "
                          "table[idx] = values.cpu() (PyTorch's default; the baseline on CPUs)",
        "torch_pinned": "plain PyTorch's pinned path: a pinned table, index_select into a pinned buffer, then "
                        ".to(device, non_blocking=True); write-back: the values copied into a pinned buffer, then "
                        "index_copy_ into the table (SpeedTorch's 'PyTorch pinned'; the baseline on GPUs)",
        "pageable": "speedlib's pageable backend: CPU index_select, then a synchronous copy from pageable memory. "
                    "In results from before the plain-PyTorch variants existed it was the CPU baseline, a speedlib "
                    "code path: those show no ratio against it",
        "pinned": "speedlib's pinned backend: rows packed on the CPU into pinned memory, then non_blocking copies. "
                  "index_select + one copy before commit 1408e44 (the H100 run at bdb0cb6d: 42.4 % of the pinned "
                  "copy); from 1408e44 2 MiB chunks packed on worker threads, each copy overlapping the next packing "
                  "(the H200 run at 838236b: 11.3 %); index_select + one copy again once that staging was removed. "
                  "Until then it was the GPU baseline, a speedlib code path: an old ratio against it is against "
                  "speedlib's backend, not plain PyTorch, and is not shown",
        "cupy": "CuPy kernels read pinned host memory from the GPU (SpeedTorch's approach; speedlib's backend)",
        "uva": "speedlib's zero-copy backend: registered host memory read from the GPU, by torch's index_select "
               "before commit 1408e44, by a whole-row Triton kernel from it",
        "device": "the whole table in GPU memory (speedlib's backend; the upper bound)",
        "auto": "speedlib's default (HostTable without backend=): picks among its own paths by measurement at "
                "first use, cached per device and table shape; pageable on CPUs",
        "sparse_adam": "plain PyTorch: nn.Embedding(sparse=True) + torch.optim.SparseAdam, table on the device "
                       "(GPUs only)",
        "sparse_adam_host": "plain PyTorch: nn.Embedding(sparse=True) in host memory + torch.optim.SparseAdam on "
                            "the CPU, rows looked up on the CPU and copied to the device, the gradient copied back "
                            "(EmbeddingStep's baseline)",
        "index_select": "Packing's baseline, plain PyTorch: torch.index_select (write-back: index_copy_), one call "
                        "on all intra-op threads, host to host (Packing: measured at 838236b and earlier)",
        "staged": "Packing: speedlib's pinned backend's staging workers packing 2 MiB chunks (NumPy take / put on "
                  "byte rows), with no copy behind them (measured at 838236b and earlier; removed with that staging)",
    },
    "checkpoint": {
        "none": "no checkpointing (plain PyTorch; the baseline)",
        "reentrant": "torch.utils.checkpoint(use_reentrant=True) per segment (plain PyTorch; nn.BatchNorm updates "
                     "its running statistics again when a segment is rerun)",
        "non_reentrant": "torch.utils.checkpoint(use_reentrant=False) per segment (plain PyTorch)",
        "speedlib": "speedlib.checkpoint (explicit parameters) per segment, with speedlib's BatchNorm (running "
                    "statistics updated once per step)",
        "sequential": "torch.utils.checkpoint.checkpoint_sequential over the feature stack (plain PyTorch)",
    },
    "amp": {
        "fp32": "strict float32, TF32 off for matmuls and cuDNN convolutions (plain PyTorch; the baseline, the "
                "Tuning Guide's)",
        "default": "PyTorch's default precision: cuDNN convolutions in TF32 (torch.backends.cudnn.allow_tf32 = True), "
                   "matmuls in float32 (torch.backends.cuda.matmul.allow_tf32 = False) (plain PyTorch; GPUs only: "
                   "on CPUs it is fp32)",
        "tf32": "TF32 Tensor Core maths in matmuls and convolutions (speedlib.amp)",
        "fp16": "float16 autocast with a GradScaler (speedlib.amp)",
        "bf16": "bfloat16 autocast (speedlib.amp)",
        "fp16_channels_last": "float16 autocast, model and input in channels_last (speedlib.amp)",
        "bf16_channels_last": "bfloat16 autocast, model and input in channels_last (speedlib.amp)",
    },
    "parallel": {
        "single": "one process, one device (plain PyTorch; the baseline on CPUs)",
        "ddp": "DistributedDataParallel, one process per device (speedlib.parallel.wrap)",
        "dataparallel": "torch.nn.DataParallel, one process driving every device (plain PyTorch; the baseline)",
        "off": "DDP all-reduces after every micro-batch (plain PyTorch; NoSync's baseline)",
        "on": "DDP inside no_sync() for all but the last micro-batch (speedlib.tuning.accumulation_step)",
    },
    "tuning": {
        "off": "the code as most people write it, with torch alone (plain PyTorch; the baseline)",
        "on": "the knob applied, through speedlib.tuning (what it changes for each knob follows)",
        "no_grad": "evaluation under torch.no_grad() (speedlib.tuning.evaluate)",
        "inference_mode": "evaluation under torch.inference_mode() (speedlib.tuning.evaluate)",
        "workers": "DataLoader with worker processes (speedlib.tuning.loader)",
        "pin_memory": "DataLoader with pin_memory=True (speedlib.tuning.loader)",
        "workers_pin_memory": "DataLoader with workers and pin_memory=True (speedlib.tuning.loader)",
        "torchscript": "the GELU scripted with TorchScript (speedlib.tuning.pointwise)",
        "compile": "the GELU compiled with torch.compile (speedlib.tuning.pointwise)",
    },
}

# Per technique: which variant is what PyTorch does by default (a user who changes nothing
# gets it), read from torch 2.14's source, and where the suite does not measure it. The
# headline grid leads with that variant where it is measured (speedbench.report.headline); the
# claims table keeps each source's own baseline.
DEFAULTS: dict[str, str] = {
    "contiguous": "PyTorch's default: torch.optim.Adam without foreach or fused runs foreach when every parameter "
                  "is on CUDA and forloop otherwise, CPUs included; fused is never picked by itself "
                  "(torch/optim/optimizer.py, _default_to_fused_or_foreach)",
    "transfer": "PyTorch's default: torch_pageable (a host tensor is pageable unless pinned, and .to(device) copies "
                "it synchronously)",
    "checkpoint": "PyTorch's default: none (no checkpointing); torch.utils.checkpoint called without use_reentrant "
                  "runs reentrant, with a warning",
    "amp": "PyTorch's default: default on GPUs, which the suite measures there (cuDNN convolutions in TF32, matmuls "
           "in float32; on GPUs older than Ampere TF32 does nothing and it computes as fp32); fp32 on CPUs, where "
           "TF32 does not exist",
    "parallel": "PyTorch's default: single, one device; for several GPUs there is none (its documentation "
                "recommends DDP over DataParallel); off, an all-reduce every backward, is DDP's default",
    "tuning": "PyTorch's default: off for every knob but zero_grad, whose on (grad = None) is "
              "optimizer.zero_grad()'s default since torch 2.0; off is also autograd on, DataLoader(num_workers=0, "
              "pin_memory=False) and eager execution. For sync, create_on_device, preallocate, retained_graph and "
              "accumulation there is no setting: off is the common way to write the code",
}

# The Tuning Guide's on/off knobs: what "on" changes (off is the code most people write).
KNOBS: dict[str, str] = {
    "conv_bias": "on: no bias on a convolution directly before BatchNorm",
    "zero_grad": "on: gradients set to None instead of zero-filled",
    "channels_last": "on: model and input in NHWC (channels_last)",
    "cudnn_benchmark": "on: cuDNN's autotuner",
    "accumulation": "on: the same batch in 4 micro-batches (2 on CPUs): the price of accumulating, "
                    "whose gain is memory",
    "sync": "on: a loss meter that stays on the device instead of calling .item() every step",
    "create_on_device": "on: tensors created with device= instead of .to(device)",
    "preallocate": "on: one longest-length forward and backward before variable-length training",
    "retained_graph": "on: a detached running loss instead of summing the loss tensor, which keeps every "
                      "step's graph alive",
}

# Classes that measure one knob each: their variants are that knob's off and on.
KNOB_CLASSES: dict[str, str] = {
    "CudnnBenchmark": "cudnn_benchmark", "Sync": "sync", "SyncCount": "sync", "CreateOnDevice": "create_on_device",
    "Preallocate": "preallocate", "PreallocateSegments": "preallocate", "RetainedGraph": "retained_graph",
}

# Metric names (the benchmark method without track_/time_) -> what they are.
METRICS: dict[str, str] = {
    "seconds": "seconds per step",
    "speedup": "x faster than the baseline",
    "step": "seconds per step",
    "step_time": "seconds per step",
    "adam_step": "seconds per Adam step",
    "gather": "seconds per gather",
    "scatter": "seconds per write-back",
    "fraction_of_floor": "% of the memory-bandwidth floor",
    "gather_fraction_of_floor": "gather, % of the pinned host->device copy",
    "scatter_fraction_of_floor": "write-back, % of the pinned device->host copy",
    # the two terms of those %, GB/s, from the same process (shown beside the % in the floor table)
    "gather_bandwidth": "gather bandwidth, random rows",
    "scatter_bandwidth": "write-back bandwidth, random rows",
    "h2d_floor": "pinned host->device copy, the gather's floor",
    "d2h_floor": "pinned device->host copy, the write-back's floor",
    "step_bandwidth": "memory bandwidth of the step",
    "bandwidth": "bandwidth",
    "copy_bandwidth": "bulk copy bandwidth",
    "host_footprint": "host memory of the table",
    "device_footprint": "device memory of the table",
    "peak_memory": "peak GPU memory",
    "peak_activation_memory": "peak activation memory",
    "saved_activations": "saved activations",
    "allreduces": "all-reduces per step",
    "samples_per_second": "samples per second",
    "scaling_efficiency": "% of linear scaling",
    "throughput": "samples per second",
    "compile_seconds": "compile time",
    "retained_bytes": "activations kept alive",
    "new_segments": "new allocator segments",
    "syncs": "host-device synchronisations",
    "first_view": "dashboard first view",
    "load_results": "loading the result files",
    # the interference counters, read with the result they describe (speedbench.stats.contention)
    "interference": "CPU time other processes took, % of the machine",
    "preemptions": "times the measuring process was preempted, per second",
    "gpu_clock": "SM clock, % of its maximum",
    "gpu_neighbours": "other processes on the GPU",
}


def metric(name) -> str:
    """A metric in words, the identifier itself where there are none."""
    return METRICS.get(str(name), str(name))


def benchmark(name: str, technique: bool = True) -> str:
    """A full benchmark name in words: "bench_amp.TrainingStep.track_seconds" reads
    "amp, TrainingStep: seconds per step" ("TrainingStep: seconds per step" without the
    technique, where the page names it)."""
    module, _, rest = str(name).partition(".")
    cls, _, method = rest.partition(".")
    if not method:
        return str(name)
    said = f"{cls}: {metric(method.removeprefix('track_').removeprefix('time_'))}"
    return f"{module.removeprefix('bench_')}, {said}" if technique else said


def glossary(technique: str, variants, knobs=(), classes=()) -> str:
    """One line naming what each of `variants` is, then what "on" means for each tuning knob
    among `knobs` and the knobs that `classes` measure, in the order given, then which variant
    is PyTorch's default (DEFAULTS); names without words are left out."""
    words = VARIANTS.get(technique, {})
    parts = [f"{v}: {words[v]}" for v in dict.fromkeys(map(str, variants)) if v in words]
    knobs = [*map(str, knobs), *(KNOB_CLASSES[c] for c in map(str, classes) if c in KNOB_CLASSES)]
    parts += [f"{k} {KNOBS[k]}" for k in dict.fromkeys(knobs) if k in KNOBS]
    if parts and technique in DEFAULTS:  # a baseline is not always what a user gets: say which is
        parts.append(DEFAULTS[technique])
    return "; ".join(parts)
