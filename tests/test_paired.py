"""speedbench.paired: rotated turns, and Hodges-Lehmann ratios with signed-rank intervals;
benchmarks.common.Paired: rounds spread over fresh builds."""

from __future__ import annotations

import math
import random
import weakref

import pytest

from speedbench.paired import paired_ratio, signed_rank_cutoff, take_turns


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
    from benchmarks import common  # noqa: PLC0415

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
            import torch  # noqa: PLC0415

            type(self).alive_at_build.append(sum(ref() is not None for ref in self.made))
            held = _Built()
            held.build = len(self.made)
            self.made.append(weakref.ref(held))
            # Each build runs at its own speed, as builds whose memory landed elsewhere do.
            return torch.device("cpu"), {v: (lambda held=held, v=v: (held.build, v)) for v in variants_of_build(held.build)}

    Comparison.pairs = pairs
    return Comparison


def _fake_timer(monkeypatch):
    """paired_times without a clock: round r of build b takes b + 1 seconds for the baseline
    and half that for 'fast', so pooled samples show which build they came from."""
    from benchmarks import common  # noqa: PLC0415

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
    from benchmarks import common  # noqa: PLC0415

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
    from benchmarks import common  # noqa: PLC0415

    calls = _fake_timer(monkeypatch)
    monkeypatch.setattr(common, "QUICK", True)
    _builds_class(n_builds=3, pairs=15)().measure_all()
    assert calls == [1]
