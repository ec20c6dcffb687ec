"""speedbench.stats.paired: rotated turns, and Hodges-Lehmann ratios with signed-rank intervals;
benchmarks.common.Paired: rounds spread over fresh builds."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
import types
import weakref
from pathlib import Path

import pytest

from benchmarks import common
from speedbench.stats.paired import paired_ratio, signed_rank_cutoff, take_turns


@pytest.mark.parametrize("n, critical", [(8, 0), (10, 3), (15, 15), (20, 37), (25, 68)])
def test_cutoffs_match_the_published_signed_rank_table(n, critical):
    """Critical values of the Wilcoxon signed-rank test, two-sided alpha = 0.01, from the
    standard printed table: W+ <= critical is significant, so the interval starts at the
    (critical + 1)-th Walsh average."""
    assert signed_rank_cutoff(n, 0.01) == critical + 1


def test_too_few_pairs_have_no_99_percent_interval():
    r = paired_ratio([2.0] * 7, [1.0] * 7)
    assert r.ratio == pytest.approx(2.0) and math.isnan(r.low) and math.isnan(r.high) and r.n == 7


def test_hodges_lehmann_is_the_median_of_walsh_averages():
    # log ratios 1, 2, 3: Walsh averages 1, 1.5, 2, 2, 2.5, 3, whose median is 2.
    base = [math.e ** k for k in (1, 2, 3)]
    r = paired_ratio(base, [1.0, 1.0, 1.0])
    assert r.ratio == pytest.approx(math.e ** 2) and r.median == pytest.approx(math.e ** 2)
    # A skewed set tells the two apart: logs 0, 0, 3 -> Walsh 0, 0, 1.5, 0, 1.5, 3 -> median 0.75.
    r = paired_ratio([1.0, 1.0, math.e ** 3], [1.0, 1.0, 1.0])
    assert r.ratio == pytest.approx(math.e ** 0.75) and r.median == pytest.approx(1.0)


def test_interval_is_the_walsh_order_statistics_at_the_cutoff():
    # Ten pairs with log ratios 0.01 .. 0.10: the interval is the 4th smallest and the 4th
    # largest of the 55 Walsh averages (cutoff 4 at n = 10).
    logs = [k / 100 for k in range(1, 11)]
    walsh = sorted((a + b) / 2 for i, a in enumerate(logs) for b in logs[i:])
    r = paired_ratio([math.exp(x) for x in logs], [1.0] * 10)
    assert (r.low, r.high) == (pytest.approx(math.exp(walsh[3])), pytest.approx(math.exp(walsh[-4])))
    assert r.low < r.ratio < r.high


def test_the_interval_covers_the_true_ratio_about_99_percent_of_the_time():
    """Simulated rounds with a drifting machine (both variants slowed alike in a round) and
    independent noise: the drift cancels in each pair, and a 99 % interval misses the true
    1.25x in about 1 % of 400 seeded experiments."""
    rng = random.Random(0)
    misses, widths = 0, []
    for _ in range(400):
        base, variant = [], []
        for _ in range(15):
            drift = rng.uniform(0.6, 1.4)  # up to 40 % between rounds, as between processes
            base.append(1.25 * drift * math.exp(rng.gauss(0, 0.03)))
            variant.append(drift * math.exp(rng.gauss(0, 0.03)))
        r = paired_ratio(base, variant)
        misses += not (r.low <= 1.25 <= r.high)
        widths.append(r.high / r.low)
    assert misses <= 12  # expected 4 (1 %); 12 would be 3 %, beyond any seed's luck
    # Drift of 40 % between rounds leaves intervals about as narrow as the 3 % noise allows
    # (about 1.06x at 15 pairs): it cancels within each pair.
    assert sorted(widths)[200] < 1.08 and max(widths) < 1.15


def test_rounds_rotate_the_order_and_warmup_is_dropped():
    calls = []

    def variant(name):
        def run():
            calls.append(name)
            return float(len(calls))
        return run

    samples = take_turns({"a": variant("a"), "b": variant("b"), "c": variant("c")}, rounds=3, warmup=1)
    assert "".join(calls) == "abc" + "bca" + "cab" + "abc"
    # The warm-up round's times (1, 2, 3) are dropped; every variant has one sample a round.
    assert samples == {"a": [6.0, 8.0, 10.0], "b": [4.0, 9.0, 11.0], "c": [5.0, 7.0, 12.0]}


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="equal, non-zero length"):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive, finite"):
        paired_ratio([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="rounds >= 1"):
        take_turns({"a": lambda: 1.0}, rounds=0)


class _Built:
    """What one build of a variant holds (a model, say); its weak reference tells whether a
    build was freed before the next one was made."""


def _builds_class(n_builds, pairs, variants_of_build=lambda b: ("base", "fast")):
    class Comparison(common.Paired):
        params = (["w"], ["base", "fast"])
        param_names = ["workload", "variant"]
        baseline = "base"
        builds = n_builds
        warmup = 0
        made: list = []  # weak references to every build's objects, in build order
        alive_at_build: list = []  # how many earlier builds were still alive when each began

        def setup_cache(self):
            return self.measure_all()

        def steps(self, workload):
            import torch  # noqa: PLC0415 - as a benchmark's steps import it: the rest of the file needs no torch

            type(self).alive_at_build.append(sum(ref() is not None for ref in self.made))
            held = _Built()
            held.build = len(self.made)
            self.made.append(weakref.ref(held))
            # Each build runs at its own speed, as builds whose memory landed elsewhere do.
            return torch.device("cpu"), {v: (lambda held=held, v=v: (held.build, v))
                                         for v in variants_of_build(held.build)}

    Comparison.pairs = pairs
    return Comparison


def _fake_timer(monkeypatch):
    """paired_times without a clock: round r of build b takes b + 1 seconds for the baseline
    and half that for 'fast', so pooled samples show which build they came from."""
    calls = []

    def fake(steps, dev, rounds, warmup, number=1, counters=None):
        build = next(iter(steps.values()))()[0]
        calls.append(rounds)
        if counters is not None:  # each round's interference counters, told apart by build
            counters.extend({"others_cpu": float(build), "preemptions": 0.0} for _ in range(rounds))
        return {v: [(build + 1.0) * (0.5 if v == "fast" else 1.0)] * rounds for v in steps}

    monkeypatch.setattr(common, "paired_times", fake)
    return calls


def test_rounds_are_spread_over_fresh_builds_each_freed_before_the_next(monkeypatch):
    calls = _fake_timer(monkeypatch)
    cls = _builds_class(n_builds=3, pairs=15)
    cache = cls().measure_all()
    status, times = cache[("w", "base")]
    assert status == "ok" and calls == [5, 5, 5]  # 15 rounds: five in each of three builds
    assert times["base"] == [1.0] * 5 + [2.0] * 5 + [3.0] * 5  # pooled in build order
    assert cls().track_speedup(cache, "w", "fast")["samples"] == [2.0] * 15  # still per round
    # the counters pool the same way, one per round, for every variant of the configuration
    for variant in ("base", "fast"):
        assert cls().track_interference(cache, "w", variant)["samples"] == [0.0] * 5 + [1.0] * 5 + [2.0] * 5
    assert cls.alive_at_build == [0, 0, 0]  # the last build was freed before each new one
    assert all(ref() is None for ref in cls.made)


def test_builds_round_up_to_at_least_the_rounds_asked_for_and_one_build_is_the_default(monkeypatch):
    calls = _fake_timer(monkeypatch)
    _builds_class(n_builds=3, pairs=8)().measure_all()
    assert calls == [3, 3, 3]  # 9 rounds >= 8
    calls.clear()
    assert common.Paired.builds == 1
    _builds_class(n_builds=common.Paired.builds, pairs=8)().measure_all()
    assert calls == [8]


def test_builds_with_different_variants_are_not_pooled(monkeypatch):
    _fake_timer(monkeypatch)
    cls = _builds_class(n_builds=2, pairs=4, variants_of_build=lambda b: ("base", "fast") if b == 0 else ("base",))
    status, why = cls().measure_all()[("w", "base")]
    assert status == "fail" and "cannot be pooled" in why


def test_a_quick_run_makes_one_build_of_one_round(monkeypatch):
    calls = _fake_timer(monkeypatch)
    monkeypatch.setattr(common, "QUICK", True)
    _builds_class(n_builds=3, pairs=15)().measure_all()
    assert calls == [1]


# --- rounds sized from a measured round under a time budget (Paired.round_budget) ---------


def test_take_turns_sizes_the_rounds_from_the_first_measured_one_which_counts():
    calls, seen = [], []

    def variant(name):
        def run():
            calls.append(name)
            return float(len(calls))
        return run

    def size(first):
        seen.append(dict(first))
        return 3

    samples = take_turns({"a": variant("a"), "b": variant("b"), "c": variant("c")}, rounds=99, warmup=1, size=size)
    # one warm-up round, then three measured ones in all: no probe round, the rotation unbroken
    assert "".join(calls) == "abc" + "bca" + "cab" + "abc"
    assert seen == [{"b": 4.0, "c": 5.0, "a": 6.0}]  # asked once, with the first measured round's samples
    assert samples == {"a": [6.0, 8.0, 10.0], "b": [4.0, 9.0, 11.0], "c": [5.0, 7.0, 12.0]}
    one = take_turns({"a": lambda: 1.0, "b": lambda: 2.0}, rounds=5, warmup=0, size=lambda first: 1)
    assert one == {"a": [1.0], "b": [2.0]}  # the first round alone, when that is all there is room for
    with pytest.raises(ValueError, match="size must return"):
        take_turns({"a": lambda: 1.0}, rounds=1, size=lambda first: 0)


@pytest.mark.parametrize("budget, per_round, fewest, most, builds, per_build", [
    (120, 6.2, 8, 15, 1, 15),  # 19 fit: the ceiling
    (40, 4.0, 8, 15, 1, 10),  # floor(40 / 4)
    (40, 3.99, 8, 15, 1, 10),  # floor, never more than fits
    (40, 5.0, 8, 15, 1, 8),  # exactly the floor fits
    (40, 9.1, 8, 15, 1, 8),  # 4 fit: the floor all the same (a warning)
    (40, 0.0, 8, 15, 1, 15),  # a round too short to time: the ceiling
    (40, 5e-324, 8, 15, 1, 15),  # room for more rounds than a float holds: the ceiling, no overflow
    (40, 1.0, 8, 2, 1, 2),  # a class asking for fewer rounds than the floor gets what it asked
    (40, 1.0, 8, 15, 3, 5),  # 13 a build fit: ceil(15 / 3) a build
    (40, 4.0, 8, 15, 3, 3),  # 10 fit in all: 3 a build, 9 <= 10 (never rounded up past the budget)
    (40, 9.1, 8, 15, 3, 3),  # the floor, ceil(8 / 3) a build
])
def test_sized_rounds_clamps_what_fits_between_min_pairs_and_pairs(budget, per_round, fewest, most, builds, per_build):
    got, line = common.sized_rounds("C('w',)", budget, per_round, fewest, most, builds)
    assert got == per_build
    assert line.startswith("warning: ") == (per_round * per_build * builds > budget)
    assert f"-> {per_build * builds} rounds" in line


def test_sized_rounds_says_what_it_decided_and_warns_when_the_floor_overshoots():
    assert common.sized_rounds("CheckpointStep('densenet_bc', 64)", 120, 6.2, 8, 15) == (
        15, "CheckpointStep('densenet_bc', 64): one round 6.2 s -> 15 rounds, about 93 s "
            "(budget 120 s, 8 to 15 rounds)")
    per_build, line = common.sized_rounds("C('w',)", 40, 9.1, 8, 15)
    assert per_build == 8
    assert line == ("warning: C('w',): one round 9.1 s -> 8 rounds, the fewest allowed (min_pairs 8): about 72.8 s, "
                    "over the budget of 40 s by 32.8 s")
    assert "over 3 builds" in common.sized_rounds("C('w',)", 40, 1.0, 8, 15, builds=3)[1]
    with pytest.raises(ValueError, match="budget > 0"):
        common.sized_rounds("C('w',)", 0, 1.0, 8, 15)


class _Clock:
    """A fake time.perf_counter for benchmarks.common: steps advance it by what they say they take."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _budget_class(clock, seconds: dict, budget, pairs=15, warmup=1, builds=1, min_pairs=8):
    """A Paired class of two variants on CPU whose steps take `seconds[variant]` on the fake
    clock; it counts every step it runs, per build."""
    class Sized(common.Paired):
        params = (["w"], ["base", "fast"])
        param_names = ["workload", "variant"]
        baseline = "base"
        ran: list = []  # one Counter-like dict per build: variant -> steps run

        def setup_cache(self):
            return self.measure_all()

        def steps(self, workload):
            import torch  # noqa: PLC0415 - as a benchmark's steps import it: the rest of the file needs no torch

            counts = {v: 0 for v in seconds}
            type(self).ran.append(counts)

            def step(v):
                def run():
                    counts[v] += 1
                    clock.now += seconds[v]
                return run
            return torch.device("cpu"), {v: step(v) for v in seconds}

    Sized.round_budget, Sized.pairs, Sized.warmup = budget, pairs, warmup
    Sized.builds, Sized.min_pairs = builds, min_pairs
    return Sized


@pytest.fixture
def clock(monkeypatch):
    """benchmarks.common's clock, faked: only its own binding of `time` is replaced."""
    fake = _Clock()
    monkeypatch.setattr(common, "time", types.SimpleNamespace(perf_counter=fake, monotonic=time.monotonic))
    return fake


def test_a_budget_sizes_the_rounds_from_the_first_measured_round(clock, capsys):
    cls = _budget_class(clock, {"base": 2.0, "fast": 0.5}, budget=30.0, warmup=1)  # 2.5 s a round: 12 fit
    bench = cls()
    cache = bench.measure_all()
    status, times = cache[("w", "base")]
    assert status == "ok" and times["base"] == [2.0] * 12 and times["fast"] == [0.5] * 12
    # one warm-up round and the 12 measured ones: the timed first round was one of them, no probe
    assert cls.ran == [{"base": 13, "fast": 13}]
    line = "Sized('w',): one round 2.5 s -> 12 rounds, about 30 s (budget 30 s, 8 to 15 rounds)"
    assert line in capsys.readouterr().out.splitlines()
    # N, as the results will count it: one sample a round, for the speedup and the counters alike
    assert bench.track_speedup(cache, "w", "fast")["samples"] == [4.0] * 12
    assert len(bench.track_interference(cache, "w", "fast")["samples"]) == 12
    # what was decided is kept, and the baseline's report says it (asv shows it with --show-stderr)
    assert cache[(common.SIZED, "w")] == ("ok", line)
    bench.track_seconds(cache, "w", "base")
    bench.track_seconds(cache, "w", "fast")
    assert capsys.readouterr().err.splitlines() == [line]


def test_a_budget_never_goes_below_min_pairs_or_above_pairs(clock, capsys):
    slow = _budget_class(clock, {"base": 6.0, "fast": 3.0}, budget=40.0)  # 9 s a round: 4 fit
    cache = slow().measure_all()
    assert len(cache[("w", "fast")][1]["fast"]) == 8
    out = capsys.readouterr().out
    assert ("warning: Sized('w',): one round 9 s -> 8 rounds, the fewest allowed (min_pairs 8): about 72 s, "
            "over the budget of 40 s by 32 s") in out
    fast = _budget_class(clock, {"base": 0.02, "fast": 0.01}, budget=40.0)
    assert len(fast().measure_all()[("w", "fast")][1]["fast"]) == 15
    assert "warning" not in capsys.readouterr().out


def test_a_budget_spreads_the_decided_rounds_over_the_builds(clock, capsys):
    cls = _budget_class(clock, {"base": 1.0, "fast": 1.0}, budget=20.0, builds=3, warmup=0)  # 10 fit: 3 a build
    times = cls().measure_all()[("w", "base")][1]
    assert len(times["base"]) == 9 and cls.ran == [{"base": 3, "fast": 3}] * 3
    assert "one round 2 s -> 9 rounds over 3 builds" in capsys.readouterr().out


def test_a_quick_run_with_a_budget_keeps_one_round_and_sizes_nothing(clock, capsys, monkeypatch):
    monkeypatch.setattr(common, "QUICK", True)
    cls = _budget_class(clock, {"base": 9.0, "fast": 9.0}, budget=1.0, builds=3)
    cache = cls().measure_all()
    assert cache[("w", "base")][1]["base"] == [9.0] and cls.ran == [{"base": 1, "fast": 1}]  # no warm-up either
    assert (common.SIZED, "w") not in cache
    assert "round" not in capsys.readouterr().out


def test_without_a_budget_a_class_runs_pairs_rounds_as_before(clock, capsys):
    assert common.Paired.round_budget is None  # opt-in
    cls = _budget_class(clock, {"base": 60.0, "fast": 60.0}, budget=None, pairs=15, warmup=1)
    cache = cls().measure_all()
    assert len(cache[("w", "base")][1]["base"]) == 15 and cls.ran == [{"base": 16, "fast": 16}]
    assert (common.SIZED, "w") not in cache
    assert "round" not in capsys.readouterr().out
    two = _budget_class(clock, {"base": 1.0, "fast": 1.0}, budget=None, pairs=8, builds=3, warmup=0)
    assert len(two().measure_all()[("w", "base")][1]["base"]) == 9  # 3 builds of ceil(8 / 3)


# The 9-minute command the GPU plan runs chunks in (docs/gpu-slots.md), and what a checkpoint
# configuration spends outside its measured rounds: building its five models, with their data,
# on the GPU (a generous guess; nothing here has been timed on one). Warm-up is counted from
# the class: its dropped rounds and the trainers' own warm-up steps, each no longer than a
# round, and a round no longer than budget / min_pairs wherever no warning is printed.
COMMAND_SECONDS = 9 * 60
BUILD_SECONDS = 20.0


def test_the_headline_checkpoint_chunk_fits_one_gpu_command():
    """The worst case in which no configuration warns (a round of at most budget / 8), from the
    chunk's definition and the GPU profile of the classes it selects: every configuration's
    budget, its warm-up and builds (an allowance), the class's start and its reporting
    processes, inside one 9-minute command. Arithmetic on the definitions, not a timing: a GPU
    slower than that prints a warning per configuration instead, and only a GPU run can
    say what the chunk takes."""
    from speedbench.chunks import load_chunks  # noqa: PLC0415 - only this test reads the checkout's chunks
    from speedbench.run import plan  # noqa: PLC0415 - pandas, only for this test: the rest of the file needs none

    root = Path(__file__).resolve().parents[3]
    chunk = next(c for c in load_chunks(root) if c.name == "headline-checkpoint")
    # The GPU profile is chosen at import from $SPEEDLIB_DEVICE (benchmarks.common.ON_GPU),
    # so the classes are read in a process of their own; importing them imports no torch.
    script = """
import importlib, inspect, itertools, json, pkgutil, re, sys
import benchmarks
from benchmarks import common
assert common.ON_GPU
out = {}
for m in pkgutil.iter_modules(benchmarks.__path__):
    if not m.name.startswith("bench_"):
        continue
    module = importlib.import_module(f"benchmarks.{m.name}")
    for name, cls in vars(module).items():
        if not (inspect.isclass(cls) and issubclass(cls, common.Measured) and cls.__module__ == module.__name__
                and not inspect.isabstract(cls)):
            continue
        methods = [a for a in dir(cls) if a.startswith("track_")]
        combos = list(itertools.product(*cls.params)) if cls.params else [()]
        chosen = [c for c in combos for a in methods
                  if re.search(sys.argv[1], f"{m.name}.{name}.{a}({', '.join(map(repr, c))})")]
        if not chosen:
            continue
        paired = issubclass(cls, common.Paired)
        configs = {c[:-1] if paired else c for c in chosen}
        out[f"{m.name}.{name}"] = {
            "paired": paired, "configs": len(configs), "reports": len(chosen),
            "budget": getattr(cls, "round_budget", None), "min_pairs": getattr(cls, "min_pairs", None),
            "warmup": getattr(cls, "warmup", None), "builds": getattr(cls, "builds", None),
            "step_warmup": inspect.signature(module._Trainer).parameters["warmup"].default
                           if hasattr(module, "_Trainer") else 0}
print(json.dumps(out))
"""
    env = {**os.environ, "SPEEDLIB_DEVICE": "cuda"}
    env.pop("SPEEDLIB_QUICK", None)
    done = subprocess.run([sys.executable, "-c", script, chunk.regex], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    classes = json.loads(done.stdout)
    assert classes, f"the chunk {chunk.regex} selects no class"
    measuring = total = 0.0
    for name, c in classes.items():
        assert c["paired"] and c["budget"] is not None, f"{name} has no round budget: its time on a GPU is unbounded"
        assert c["min_pairs"] >= 8  # the fewest rounds with a 99 % interval
        longest_round = c["budget"] / c["min_pairs"]  # any longer, and the run warns it overshoots
        warm = (c["warmup"] * c["builds"] + c["step_warmup"] * c["builds"]) * longest_round
        measuring += c["configs"] * c["budget"]
        total += plan.SECONDS_PER_CLASS + c["configs"] * (c["budget"] + warm + BUILD_SECONDS * c["builds"])
        total += plan.SECONDS_PER_REPORT * c["reports"]
    assert measuring <= 0.6 * 8 * 60, measuring  # well inside 8 minutes of measuring
    assert total <= COMMAND_SECONDS, total
