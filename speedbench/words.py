"""The suite's short names in the words a practitioner uses.

Benchmarks name their variants, knobs and metrics with identifiers (`forloop`, `on`,
`gather_fraction_of_floor`) because they are parameters and file keys. A reader of the
dashboard or of an exported table should not have to open the benchmark source to learn
that `forloop` is torch.optim.Adam(foreach=False) or what "on" means for the accumulation
knob. The identifiers stay in tables and links (they are what `speedlib run --bench`
selects); these words go beside them: in a glossary under each chart, in chart labels.

The definitions repeat the benchmark modules' docstrings (benchmarks/bench_<name>.py), which
remain the reference; a variant's words live in its technique's record (speedbench.techniques),
the knobs' and metrics' here; tests/harness/report/test_words.py checks that every variant and knob a benchmark
declares has its words.
"""

from __future__ import annotations

from speedbench.techniques import TECHNIQUES

__all__ = ["VARIANTS", "DEFAULTS", "KNOBS", "KNOB_CLASSES", "METRICS", "metric", "benchmark", "glossary"]

# Per technique, from its record (speedbench.techniques): variant -> what it is, and which
# variant is PyTorch's default, said after the variants a glossary names.
VARIANTS: dict[str, dict[str, str]] = {name: dict(t.variants) for name, t in TECHNIQUES.items()}
DEFAULTS: dict[str, str] = {name: t.default for name, t in TECHNIQUES.items() if t.default}

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
    # the host-gather roofline (bench_transfer.Roofline, RooflineHypotheses), one point each
    "roofline_gather": "gather, % of the pinned host->device copy, at the roofline's point",
    "roofline_scatter": "write-back, % of the pinned device->host copy, at the roofline's point",
    "roofline_gather_bandwidth": "gather bandwidth at the roofline's point",
    "roofline_scatter_bandwidth": "write-back bandwidth at the roofline's point",
    "roofline_h2d_floor": "pinned host->device copy, the roofline gather's floor",
    "roofline_d2h_floor": "pinned device->host copy, the roofline write-back's floor",
    "roofline_gather_bus_bytes": "bytes a gathered row costs on the bus (a model: sectors or lines, and its index)",
    "roofline_scatter_bus_bytes": "bytes a written row costs on the bus (a model: the sectors it touches)",
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
