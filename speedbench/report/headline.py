"""The headline grid: one row per question, one column per machine, one figure per cell.

A question (speedbench.techniques.Question) is one comparison: what is timed (its scope),
against which baseline, speed or peak memory. Every cell of its row answers that one question
on its machine's latest commit, so cells side by side compare: a technique asking two things
(the flat buffer's optimizer step and its whole iteration; checkpointing's step time and its
peak memory; mixed precision against PyTorch's default precision and against strict fp32) has
two rows. A cell shows the paired figure (the variants taking turns in one process: Hodges-
Lehmann estimate, 99 % Wilcoxon interval, N rounds) wherever that comparison was measured so;
a separately timed one only where it was not (`Headline.fallback`), marked not paired. A cell
whose machine lacks the comparison says why, and never shows another comparison's number: a
run that did not time the baseline, an earlier benchmark version that had no such variant, a
chunk not run yet, a machine without a GPU. A comparison about several GPUs measured on one
(DistributedDataParallel against DataParallel at world=1) is no answer either: its cell says
what the figure is (the wrapper's overhead) and is not coloured as a result.

Baselines are plain PyTorch, written with torch alone in the benchmarks, never a speedlib code
path. A row "vs PyTorch's default" compares on each machine with what PyTorch does there when
nothing is changed (torch.optim.Adam is foreach where every parameter is on CUDA, the
per-tensor loop on CPUs; on GPUs cuDNN convolutions run in TF32): the question is the same,
the variant follows the machine, and the cell names it. The other baselines of a comparison
(fused Adam, the sources' own) are in `speedlib report --table paired`, computed from the same
rounds (speedbench.report.paired_speedups.against), and the claims table keeps the sources' baselines.
"""

from __future__ import annotations

import math

import pandas as pd

from speedbench import chunks, report
from speedbench.results.environment import NoGpuModel
from speedbench.stats import contention
from speedbench.techniques import TECHNIQUES, Headline, Question

__all__ = ["Headline", "Question", "HEADLINES", "QUESTIONS", "TIDY", "WIDE_NOTE", "MEASURED", "grid", "glance",
           "single_device", "single_device_note", "machine_kind", "order_machines"]


# Each technique's main comparison, and the chart's rows, from the records in their order.
HEADLINES = tuple(t.comparison for t in TECHNIQUES.values() if t.comparison is not None)
QUESTIONS = tuple(q for t in TECHNIQUES.values() for q in t.questions)
EARLIER = report.EARLIER  # the dagger the tables use too
# Words in every note on why a cell's interval is wide, one note per cell: the overview folds them away.
WIDE_NOTE = "its 99 % interval"
MEASURED = "measured"  # a cell's status where it answers its question; anything else says why not

# The grid as tidy data (its CSV export, the overview's chart, the static site): one row per
# question and machine, numbers as numbers, the marks as booleans, N an integer.
TIDY = ["question", "label", "technique", "title", "machine", "gpu", "commit", "suite", "scope", "measure", "case",
        "variant", "baseline", "baseline_name", "baseline_words", "ratio", "low", "high", "gain", "N", "paired",
        "value", "baseline_value", "unit", "contended", "earlier_version", "gpu_tests_failed", "status",
        "result_id"]


def machine_kind(gpu) -> str | None:
    """"gpu" or "cpu": the kind of machine a column measured on, whose PyTorch defaults
    differ (Adam's foreach needs every parameter on CUDA); None where its run did not say."""
    gpu = str(gpu)
    if gpu == NoGpuModel.CPU_ONLY:
        return "cpu"
    return None if gpu in (NoGpuModel.UNKNOWN, "", "nan", "None") else "gpu"


def order_machines(rows: pd.DataFrame) -> list[str]:
    """The machines of `rows` (machine and gpu columns) as every copy of the grid lists them:
    those with a GPU first (the question is which GPU), each group by name."""
    gpus = dict(zip(rows["machine"], rows["gpu"].astype(str), strict=False))
    return sorted(gpus, key=lambda m: (machine_kind(gpus[m]) != "gpu", m))


def _others(row, h: Headline) -> str:
    """The parameters that tell this row apart from the comparison's other rows (batch=...)."""
    fixed = {k for k, _ in h.where} | {"workload"}
    parts = [p for p in str(getattr(row, "params", "") or "").split(", ")
             if p and not p.startswith("variant=") and p.split("=", 1)[0] not in fixed]
    return ", ".join(parts)


def _tag(h: Headline, baseline: str, kind: str | None) -> str:
    """What a baseline is, in words: PyTorch's default here, the source's baseline."""
    said = []
    if dict(h.default).get(kind) == baseline:
        anywhere = len({v for _, v in h.default}) <= 1
        said.append("PyTorch's default" + ("" if anywhere else f" on {'CUDA' if kind == 'gpu' else 'CPUs'}"))
    if baseline == h.baseline and h.source:
        said.append(h.source)
    return ", ".join(said)


def _command(h: Headline) -> str:
    """The `speedlib run` that measures `h`: its class's chunk."""
    return chunks.how_to_measure(f"bench_{h.technique}.{h.suite}.")


class _Found:
    """Every ratio a comparison's classes give, computed once per class for every machine
    (the grid costs the same at 2 machines or 20): `rows(h, measure, baseline)`."""

    def __init__(self, last: pd.DataFrame):
        self.last = last
        self._every_paired: pd.DataFrame | None = None
        self._paired: dict[tuple, pd.DataFrame] = {}
        self._ratios: dict[tuple, pd.DataFrame] = {}
        self._by_machine: dict[tuple, dict[str, pd.DataFrame]] = {}

    def mine(self, h: Headline, suite: str) -> pd.DataFrame:
        """`h`'s class's rows at its fixed parameters: the ratios are estimated for these alone
        (Transfer measures 4 configurations of 8 variants; the row gathers random rows)."""
        keep = (self.last["technique"] == h.technique) & (self.last["suite"] == suite)
        for column, value in h.where:
            if column in self.last:
                keep &= self.last[column] == value
        return self.last[keep]

    def rows(self, h: Headline, measure: str, baseline: str) -> pd.DataFrame:
        """`h`'s variant against `baseline` on every machine: ratio (baseline / variant), its
        interval and n; peak memory from `h.memory_suite`, the ratio still baseline / variant."""
        if measure == "peak memory":
            key = (h.technique, h.memory_suite, "peak_memory", baseline)
            if key not in self._ratios:
                own = self.mine(h, h.memory_suite)
                self._ratios[key] = self._headline(report.speedups(own[own["metric"] == "peak_memory"],
                                                                   baseline=baseline), h)
            return self._ratios[key]
        if h.paired:
            key = (h.technique, h.suite)
            if key not in self._paired:  # holds the ratios against PyTorch's defaults and `beside` too
                every = self._all_paired()
                own = every[(every["technique"] == h.technique) & (every["suite"] == h.suite)] if len(every) else every
                self._paired[key] = self._headline(own, h)
            rows = self._paired[key]
            return rows[rows["baseline"] == baseline] if not rows.empty else rows
        key = (h.technique, h.suite, h.metric, baseline)
        if key not in self._ratios:
            own = self.mine(h, h.suite)
            self._ratios[key] = self._headline(report.speedups(own[own["metric"] == h.metric], baseline=baseline), h)
        return self._ratios[key]

    def _all_paired(self) -> pd.DataFrame:
        """`report.paired` of every class at once (`last` holds the questions' classes alone): each
        row's ratio is its own class's (its baseline found among its class's rows, the other
        baselines from its own rounds), so one call gives what a call per class gave, without the
        fixed cost of each."""
        if self._every_paired is None:
            self._every_paired = report.paired(self.last)
        return self._every_paired

    def on(self, h: Headline, measure: str, baseline: str, machine: str) -> pd.DataFrame:
        """`rows` on one machine, the frame cut by machine once per comparison: a cut of the wide
        frame copies every column, and the grid asks every machine of every question."""
        key = (id(h), measure, baseline)
        if key not in self._by_machine:
            rows = self.rows(h, measure, baseline)
            self._by_machine[key] = dict(tuple(rows.groupby("machine", sort=False))) if not rows.empty else {}
        return self._by_machine[key].get(machine, self.last.iloc[0:0])

    @staticmethod
    def _headline(rows: pd.DataFrame, h: Headline) -> pd.DataFrame:
        return report.headline_rows(rows, h) if not rows.empty else rows


def _why_not(found: _Found, q: Question, machine: str, baseline: str) -> str:
    """Why `machine` has no answer to `q`: the run of its classes that did not time the
    variant or the baseline (an earlier benchmark version, said), else the chunk to run."""
    h = q.comparison
    names = dict(h.names)
    for source in (h, h.fallback):
        if source is None:
            continue
        suite = h.memory_suite if q.measure == "peak memory" else source.suite
        own = found.mine(source, suite)
        own = own[own["machine"] == machine]
        if own.empty:
            continue
        lacking = [names.get(v, v) for v in dict.fromkeys((source.variant, baseline)) if v not in set(own["variant"])]
        commit = own.sort_values("commit_date", kind="stable")["commit"].iloc[-1][:8]
        # the reason first: the chart shows a reason's first words, the grid and the hover all of it
        run = f"earlier benchmark version at {commit}, which" if report.earlier_version(own).any() else \
            f"its run at {commit}"
        if lacking:
            return f"not measured: {run} did not time {' or '.join(lacking)}"
        return f"not measured: {run} gave no ratio of these two"
    return f"not measured yet: {_command(h if q.measure == 'speed' else _memory_class(h))}"


def _memory_class(h: Headline) -> Headline:
    """`h` as its peak-memory class (for the command that measures it)."""
    return Headline(h.technique, h.what, h.memory_suite or h.suite, h.variant, h.baseline)


def _largest(rows: pd.DataFrame, h: Headline):
    """The one case a cell shows where a class measured several (checkpointing's batch sizes):
    the largest, the one the technique is for (every case is on the technique's page)."""
    if len(rows) == 1:
        return rows.iloc[0]
    cases = [(report.natural(_others(r, h)), i) for i, r in enumerate(rows[["params"]].itertuples())]
    return rows.iloc[max(cases)[1]]


def _world(r) -> int | None:
    world = pd.to_numeric(pd.Series([getattr(r, "world", None)]), errors="coerce").iloc[0]
    return None if pd.isna(world) else int(world)


def _answer(found: _Found, q: Question, machine: str, gpu: str) -> dict:
    """The tidy row of `q` on `machine`: its figure, or the reason it has none."""
    h, kind = q.comparison, machine_kind(gpu)
    baseline = q.baseline_on(kind)
    names = dict(h.names)
    base = {"question": q.key, "label": q.label, "technique": q.technique, "title": TECHNIQUES[q.technique].title,
            "machine": machine, "gpu": gpu, "measure": q.measure, "variant": h.variant, "baseline": baseline,
            "baseline_name": names.get(baseline, baseline), "baseline_words": _tag(h, baseline, kind),
            "scope": _scope(q), "suite": h.memory_suite if q.measure == "peak memory" else h.suite,
            "paired": False, "contended": False, "earlier_version": False, "gpu_tests_failed": False}
    if (h.gpu_only or q.measure == "peak memory") and kind == "cpu":  # peak memory is the GPU's
        needs = f"needs {h.devices} or more GPUs" if h.devices > 1 else "needs a GPU"
        # its class may run on a CPU too (a gather with no device to copy to): why that figure is not the row's
        ran = q.measure == "speed" and not found.on(h, q.measure, baseline, machine).empty
        said = "this CPU's figure (on the technique page) is measured without one: another comparison"
        return {**base, "status": f"{needs}: {said}" if ran else needs}
    source, rows = h, found.on(h, q.measure, baseline, machine)
    if rows.empty and h.fallback is not None and q.measure == "speed":
        source, rows = h.fallback, found.on(h.fallback, q.measure, baseline, machine)
    if rows.empty:
        return {**base, "status": _why_not(found, q, machine, baseline)}
    r = _largest(rows, source)
    memory = q.measure == "peak memory"
    one = pd.DataFrame([r])
    ratio = (1 / r["ratio"] if r["ratio"] else math.inf) if memory else r["ratio"]
    world = _world(r)
    paired = bool(source.paired and not memory)
    status = MEASURED
    if h.devices > 1 and world is not None and world < h.devices:
        status = f"{'one GPU' if world == 1 else f'{world} GPUs'}: {h.too_few or 'not the comparison'} " \
                 f"(needs >= {h.devices} GPUs)"
    return {**base, "commit": r["commit"], "suite": r["suite"], "scope": _scope(q) if memory else source.scope,
            "case": _others(r, source), "ratio": ratio,
            "low": math.nan if memory else r["ratio_low"], "high": math.nan if memory else r["ratio_high"],
            "gain": r["ratio"], "N": r["n"], "paired": paired,
            # the two values a separately timed ratio divides (a paired one is of its rounds: none)
            "value": math.nan if paired else r.get("value", math.nan),
            "baseline_value": math.nan if paired else r.get("baseline_value", math.nan),
            "unit": "" if paired else r.get("unit", ""), "contended": r.get("contention", "") == contention.CONTENDED,
            "earlier_version": bool(report.earlier_version(one).any()),
            "gpu_tests_failed": bool(report.gpu_tests_failed(one).any()), "status": status,
            "result_id": r.get("result_id", ""), "_row": r}


def _scope(q: Question) -> str:
    if q.measure == "peak memory":
        return f"peak GPU memory of the {q.comparison.scope}"
    return q.comparison.scope


def _figure(a: dict) -> str:
    """A cell's figure as the grid's text writes it: "7.77x [6.93, 8.68] N=30 vs foreach
    (PyTorch's default on CUDA)", with its case, its two values where not paired, and marks."""
    ratio = report.fmt_ratio(a["ratio"], a["low"], a["high"]) + (f" {report.CONTENDED}" if a["contended"] else "")
    words = f" ({a['baseline_words']})" if a["baseline_words"] else ""
    if a["measure"] == "peak memory":
        text = f"peak memory {ratio} vs {a['baseline_name']}{words}"
    elif a["paired"]:
        text = f"{ratio} N={a['N']} vs {a['baseline_name']}{words}"
    else:
        # Not taking turns (DDP and DataParallel are separate launches; FractionOfFloor times one
        # variant after another): both values and how many each has, so that a ratio without
        # brackets does not read as a sure one.
        text = f"{ratio} vs {a['baseline_name']}{words} ({_values(a)}; N={a['N']} each, not paired: {a['suite']})"
    text = (f"{a['case']}: " if a["case"] else "") + text
    return text + (f" {EARLIER}" if a["earlier_version"] else "") \
        + (f" {report.GPU_TESTS_FAILED}" if a["gpu_tests_failed"] else "")


def _values(a: dict) -> str:
    """Both values of an unpaired comparison, in the metric's unit."""
    if a["unit"] == "seconds":
        return f"{a['value'] * 1e3:.3g} vs {a['baseline_value'] * 1e3:.3g} ms"
    return f"{a['value']:.3g} vs {a['baseline_value']:.3g} {a['unit']}"


def _text(a: dict) -> str:
    if a["status"] == MEASURED:
        return _figure(a)
    return f"{a['status']}: {_figure(a)}" if "ratio" in a else a["status"]


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


def single_device(rows: pd.DataFrame, h: Headline) -> list[str]:
    """The machines whose results of `h` (a comparison about several devices) reach fewer
    devices than it needs: there the variants train the same single replica."""
    if h.devices <= 1:
        return []
    found = _Found(report.latest(rows))
    hits = found.rows(h, "speed", h.baseline)
    if hits.empty or "world" not in hits:
        return []
    worlds = pd.to_numeric(hits["world"], errors="coerce")
    return [m for m, w in worlds.groupby(hits["machine"]).max().items() if w < h.devices]


def single_device_note(h: Headline, machine: str) -> str:
    return (f"{TECHNIQUES[h.technique].title} on {machine}: one device only, so the two run the same single "
            f"replica and the ratio is their per-step overhead ({h.too_few or 'not the comparison'}), not the "
            f"scaling the comparison is about ({_command(h)} on a machine with {h.devices} or more GPUs)")


def _fallback_notes(found: _Found, answers: list[dict]) -> list[str]:
    """Where a row's paired figure is shown and the same machine also timed the comparison
    without pairing, both figures and why the paired one is the answer (issue 51: 1.71x
    paired beside 1.18x from one variant after another, on one machine and commit)."""
    notes = []
    for a in answers:
        q = next(q for q in QUESTIONS if q.key == a["question"])
        h = q.comparison
        if a["status"] != MEASURED or not a["paired"] or h.fallback is None or not h.fallback_differs:
            continue
        other = found.rows(h.fallback, "speed", a["baseline"])
        other = other[(other["machine"] == a["machine"]) & (other["commit"] == a["commit"])] if not other.empty \
            else other
        if other.empty:
            continue
        r = _largest(other, h.fallback)
        shown = report.fmt_ratio(a["ratio"], a["low"], a["high"])
        notes.append(f"{q.label} on {a['machine']} at {a['commit'][:8]}: {shown} N={a['N']}, the variants taking "
                     f"turns ({h.suite}), is shown; timed one variant after another "
                     f"({h.fallback.suite}) the same comparison reads {report.fmt_ratio(r['ratio'], None, None)} "
                     f"({r['value']:.3g} vs {r['baseline_value']:.3g} {r['unit']}). {h.fallback_differs} the "
                     "comparison")
    return notes


def grid(df: pd.DataFrame) -> report.Table:
    """Questions down, machines (latest commit each) across; see the module docstring. A
    result measured on a contended machine gives way to the newest uncontended one of the same
    machine (report.citable), and the notes say where; with none, it is shown marked."""
    # each question's classes only: the ratios below are taken over a few hundred rows, not every result
    suites = {(q.technique, s) for q in QUESTIONS for h in (q.comparison, q.comparison.fallback) if h is not None
              for s in (h.suite, h.memory_suite) if s}
    wanted = pd.Series([(t, s) in suites for t, s in zip(df["technique"], df["suite"], strict=True)], index=df.index,
                       dtype=bool) if not df.empty else pd.Series([], dtype=bool)
    last = report.citable(df[wanted]) if not df.empty else df
    gpus = dict(zip(df["machine"], df["gpu"].astype(str), strict=True))  # one kind of hardware per machine name
    machines = order_machines(df)  # as the chart: GPU machines first
    columns = {m: f"{m} ({gpus[m]})" for m in machines}
    found = _Found(last)
    answers = [_answer(found, q, m, gpus[m]) for q in QUESTIONS for m in machines]
    rows = []
    for q in QUESTIONS:
        row = {"technique": TECHNIQUES[q.technique].title, "question": q.label}
        row.update({columns[a["machine"]]: _text(a) for a in answers if a["question"] == q.key})
        rows.append({**row, "comparison": _comparison_words(q)})  # the numbers first, where the eye lands
    used = [a["_row"] for a in answers if "_row" in a]
    # a result two rows cite (mixed precision on a CPU: strict fp32 is PyTorch's default there) counts once
    sources = pd.DataFrame(used) if used else df.iloc[0:0]
    sources = sources.drop_duplicates([c for c in ("result_id", "baseline") if c in sources]).reset_index(drop=True) \
        if "result_id" in sources else sources.reset_index(drop=True)
    notes = ["one row, one comparison: the same scope, baseline and measure in every machine's cell; x faster "
             "than the baseline (peak memory: variant / baseline, lower is better); latest commit per machine",
             "[low, high]: the 99 % Wilcoxon interval of a paired speedup (variants taking turns in one process, N "
             "rounds); a separately timed figure is shown only where no paired one exists, marked not paired, "
             "with both values",
             "where a class measures several cases (checkpointing's batch sizes), a cell shows the largest; every "
             "case is on the technique's page and in speedlib report --table paired, with every other baseline"]
    notes += [f"{q.label}: {_baseline_words(q)}" for q in QUESTIONS]
    notes = report.with_earlier_note(notes, sources)  # the dagger's note, the double dagger's and its counters
    notes += _instead_of_contended(df, sources)
    notes += _fallback_notes(found, answers)
    if not sources.empty:  # whether each column's numbers were measured on a quiet machine, said once
        states: dict[str, list[str]] = {}
        for machine, its in sources.groupby("machine", sort=True):
            states.setdefault(report.run_state(its), []).append(machine)
        notes.append("machine state when measured: " + "; ".join(f"{', '.join(ms)}: {state}"
                                                                   for state, ms in states.items()))
    notes += [single_device_note(q.comparison, a["machine"]) for q in QUESTIONS for a in answers
              if a["question"] == q.key and q.comparison.devices > 1 and "ratio" in a and a["status"] != MEASURED]
    notes += _wide_notes(answers)
    data = pd.DataFrame([{k: a.get(k) for k in TIDY} for a in answers], columns=TIDY)
    data["N"] = pd.array(pd.to_numeric(data["N"], errors="coerce"), dtype="Int64")
    for c in ("ratio", "low", "high", "gain", "value", "baseline_value"):
        data[c] = pd.to_numeric(data[c], errors="coerce").astype(float)
    for c in ("paired", "contended", "earlier_version", "gpu_tests_failed"):
        data[c] = data[c].astype(bool)
    return report.Table("Headline: one comparison per row, one column per machine", pd.DataFrame(rows), sources,
                        notes, data=data)


def _comparison_words(q: Question) -> str:
    h = q.comparison
    memory = "peak memory of " if q.measure == "peak memory" else ""
    return f"{memory}{h.what}"


def _baseline_words(q: Question) -> str:
    """Which baseline the row compares with, in words, on each kind of machine."""
    h = q.comparison
    if q.baseline:
        return f"against {dict(h.names).get(q.baseline, q.baseline)}" + (
            f" ({_tag(h, q.baseline, 'gpu')})" if _tag(h, q.baseline, "gpu") else "")
    if h.default:
        kinds = dict(h.default)
        if len(set(kinds.values())) == 1:
            b = next(iter(kinds.values()))
            return f"against {dict(h.names).get(b, b)}, PyTorch's default on every machine"
        return "against PyTorch's default on each machine: " + "; ".join(
            f"{dict(h.names).get(v, v)} on {'GPUs' if k == 'gpu' else 'CPUs'}" for k, v in kinds.items())
    return h.against or f"against {dict(h.names).get(h.baseline, h.baseline)}"


def _wide_notes(answers: list[dict]) -> list[str]:
    out = []
    for a in answers:
        r = a.get("_row")
        if r is None or not isinstance(r.get("wide_because"), str) or not r["wide_because"]:
            continue
        out.append(f"{a['label']} on {a['machine']} ({r['params']}, vs {a['baseline']}): {WIDE_NOTE} "
                   f"[{r['ratio_low']:.3g}, {r['ratio_high']:.3g}] spans {r['width']:.2f}x (high / low), more than "
                   f"{report.PAIRED_WIDTH_TARGET:.2f}x: {r['wide_because']}")
    return out


def glance(df: pd.DataFrame) -> pd.DataFrame:
    """The grid's tidy rows: one per question and machine, what the at-a-glance chart draws."""
    return grid(df).data
