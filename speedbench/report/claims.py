"""The sources' published claims, and the table that sets what speedlib measured beside them.

Each `Claim`, written in its technique's record (speedbench.techniques), names a source's
figure and the metric, variant and baseline that measure the same thing; `comparable` says
whether a result's device compares with the source's. Also the helpers the technique pages
use to say what was not measured, and why (`never_run`, `why_not_measured`, `is_own_baseline`).
"""

from __future__ import annotations

import pandas as pd

from speedbench import chunks
from speedbench.report.marks import CONTENDED, EARLIER, citable, contended, earlier_version, with_earlier_note
from speedbench.report.paired_speedups import paired
from speedbench.report.ratios import speedups
from speedbench.report.rows import Table, _shown, fmt_ratio
from speedbench.results.common import Status
from speedbench.results.environment import NoGpuModel
from speedbench.stats import contention
from speedbench.techniques import TECHNIQUES, Claim, SourceRow

__all__ = ["Claim", "CLAIMS", "SourceRow", "comparable", "how_to_measure", "claims_table", "is_own_baseline",
           "never_run", "still_missing", "why_not_measured"]


def how_to_measure(claim: Claim) -> str:
    """The `speedlib run` that measures `claim`, on the devices it needs."""
    on = f"a machine with {claim.devices} or more GPUs" if claim.devices > 1 else "a GPU"
    return f"{chunks.how_to_measure(f'bench_{claim.technique}.{claim.measured_by or claim.suite}.')} on {on}"


def comparable(gpu: str, claim: Claim, world=None) -> str:
    """Whether a result on `gpu` (with `world` devices, where the result says) can be set
    beside `claim`, in words."""
    if claim.devices > 1 and pd.notna(world) and str(world).isdigit() and int(world) < claim.devices:
        return (f"no: world={world}, a single device, where the claim is about splitting the work over "
                f"{claim.hardware}")
    if claim.hardware is None:
        return "yes: an exact count, the same on any device"
    if gpu in (NoGpuModel.CPU_ONLY, NoGpuModel.UNKNOWN, "") or gpu.startswith("none"):
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


# Every technique's claims, from its record.
CLAIMS = tuple(c for t in TECHNIQUES.values() for c in t.claims)


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
                      for b, t, v in zip(rows["benchmark"], rows["technique"], rows["variant"], strict=True)],
                     index=rows.index, dtype=bool)


def never_run(suite: list[str], rows: pd.DataFrame, technique: str, machine: str) -> pd.DataFrame:
    """The technique's benchmarks (names from asv's listing, `suite`) that `machine` has no
    row of at all, measured or not (`rows`: both frames): they never ran there, so neither
    table lists them, and the page must not say "nothing was skipped". With the command
    that measures each (speedbench.chunks.how_to_measure)."""
    ran = set(rows.loc[rows["machine"] == machine, "benchmark"])
    # the interference counters' tracks travel with the results they describe, not as rows
    counters = tuple(f".track_{m}" for m in contention.COUNTER_METRICS)
    missing = sorted(b for b in suite if b.startswith(f"bench_{technique}.") and b not in ran
                     and not b.endswith(counters))
    return pd.DataFrame({"benchmark": missing, "measured by": [chunks.how_to_measure(b) for b in missing]})


def still_missing(not_measured: pd.DataFrame, measured: pd.DataFrame) -> pd.DataFrame:
    """The rows of `not_measured` that are their benchmark's newest state on their machine (same
    benchmark and parameters): one outdated at an old commit but measured at a later one is no
    longer missing, and a benchmark skipped at every commit is listed once, at its newest."""
    key, when = ["machine", "benchmark", "params"], ["commit_date", "run_date"]
    # _row: a not-measured row's position, -1 for a measured one
    both = pd.concat([measured[key + when].assign(_row=-1),
                      not_measured[key + when].assign(_row=range(len(not_measured)))], ignore_index=True)
    # an undated commit counts as oldest; a commit run twice, by its run
    both[when] = both[when].fillna(pd.Timestamp(0, tz="UTC"))
    newest = both.sort_values(when, kind="stable").groupby(key, dropna=False).tail(1)["_row"]
    return not_measured.iloc[newest[newest >= 0].to_numpy()]


def why_not_measured(rows: pd.DataFrame) -> pd.Series:
    """Per row of the loader's not-measured frame: why it has no value, in words. asv keeps
    only "skipped" (NaN), so the reason is read off the row: its status, its machine (GPU
    count) and its parameters, the same conditions the benchmarks skip on."""
    def why(r) -> str:
        if r.status == Status.OUTDATED:
            return "measured with an earlier version of the benchmark, not comparable with the current one"
        if r.status == Status.FAILED:
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
            label = (f"{c.also}: {c.variant} vs {c.baseline} "
                     "(bandwidth ratio: each as % of a pinned copy timed just before it)")
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
                         "measured": f"not measured yet: {how_to_measure(c)}", "comparable": ""})
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

