"""The techniques the suite measures, one record each: everything the harness knows of a technique.

A new technique adds its record to `TECHNIQUES` (docs/adding-a-technique.md): its title,
baseline chain and headline metric (the tables, speedbench.report.ratios and .paired_speedups), its plain-PyTorch
variants, every variant in words and which one is PyTorch's default (speedbench.words), the
sources' published claims (speedbench.report.claims), its headline comparison (the overview's
first table, speedbench.report.headline) and the chunks of benchmarks/chunks.py that measure it.
Those modules read the record, as do the dashboard's technique pages (dashboard/_technique.page)
and the tests' lists of techniques; tests/harness/report/test_techniques.py and tests/test_docs.py
hold the rest of the checkout (benchmarks/chunks.py, the README's and docs/benchmarks.md's tables) to it.
This module imports nothing else of the harness, so any package can import it.

A baseline is plain PyTorch: a variant written with torch alone in its benchmark
(benchmarks/bench_<name>.py, listed there as PLAIN_PYTORCH and here as `plain`), never a
speedlib code path, so a ratio against it does not move when speedlib's code does.
tests/test_baselines.py holds the two lists together and runs every plain variant's step
with a check that no speedlib code runs in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Technique", "TECHNIQUES", "Claim", "SourceRow", "Headline", "Question"]


@dataclass(frozen=True)
class SourceRow:
    """One row of a source's published table: its label, as the source prints it, and its
    figures, e.g. SourceRow("This (1 GPU, batch 256)", (("memory GB", 5.37), ("time s", 0.50))).
    A claim that compares two figures takes both from one row each (`Claim.rows`), so a
    memory and a time are never paired across rows."""

    label: str
    figures: tuple[tuple[str, float], ...]

    def figure(self, name: str) -> float:
        return dict(self.figures)[name]


@dataclass(frozen=True)
class Claim:
    """A source's published figure and where speedlib measures the same thing."""

    technique: str
    source: str
    claim: str
    claimed: float | None  # as a ratio in the direction of `measured_as`; None: no figure given
    claimed_high: float | None
    measured_as: str  # "speedup" (x faster) or "memory ratio" (variant / baseline)
    metric: str
    variant: str
    baseline: str
    workload: str | None = None  # the model the figure was measured on, where only that one compares
    # The class that measures it with variants taking turns (a paired speedup, preferred when
    # measured), and parameters the comparison is fixed at, e.g. (("op", "gather"),).
    suite: str | None = None
    where: tuple[tuple[str, str], ...] = ()
    # The device the source measured on; None where the figure is a count that does not
    # depend on it (bytes of memory). A CPU result beside a GPU claim is not comparable.
    hardware: str | None = "a GPU"
    # A metric that measures the same comparison another way, used where neither the paired
    # class nor `metric` ran: each transfer variant's bandwidth as a % of the pinned copy in
    # its own process, so the ratio of two variants' % is the ratio of their bandwidths.
    also: str | None = None
    # The class that measures `metric`, where it is not `suite`: a claim not measured yet
    # says which `speedlib run` would measure it (speedbench.chunks.how_to_measure).
    measured_by: str | None = None
    # Devices the claim is about: DDP against DataParallel means nothing on one GPU.
    devices: int = 1
    # Where the figure is the ratio of two figures of the source's table: the variant's row
    # and the baseline's row, and which of their figures (`figure`) the claim compares.
    # `claimed` is then `from_rows` (the tests hold every claim to it).
    rows: tuple[SourceRow, SourceRow] | None = None
    figure: str | None = None

    @property
    def from_rows(self) -> float | None:
        """The ratio the source rows give, in the direction of `measured_as`: variant /
        baseline for a memory ratio, baseline / variant for a speedup (a time: lower is better)."""
        if self.rows is None or self.figure is None:
            return None
        variant, baseline = (row.figure(self.figure) for row in self.rows)
        return variant / baseline if self.measured_as == "memory ratio" else baseline / variant


@dataclass(frozen=True)
class Headline:
    """A technique's main comparison, as its benchmark class measures it."""

    technique: str
    what: str  # the comparison in a practitioner's words
    suite: str  # the benchmark class
    variant: str
    baseline: str
    where: tuple[tuple[str, str], ...] = ()  # parameters the comparison is fixed at
    paired: bool = True  # False: not taking turns (separate launches, one value each)
    metric: str | None = None  # not paired: the metric compared (its kind says which way is better)
    memory_suite: str | None = None  # an exact peak-memory class to show beside the speedup
    gpu_only: bool = False  # the variant cannot run without CUDA
    devices: int = 1  # the devices the comparison is about: fewer measure overhead, not its point
    # Which baselines its cells use, in words (the grid's notes say it for every row).
    against: str = ""
    # PyTorch's default among the variants, per kind of machine ("gpu", "cpu"), where it is
    # not always `baseline`: the cell leads with it. `baseline` stays the source's.
    default: tuple[tuple[str, str], ...] = ()
    beside: tuple[str, ...] = ()  # more baselines shown after the lead, before the source's
    names: tuple[tuple[str, str], ...] = ()  # baselines in a cell's words, where not their identifiers
    source: str = ""  # whose baseline `baseline` is, said after it where it does not lead alone
    # What the timed region holds, said first in every cell: a 35.8x optimizer step stood in
    # one column with a 3.18x training step, and nothing told a reader they time different work.
    scope: str = "whole training step"
    # Where the headline times a part of a step: the same variants timed over the whole step,
    # shown beside it, since the part's ratio is not what a training run gains.
    whole: Headline | None = None
    # The same comparison timed without pairing (one variant after another, one value each),
    # read only on a machine where this paired class was not measured, and marked so.
    fallback: Headline | None = None
    # Why a fallback's ratios are not the comparison, said beside it where both were measured.
    fallback_differs: str = ""
    # What the ratio measures on fewer than `devices` devices ("wrapper overhead only").
    too_few: str = ""


@dataclass(frozen=True)
class Question:
    """One row of the at-a-glance chart and of the headline grid: one comparison (what is timed,
    against which baseline, speed or peak memory), the same in every machine's cell. A technique
    with two questions has two rows: a cell never holds another comparison's number."""

    key: str  # stable, in links and anchors: "contiguous-step"
    label: str  # the row's name in a few words, the baseline included
    comparison: Headline  # the class, variant and parameters it reads (its fallback where unpaired)
    # A variant, or "" for PyTorch's default on each kind of machine (`comparison.default`, else
    # `comparison.baseline`): the question "what does it gain over doing nothing?" on every machine.
    baseline: str = ""
    measure: str = "speed"  # or "peak memory": variant / baseline from `comparison.memory_suite`, lower is better

    @property
    def technique(self) -> str:
        return self.comparison.technique

    def baseline_on(self, kind: str | None) -> str:
        """The variant this row compares with on a machine of `kind` ("gpu", "cpu", None: unknown)."""
        return self.baseline or dict(self.comparison.default).get(kind) or self.comparison.baseline


@dataclass(frozen=True)
class Technique:
    title: str
    baseline: str  # the variant every other variant is compared with
    headline: str  # the metric the overview shows where no paired headline was measured
    # Baselines for benchmarks that have no `baseline` variant, in order of preference
    # (DataParallel does not run on CPUs; some benchmarks switch one option off and on).
    fallbacks: tuple[str, ...] = ()
    # The class whose paired speedups (variants taking turns in one process) are the headline.
    suite: str | None = None
    # The variants written with torch alone in the benchmarks: every baseline is one of them.
    plain: tuple[str, ...] = ()
    # Variants that were a class's baseline in results measured before baselines were plain
    # PyTorch, though they are speedlib code paths: their own speedup was never recorded, by
    # design, and nothing is shown as a ratio against them.
    former: tuple[str, ...] = ()
    # Variant -> what it is, saying whose code it runs: "plain PyTorch" (written with torch
    # alone in the benchmark; every baseline is one), speedlib's, or another package's. The
    # benchmark modules' docstrings remain the reference; tests/harness/report/test_words.py checks coverage.
    variants: dict[str, str] = field(default_factory=dict)
    # Which variant is what PyTorch does by default (a user who changes nothing gets it), read
    # from torch 2.14's source, and where the suite does not measure it: the headline grid leads
    # with that variant where it is measured; the claims table keeps each source's own baseline.
    default: str = ""
    claims: tuple[Claim, ...] = ()  # the sources' published figures, set beside what was measured
    comparison: Headline | None = None  # its main comparison (and the whole step beside it)
    questions: tuple[Question, ...] = ()  # the rows of the overview's chart, each one comparison
    # The chunks of benchmarks/chunks.py that measure its classes, the headline comparison's first.
    chunks: tuple[str, ...] = ()

    @property
    def baselines(self) -> tuple[str, ...]:
        return (self.baseline, *self.fallbacks)

    def __post_init__(self):
        speedlib = [b for b in self.baselines if b not in self.plain]
        if speedlib:  # the rule, checked where the chain is written
            raise ValueError(f"{self.title}: baselines {speedlib} are not plain PyTorch variants {self.plain}")


def _named(records: dict[str, Technique]) -> dict[str, Technique]:
    """`records`, refused where a claim or headline comparison names another technique than its record's."""
    for name, t in records.items():
        parts = [*t.claims, *([t.comparison, t.comparison.whole] if t.comparison else []), *t.questions]
        strays = sorted({p.technique for p in parts if p is not None and p.technique != name})
        if strays:
            raise ValueError(f"{name}: its claims or headline comparison name {strays}")
    return records


# pytorch-checkpoint's README table (DenseNet-BC-100, TITAN X Pascal): one GPU, batch 256.
# Its "Previous" row (torch.utils.checkpoint: 5.38G, 0.52s) is not the one compared here.
_NAIVE = SourceRow("Naive (1 GPU, batch 256)", (("memory GB", 9.93), ("time s", 0.42)))
_THIS = SourceRow("This (1 GPU, batch 256)", (("memory GB", 5.37), ("time s", 0.50)))
# SpeedTorch's README (Colab): host memory of a 10M x 128 float32 table. Its "PyTorch pinned"
# is plain PyTorch (a pinned tensor, index_select, a non_blocking copy): torch_pinned in the
# benchmark, never speedlib's pinned backend.
_CUPY_PINNED = SourceRow("CuPy pinned", (("host memory GB", 9.93),))
_TORCH_PINNED = SourceRow("PyTorch pinned", (("host memory GB", 6.59),))

_ADAM = Headline(
    "contiguous", "Adam step on ResNet-50's parameters, flat buffer (speedlib) vs PyTorch's default "
    "Adam, vs fused Adam and vs the per-tensor loop", "AdamStep", "speedlib", "forloop",
    (("workload", "resnet50"),),
    against="leads with PyTorch's default Adam on the machine: foreach where every parameter is on CUDA, "
            "the per-tensor loop (forloop) on CPUs (torch.optim.Adam without foreach or fused); then fused "
            "Adam (fused=True, never the default); then the per-tensor loop, contiguous_params' baseline, "
            "which the claims table keeps",
    default=(("gpu", "foreach"), ("cpu", "forloop")), beside=("fused",),
    names=(("forloop", "per-tensor loop"),), source="contiguous_params' baseline",
    scope="Adam step alone (optimizer.step(), not clip or zero_grad)",
    whole=Headline("contiguous", "the whole training iteration (forward, backward, clip, Adam step, "
                   "zero_grad) on ResNet-50", "Iteration", "speedlib", "forloop",
                   (("workload", "resnet50"),), default=(("gpu", "foreach"), ("cpu", "forloop")),
                   beside=("fused",), names=(("forloop", "per-tensor loop"),),
                   source="contiguous_params' baseline", scope="whole training iteration"))

# The unpaired figure the transfer row once led with: FractionOfFloor times each variant alone
# (its bandwidth is a % of the pinned copy), which is its purpose, not a comparison between them.
_GATHER_ALONE = Headline(
    "transfer", "the same gather timed one variant after another (FractionOfFloor: 20 calls each, one value "
    "per variant), each as % of the pinned host->device copy", "FractionOfFloor", "auto", "torch_pinned",
    paired=False, metric="gather_fraction_of_floor", gpu_only=True,
    default=(("gpu", "torch_pageable"), ("cpu", "torch_pageable")),
    names=(("torch_pageable", "PyTorch pageable"), ("torch_pinned", "PyTorch pinned")),
    source="SpeedTorch's baseline", scope="row gather only (no training)")

_GATHER = Headline(
    "transfer", "gather of 131072 random rows from a 10M-row host table onto the GPU, HostTable's default (auto: "
    "speedlib picks its path by measurement) vs PyTorch's default pageable copy and vs PyTorch's pinned path, "
    "the variants taking turns (Transfer, op=gather, indices=random)", "Transfer", "auto", "torch_pinned",
    (("op", "gather"), ("indices", "random")), gpu_only=True,
    against="leads with torch_pageable, PyTorch's default (table[idx].to(device): a host tensor is pageable "
            "unless pinned, and .to(device) copies it synchronously); then torch_pinned, PyTorch's pinned "
            "path (index_select into a pinned buffer, then .to(device, non_blocking=True)), SpeedTorch's "
            "baseline ('PyTorch pinned'), which the claims table keeps; both written with torch alone in the "
            "benchmark. Results measured before they existed had speedlib's own pinned backend as "
            "baseline: they show no ratio",
    default=(("gpu", "torch_pageable"), ("cpu", "torch_pageable")),
    names=(("torch_pageable", "PyTorch pageable"), ("torch_pinned", "PyTorch pinned")),
    source="SpeedTorch's baseline", scope="row gather only (no training)",
    fallback=_GATHER_ALONE,
    # Why the two differ (issue 51): on the H200 at d93fd5c1 they agree within 1.5 % on the paths
    # where the GPU reads host memory itself (cupy, uva) and differ on those the host CPU packs.
    fallback_differs="FractionOfFloor times each variant alone, 20 calls of the same rows in a row with the "
                     "device synchronised after each: the rows and page-table entries the last call touched are "
                     "still in the host's caches for the paths the CPU packs (torch_pinned, torch_pageable), and "
                     "no path can overlap one call's packing with the last call's copy. Its figures are each "
                     "variant's share of the bus, not a comparison between variants; the paired Transfer class "
                     "(the variants taking turns, every round against the same baseline) is",
    whole=Headline("transfer", "an embedding's training step (forward, backward, optimizer step) on a "
                   "host-resident table, HostTable's default (auto) vs nn.Embedding(sparse=True) + "
                   "SparseAdam in host memory", "EmbeddingStep", "auto", "sparse_adam_host",
                   beside=("sparse_adam",),
                   names=(("sparse_adam_host", "SparseAdam on the host"),
                          ("sparse_adam", "SparseAdam on the GPU")),
                   scope="whole embedding training step"))

_CHECKPOINT = Headline(
    "checkpoint", "DenseNet-BC-100 training step, checkpointed (speedlib) vs none",
    "TrainingStep", "speedlib", "none", (("workload", "densenet_bc"),), memory_suite="PeakMemory",
    against="against none (no checkpointing), PyTorch's default", default=(("gpu", "none"), ("cpu", "none")))

_AMP = Headline(
    "amp", "ResNet-50 training step, bf16 + channels_last vs PyTorch's default precision and vs strict fp32",
    "TrainingStep", "bf16_channels_last", "fp32", (("workload", "resnet50"),),
    against="leads on GPUs with default, PyTorch's default precision (cuDNN convolutions in TF32, matmuls "
            "in float32: torch.backends.cudnn.allow_tf32 = True, torch.backends.cuda.matmul.allow_tf32 = "
            "False; on GPUs older than Ampere TF32 does nothing and it computes as fp32); then strict fp32 "
            "(TF32 off everywhere), the Tuning Guide's baseline, which the claims table keeps. On CPUs TF32 "
            "does not exist: PyTorch's default is strict fp32, which leads there",
    default=(("gpu", "default"), ("cpu", "fp32")),
    # a cell says "vs TF32 convolutions": what PyTorch's default precision changes (matmuls stay float32)
    names=(("default", "TF32 convolutions"), ("fp32", "strict fp32")),
    source="the Tuning Guide's baseline")

_DDP = Headline(
    "parallel", "training step, DistributedDataParallel vs DataParallel",
    "Step", "ddp", "dataparallel", paired=False, metric="step", gpu_only=True, devices=2,
    scope="whole training step, all GPUs",
    against="against DataParallel, the sources' baseline: PyTorch has no default for several GPUs "
            "(its documentation recommends DDP over DataParallel)",
    names=(("dataparallel", "DataParallel"),), too_few="wrapper overhead only")

_CHANNELS_LAST = Headline(
    "tuning", "ResNet-50 training step, channels_last on vs off",
    "TrainingStep", "on", "off", (("knob", "channels_last"),),
    against="against off (NCHW), PyTorch's default memory format", default=(("gpu", "off"), ("cpu", "off")),
    names=(("off", "NCHW"),))

# The overview's rows, per technique: each one comparison, the same in every machine's cell.
QUESTIONS_CONTIGUOUS = (
    Question("contiguous-step", "Flat-buffer Adam: optimizer step vs PyTorch's default Adam", _ADAM),
    Question("contiguous-iteration", "Flat-buffer Adam: whole iteration vs PyTorch's default Adam", _ADAM.whole),
)
QUESTIONS_TRANSFER = (
    Question("transfer-gather", "Host-table gather vs PyTorch's default (pageable copy)", _GATHER),
    Question("transfer-gather-pinned", "Host-table gather vs PyTorch's pinned path", _GATHER, baseline="torch_pinned"),
    Question("transfer-step", "Host-table embedding: training step vs SparseAdam on the host", _GATHER.whole),
)
QUESTIONS_CHECKPOINT = (
    Question("checkpoint-time", "Checkpointing: step time vs none", _CHECKPOINT),
    Question("checkpoint-memory", "Checkpointing: peak memory vs none", _CHECKPOINT, measure="peak memory"),
)
QUESTIONS_AMP = (
    Question("amp-default", "Mixed precision vs PyTorch's default precision", _AMP),
    Question("amp-fp32", "Mixed precision vs strict fp32", _AMP, baseline="fp32"),
)
QUESTIONS_PARALLEL = (Question("parallel", "DDP vs DataParallel: step time, all GPUs", _DDP),)
QUESTIONS_TUNING = (Question("tuning", "channels_last vs NCHW: training step", _CHANNELS_LAST),)

# The baselines are what each technique's source write-up compared against, written with
# torch alone (SpeedTorch's "PyTorch pinned" is torch_pinned, not speedlib's pinned backend).
# Each headline comparison is the one its source write-up is about, on the suite's workload
# that matches the source best, led by PyTorch's default where that is another variant.
TECHNIQUES = _named({
    "contiguous": Technique(
        "Flat-buffer (contiguous) parameters", "forloop", "adam_step", suite="AdamStep",
        plain=("forloop", "foreach", "fused"),
        variants={
            "forloop": "torch.optim.Adam(foreach=False), one kernel chain per tensor (plain PyTorch; the "
                       "source write-up's baseline, and what Adam runs on CPU tensors)",
            "foreach": "torch.optim.Adam(foreach=True), multi-tensor kernels (plain PyTorch; what Adam picks by "
                       "itself on CUDA)",
            "fused": "torch.optim.Adam(fused=True) (plain PyTorch)",
            "speedlib": "speedlib.ContiguousParams: one flat buffer, Adam(fused=True) on it",
            "original": "the contiguous_params 1.0.0 package's flat buffer",
        },
        default="PyTorch's default: torch.optim.Adam without foreach or fused runs foreach when every parameter "
                "is on CUDA and forloop otherwise, CPUs included; fused is never picked by itself "
                "(torch/optim/optimizer.py, _default_to_fused_or_foreach)",
        claims=(
            Claim("contiguous", "contiguous_params README", "optimizer step 7x-100x faster", 7.0, 100.0,
                  "speedup", "adam_step", "speedlib", "forloop", suite="AdamStep"),
        ),
        comparison=_ADAM,
        questions=QUESTIONS_CONTIGUOUS,
        chunks=("headline-contiguous", "contiguous-amp"),
    ),
    # torch_pinned is the GPU baseline; CPUs run only pageable tables: torch_pageable there. EmbeddingStep
    # compares with sparse_adam_host, and Packing (in old results only) with index_select.
    "transfer": Technique(
        "Host<->GPU transfer and CPU-hosted embeddings", "torch_pinned", "gather",
        ("torch_pageable", "sparse_adam_host", "index_select"), suite="Transfer",
        plain=("torch_pageable", "torch_pinned", "sparse_adam_host", "sparse_adam", "index_select"),
        former=("pinned", "pageable"),
        variants={
            "torch_pageable": "plain PyTorch's pageable copy: a host table, table[idx].to(device); write-back "
                              "table[idx] = values.cpu() (PyTorch's default; the baseline on CPUs)",
            "torch_pinned": "plain PyTorch's pinned path: a pinned table, index_select into a pinned buffer, then "
                            ".to(device, non_blocking=True); write-back: the values copied into a pinned buffer, "
                            "then index_copy_ into the table (SpeedTorch's 'PyTorch pinned'; the baseline on GPUs)",
            "pageable": "speedlib's pageable backend: CPU index_select, then a synchronous copy from pageable memory. "
                        "In results from before the plain-PyTorch variants existed it was the CPU baseline, a "
                        "speedlib code path: those show no ratio against it",
            "pinned": "speedlib's pinned backend: rows packed on the CPU into pinned memory, then non_blocking "
                      "copies (how it packed them at older commits: docs/techniques/transfer.md). In results from "
                      "before the plain-PyTorch variants existed it was the GPU baseline, a speedlib code path: an "
                      "old ratio against it is against speedlib's backend, not plain PyTorch, and is not shown",
            "cupy": "CuPy kernels read pinned host memory from the GPU (SpeedTorch's approach; speedlib's backend)",
            "uva": "speedlib's zero-copy backend: registered host memory read from the GPU by a whole-row Triton "
                   "kernel (what read it at older commits: docs/techniques/transfer.md)",
            "device": "the whole table in GPU memory (speedlib's backend; the upper bound)",
            "uva_sorted": "speedlib's uva backend with sort_indices=True: indices sorted, rows read in index order, "
                          "the caller's order restored in the same pass (the roofline's hypotheses)",
            "uva_2m": "speedlib's uva backend with huge_pages=True: the table in 2 MiB pages (transparent huge pages, "
                      "2 MiB-aligned, then registered), against 4 KiB pages (the roofline's hypotheses)",
            "uva_lines": "speedlib's uva backend with whole_lines=True: gathers read whole aligned 128-byte lines, the "
                         "neighbours' bytes dropped (the roofline's hypotheses)",
            "uva_4k_in_flight": "speedlib's uva backend with bytes_in_flight=4096: each kernel program reads 4 KiB "
                                "before writing (16 KiB by default; the roofline's hypotheses)",
            "uva_64k_in_flight": "speedlib's uva backend with bytes_in_flight=65536: each kernel program reads 64 KiB "
                                 "before writing, with 8 warps (16 KiB and 4 by default; the roofline's hypotheses)",
            "auto": "speedlib's default (HostTable without backend=): picks among its own paths by measurement at "
                    "first use, cached per device and table shape; pageable on CPUs",
            "sparse_adam": "plain PyTorch: nn.Embedding(sparse=True) + torch.optim.SparseAdam, table on the device "
                           "(GPUs only)",
            "sparse_adam_host": "plain PyTorch: nn.Embedding(sparse=True) in host memory + torch.optim.SparseAdam on "
                                "the CPU, rows looked up on the CPU and copied to the device, the gradient copied "
                                "back (EmbeddingStep's baseline)",
            "index_select": "Packing's baseline, plain PyTorch: torch.index_select (write-back: index_copy_), one "
                            "call on all intra-op threads, host to host (Packing is in old results only: "
                            "docs/techniques/transfer.md)",
            "staged": "Packing: speedlib's pinned backend's staging workers packing 2 MiB chunks (NumPy take / put "
                      "on byte rows), with no copy behind them (in old results only: docs/techniques/transfer.md)",
        },
        default="PyTorch's default: torch_pageable (a host tensor is pageable unless pinned, and .to(device) "
                "copies it synchronously)",
        claims=(
            Claim("transfer", "SpeedTorch README (Tesla K80, 2-core CPU)",
                  "CuPy pinned gather 3.1x faster than PyTorch pinned", 3.1, None, "speedup", "gather", "cupy",
                  "torch_pinned", suite="Transfer", where=(("op", "gather"), ("indices", "random")),
                  hardware="a Tesla K80", also="gather_fraction_of_floor"),
            Claim("transfer", "SpeedTorch README (Tesla K80, 2-core CPU)",
                  "CuPy pinned write-back 410x faster than PyTorch pinned", 410.0, None, "speedup", "scatter", "cupy",
                  "torch_pinned", suite="Transfer", where=(("op", "scatter"), ("indices", "random")),
                  hardware="a Tesla K80", also="scatter_fraction_of_floor"),
            Claim("transfer", "SpeedTorch README (Colab)",
                  "10M x 128 float32 table: CuPy pinned 9.93 GB of host memory, PyTorch pinned 6.59 GB",
                  9.93 / 6.59, None, "memory ratio", "host_footprint", "cupy", "torch_pinned", hardware=None,
                  measured_by="Footprint", rows=(_CUPY_PINNED, _TORCH_PINNED), figure="host memory GB"),
        ),
        comparison=_GATHER,
        questions=QUESTIONS_TRANSFER,
        chunks=("headline-transfer", "transfer-roofline", "transfer-hypotheses", "transfer-parallel"),
    ),
    "checkpoint": Technique(
        "Activation checkpointing", "none", "step", suite="TrainingStep",
        plain=("none", "reentrant", "non_reentrant", "sequential"),
        variants={
            "none": "no checkpointing (plain PyTorch; the baseline)",
            "reentrant": "torch.utils.checkpoint(use_reentrant=True) per segment (plain PyTorch; nn.BatchNorm "
                         "updates its running statistics again when a segment is rerun)",
            "non_reentrant": "torch.utils.checkpoint(use_reentrant=False) per segment (plain PyTorch)",
            "speedlib": "speedlib.checkpoint (explicit parameters) per segment, with speedlib's BatchNorm (running "
                        "statistics updated once per step)",
            "sequential": "torch.utils.checkpoint.checkpoint_sequential over the feature stack (plain PyTorch)",
        },
        default="PyTorch's default: none (no checkpointing); torch.utils.checkpoint called without use_reentrant "
                "runs reentrant, with a warning",
        claims=(
            Claim("checkpoint", "efficient DenseNet / pytorch-checkpoint (TITAN X, DenseNet-BC-100)",
                  "about -46 % memory (9.93 -> 5.37 GB)", 5.37 / 9.93, None, "memory ratio", "peak_memory",
                  "speedlib", "none", "densenet_bc", hardware="a TITAN X", measured_by="PeakMemory",
                  rows=(_THIS, _NAIVE), figure="memory GB"),
            Claim("checkpoint", "efficient DenseNet / pytorch-checkpoint (TITAN X, DenseNet-BC-100)",
                  "about +19 % step time (0.42 -> 0.50 s)", 0.42 / 0.50, None, "speedup", "step", "speedlib", "none",
                  "densenet_bc", suite="TrainingStep", hardware="a TITAN X", rows=(_THIS, _NAIVE), figure="time s"),
        ),
        comparison=_CHECKPOINT,
        questions=QUESTIONS_CHECKPOINT,
        chunks=("headline-checkpoint", "headline-checkpoint-memory", "checkpoint"),
    ),
    "amp": Technique(
        "Mixed precision", "fp32", "step", suite="TrainingStep", plain=("fp32", "default"),
        variants={
            "fp32": "strict float32, TF32 off for matmuls and cuDNN convolutions (plain PyTorch; the baseline, the "
                    "Tuning Guide's)",
            "default": "PyTorch's default precision: cuDNN convolutions in TF32 (torch.backends.cudnn.allow_tf32 = "
                       "True), matmuls in float32 (torch.backends.cuda.matmul.allow_tf32 = False) (plain PyTorch; "
                       "GPUs only: on CPUs it is fp32)",
            "tf32": "TF32 Tensor Core maths in matmuls and convolutions (speedlib.amp)",
            "fp16": "float16 autocast with a GradScaler (speedlib.amp)",
            "bf16": "bfloat16 autocast (speedlib.amp)",
            "fp16_channels_last": "float16 autocast, model and input in channels_last (speedlib.amp)",
            "bf16_channels_last": "bfloat16 autocast, model and input in channels_last (speedlib.amp)",
        },
        default="PyTorch's default: default on GPUs, which the suite measures there (cuDNN convolutions in TF32, "
                "matmuls in float32; on GPUs older than Ampere TF32 does nothing and it computes as fp32); fp32 on "
                "CPUs, where TF32 does not exist",
        claims=(
            Claim("amp", "PyTorch Performance Tuning Guide", "mixed precision up to 3x faster", None, 3.0,
                  "speedup", "step", "bf16", "fp32", suite="TrainingStep", hardware="Volta or newer GPUs"),
            Claim("amp", "PyTorch Performance Tuning Guide", "mixed precision up to 3x faster (with channels_last)",
                  None, 3.0, "speedup", "step", "bf16_channels_last", "fp32", suite="TrainingStep",
                  hardware="Volta or newer GPUs"),
        ),
        comparison=_AMP,
        questions=QUESTIONS_AMP,
        chunks=("headline-amp", "contiguous-amp"),
    ),
    # DDP and DataParallel are separate launches, not pairable: the headline is their step times
    "parallel": Technique(
        "DistributedDataParallel vs DataParallel", "dataparallel", "step", ("single", "off"),
        plain=("single", "dataparallel", "off"),
        variants={
            "single": "one process, one device (plain PyTorch; the baseline on CPUs)",
            "ddp": "DistributedDataParallel, one process per device (speedlib.parallel.wrap)",
            "dataparallel": "torch.nn.DataParallel, one process driving every device (plain PyTorch; the baseline)",
            "off": "DDP all-reduces after every micro-batch (plain PyTorch; NoSync's baseline)",
            "on": "DDP inside no_sync() for all but the last micro-batch (speedlib.tuning.accumulation_step)",
        },
        default="PyTorch's default: single, one device; for several GPUs there is none (its documentation "
                "recommends DDP over DataParallel); within DDP, an all-reduce after every backward (NoSync's "
                "off) is the default",
        claims=(
            Claim("parallel", "PyTorch Tuning Guide; Lightning speed-up guide",
                  "DistributedDataParallel much faster than DataParallel", None, None, "speedup", "step", "ddp",
                  "dataparallel", hardware="several GPUs", measured_by="Step", devices=2),
        ),
        comparison=_DDP,
        questions=QUESTIONS_PARALLEL,
        chunks=("headline-parallel", "transfer-parallel"),
    ),
    "tuning": Technique(
        "Performance Tuning Guide knobs", "off", "step", suite="TrainingStep", plain=("off",),
        variants={
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
        default="PyTorch's default: off for every knob but zero_grad, whose on (grad = None) is "
                "optimizer.zero_grad()'s default since torch 2.0; off is also autograd on, DataLoader(num_workers=0, "
                "pin_memory=False) and eager execution. For sync, create_on_device, preallocate, retained_graph and "
                "accumulation there is no setting: off is the common way to write the code",
        comparison=_CHANNELS_LAST,
        questions=QUESTIONS_TUNING,
        chunks=("headline-tuning", "rest"),
    ),
})
