"""The headline grid: one comparison per technique, one column per machine.

The overview opens with it so that its first screen answers "which trick, how much, on
which GPU, and how sure": each cell is the technique's main comparison on that machine's
latest commit, as a paired speedup (Hodges-Lehmann estimate, 99 % Wilcoxon interval, N
rounds) where the variants took turns in one process, else as the ratio of separately
timed values, with the exact peak-memory ratio beside it where the technique is about
memory. A cell that has no number says why and what would measure it.

Baselines are plain PyTorch, written with torch alone in the benchmarks, never a speedlib code
path (speedbench.techniques). A cell leads with the comparison against what PyTorch does by
default on that machine, where the suite measures it and it is not the source's own baseline
(torch.optim.Adam is foreach where every parameter is on CUDA, the per-tensor loop on CPUs; a
host tensor is pageable; on GPUs cuDNN convolutions run in TF32 and matmuls in float32), then
the other baselines a practitioner would weigh (fused Adam), then the source's baseline, which
the claims table keeps (speedbench.report.CLAIMS). Each technique's record (speedbench.techniques)
says which variant is PyTorch's default, and where the suite does not measure it.
"""

from __future__ import annotations

import math

import pandas as pd

from speedbench import report
from speedbench.results.environment import NoGpuModel
from speedbench.run import plan
from speedbench.stats import contention
from speedbench.techniques import TECHNIQUES, Headline

__all__ = ["Headline", "HEADLINES", "WIDE_NOTE", "grid", "glance", "pick", "single_device", "single_device_note"]


# Each technique's main comparison, from its record, in the records' order.
HEADLINES = tuple(t.comparison for t in TECHNIQUES.values() if t.comparison is not None)


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
    if h.paired:  # report.paired holds the ratios against PyTorch's defaults and `beside` too
        rows = report.paired(mine[mine["suite"] == h.suite])
        hits = report.headline_rows(rows, h) if not rows.empty else rows
        hits, *more = [hits[hits["baseline"] == b] if not hits.empty else hits
                       for b in (h.baseline, *report.other_baselines(h))]
    else:
        own = mine[(mine["suite"] == h.suite) & (mine["metric"] == h.metric)]
        hits, *more = [_unpaired(own, h, b) for b in (h.baseline, *report.other_baselines(h))]
    more = [m for m in more if not m.empty]
    if more:
        hits = pd.concat([hits, *more], ignore_index=True) if not hits.empty else pd.concat(more, ignore_index=True)
    memory = mine.iloc[0:0]
    if h.memory_suite:
        memory = report.speedups(mine[(mine["suite"] == h.memory_suite) & (mine["metric"] == "peak_memory")],
                                 baseline=h.baseline)
        memory = report.headline_rows(memory, h) if not memory.empty else memory
    return hits, memory


def _unpaired(own: pd.DataFrame, h: Headline, baseline: str) -> pd.DataFrame:
    """`h`'s variant against `baseline`, from separately timed values of its metric."""
    rows = report.speedups(own, baseline=baseline)
    return report.headline_rows(rows, h) if not rows.empty else rows


EARLIER = report.EARLIER  # the dagger the tables use too
# Words in every note on why a cell's interval is wide, one note per cell: the overview folds them away.
WIDE_NOTE = "its 99 % interval"


def _kind(gpu) -> str | None:
    """"gpu" or "cpu": the kind of machine a column measured on, whose PyTorch defaults
    differ (Adam's foreach needs every parameter on CUDA); None where its run did not say."""
    gpu = str(gpu)
    if gpu == NoGpuModel.CPU_ONLY:
        return "cpu"
    return None if gpu in (NoGpuModel.UNKNOWN, "", "nan", "None") else "gpu"


def _order(h: Headline, kind: str | None, present) -> list[str]:
    """The baselines a cell shows, the lead first: PyTorch's default on this kind of machine
    where it was measured, then `h.beside`, then the source's baseline (which leads where the
    default is unknown or was not measured)."""
    default = dict(h.default).get(kind)
    order = [default, *h.beside, h.baseline] if default in present else [h.baseline, *h.beside]
    return [b for b in dict.fromkeys(order) if b in present]


def _tag(h: Headline, baseline: str, kind: str | None) -> str:
    """What a baseline is, said after its name: PyTorch's default here, the source's baseline."""
    said = []
    if dict(h.default).get(kind) == baseline:
        anywhere = len({v for _, v in h.default}) == 1
        said.append("PyTorch's default" + ("" if anywhere else f" on {'CUDA' if kind == 'gpu' else 'CPUs'}"))
    if baseline == h.baseline and h.source:
        said.append(h.source)
    return ", ".join(said)


def _busy(r) -> str:
    """" ‡" after a figure measured on a contended machine."""
    return f" {report.CONTENDED}" if getattr(r, "contention", "") == contention.CONTENDED else ""


def _versus(r, h: Headline, kind: str | None, lead: bool) -> str:
    """One ratio of a cell that shows several baselines, naming its baseline; N with the lead
    only (every ratio of a paired class comes from the same rounds)."""
    ratio = report.fmt_ratio(r.ratio, r.ratio_low, r.ratio_high) + _busy(r)
    name, tag = dict(h.names).get(r.baseline, r.baseline), _tag(h, r.baseline, kind)
    if h.paired:
        return f"{ratio}{f' N={r.n}' if lead else ''} vs {name}" + (f" ({tag})" if tag else "")
    said = [tag, _values(r), f"N={r.n} each, not paired" if lead else ""]
    return f"{ratio} vs {name} ({'; '.join(x for x in said if x)})"


def _ordered(hits: pd.DataFrame, h: Headline, gpu: str) -> list[tuple[str, list]]:
    """One cell's rows as the grid shows them: groups told apart by other parameters
    (batch=...), each group's baselines the lead first (`_order`)."""
    if not (h.default or h.beside):
        return [(_others(row, h), [r]) for (_, row), r in zip(hits.iterrows(), hits.itertuples(), strict=True)]
    order = _order(h, _kind(gpu), set(hits["baseline"]) if not hits.empty else set())
    hits = _shown(hits, order)
    groups: dict[str, list] = {}
    for other, r in zip((_others(row, h) for _, row in hits.iterrows()), hits.itertuples(), strict=True):
        groups.setdefault(other, []).append(r)
    return [(other, sorted(rs, key=lambda r: order.index(r.baseline))) for other, rs in groups.items()]


def _shown(hits: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """The rows of the baselines a cell shows (`_order`): the others are neither shown nor its sources."""
    return hits[hits["baseline"].isin(order)] if not hits.empty else hits


def _cell(hits: pd.DataFrame, memory: pd.DataFrame, h: Headline, gpu: str) -> tuple[str, pd.DataFrame]:
    """The text of one machine's cell (from that machine's rows) and the rows it was computed from."""
    if h.default or h.beside:  # several baselines: each ratio names its own, the lead first
        kind = _kind(gpu)
        hits = _shown(hits, _order(h, kind, set(hits["baseline"]) if not hits.empty else set()))
        labelled = []
        for other, rs in _ordered(hits, h, gpu):
            text = "; ".join(_versus(r, h, kind, lead=i == 0) for i, r in enumerate(rs))
            labelled.append(f"{other}: {text}" if other else text)
    else:
        if h.paired:
            texts = [f"{report.fmt_ratio(r.ratio, r.ratio_low, r.ratio_high)}{_busy(r)} N={r.n}"
                     for r in hits.itertuples()]
        else:
            # Not taking turns (DDP and DataParallel are separate launches; the transfer variants
            # run one after another): say how many values each side has (asv tracks give one), so
            # that a ratio without brackets does not read as a sure one.
            texts = [f"{report.fmt_ratio(r.ratio, r.ratio_low, r.ratio_high)}{_busy(r)} ({_values(r)}; N={r.n} "
                     "each, not paired)" for r in hits.itertuples()]
        labelled = [f"{other}: {t}" if other else t
                    for other, t in zip((_others(r, h) for _, r in hits.iterrows()), texts, strict=True)]
    if not labelled:  # said first, so that a memory-only cell does not pass for the whole comparison
        labelled = [f"speed not measured yet ({_command(h)})"]
    used = [hits]
    if h.memory_suite:
        # the ratio is baseline / variant, inverted here: a baseline that used no memory divides by 0
        labelled += [f"{_others(r, h)}: peak memory {_memory_ratio(r.ratio)}".lstrip(": ")
                     for _, r in memory.iterrows() if pd.notna(r.ratio)]
        used.append(memory)
    if any(len(u) for u in used):
        # the dagger covers the cell (one benchmark version); the double dagger stands after
        # each contended figure, the lead most of all (`_busy`)
        sources = pd.concat(used)
        return "; ".join(labelled) + (f" {EARLIER}" if report.earlier_version(sources).any() else "") \
            + (f" {report.GPU_TESTS_FAILED}" if report.gpu_tests_failed(sources).any() else ""), sources
    if h.gpu_only and gpu == NoGpuModel.CPU_ONLY:
        return "needs a GPU", hits.iloc[0:0]
    return f"not measured yet: {_command(h)}", hits.iloc[0:0]


def _on(rows: pd.DataFrame, machine: str) -> pd.DataFrame:
    return rows[rows["machine"] == machine] if len(rows) else rows


def _scoped(h: Headline, text: str) -> str:
    """A cell's text led by what its timed region holds: "Adam step alone (...): 5.65x ..."."""
    return f"{h.scope[0].upper()}{h.scope[1:]}: {text}"


def _memory_ratio(ratio: float) -> str:
    """Variant / baseline peak memory from `ratio` (baseline / variant)."""
    return report.fmt_ratio(1 / ratio if ratio else math.inf, None, None)


def _instead_of_contended(df: pd.DataFrame, sources: pd.DataFrame) -> list[str]:
    """A note for each cell's result that is not its machine's latest because the latest was
    measured on a contended machine (report.citable chose an earlier, clean one)."""
    if sources.empty or df.empty:
        return []
    newest = report.latest(df).drop_duplicates(["machine", "benchmark"]).set_index(["machine", "benchmark"])["commit"]
    notes = set()
    for r in sources.itertuples():
        latest_commit = newest.get((r.machine, r.benchmark))
        if latest_commit is not None and latest_commit != r.commit:
            out_of = TECHNIQUES[r.technique].title if r.technique in TECHNIQUES else r.technique
            notes.add(f"{out_of} on {r.machine}: commit {r.commit[:8]}, the newest measured on an uncontended "
                      f"machine; the latest, {latest_commit[:8]}, was contended ({report.CONTENDED})")
    return sorted(notes)


def _not_own(r) -> str:
    """", vs foreach" for a ratio against another baseline than its technique's own."""
    own = TECHNIQUES[r.technique].baseline if r.technique in TECHNIQUES else None
    return "" if r.baseline == own else f", vs {r.baseline}"


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
    return (f"{TECHNIQUES[h.technique].title} on {machine}: one device only, so the two run the same single "
            "replica and the ratio is their per-step overhead, not the scaling the comparison is about "
            f"({_command(h)} on a machine with {h.devices} or more GPUs)")


def grid(df: pd.DataFrame) -> report.Table:
    """Techniques down, machines (latest commit each) across; see the module docstring. A
    result measured on a contended machine gives way to the newest uncontended one of the same
    machine (report.citable), and the notes say where; with none, it is shown marked."""
    last = report.citable(df)
    machines = sorted(last["machine"].unique()) if not last.empty else []
    columns = {m: f"{m} ({last.loc[last['machine'] == m, 'gpu'].iloc[0]})" for m in machines}
    rows, used, few, tidy = [], [], [], []
    gpus = dict(zip(last["machine"], last["gpu"].astype(str), strict=True))
    for h in HEADLINES:
        row = {"technique": TECHNIQUES[h.technique].title}
        hits, memory = _comparisons(last, h)
        whole = _comparisons(last, h.whole) if h.whole else None
        few += [(h, m) for m in _too_few_devices(hits, h)]
        for m in machines:
            text, source = _cell(_on(hits, m), _on(memory, m), h, gpus[m])
            parts = [_scoped(h, text)]
            used.append(source)
            tidy += _tidy(_on(hits, m), _on(memory, m), h, m, gpus[m], "headline", text)
            if whole is not None:
                text, source = _cell(_on(whole[0], m), _on(whole[1], m), h.whole, gpus[m])
                parts.append(_scoped(h.whole, text))
                used.append(source)
                tidy += _tidy(_on(whole[0], m), _on(whole[1], m), h.whole, m, gpus[m], "whole step", text)
            row[columns[m]] = ". ".join(parts)
        what = h.what + (f"; beside it, {h.whole.what}" if h.whole else "")
        rows.append({**row, "comparison": what})  # the numbers first, where the eye lands
    sources = pd.concat(used) if used else df.iloc[0:0]
    notes = ["x faster than the baseline (peak memory: variant / baseline), latest commit per machine; a cell "
             "with several baselines names each, PyTorch's default on that machine first",
             "[low, high]: the 99 % Wilcoxon interval of a paired speedup (variants taking turns in one "
             "process, N rounds); separate launches: the worst-case bounds of two separately timed values"]
    notes += [f"{TECHNIQUES[h.technique].title}: {h.against}" for h in HEADLINES if h.against]
    parts = [h for h in HEADLINES if h.whole]
    notes.append("scope: each cell opens with what its timed region holds; "
                 + "; ".join(f"{TECHNIQUES[h.technique].title} times {h.scope}, and its cells add "
                             f"{h.whole.scope} ({h.whole.suite}), what a training run gains" for h in parts))
    notes = report.with_earlier_note(notes, sources)  # the dagger's note, the double dagger's and its counters
    notes += _instead_of_contended(df, sources)
    if not sources.empty:  # whether each column's numbers were measured on a quiet machine, said once
        states: dict[str, list[str]] = {}
        for machine, its in sources.groupby("machine", sort=True):
            states.setdefault(report.run_state(its), []).append(machine)
        notes.append("machine state when measured: " + "; ".join(f"{', '.join(ms)}: {state}"
                                                                   for state, ms in states.items()))
    notes += [single_device_note(h, m) for h, m in few]
    wide = sources[sources["wide_because"].map(lambda w: isinstance(w, str) and bool(w))] \
        if "wide_because" in sources else sources.iloc[0:0]
    whole_suites = {(h.technique, h.whole.suite) for h in HEADLINES if h.whole}
    notes += [f"{TECHNIQUES[r.technique].title} on {r.machine} ("
              # the whole-step class shares its parameters with the headline's: name it
              + (f"{r.suite}, " if (r.technique, r.suite) in whole_suites else "")
              + f"{r.params}{_not_own(r)}): {WIDE_NOTE} "
              f"[{r.ratio_low:.3g}, {r.ratio_high:.3g}] spans {r.width:.2f}x (high / low), more than "
              f"{report.PAIRED_WIDTH_TARGET:.2f}x: {r.wide_because}" for r in wide.itertuples()]
    return report.Table("Headline: each technique's main comparison per machine", pd.DataFrame(rows), sources, notes,
                        data=pd.DataFrame(tidy, columns=TIDY))


# The grid as tidy data (its CSV export, the overview's chart, the static site): one row per
# technique, machine and comparison (baseline, case, speed or memory), numbers as numbers.
TIDY = ["technique", "title", "machine", "gpu", "part", "scope", "measure", "case", "baseline", "baseline_name",
        "baseline_words", "lead", "ratio", "low", "high", "n", "paired", "contended", "earlier_version",
        "gpu_tests_failed", "status", "result_id"]


def _tidy(hits: pd.DataFrame, memory: pd.DataFrame, h: Headline, machine: str, gpu: str, part: str,
          text: str) -> list[dict]:
    """One machine's cell of `h` as tidy rows: every ratio the cell's text shows, in its order
    (`_ordered`), then its peak-memory ratios; a cell without a number gives one row saying why."""
    kind, names = _kind(gpu), dict(h.names)
    base = {"technique": h.technique, "title": TECHNIQUES[h.technique].title, "machine": machine, "gpu": gpu,
            "part": part, "scope": h.scope}
    out = []

    def row(r, measure: str, case: str, lead: bool, ratio, low, high) -> dict:
        return {**base, "measure": measure, "case": case, "baseline": r.baseline,
                "baseline_name": names.get(r.baseline, r.baseline), "baseline_words": _tag(h, r.baseline, kind),
                "lead": lead, "ratio": ratio, "low": low, "high": high, "n": r.n, "paired": h.paired,
                "contended": getattr(r, "contention", "") == contention.CONTENDED,
                "earlier_version": bool(report.earlier_version(pd.DataFrame([r._asdict()])).any()),
                "gpu_tests_failed": bool(report.gpu_tests_failed(pd.DataFrame([r._asdict()])).any()),
                "status": "measured", "result_id": getattr(r, "result_id", "")}

    for other, rs in _ordered(hits, h, gpu):
        out += [row(r, "speed", other, i == 0, r.ratio, r.ratio_low, r.ratio_high) for i, r in enumerate(rs)]
    if h.memory_suite:  # variant / baseline, as the cell's text says it (an exact count: no interval)
        out += [row(r, "peak memory", _others(pd.Series(r._asdict()), h), not out and i == 0,
                    1 / r.ratio if r.ratio else math.inf, math.nan, math.nan)
                for i, r in enumerate(memory[memory["ratio"].notna()].itertuples())] if not memory.empty else []
    if not out:  # why this cell has no number: the same words as the grid's
        out.append({**base, "measure": "speed", "lead": True, "status": text, "paired": h.paired})
    return out


def glance(df: pd.DataFrame) -> pd.DataFrame:
    """`pick` of the grid of `df`."""
    return pick(grid(df).data)


def pick(rows: pd.DataFrame) -> pd.DataFrame:
    """One number per technique and machine of the grid's tidy rows (`grid(df).data`), what a
    training run gains: the whole step's lead ratio where measured, else the headline's (its
    scope said in `part`), else its peak-memory ratio, else the cell's reason, "needs a GPU" last
    (on a CPU the embedding step is not measured yet; only the row gather needs a GPU); the same
    numbers as every export. Machines with a GPU first."""
    if rows.empty:
        return rows
    measured = rows[rows["status"] == "measured"]
    speed = measured[measured["measure"] == "speed"]
    picks = []
    for (technique, machine), its in rows.groupby(["technique", "machine"], sort=False):
        mine = speed[(speed["technique"] == technique) & (speed["machine"] == machine)]
        whole = mine[mine["part"] == "whole step"]
        pool = whole if not whole.empty else mine
        if pool.empty:
            pool = measured[(measured["technique"] == technique) & (measured["machine"] == machine)]
        reasons = its.sort_values("status", key=lambda s: s == "needs a GPU", kind="stable")
        picks.append(pool.iloc[0] if not pool.empty else reasons.iloc[0])
    out = pd.DataFrame(picks).reset_index(drop=True)
    gpu_first = out["gpu"].map(lambda g: _kind(g) != "gpu")
    return out.assign(_cpu=gpu_first).sort_values(["_cpu", "machine"], kind="stable").drop(columns="_cpu") \
        .reset_index(drop=True)
