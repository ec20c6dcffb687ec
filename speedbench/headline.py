"""The headline grid: one comparison per technique, one column per machine.

The overview opens with it so that its first screen answers "which trick, how much, on
which GPU, and how sure": each cell is the technique's main comparison on that machine's
latest commit, as a paired speedup (Hodges-Lehmann estimate, 99 % Wilcoxon interval, N
rounds) where the variants took turns in one process, else as the ratio of separately
timed values, with the exact peak-memory ratio beside it where the technique is about
memory. A cell that has no number says why and what would measure it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from speedbench import plan, report

__all__ = ["Headline", "HEADLINES", "grid", "single_device", "single_device_note"]


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


# One per technique, the comparison its source write-up is about, on the suite's workload
# that matches the source best.
HEADLINES = (
    Headline("contiguous", "Adam step, flat buffer vs per-tensor loop (ResNet-50's parameters)",
             "AdamStep", "speedlib", "forloop", (("workload", "resnet50"),)),
    Headline("transfer", "gather of 131072 random rows from a 10M-row host table, CuPy vs pinned PyTorch "
             "(each as % of the pinned copy bandwidth)", "FractionOfFloor", "cupy", "pinned", paired=False,
             metric="gather_fraction_of_floor", gpu_only=True),
    Headline("checkpoint", "DenseNet-BC-100 training step, checkpointed (speedlib) vs none",
             "TrainingStep", "speedlib", "none", (("workload", "densenet_bc"),), memory_suite="PeakMemory"),
    Headline("amp", "ResNet-50 training step, bf16 + channels_last vs strict fp32",
             "TrainingStep", "bf16_channels_last", "fp32", (("workload", "resnet50"),)),
    Headline("parallel", "training step, DistributedDataParallel vs DataParallel",
             "Step", "ddp", "dataparallel", paired=False, metric="step", gpu_only=True, devices=2),
    Headline("tuning", "ResNet-50 training step, channels_last on vs off",
             "TrainingStep", "on", "off", (("knob", "channels_last"),)),
)


def _fixed(rows: pd.DataFrame, h: Headline) -> pd.DataFrame:
    """The rows of `h`'s variant at its fixed parameters (rows already of its class)."""
    keep = (rows["technique"] == h.technique) & (rows["variant"] == h.variant)
    for column, value in h.where:
        keep &= (rows[column] == value) if column in rows else False
    return rows[keep]


def _others(row: pd.Series, h: Headline) -> str:
    """The parameters that tell this row apart from the comparison's other rows (batch=...)."""
    fixed = {k for k, _ in h.where} | {"workload"}
    parts = [p for p in str(row.get("params") or "").split(", ")
             if p and not p.startswith("variant=") and p.split("=", 1)[0] not in fixed]
    return ", ".join(parts)


def _values(r) -> str:
    """Both values of an unpaired comparison, in the metric's unit."""
    if r.unit == "seconds":
        return f"{r.value * 1e3:.3g} vs {r.baseline_value * 1e3:.3g} ms"
    return f"{r.value:.3g} vs {r.baseline_value:.3g} {r.unit}"


def _comparisons(last: pd.DataFrame, h: Headline) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`h`'s ratios on every machine at once (speed, and memory where it has a memory class):
    one computation per technique, not per cell, so the grid costs the same at 2 machines or 20."""
    mine = last[last["technique"] == h.technique]
    if h.paired:
        rows = report.paired(mine[mine["suite"] == h.suite])
        hits = _fixed(rows, h) if not rows.empty else rows
        hits = hits[hits["baseline"] == h.baseline] if not hits.empty else hits
    else:
        rows = report.speedups(mine[(mine["suite"] == h.suite) & (mine["metric"] == h.metric)], baseline=h.baseline)
        hits = _fixed(rows, h) if not rows.empty else rows
    memory = mine.iloc[0:0]
    if h.memory_suite:
        memory = report.speedups(mine[(mine["suite"] == h.memory_suite) & (mine["metric"] == "peak_memory")],
                                 baseline=h.baseline)
        memory = _fixed(memory, h) if not memory.empty else memory
    return hits, memory


EARLIER = report.EARLIER  # the dagger the tables use too


def _cell(hits: pd.DataFrame, memory: pd.DataFrame, h: Headline, gpu: str) -> tuple[str, pd.DataFrame]:
    """The text of one machine's cell (from that machine's rows) and the rows it was computed from."""
    if h.paired:
        texts = [f"{report._fmt_ratio(r.ratio, r.ratio_low, r.ratio_high)} N={r.n}" for r in hits.itertuples()]
    else:
        # Not taking turns (DDP and DataParallel are separate launches; the transfer variants
        # run one after another): say how many values each side has (asv tracks give one), so
        # that a ratio without brackets does not read as a sure one.
        texts = [f"{report._fmt_ratio(r.ratio, r.ratio_low, r.ratio_high)} ({_values(r)}; N={r.n} each, not paired)"
                 for r in hits.itertuples()]
    labelled = [f"{other}: {t}" if other else t
                for other, t in zip((_others(r, h) for _, r in hits.iterrows()), texts)]
    if not labelled:  # said first, so that a memory-only cell does not pass for the whole comparison
        labelled = [f"speed not measured yet ({_command(h)})"]
    used = [hits]
    if h.memory_suite:
        labelled += [f"{_others(r, h)}: peak memory {1 / r.ratio:.3g}x".lstrip(": ")
                     for _, r in memory.iterrows() if pd.notna(r.ratio)]
        used.append(memory)
    if any(len(u) for u in used):
        sources = pd.concat(used)
        return "; ".join(labelled) + (f" {EARLIER}" if report.earlier_version(sources).any() else ""), sources
    if h.gpu_only and gpu == "CPU only":
        return "needs a GPU", hits.iloc[0:0]
    return f"not measured yet: {_command(h)}", hits.iloc[0:0]


def _command(h: Headline) -> str:
    """The `speedlib run` that measures `h`: its class's chunk."""
    return plan.how_to_measure(f"bench_{h.technique}.{h.suite}.")


def single_device(rows: pd.DataFrame, h: Headline) -> list[str]:
    """The machines whose results of `h` (a comparison about several devices) reach fewer
    devices than it needs: there the variants train the same single replica."""
    return _too_few_devices(_comparisons(report.latest(rows), h)[0], h) if h.devices > 1 else []


def _too_few_devices(hits: pd.DataFrame, h: Headline) -> list[str]:
    if h.devices <= 1 or hits.empty or "world" not in hits:
        return []
    worlds = pd.to_numeric(hits["world"], errors="coerce")
    return [m for m, w in worlds.groupby(hits["machine"]).max().items() if w < h.devices]


def single_device_note(h: Headline, machine: str) -> str:
    return (f"{report.TECHNIQUES[h.technique].title} on {machine}: one device only, so the two run the same single "
            "replica and the ratio is their per-step overhead, not the scaling the comparison is about "
            f"({_command(h)} on a machine with {h.devices} or more GPUs)")


def grid(df: pd.DataFrame) -> report.Table:
    """Techniques down, machines (latest commit each) across; see the module docstring."""
    last = report.latest(df)
    machines = sorted(last["machine"].unique()) if not last.empty else []
    columns = {m: f"{m} ({last.loc[last['machine'] == m, 'gpu'].iloc[0]})" for m in machines}
    rows, used, few = [], [], []
    gpus = dict(zip(last["machine"], last["gpu"].astype(str)))
    for h in HEADLINES:
        row = {"technique": report.TECHNIQUES[h.technique].title}
        hits, memory = _comparisons(last, h)
        few += [(h, m) for m in _too_few_devices(hits, h)]
        for m in machines:
            row[columns[m]], source = _cell(hits[hits["machine"] == m] if len(hits) else hits,
                                            memory[memory["machine"] == m] if len(memory) else memory, h, gpus[m])
            used.append(source)
        rows.append({**row, "comparison": h.what})  # the numbers first, where the eye lands
    sources = pd.concat(used) if used else df.iloc[0:0]
    notes = ["x faster than the baseline (peak memory: variant / baseline), latest commit per machine",
             "[low, high]: the 99 % Wilcoxon interval of a paired speedup (variants taking turns in one "
             "process, N rounds); separate launches: the worst-case bounds of two separately timed values"]
    if report.earlier_version(sources).any():
        notes.append(report.EARLIER_NOTE)
    notes += [single_device_note(h, m) for h, m in few]
    wide = sources[sources["wide_because"].fillna("").astype(bool)] if "wide_because" in sources else sources.iloc[0:0]
    notes += [f"{report.TECHNIQUES[r.technique].title} on {r.machine} ({r.params}): its 99 % interval "
              f"[{r.ratio_low:.3g}, {r.ratio_high:.3g}] spans {r.width:.2f}x (high / low), more than "
              f"{report.PAIRED_WIDTH_TARGET:.2f}x: {r.wide_because}" for r in wide.itertuples()]
    return report.Table("Headline: each technique's main comparison per machine", pd.DataFrame(rows), sources, notes)
