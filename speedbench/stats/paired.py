"""Paired measurement: variants taking turns in one process, and the ratio over pairs.

On a shared machine the same code measures up to 40 % apart in two processes, and a GPU's
clocks drift with heat, while variants that take turns within one process see the same
conditions within a fraction of a second. So a comparison is measured as rounds: every
round runs each variant once, in an order rotated from round to round (A B C, B C A,
C A B, ...) so that no variant always runs first after a pause or last before one. Round i
gives one ratio per variant, baseline_i / variant_i (> 1: the variant is faster), and the
headline is computed over those per-round ratios, never over two separately taken medians.

The estimate and its interval: Hodges-Lehmann on the log ratios, with the interval from
inverting the Wilcoxon signed-rank test. Why this and not a bootstrap: the interval is exact
(its coverage holds at the 10-30 rounds a benchmark can afford, where percentile bootstraps
of a median under-cover), it needs only that log ratios be symmetric about their centre
(the log makes "2x slower" and "2x faster" the same size), and a few rounds disturbed by
another process move it little (the estimate ignores up to 29 % of wild pairs). Below 8
rounds no 99 % interval exists (2^-8 < 0.005 is the smallest tail the test can reach).

Memory and saved-activation comparisons are exact counts: they need no pairing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["take_turns", "PairedRatio", "paired_ratio", "ratio_estimate", "signed_rank_cutoff"]


def take_turns(variants: dict[str, Callable[[], float]], rounds: int, warmup: int = 1,
               observe: Callable[[], Callable[[], object]] | None = None,
               observed: list | None = None,
               size: Callable[[dict[str, float]], int] | None = None) -> dict[str, list[float]]:
    """Run each variant once per round, in rotated order; return each variant's samples.

    Each callable returns the seconds it measured (a synchronising timer around one step,
    for example). `warmup` rounds run first and are dropped: caches, allocators, autotuners.
    observe: called as each measured round starts; what it returns is called as the round
    ends, and its result appended to `observed`, one per round in the samples' order (the
    interference counters of speedbench.measure.interference: what else ran during the round).
    size: called once, as the first measured round ends, with that round's samples
    ({variant: seconds}); it returns how many measured rounds to run in all, that first one
    included, in place of `rounds`. The rounds go on from there, the rotation unbroken.
    """
    if rounds < 1 or warmup < 0:
        raise ValueError(f"need rounds >= 1 and warmup >= 0, got {rounds} and {warmup}")
    if (observe is None) != (observed is None):
        raise ValueError("observe and observed go together")
    names = list(variants)
    samples: dict[str, list[float]] = {n: [] for n in names}
    total, r = warmup + rounds, 0
    while r < total:
        shift = r % len(names)
        close = observe() if observe is not None and r >= warmup else None
        for name in names[shift:] + names[:shift]:
            seconds = variants[name]()
            if r >= warmup:
                samples[name].append(seconds)
        if close is not None:
            observed.append(close())
        if size is not None and r == warmup:
            wanted = size({n: samples[n][0] for n in names})
            if not isinstance(wanted, int) or wanted < 1:
                raise ValueError(f"size must return a number of rounds >= 1, got {wanted!r}")
            total = warmup + wanted
        r += 1
    return samples


@dataclass(frozen=True)
class PairedRatio:
    """baseline / variant over rounds: > 1 means the variant is faster."""

    ratio: float  # Hodges-Lehmann estimate, back on the ratio scale
    low: float  # 99 % interval (NaN below 8 rounds)
    high: float
    n: int  # rounds (pairs)
    median: float  # plain median of the per-round ratios, for comparison


@functools.cache  # a pure function of (n, alpha), about 2 ms each: every table asks it for the same few n
def signed_rank_cutoff(n: int, alpha: float = 0.01) -> int:
    """The largest c with P(W+ <= c - 1) <= alpha / 2 for the signed-rank statistic of n
    pairs (exact distribution); 0 when even W+ = 0 is likelier than alpha / 2."""
    # counts[s]: subsets of the ranks 1..n whose sum is s, i.e. arrangements giving W+ = s.
    counts = [1] + [0] * (n * (n + 1) // 2)
    for rank in range(1, n + 1):
        for s in range(len(counts) - 1, rank - 1, -1):
            counts[s] += counts[s - rank]
    total, below, c = 2 ** n, 0, 0
    for s, k in enumerate(counts):
        below += k
        if below / total > alpha / 2:
            break
        c = s + 1
    return c


def paired_ratio(baseline: Sequence[float], variant: Sequence[float], alpha: float = 0.01) -> PairedRatio:
    """The ratio baseline / variant over paired samples (round i of each), with its interval."""
    if len(baseline) != len(variant) or not baseline:
        raise ValueError(f"paired samples must have one equal, non-zero length, got {len(baseline)} and {len(variant)}")
    if any(not (x > 0 and math.isfinite(x)) for x in (*baseline, *variant)):
        raise ValueError("paired samples must be positive, finite times")
    return ratio_estimate([b / v for b, v in zip(baseline, variant, strict=True)], alpha)


def ratio_estimate(ratios: Sequence[float], alpha: float = 0.01) -> PairedRatio:
    """The headline of per-round ratios (as a benchmark's `track_speedup` stores them)."""
    if not ratios or any(not (r > 0 and math.isfinite(r)) for r in ratios):
        raise ValueError("per-round ratios must be positive and finite, and there must be some")
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    walsh = sorted((logs[i] + logs[j]) / 2 for i in range(n) for j in range(i, n))
    estimate = _median(walsh)
    c = signed_rank_cutoff(n, alpha)
    low, high = (walsh[c - 1], walsh[len(walsh) - c]) if c >= 1 else (math.nan, math.nan)
    return PairedRatio(math.exp(estimate), math.exp(low), math.exp(high), n, math.exp(_median(sorted(logs))))


def _median(ordered: Sequence[float]) -> float:
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
