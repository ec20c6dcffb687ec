"""History across commits (speedbench.report.commits) and asv compare's significance rule
(speedbench.stats.significance): history flags, the Mann-Whitney U test, steps across commits,
and `speedlib report --fail-on-regression`."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from speedbench import report
from speedbench.cli import parser as cli
from speedbench.results import synthetic
from speedbench.results.load import load_results

ROOT = Path(__file__).resolve().parents[3]
TIME = "bench_contiguous.OptimizerStep.time_adam_step"


def _history_rows(values, ci_halfwidth=0.01, samples=None, kind="time", repeat=10):
    """One case across commits, a day apart; `samples[i]`: commit i's stored samples."""
    rows = []
    for i, v in enumerate(values):
        day = pd.Timestamp("2026-01-01", tz="UTC") + pd.Timedelta(days=i)
        rows.append({"machine": "m", "benchmark": "bench_x.S.time_y", "params": "", "kind": kind, "unit": "seconds",
                     "commit": f"{i:040d}", "commit_date": day, "run_date": day, "value": v,
                     "ci99_low": v - ci_halfwidth, "ci99_high": v + ci_halfwidth, "n": 10, "repeat": repeat,
                     "samples": list(samples[i]) if samples is not None else []})
    return pd.DataFrame(rows)


def test_history_flags_only_large_changes_outside_the_interval():
    h = report.history(_history_rows([1.0, 1.05, 1.30, 1.31], 0.01))
    assert list(h["significant"]) == [False, False, True, False]
    assert list(h["direction"]) == ["", "", "regression", ""]
    assert list(h["test"]) == ["", "99% CI", "99% CI", "99% CI"]  # no samples stored: asv's CI check
    wide = report.history(_history_rows([1.0, 1.30], 0.2))  # 30 % slower but the CIs overlap
    assert not wide["significant"].any()
    faster = report.history(_history_rows([1.0, 0.5], 0.01))
    assert list(faster["direction"]) == ["", "improvement"]


# --- Mann-Whitney U: known values, not figures produced by this code -----------------------

def test_mann_whitney_exact_small_cases_counted_by_hand():
    # 3 vs 3, fully separated: 1 of the C(6,3) = 20 equally likely orders puts every x below
    # every y, 1 puts every x above: two-sided p = 2/20.
    r = report.mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert (r.u, r.method) == (0, "exact") and r.p == pytest.approx(2 / 20) and r.z < 0
    assert report.mann_whitney_u([4, 5, 6], [1, 2, 3]).p == pytest.approx(2 / 20)
    # 4 vs 4 with one inversion (5 > 4): U = 1; of the C(8,4) = 70 orders one gives U = 0 and
    # one gives U = 1, so P(U <= 1) = 2/70 and p = 4/70.
    r = report.mann_whitney_u([1, 2, 3, 5], [4, 6, 7, 8])
    assert r.u == 1 and r.p == pytest.approx(4 / 70)
    # One tie (3, 3): U is 0 or 1 depending on how it is broken; the least significant
    # breaking (U = 1) gives P(U <= 1) = 2/20, p = 0.2 (0.1 if the tie were ignored).
    assert report.mann_whitney_u([1, 2, 3], [3, 4, 5]).p == pytest.approx(0.2)
    assert report.mann_whitney_u([1, 1, 1], [1, 1, 1]).p == 1.0


def _with_u(n: int, u: int) -> tuple[list[float], list[float]]:
    """n x's and n y's (0..n-1) with exactly u pairs x > y: x = c - 0.5 is above c of the y's."""
    counts = [min(n, max(0, u - n * i)) for i in range(n)]
    return [c - 0.5 for c in counts], [float(v) for v in range(n)]


# Two-sided critical values of U for equal samples, from the standard Mann-Whitney table
# (e.g. Siegel & Castellan, Nonparametric Statistics, table J): reject at alpha when U <= the value.
@pytest.mark.parametrize("n, alpha, critical", [(5, 0.05, 2), (5, 0.01, 0), (8, 0.05, 13), (8, 0.01, 7),
                                                (10, 0.05, 23), (10, 0.01, 16), (20, 0.05, 127), (20, 0.01, 105)])
def test_mann_whitney_exact_matches_the_table_of_critical_values(n, alpha, critical):
    at = report.mann_whitney_u(*_with_u(n, critical))
    above = report.mann_whitney_u(*_with_u(n, critical + 1))
    assert at.u == critical and at.method == "exact"
    assert at.p <= alpha < above.p


def test_mann_whitney_normal_approximation_with_ties_by_hand():
    # 21 a side: the normal approximation. x = 1, 2, 3 (7 each), y = 2, 3, 4 (7 each).
    # U (x above y, ties one half): the 2s tie with 7 y's (3.5 each), the 3s are above 7 and
    # tie with 7 (10.5 each): U = 7 * 3.5 + 7 * 10.5 = 98; mn/2 = 220.5.
    # Tie groups 7, 14, 14, 7: sum(t^3 - t) = 2 * 336 + 2 * 2730 = 6132; N = 42.
    x, y = [1] * 7 + [2] * 7 + [3] * 7, [2] * 7 + [3] * 7 + [4] * 7
    var = 21 * 21 / 12 * ((42 + 1) - 6132 / (42 * 41))
    z_corrected = (220.5 - 98 - 0.5) / math.sqrt(var)  # continuity correction 0.5
    r = report.mann_whitney_u(x, y)
    assert r.method == "normal" and r.u == 98
    assert r.p == pytest.approx(math.erfc(z_corrected / math.sqrt(2)))
    assert r.z == pytest.approx((98 - 220.5) / math.sqrt(var))


# --- asv compare's rule in history() ----------------------------------------------------

def _spread(centre: float, n: int = 10, step: float = 0.001) -> list[float]:
    return [centre + step * i for i in range(n)]


def test_stored_samples_decide_by_mann_whitney_and_the_intervals_must_be_apart_too():
    # Samples fully separated (p = 2 / C(20, 10)), the CIs narrow and apart: a change.
    h = report.history(_history_rows([1.0, 1.3], 0.01, samples=[_spread(1.0), _spread(1.3)]))
    assert list(h["significant"]) == [False, True] and h["test"].iloc[1] == "Mann-Whitney U"
    assert h["p_value"].iloc[1] == pytest.approx(2 / math.comb(20, 10))
    # The same samples with wide, overlapping CIs: asv's rule alone flagged it; a jump of the
    # median inside overlapping intervals is drift between runs (issue 44: the History page opened
    # on a contended CPU's tf32 step "+283 %", [0.117, 1.57] s against [0.094, 0.186] s).
    h = report.history(_history_rows([1.0, 1.3], 0.5, samples=[_spread(1.0), _spread(1.3)]))
    assert not h["significant"].any() and h["test"].iloc[1] == "Mann-Whitney U; 99 % intervals overlap"
    assert h["p_value"].iloc[1] == pytest.approx(2 / math.comb(20, 10))  # the test's own p, still said
    # Medians 1.5 -> 2.0, intervals disjoint, but the samples interleave: no difference.
    old = _spread(1.0, 5) + _spread(2.0, 5)
    new = [v + 0.0005 for v in _spread(1.0, 4) + _spread(2.0, 6)]
    h = report.history(_history_rows([1.5, 2.0], 0.01, samples=[old, new]))
    assert not h["significant"].any() and h["p_value"].iloc[1] > 0.05


def test_p_below_001_is_not_enough():
    # 10 vs 10 with U = 16: p <= 0.01 by the table, but above asv's 0.002. The medians move
    # 30 % and the intervals are disjoint, so only the test's threshold keeps it unflagged.
    x, y = _with_u(10, 16)  # 8 x's below every y, the other two above 6 and 10 of them

    def spread(v):  # keeps the order of all 20 values (so U), opens a gap between 4 and 5.5
        return 1.0 + v / 100 + (0.5 if v >= 5 else 0.0)

    old, new = [spread(v) for v in x], [spread(v) for v in y]
    medians = [float(np.median(old)), float(np.median(new))]
    assert medians[1] / medians[0] > 1.2
    h = report.history(_history_rows(medians, 0.01, samples=[old, new]))
    assert h["test"].iloc[1] == "Mann-Whitney U" and report.mann_whitney_u(old, new).u == 16
    assert 0.002 < h["p_value"].iloc[1] <= 0.01 and not h["significant"].any()


def test_too_few_samples_for_the_test_fall_back_to_the_intervals():
    # 5 vs 5: the most extreme order has p = 1 / C(10, 5) > 0.002, so asv compares the CIs.
    h = report.history(_history_rows([1.0, 1.3], 0.01, samples=[_spread(1.0, 5), _spread(1.3, 5)]))
    assert list(h["significant"]) == [False, True] and h["test"].iloc[1] == "99% CI"


def test_results_without_statistics_go_by_the_ratio():
    track = report.history(_history_rows([1.0, 1.2, 1.25], float("nan"), kind="memory"))
    assert list(track["significant"]) == [False, True, False] and set(track["test"][1:]) == {"ratio only"}
    single = report.history(_history_rows([1.0, 1.2], 0.5, repeat=1))  # one repeat: asv ignores its "CI"
    assert single["significant"].iloc[1] and single["test"].iloc[1] == "ratio only"


# --- steps across commits ---------------------------------------------------------------

def _levels(levels, seed=0, kind="time"):
    """A history whose commit i sits at levels[i], 10 samples with 2 % noise each."""
    rng = np.random.default_rng(seed)
    samples = [list(level * (1 + 0.02 * rng.standard_normal(10))) for level in levels]
    return _history_rows([float(np.median(s)) for s in samples], 0.01, samples=samples, kind=kind)


def steps(h) -> list[tuple[int, str]]:
    return [(i, d) for i, (s, d) in enumerate(zip(h["step"], h["step_direction"], strict=True)) if s]


def test_a_step_is_found_at_the_first_commit_of_the_new_level():
    assert steps(report.history(_levels([1.0] * 5 + [1.3] * 5))) == [(5, "regression")]
    assert steps(report.history(_levels([1.0] * 4 + [0.8] * 6, seed=1))) == [(4, "improvement")]
    assert steps(report.history(_levels([1.0] * 3 + [1.3] * 3, seed=2))) == [(3, "regression")]  # shortest levels
    down = report.history(_levels([10.0] * 5 + [7.0] * 4, seed=3, kind="bandwidth"))  # higher is better
    assert steps(down) == [(5, "regression")]
    table = report.history_table(_levels([1.0] * 5 + [1.3] * 5), "bench_x.S.time_y").frame
    assert table["flag"].iloc[5] == "regression; step: regression" and table["flag"].iloc[6] == ""


def test_two_steps_are_both_found():
    assert steps(report.history(_levels([1.0] * 4 + [1.5] * 4 + [1.0] * 4))) == [(4, "regression"), (8, "improvement")]


@pytest.mark.parametrize("levels", [[1.0] * 4 + [2.0] + [1.0] * 3, [1.0] * 5 + [2.0], [2.0] + [1.0] * 6,
                                    [1.0] * 3 + [2.0, 2.0] + [1.0] * 3])
def test_a_blip_is_not_a_step(levels):
    h = report.history(_levels(levels))
    assert steps(h) == []
    assert h["significant"].any()  # the commit-to-commit flag still marks it


def test_no_change_is_no_step():
    for seed in range(5):
        h = report.history(_levels([1.0] * 12, seed=seed))
        assert steps(h) == [] and not h["significant"].any()


def test_a_step_in_single_values_needs_enough_commits_for_the_test():
    few = report.history(_history_rows([1.0] * 3 + [2.0] * 3, float("nan"), kind="memory"))
    assert not few["step"].any()  # 3 vs 3 values: the test cannot reach p < 0.002
    many = report.history(_history_rows([1.0] * 7 + [2.0] * 7, float("nan"), kind="memory"))
    assert steps(many) == [(7, "regression")]


# --- speedlib report --fail-on-regression A B ---------------------------------------------

def _scale_time(tree: Path, machine: str, commit_index: int, factor: float) -> None:
    """Scale every time_adam_step value and statistic of one result file by `factor`."""
    path = sorted((tree / machine).glob("*-existing-*.json"),
                  key=lambda f: json.loads(f.read_text())["date"])[commit_index]
    data = json.loads(path.read_text())
    # strict=False: asv's format drops a row's trailing nulls, so a row may be shorter than the columns
    entry = dict(zip(data["result_columns"], data["results"][TIME], strict=False))
    for col in ("result", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25", "stats_q_75"):
        entry[col] = [v * factor for v in entry[col]]
    entry["samples"] = [[v * factor for v in s] for s in entry["samples"]]
    data["results"][TIME] = [entry[c] for c in data["result_columns"]]
    path.write_text(json.dumps(data))


@pytest.fixture
def two_commits(tmp_path) -> tuple[Path, str, str]:
    synthetic.write_results(tmp_path, commits=2, machines=2)
    commits = load_results(tmp_path).measured.sort_values("commit_date")["commit"].unique()
    return tmp_path, commits[0][:8], commits[1][:8]


def gate(tree: Path, a: str, b: str, *options: str) -> int:
    return cli.main(["report", "--results", str(tree), "--format", "csv", *options, "--fail-on-regression", a, b])


def test_fail_on_regression_exits_1_on_a_significant_regression(two_commits, capsys):
    tree, a, b = two_commits
    _scale_time(tree, "synthetic-h100", 1, 1.5)
    assert gate(tree, a, b) == 1
    said = capsys.readouterr()
    table = pd.read_csv(io.StringIO(said.out))
    assert len(table) == 6 and set(table["verdict"]) == {"regression"} and set(table["machine"]) == {"synthetic-h100"}
    assert table["test"].str.startswith("Mann-Whitney U, p = ").all()
    # the CSV is plain data: its notes, this summary among them, go with its provenance to stderr
    assert "36 results compared (synthetic-h100, synthetic-h200): 6 significant regression(s)" in said.err
    assert gate(tree, a, b, "--machine", "synthetic-h200") == 0  # the other machine did not change
    assert gate(tree, b, a) == 0  # backwards it is an improvement


def test_fail_on_regression_exits_0_without_one(two_commits, capsys):
    tree, a, b = two_commits
    assert gate(tree, a, b) == 0
    assert pd.read_csv(io.StringIO(capsys.readouterr().out)).empty  # noise only: nothing to show
    _scale_time(tree, "synthetic-h200", 1, 0.5)
    assert gate(tree, a, b) == 0
    table = pd.read_csv(io.StringIO(capsys.readouterr().out))
    assert len(table) == 6 and set(table["verdict"]) == {"improvement"}


@pytest.mark.parametrize("args, message", [
    (["deadbeef", "B"], "no results for commit deadbeef"),
    (["HEAD", "B"], "'HEAD' is not a commit hash prefix"),
    (["A", "A"], "given twice"),
    (["A", "B", "--machine", "nope"], "no measured results for machine nope"),
])
def test_fail_on_regression_exits_2_on_bad_input(two_commits, capsys, args, message):
    tree, a, b = two_commits
    assert gate(tree, *[{"A": a, "B": b}.get(x, x) for x in args]) == 2
    assert message in capsys.readouterr().err


def test_compare_commits_needs_a_machine_that_measured_both(two_commits):
    tree, a, b = two_commits
    df = load_results(tree).measured
    split = df[~((df["machine"] == "synthetic-h100") & df["commit"].str.startswith(b))
               & ~((df["machine"] == "synthetic-h200") & df["commit"].str.startswith(a))]
    with pytest.raises(ValueError, match="on the same machine"):
        report.compare_commits(split, a, b)
    with pytest.raises(ValueError, match="ambiguous"):
        report.resolve_commit(df.assign(commit="abcd" + df["commit"]), "abcd")  # two commits start so
