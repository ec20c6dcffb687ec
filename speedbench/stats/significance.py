"""Significance across commits: asv compare's rule and step detection, in numpy only.

A change between two results counts only where the ratio is beyond SIGNIFICANCE_FACTOR and
the two results differ (`differ`: the two-sided Mann-Whitney U test at P_THRESHOLD where both
kept their samples, else disjoint 99 % intervals, else the ratio alone), as asv compare 0.6
decides, and where both have a 99 % interval, the two intervals apart (`_verdict`).
Sustained level changes across a history are found by binary segmentation (`_steps`).
Implemented here rather than imported from scipy, so that viewing results needs neither asv
nor scipy; tests/harness/stats/test_statistics_scipy.py checks the test against scipy's.
The history and change tables that use these rules are in speedbench.report.commits.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
import pandas as pd

__all__ = ["SIGNIFICANCE_FACTOR", "P_THRESHOLD", "EXACT_MAX", "MIN_SEGMENT", "MannWhitney", "mann_whitney_u",
           "differ"]

# A change is only reported when the ratio is beyond this factor (asv compare's default) and the
# two results differ statistically (`differ`).
SIGNIFICANCE_FACTOR = 1.10
# asv compare's threshold for its Mann-Whitney U test (asv/_stats.py, is_different).
P_THRESHOLD = 0.002
# Exact null distribution of U up to this many samples a side, normal approximation beyond
# (where asv switches too).
EXACT_MAX = 20
# Step detection: each level spans at least this many commits, so one odd commit can never
# move a level's median beyond the other commits' values.
MIN_SEGMENT = 3


# --- significance: asv compare's rule, and steps across commits --------------------------

class MannWhitney(NamedTuple):
    u: float  # pairs (x, y) with x above y, a tie counting one half
    p: float  # two-sided
    z: float  # (U - mn/2) / its tie-corrected standard deviation: how far apart, and which way
    method: str  # "exact" or "normal"


@functools.lru_cache(maxsize=None)
def _u_counts(m: int, n: int) -> np.ndarray:
    """counts[u]: how many of the C(m+n, m) orders of m x's and n y's (no ties) give U = u.
    The largest value is an x, above all n y's, or a y, above nothing: that splits the count."""
    if m == 0 or n == 0:
        return np.ones(1, dtype=np.int64)
    counts = np.zeros(m * n + 1, dtype=np.int64)
    top_x, top_y = _u_counts(m - 1, n), _u_counts(m, n - 1)
    counts[n:n + len(top_x)] += top_x
    counts[:len(top_y)] += top_y
    return counts


def higher_is_better(kind: str) -> bool:
    """Whether a larger value of this metric kind (results.load.metric_kind) is the better one."""
    return kind in ("fraction of floor", "bandwidth", "throughput", "paired speedup")


def mann_whitney_u(x, y) -> MannWhitney:
    """Two-sided Mann-Whitney U test of x against y (NaN values left out).

    Up to EXACT_MAX values a side the p-value comes from the exact null distribution of U.
    That distribution assumes no ties, so ties are broken the way least favourable to
    significance (the attainable U nearest mn/2): a tie never makes p smaller. Beyond that,
    the normal approximation with the tie-corrected variance and a continuity correction.
    """
    x, y = (np.asarray(v, dtype=float) for v in (x, y))
    x, y = x[~np.isnan(x)], y[~np.isnan(y)]
    m, n = len(x), len(y)
    if not m or not n:
        raise ValueError("Mann-Whitney U needs at least one value on each side")
    values, where, tied = np.unique(np.concatenate([x, y]), return_inverse=True, return_counts=True)
    midrank = np.cumsum(tied) - (tied - 1) / 2
    u = float(midrank[where[:m]].sum() - m * (m + 1) / 2)
    total, half = m + n, m * n / 2
    var = m * n / 12 * ((total + 1) - float((tied ** 3 - tied).sum()) / (total * (total - 1)))
    sd = math.sqrt(var) if var > 0 else 0.0  # 0 only when every value is the same
    z = (u - half) / sd if sd else 0.0
    if max(m, n) <= EXACT_MAX:
        x_at = np.bincount(where[:m], minlength=len(values))
        y_at = np.bincount(where[m:], minlength=len(values))
        tied_pairs = int((x_at * y_at).sum())
        strictly = round(u - tied_pairs / 2)  # pairs with x strictly above y
        least = min(max(half, strictly), strictly + tied_pairs)
        tail = math.floor(min(least, m * n - least))
        p = min(1.0, 2 * int(_u_counts(m, n)[:tail + 1].sum()) / math.comb(total, m))
        return MannWhitney(u, p, z, "exact")
    p = math.erfc(max(abs(u - half) - 0.5, 0.0) / sd / math.sqrt(2)) if sd else 1.0
    return MannWhitney(u, p, z, "normal")


def _can_reject(m: int, n: int) -> bool:
    """asv runs its test only when the sample sizes let p get below the threshold (its
    bound, 1 / C(m+n, min(m, n)); at a few sizes the two-sided p still cannot)."""
    return m > 0 and n > 0 and 1 / math.comb(m + n, min(m, n)) < P_THRESHOLD


def _samples(r) -> list[float]:
    s = r.get("samples")
    return [v for v in s if not math.isnan(v)] if isinstance(s, list) else []


def _has_stats(r) -> bool:
    # asv compares results without statistics (track_* values) or from a single repeat by
    # their ratio alone.
    return pd.notna(r.get("ci99_low")) and pd.notna(r.get("ci99_high")) and r.get("repeat") != 1


def differ(a, b) -> tuple[bool, float, str]:
    """Whether results a and b (rows of the tidy frame, as dicts) differ by asv compare's rule:
    (different, p-value or NaN, which test). With samples kept on both sides, the two-sided
    Mann-Whitney U test at P_THRESHOLD; else whether the 99 % confidence intervals are
    disjoint; results without statistics count as different, leaving it to the ratio."""
    if not (_has_stats(a) and _has_stats(b)):
        return True, math.nan, "ratio only"
    sa, sb = _samples(a), _samples(b)
    if _can_reject(len(sa), len(sb)):
        p = mann_whitney_u(sa, sb).p
        return p < P_THRESHOLD, p, "Mann-Whitney U"
    overlap = a["ci99_low"] <= b["ci99_high"] and b["ci99_low"] <= a["ci99_high"]
    return not overlap, math.nan, "99% CI"


def _beyond(ratio: float) -> bool:
    return ratio > SIGNIFICANCE_FACTOR or ratio < 1 / SIGNIFICANCE_FACTOR


def _direction(ratio: float, kind: str) -> str:
    worse = ratio < 1 if higher_is_better(kind) else ratio > 1
    return "regression" if worse else "improvement"


def _change_ratio(new: float, old: float) -> float:
    """new / old, where a value of 0 (a benchmark that retains no bytes) divides nothing: the
    same value twice is no change (1), a move away from 0 has no ratio but a direction (inf,
    signed), as asv compare prints "n/a" and still flags it by its factor rule."""
    if old == 0:
        return 1.0 if new == 0 else math.copysign(math.inf, new)
    return new / old


def _overlap(a, b) -> bool:
    """Whether the 99 % intervals of a and b overlap (False where either has none)."""
    return bool(a.get("ci99_low") <= b.get("ci99_high") and b.get("ci99_low") <= a.get("ci99_high")) \
        if _has_stats(a) and _has_stats(b) else False


def _verdict(old, new) -> dict:
    """`new` against `old`: the change, and whether it is significant by asv compare's rule
    (ratio beyond SIGNIFICANCE_FACTOR and the two results differ) with the two 99 % intervals
    apart too: Mann-Whitney on each run's samples sees a jump of the median, not the drift
    between runs, and a contended 2-core machine's tf32 step went +283 % with an interval of
    [0.117, 1.57] s around the previous [0.094, 0.186] s: a flag needs the intervals to exclude
    each other."""
    ratio = _change_ratio(new["value"], old["value"])
    different, p, test = differ(old, new)
    if different and test == "Mann-Whitney U" and _overlap(old, new):
        different, test = False, "Mann-Whitney U; 99 % intervals overlap"
    significant = bool(different and _beyond(ratio))
    return {"change": ratio - 1, "test": test, "p_value": p, "significant": significant,
            "direction": _direction(ratio, new["kind"]) if significant else ""}


def _best_split(values: list[float], data: list[list[float]], lo: int, hi: int):
    """The most significant split of commits lo..hi-1 into two levels, or None: each side
    MIN_SEGMENT commits or more, the median of the commits' values moved beyond the factor,
    and the two sides' pooled data different by the Mann-Whitney test at P_THRESHOLD.
    'Most significant' is the largest |z|, which, unlike p, does not underflow to 0."""
    best = None
    for k in range(lo + MIN_SEGMENT, hi - MIN_SEGMENT + 1):
        ratio = _change_ratio(float(np.median(values[k:hi])), float(np.median(values[lo:k])))
        before, after = np.concatenate(data[lo:k]), np.concatenate(data[k:hi])
        if not _beyond(ratio) or not _can_reject(len(before), len(after)):
            continue
        test = mann_whitney_u(after, before)
        if test.p < P_THRESHOLD and (best is None or abs(test.z) > abs(best[2].z)):
            best = (k, ratio, test)
    return best


def _steps(rows: list[dict]) -> list[tuple[int, float, float]]:
    """Sustained level changes in one history (rows oldest first) by binary segmentation:
    split where `_best_split` says, then look for further steps on each side.
    Returns (index of the first commit of the new level, ratio of medians, p).

    Each commit contributes its stored samples when every commit kept them, else its one
    value (so a track_* history needs about seven commits a side before the test can
    reject at P_THRESHOLD). Pooling treats a level's runs as one population; run-to-run
    drift smaller than the factor is kept out by the ratio condition."""
    pooled = all(_has_stats(r) and _samples(r) for r in rows)
    data = [_samples(r) if pooled else [r["value"]] for r in rows]
    values = [r["value"] for r in rows]
    found, todo = [], [(0, len(rows))]
    while todo:
        lo, hi = todo.pop()
        best = _best_split(values, data, lo, hi)
        if best:
            k, ratio, test = best
            found.append((k, ratio, test.p))
            todo += [(lo, k), (k, hi)]
    return sorted(found)

