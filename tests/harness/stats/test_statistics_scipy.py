"""The harness's hand-written statistics against scipy, an independent implementation.

speedbench computes its statistics itself so that reading results needs neither asv nor
scipy; scipy is a test dependency (the `[test]` extra) so that these comparisons run in CI
rather than skip. Covered: the signed-rank cutoff and the Hodges-Lehmann interval it gives
(speedbench.stats.paired) against `scipy.stats.wilcoxon`, and `mann_whitney_u` (speedbench.stats.significance)
against `scipy.stats.mannwhitneyu`, on random and on tied samples, small and large, in the
exact and the normal-approximation regimes, and in both tails.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats  # a hard import: a missing scipy must fail here, not skip

from speedbench import report
from speedbench.stats.paired import ratio_estimate, signed_rank_cutoff

# --- Wilcoxon signed-rank: the cutoff and the interval it gives -------------------------


def _signed_ranks_with_w_plus(n: int, w_plus: int) -> np.ndarray:
    """Differences +-1..+-n (no ties, no zeros) whose positive ranks sum to exactly w_plus."""
    signs, left = [-1.0] * n, w_plus
    for rank in range(n, 0, -1):  # greedy from the top reaches every sum 0..n(n+1)/2
        if rank <= left:
            signs[rank - 1], left = 1.0, left - rank
    assert left == 0
    return np.array([s * r for r, s in enumerate(signs, 1)])


# n from below the first 99 % interval (8) through sizes where scipy's default would switch to
# its normal approximation (> 50): speedlib's distribution is exact at every n, so it is held
# to scipy's exact one throughout.
@pytest.mark.parametrize("n", [*range(5, 41), 50, 51, 64, 100, 150])
@pytest.mark.parametrize("alpha", [0.01, 0.05])
def test_signed_rank_cutoff_is_scipys_exact_critical_value(n, alpha):
    c = signed_rank_cutoff(n, alpha)
    # W+ <= c - 1 is rejected (each tail holds at most alpha / 2) and W+ = c is not.
    if c >= 1:
        at = stats.wilcoxon(_signed_ranks_with_w_plus(n, c - 1), alternative="less", method="exact")
        assert at.statistic == c - 1 and at.pvalue <= alpha / 2
    above = stats.wilcoxon(_signed_ranks_with_w_plus(n, c), alternative="less", method="exact")
    assert above.statistic == c and above.pvalue > alpha / 2
    # The upper tail mirrors it: W+ >= n(n+1)/2 - (c - 1) is rejected, one less is not.
    top = n * (n + 1) // 2
    if c >= 1:
        assert stats.wilcoxon(_signed_ranks_with_w_plus(n, top - c + 1), alternative="greater",
                              method="exact").pvalue <= alpha / 2
    assert stats.wilcoxon(_signed_ranks_with_w_plus(n, top - c), alternative="greater",
                          method="exact").pvalue > alpha / 2


def _walsh(logs) -> np.ndarray:
    n = len(logs)
    return np.sort([(logs[i] + logs[j]) / 2 for i in range(n) for j in range(i, n)])


@pytest.mark.parametrize("seed", range(12))
def test_interval_is_the_set_of_shifts_scipys_two_sided_test_keeps(seed):
    """The 99 % interval inverts the test: a shift just inside either end is kept by scipy's
    exact two-sided Wilcoxon test on (log ratio - shift), a shift just outside is rejected."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(8, 45))
    logs = rng.normal(0.1, 0.05, n)  # continuous: no ties, and no Walsh averages coincide
    r = ratio_estimate(np.exp(logs).tolist())
    walsh, c = _walsh(logs), signed_rank_cutoff(n)
    assert (math.log(r.low), math.log(r.high)) == (pytest.approx(walsh[c - 1]), pytest.approx(walsh[-c]))
    # Midway between neighbouring Walsh averages, no |log - shift| is zero or tied.
    kept = [(walsh[c - 1] + walsh[c]) / 2, (walsh[-c - 1] + walsh[-c]) / 2]
    if c >= 2:
        rejected = [(walsh[c - 2] + walsh[c - 1]) / 2, (walsh[-c] + walsh[-c + 1]) / 2]
    else:  # the interval is the whole range of Walsh averages: reject just beyond it
        rejected = [walsh[0] - 1, walsh[-1] + 1]
    for shift in kept:
        assert stats.wilcoxon(logs - shift, method="exact").pvalue > 0.01
    for shift in rejected:
        assert stats.wilcoxon(logs - shift, method="exact").pvalue <= 0.01
    # Hodges-Lehmann: the shift at which the Walsh averages balance, W+ = W- (scipy's W+
    # counts the Walsh averages above the shift, checked below), i.e. their median.
    assert math.log(r.ratio) == pytest.approx(np.median(walsh))


@pytest.mark.parametrize("seed", range(12))
def test_tied_rounds_the_walsh_count_is_scipys_midrank_statistic(seed):
    """Rounds that measure alike give tied log ratios (here multiples of 1/50, in integer units
    so the arithmetic is exact). Ties in the data tie the |differences| only within one sign
    at a shift between Walsh averages, so scipy's midrank W+ still equals the number of Walsh
    averages above the shift: the interval's ends, read off the Walsh averages, are where
    scipy's statistic crosses the cutoff that the untied test above checks."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(8, 45))
    units = np.round(rng.normal(5, 2.5, n)).astype(int)  # log ratio = units / 50: many ties
    sums = np.sort([units[i] + units[j] for i in range(n) for j in range(i, n)])  # 2x Walsh, x50
    c = signed_rank_cutoff(n)
    r = ratio_estimate(np.exp(units / 50).tolist())
    assert math.log(r.low) * 100 == pytest.approx(sums[c - 1]) and math.log(r.high) * 100 == pytest.approx(sums[-c])
    assert math.log(r.ratio) * 100 == pytest.approx(np.median(sums))
    for s in np.unique(sums):
        # Shift = (s + 0.5) / 2 units: a quarter-unit off every Walsh average, exact in floats.
        diffs = units - (s + 0.5) / 2
        res = stats.wilcoxon(diffs, alternative="greater", method="asymptotic")
        assert res.statistic == (sums > s + 0.5).sum()


# --- Mann-Whitney U ---------------------------------------------------------------------

def _assert_both_tails(mine, x, y):
    """speedlib's z (no continuity correction) against scipy's one-sided normal tests."""
    greater = stats.mannwhitneyu(x, y, alternative="greater", method="asymptotic", use_continuity=False)
    less = stats.mannwhitneyu(x, y, alternative="less", method="asymptotic", use_continuity=False)
    assert stats.norm.sf(mine.z) == pytest.approx(greater.pvalue, rel=1e-9, abs=1e-300)
    assert stats.norm.cdf(mine.z) == pytest.approx(less.pvalue, rel=1e-9, abs=1e-300)


# Sizes on both sides of EXACT_MAX: speedlib is exact while both samples have <= 20 values.
EXACT_SIZES = [(1, 1), (1, 5), (2, 2), (3, 5), (4, 9), (7, 3), (10, 10), (20, 3), (13, 20), (20, 20)]
NORMAL_SIZES = [(21, 4), (21, 21), (25, 30), (60, 80), (200, 150)]


def test_the_regimes_split_where_the_sizes_above_assume():
    assert report.EXACT_MAX == 20


@pytest.mark.parametrize("m, n", EXACT_SIZES)
@pytest.mark.parametrize("shift", [0.0, 0.7, -1.5])
def test_mann_whitney_exact_matches_scipy_on_random_samples(m, n, shift):
    rng = np.random.default_rng(m * 100 + n)
    x, y = rng.normal(size=m), rng.normal(shift, size=n)
    for a, b in ((x, y), (y, x)):  # swapping the samples mirrors U; p must not change
        mine = report.mann_whitney_u(a, b)
        ref = stats.mannwhitneyu(a, b, method="exact")
        assert mine.method == "exact" and mine.u == ref.statistic
        assert mine.p == pytest.approx(ref.pvalue, rel=1e-12)
        _assert_both_tails(mine, a, b)


@pytest.mark.parametrize("m, n", NORMAL_SIZES)
@pytest.mark.parametrize("shift", [0.0, 0.4, -0.8])
def test_mann_whitney_normal_matches_scipys_asymptotic_test(m, n, shift):
    rng = np.random.default_rng(m * 1000 + n)
    x, y = rng.normal(size=m), rng.normal(shift, size=n)
    for a, b in ((x, y), (y, x)):
        mine = report.mann_whitney_u(a, b)
        ref = stats.mannwhitneyu(a, b, method="asymptotic")  # continuity-corrected, as speedlib
        assert mine.method == "normal" and mine.u == ref.statistic
        assert mine.p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)
        _assert_both_tails(mine, a, b)


@pytest.mark.parametrize("m, n", NORMAL_SIZES)
@pytest.mark.parametrize("levels", [2, 5, 30])
def test_mann_whitney_normal_with_ties_matches_scipys_tie_corrected_test(m, n, levels):
    """Coarse timings (a few distinct values) tie heavily; both correct the variance for ties."""
    rng = np.random.default_rng(m + n + levels)
    x = rng.integers(0, levels, m).astype(float)
    y = rng.integers(0, levels, n).astype(float) + rng.integers(0, 2)
    for a, b in ((x, y), (y, x)):
        mine = report.mann_whitney_u(a, b)
        ref = stats.mannwhitneyu(a, b, method="asymptotic")
        assert mine.method == "normal" and mine.u == ref.statistic
        assert mine.p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-300)
        _assert_both_tails(mine, a, b)


def test_mann_whitney_ties_within_one_sample_only_change_nothing():
    """Ties among the x's alone (or the y's alone) leave U an integer no tie-breaking can
    move, so the exact p is scipy's exact p."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        m, n = (int(v) for v in rng.integers(1, 21, 2))
        x = rng.integers(0, 4, m) * 2.0  # even values, repeated
        y = rng.integers(0, 4, n) * 2.0 + 1  # odd values, repeated: no x equals a y
        mine = report.mann_whitney_u(x, y)
        ref = stats.mannwhitneyu(x, y, method="exact")
        assert mine.u == ref.statistic and mine.p == pytest.approx(ref.pvalue, rel=1e-12)


def _tie_breakings(x, y):
    """Every way to order the x's against the y's within each tied value (a small offset
    below the gap between distinct values): the untied samples a tie could have been."""
    values = np.unique(np.concatenate([x, y]))
    groups = [(v, int((x == v).sum()), int((y == v).sum())) for v in values]
    layouts = [list(itertools.combinations(range(a + b), a)) for _, a, b in groups]
    for choice in itertools.product(*layouts):
        bx, by = [], []
        for (v, a, b), x_slots in zip(groups, choice, strict=True):  # a layout per group
            for slot in range(a + b):
                (bx if slot in x_slots else by).append(v + slot * 1e-3)
        yield np.array(bx), np.array(by)


@pytest.mark.parametrize("seed", range(40))
def test_mann_whitney_exact_with_ties_is_the_least_significant_tie_breaking(seed):
    """Across a tie between the samples, U depends on how the tie is broken, and scipy's exact
    p (documented as not corrected for ties) takes the midrank U. speedlib takes the breaking
    least favourable to significance: its p is the largest scipy exact p over every breaking,
    and never below scipy's midrank p."""
    rng = np.random.default_rng(1000 + seed)
    m, n = (int(v) for v in rng.integers(1, 7, 2))
    x, y = rng.integers(0, 3, m).astype(float), rng.integers(0, 3, n).astype(float)
    mine = report.mann_whitney_u(x, y)
    assert mine.method == "exact" and mine.u == stats.mannwhitneyu(x, y).statistic
    worst = max(stats.mannwhitneyu(bx, by, method="exact").pvalue for bx, by in _tie_breakings(x, y))
    assert mine.p == pytest.approx(worst, rel=1e-12)
    assert mine.p >= stats.mannwhitneyu(x, y, method="exact").pvalue - 1e-12


@pytest.mark.parametrize("seed", range(20))
def test_mann_whitney_exact_with_ties_never_below_scipys_midrank_p_at_larger_sizes(seed):
    rng = np.random.default_rng(2000 + seed)
    m, n = (int(v) for v in rng.integers(8, 21, 2))
    x = rng.integers(0, 6, m).astype(float)
    y = rng.integers(0, 6, n).astype(float) + rng.integers(0, 3)
    mine = report.mann_whitney_u(x, y)
    ref = stats.mannwhitneyu(x, y, method="exact")
    assert mine.method == "exact" and mine.u == ref.statistic and mine.p >= ref.pvalue - 1e-12
    _assert_both_tails(mine, x, y)
