"""The sources' published claims, and the table that sets what speedlib measured beside them.

Each `Claim` names a source's figure and the metric, variant and baseline that measure the
same thing; `comparable` says whether a result's device compares with the source's. Also the
helpers the technique pages use to say what was not measured, and why (`never_run`,
`why_not_measured`, `is_own_baseline`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from speedbench.stats import contention
from speedbench.run import plan
from speedbench.report.tables import (CONTENDED, EARLIER, Table, fmt_ratio, _shown, with_earlier_note, citable,
                               contended, earlier_version, paired, speedups)
from speedbench.techniques import TECHNIQUES

__all__ = ["Claim", "CLAIMS", "SourceRow", "comparable", "claims_table", "is_own_baseline", "never_run", "why_not_measured"]



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
    # says which `speedlib run` would measure it (speedbench.run.plan.how_to_measure).
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

    @property
    def how_to_measure(self) -> str:
        on = f"a machine with {self.devices} or more GPUs" if self.devices > 1 else "a GPU"
        return f"{plan.how_to_measure(f'bench_{self.technique}.{self.measured_by or self.suite}.')} on {on}"


def comparable(gpu: str, claim: Claim, world=None) -> str:
    """Whether a result on `gpu` (with `world` devices, where the result says) can be set
    beside `claim`, in words."""
    if claim.devices > 1 and pd.notna(world) and str(world).isdigit() and int(world) < claim.devices:
        return (f"no: world={world}, a single device, where the claim is about splitting the work over "
                f"{claim.hardware}")
    if claim.hardware is None:
        return "yes: an exact count, the same on any device"
    if gpu in ("CPU only", "unknown", "") or gpu.startswith("none"):
        return f"no: a CPU result beside a claim measured on {claim.hardware}"
    if claim.measured_as == "memory ratio":  # peak allocator memory: cuDNN's workspaces differ by GPU
        return (f"roughly: a peak-memory ratio on a GPU beside one on {claim.hardware}; the allocator and "
                "cuDNN's workspace choices move it a little from GPU to GPU")
    if claim.hardware in _ANY_GPU:
        return f"yes: a GPU result, and the claim covers {claim.hardware}"
    if claim.hardware.lower().removeprefix("a ").removeprefix("an ") in gpu.lower():  # "a Tesla K80"
        return "yes: the same GPU"
    return f"other GPU: {gpu} beside {claim.hardware}"


# Claims that name no GPU model, or a range every current GPU falls in.
_ANY_GPU = ("a GPU", "Volta or newer GPUs")


# pytorch-checkpoint's README table (DenseNet-BC-100, TITAN X Pascal): one GPU, batch 256.
# Its "Previous" row (torch.utils.checkpoint: 5.38G, 0.52s) is not the one compared here.
_NAIVE = SourceRow("Naive (1 GPU, batch 256)", (("memory GB", 9.93), ("time s", 0.42)))
_THIS = SourceRow("This (1 GPU, batch 256)", (("memory GB", 5.37), ("time s", 0.50)))
# SpeedTorch's README (Colab): host memory of a 10M x 128 float32 table. Its "PyTorch pinned"
# is plain PyTorch (a pinned tensor, index_select, a non_blocking copy): torch_pinned in the
# benchmark, never speedlib's pinned backend.
_CUPY_PINNED = SourceRow("CuPy pinned", (("host memory GB", 9.93),))
_TORCH_PINNED = SourceRow("PyTorch pinned", (("host memory GB", 6.59),))

CLAIMS = (
    Claim("contiguous", "contiguous_params README", "optimizer step 7x-100x faster", 7.0, 100.0,
          "speedup", "adam_step", "speedlib", "forloop", suite="AdamStep"),
    Claim("transfer", "SpeedTorch README (Tesla K80, 2-core CPU)", "CuPy pinned gather 3.1x faster than PyTorch pinned",
          3.1, None, "speedup", "gather", "cupy", "torch_pinned", suite="Transfer", where=(("op", "gather"), ("indices", "random")),
          hardware="a Tesla K80", also="gather_fraction_of_floor"),
    Claim("transfer", "SpeedTorch README (Tesla K80, 2-core CPU)", "CuPy pinned write-back 410x faster than PyTorch pinned",
          410.0, None, "speedup", "scatter", "cupy", "torch_pinned", suite="Transfer",
          where=(("op", "scatter"), ("indices", "random")), hardware="a Tesla K80", also="scatter_fraction_of_floor"),
    Claim("transfer", "SpeedTorch README (Colab)", "10M x 128 float32 table: CuPy pinned 9.93 GB of host memory, PyTorch pinned 6.59 GB",
          9.93 / 6.59, None, "memory ratio", "host_footprint", "cupy", "torch_pinned", hardware=None,
          measured_by="Footprint",
          rows=(_CUPY_PINNED, _TORCH_PINNED), figure="host memory GB"),
    Claim("checkpoint", "efficient DenseNet / pytorch-checkpoint (TITAN X, DenseNet-BC-100)",
          "about -46 % memory (9.93 -> 5.37 GB)", 5.37 / 9.93, None, "memory ratio", "peak_memory", "speedlib", "none",
          "densenet_bc", hardware="a TITAN X", measured_by="PeakMemory", rows=(_THIS, _NAIVE), figure="memory GB"),
    Claim("checkpoint", "efficient DenseNet / pytorch-checkpoint (TITAN X, DenseNet-BC-100)",
          "about +19 % step time (0.42 -> 0.50 s)", 0.42 / 0.50, None, "speedup", "step", "speedlib", "none",
          "densenet_bc", suite="TrainingStep", hardware="a TITAN X", rows=(_THIS, _NAIVE), figure="time s"),
    Claim("amp", "PyTorch Performance Tuning Guide", "mixed precision up to 3x faster", None, 3.0,
          "speedup", "step", "bf16", "fp32", suite="TrainingStep", hardware="Volta or newer GPUs"),
    Claim("amp", "PyTorch Performance Tuning Guide", "mixed precision up to 3x faster (with channels_last)", None, 3.0,
          "speedup", "step", "bf16_channels_last", "fp32", suite="TrainingStep", hardware="Volta or newer GPUs"),
    Claim("parallel", "PyTorch Tuning Guide; Lightning speed-up guide", "DistributedDataParallel much faster than DataParallel",
          None, None, "speedup", "step", "ddp", "dataparallel", hardware="several GPUs", measured_by="Step",
          devices=2),
)

def _claim_rows(s: pd.DataFrame, c: Claim, by_suite: bool, metric: str | None = None) -> pd.DataFrame:
    """The rows of `s` that measure claim `c`: its class's paired speedups (`by_suite`), else
    the ratios of `metric` (its own by default); at its workload and fixed parameters where it
    names them (a metric that says its operation in its name has no `op` parameter)."""
    if s.empty:
        return s
    keep = (s["technique"] == c.technique) & (s["variant"] == c.variant) & (s["baseline"] == c.baseline)
    keep &= (s["suite"] == c.suite) if by_suite else (s["metric"] == (metric or c.metric))
    if c.workload:
        keep &= s["workload"] == c.workload
    for column, value in c.where if metric is None else ():
        keep &= (s[column] == value) if column in s else False
    return s[keep]


def is_own_baseline(rows: pd.DataFrame) -> pd.Series:
    """A paired class's baseline has seconds but no speedup of its own: asv records its
    `track_speedup` as skipped, by design, not as something left unmeasured (a former
    baseline's too, in results from before baselines were plain PyTorch)."""
    chains = {t: (*TECHNIQUES[t].baselines, *TECHNIQUES[t].former) for t in TECHNIQUES}
    return pd.Series([str(b).endswith(".track_speedup") and v in chains.get(t, ())
                      for b, t, v in zip(rows["benchmark"], rows["technique"], rows["variant"])],
                     index=rows.index, dtype=bool)


def never_run(suite: list[str], rows: pd.DataFrame, technique: str, machine: str) -> pd.DataFrame:
    """The technique's benchmarks (names from asv's listing, `suite`) that `machine` has no
    row of at all, measured or not (`rows`: both frames): they never ran there, so neither
    table lists them, and the page must not say "nothing was skipped". With the command
    that measures each (speedbench.run.plan.how_to_measure)."""
    ran = set(rows.loc[rows["machine"] == machine, "benchmark"])
    # the interference counters' tracks travel with the results they describe, not as rows
    counters = tuple(f".track_{m}" for m in contention.COUNTER_METRICS)
    missing = sorted(b for b in suite if b.startswith(f"bench_{technique}.") and b not in ran
                     and not b.endswith(counters))
    return pd.DataFrame({"benchmark": missing, "measured by": [plan.how_to_measure(b) for b in missing]})


def why_not_measured(rows: pd.DataFrame) -> pd.Series:
    """Per row of the loader's not-measured frame: why it has no value, in words. asv keeps
    only "skipped" (NaN), so the reason is read off the row: its status, its machine (GPU
    count) and its parameters, the same conditions the benchmarks skip on."""
    def why(r) -> str:
        if r.status == "outdated":
            return "measured with an earlier version of the benchmark, not comparable with the current one"
        if r.status == "failed":
            return "raised an error in its run (the output of `speedlib run` shows it)"
        gpus = int(r.gpu_count) if pd.notna(r.gpu_count) else 0
        world = str(r.world) if pd.notna(r.world) else ""
        if world.isdigit() and gpus and int(world) > gpus:
            return f"needs {world} GPUs; this machine has {gpus}"
        if r.metric == "scaling_efficiency" and world == "1":
            return "scaling is measured from 2 devices up"
        if "channels_last" in str(r.variant) and r.workload == "transformer":
            return "channels_last applies to convolutional networks only"
        if not gpus:
            return "needs a GPU" + (" (DataParallel needs CUDA)" if r.variant == "dataparallel" else "")
        return "skipped by the benchmark: a package or device it needs is missing here"

    return pd.Series([why(r) for r in rows.itertuples()], index=rows.index, dtype=object)


def claims_table(df: pd.DataFrame) -> Table:
    """Each source's published claim beside what speedlib measured (latest commit per machine,
    or the newest uncontended result where the latest was contended: `citable`)."""
    newest = citable(df)
    s, pairs = speedups(newest), paired(newest)
    rows, used, numbers = [], [], []
    for c in CLAIMS:
        hit = _claim_rows(pairs, c, by_suite=True) if c.suite else pairs.iloc[0:0]
        fixed = "".join(f", {k}={v}" for k, v in c.where)
        label = f"{c.suite}: {c.variant} vs {c.baseline} (paired speedup{fixed})"
        if hit.empty:  # not measured in turns on this commit: the ratio of separate measurements
            hit = _claim_rows(s, c, by_suite=False)
            label = f"{c.metric}: {c.variant} vs {c.baseline} ({c.measured_as})"
        if hit.empty and c.also and not _claim_rows(s, c, by_suite=False, metric=c.also).empty:
            hit = _claim_rows(s, c, by_suite=False, metric=c.also)
            label = f"{c.also}: {c.variant} vs {c.baseline} (bandwidth ratio: each as % of a pinned copy timed just before it)"
        fixed = {k for k, _ in c.where}
        others = [p for p in _shown(hit) if p != "workload" and p not in fixed]  # e.g. batch: one row per value
        if c.measured_as == "memory ratio":  # report variant / baseline, as the claim is stated
            hit = hit.assign(ratio=1 / hit["ratio"], ratio_low=1 / hit["ratio_high"], ratio_high=1 / hit["ratio_low"])
        claimed = "" if c.claimed is None and c.claimed_high is None else (
            f"{c.claimed:.3g}x" if c.claimed_high is None else
            f"up to {c.claimed_high:.3g}x" if c.claimed is None else f"{c.claimed:.3g}x-{c.claimed_high:.3g}x")
        claim_numbers = {"technique": c.technique, "source": c.source, "claimed_low": c.claimed,
                         "claimed_high": c.claimed_high, "measured_as": label}
        if hit.empty:
            rows.append({"technique": c.technique, "source": c.source, "claim": c.claim, "claimed": claimed,
                         "measured as": label, "machine": "", "workload": "",
                         "measured": f"not measured yet: {c.how_to_measure}", "comparable": ""})
            numbers.append(claim_numbers)
            continue
        used.append(hit)
        earlier, busy = earlier_version(hit), contended(hit)
        for _, r in hit.sort_values(["machine", "workload", *others], kind="stable").iterrows():
            setting = ", ".join(f"{p}={r[p]}" for p in others if r[p] != "")
            rows.append({"technique": c.technique, "source": c.source, "claim": c.claim, "claimed": claimed,
                         "measured as": label,
                         "machine": f"{r['machine']} ({r['gpu']})", "commit": r["commit"][:8],
                         "workload": f"{r['workload']} ({setting})" if setting else r["workload"],
                         "measured": fmt_ratio(r["ratio"], r["ratio_low"], r["ratio_high"])
                         + (f" {EARLIER}" if earlier[r.name] else "") + (f" {CONTENDED}" if busy[r.name] else ""),
                         "comparable": comparable(str(r["gpu"]), c, r.get("world"))})
            numbers.append({**claim_numbers, "machine": r["machine"], "gpu": r["gpu"], "commit": r["commit"],
                            "workload": r["workload"], "setting": setting, "ratio": r["ratio"],
                            "low": r["ratio_low"], "high": r["ratio_high"], "N": r["n"],
                            "earlier_version": bool(earlier[r.name]), "contended": bool(busy[r.name]),
                            "contention": r.get("contention", ""),
                            "result_id": r.get("result_id", ""), "comparable": rows[-1]["comparable"]})
    sources = pd.concat(used) if used else df.iloc[0:0]
    # The figures beside the claim, then where they were measured and whether that compares;
    # the source's name and the measurement's name are long and go last.
    order = ["technique", "claim", "claimed", "measured", "machine", "commit", "workload", "comparable", "source",
             "measured as"]
    return Table("Claims versus measured", pd.DataFrame(rows, columns=order), sources,
                 with_earlier_note(["measured: latest commit per machine, or its newest result measured on an "
                                     f"uncontended machine where the latest was contended ({CONTENDED} where none "
                                     "was); ratio [99 % CI bounds]",
                  "paired speedup: variants taking turns in one process; Hodges-Lehmann estimate of the per-round "
                  "ratios [99 % Wilcoxon interval]; otherwise the ratio of separate measurements [worst-case bounds]"],
                  sources),
                 pd.DataFrame(numbers))

