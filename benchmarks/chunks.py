"""The suite in time-boxed chunks, headline comparisons first (`speedlib run --chunk`).

A GPU slot is short (minutes per command, half an hour in all), and asv writes a result
file only when its run ends, so a run killed at a limit saves nothing. The suite is
therefore run as chunks, each its own `asv run` and archive: a command killed at its limit
loses only its own chunk, and the chunks that matter most come first.

Each chunk is a list of regular expressions matched, as asv's `--bench` does, against
`module.Class.method(param, ...)` with the parameters' reprs. A benchmark belongs to the
first chunk that matches it; the last chunk matches everything, so a benchmark added later
is never left out. No imports: the harness reads this file without torch, from a checkout
of any commit. Each technique's record (speedbench/techniques.py) names the chunks that hold
its classes; tests/harness/report/test_techniques.py holds the two together.

The headline is split into one chunk per class (`--chunk headline` selects them all): on
an H100 the six classes together took over eight minutes, and a chunk killed at a limit
saves nothing, so a whole-headline chunk lost all six. The cheap ones come first, so that a
short slot still measures every technique.

A class is measured whole in one process (benchmarks/common.py: its setup_cache measures
every parameter set), so chunks select whole classes: a class split over two chunks would
be measured twice.

`speedlib run --plan` prints each chunk's cost: the durations asv recorded for its
benchmarks on this machine where there are any, else an estimate per parameter combination
(see speedbench/run/plan.py).
"""

CHUNKS = (
    ("headline-amp", "mixed precision: every precision against fp32 on ResNet-50 and a transformer", (
        r"bench_amp\.TrainingStep\.",
    )),
    ("headline-contiguous", "flat buffers: the Adam step against per-tensor Adam, with % of the bandwidth floor", (
        r"bench_contiguous\.AdamStep\.",
    )),
    ("headline-transfer", "host tables: gather and write-back, the paths taking turns and against the pinned-copy "
                          "floor", (
        r"bench_transfer\.Transfer\.", r"bench_transfer\.FractionOfFloor\.",
    )),
    ("headline-tuning", "the Tuning Guide's training-step knobs, off against on", (
        r"bench_tuning\.TrainingStep\.",
    )),
    ("headline-parallel", "DistributedDataParallel against DataParallel", (
        r"bench_parallel\.Step\.",
    )),
    ("headline-checkpoint-memory", "checkpointing: peak memory against no checkpointing (exact counts)", (
        r"bench_checkpoint\.PeakMemory\.",
    )),
    ("headline-checkpoint", "checkpointing: step time against no checkpointing", (
        r"bench_checkpoint\.TrainingStep\.",
    )),
    ("contiguous-amp", "flat buffers and mixed precision: the other workloads and metrics", (
        r"bench_contiguous\.", r"bench_amp\.",
    )),
    ("checkpoint", "checkpointing: saved activations, DataParallel and DDP", (
        r"bench_checkpoint\.",
    )),
    # The roofline's two classes in two chunks: each builds tables up to 40 GB for minutes, and
    # a chunk killed at a limit saves nothing.
    ("transfer-roofline", "host tables: the host-gather roofline, each path's % of the copy floor one axis at a time", (
        r"bench_transfer\.Roofline\.",
    )),
    ("transfer-hypotheses", "host tables: the uva kernel's hypotheses (issue 52) beside plain uva", (
        r"bench_transfer\.RooflineHypotheses\.",
    )),
    ("transfer-parallel", "host tables in detail; DDP and DataParallel scaling", (
        r"bench_transfer\.", r"bench_parallel\.",
    )),
    ("rest", "the Tuning Guide's knobs one by one, the dashboard, anything added later", (
        r"",
    )),
)
