"""speedbench.stats.contention: disturbed rounds, contended results, and how every table shows them."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from project_bits import commit_all, copy_project, run_cli

from speedbench import report
from speedbench.cli import parser as cli
from speedbench.measure import preflight
from speedbench.report import headline
from speedbench.results.load import load_results
from speedbench.run import suite
from speedbench.stats import contention, paired
from speedbench.stats.contention import CLEAN, CONTENDED, DROPPED, UNKNOWN

QUIET = {"others_cpu": [1.0] * 15, "preemptions": [3.0] * 15}


def test_quiet_rounds_are_clean():
    v = contention.judge(QUIET, 15, 2, 2)
    assert v.state == CLEAN and v.disturbed == (False,) * 15 and v.note == "" and v.dropped == 0


def test_a_few_disturbed_rounds_are_left_out_and_counted():
    counters = {"others_cpu": [1.0] * 12 + [48.0, 30.0, 3.0], "preemptions": [3.0] * 13 + [450.0, 2.0]}
    v = contention.judge(counters, 15, 2, 2)
    assert v.state == DROPPED and v.dropped == 2
    assert v.keep(list(range(15))) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 14]
    assert v.note.startswith("2 disturbed rounds left out of 15")


def test_preemptions_judge_a_round_only_where_the_share_of_the_machine_is_unknown():
    # a DataLoader's own workers preempt the measuring process: no neighbour, not disturbed
    own_workers = {"others_cpu": [0.0] * 15, "preemptions": [400.0] * 15}
    assert contention.judge(own_workers, 15, 2, 2).state == CLEAN
    no_proc_stat = {"preemptions": [400.0] * 15}  # macOS, or a /proc without stat
    assert contention.judge(no_proc_stat, 15).state == CONTENDED
    assert contention.judge({"preemptions": [contention.PREEMPTIONS_MAX - 1] * 15}, 15).state == CLEAN


def test_mostly_disturbed_rounds_make_a_contended_result_that_keeps_every_round():
    busy = {"others_cpu": [50.0] * 15, "preemptions": [300.0] * 15}
    v = contention.judge(busy, 15, 2, 2)
    assert v.state == CONTENDED and v.dropped == 0 and v.keep([1.0] * 15) == [1.0] * 15
    assert "contended: 15 of 15 rounds disturbed" in v.note and "kept 1.0 of 2 CPUs busy" in v.note
    assert "300 preemptions/s" in v.note


def test_too_few_undisturbed_rounds_for_an_interval_is_contended_too():
    # 2 of 9 disturbed: under a third, but 7 left cannot give a 99 % interval
    v = contention.judge({"others_cpu": [50.0, 50.0] + [1.0] * 7}, 9, 2, 2)
    assert v.state == CONTENDED
    one = contention.judge({"others_cpu": [60.0]}, 1, 2, 2)  # an unpaired timing: one window
    assert one.state == CONTENDED and one.note.startswith("contended: the measurement was disturbed")
    assert contention.judge({"others_cpu": [2.0]}, 1, 2, 2).state == CLEAN


def test_other_work_counts_in_cores_beyond_the_ones_the_benchmark_leaves_free():
    one_busy_process = {"others_cpu": [100 / 16] * 9}  # one core of a 16-core GPU host
    assert contention.judge(one_busy_process, 9, 16, 16).state == CONTENDED  # every core had a torch thread
    assert contention.judge(one_busy_process, 9, 16, 8).state == CLEAN  # 8 cores were free
    assert contention.others_limit(2, 2) == 25.0 and contention.others_limit(2, 1) == 75.0
    assert contention.others_limit(None) is None
    # the machine's size unknown: its share cannot be judged, preemptions stand in
    assert contention.judge({"others_cpu": [90.0] * 9, "preemptions": [1.0] * 9}, 9).state == CLEAN


def test_no_counters_or_counters_of_another_run_are_unknown():
    assert contention.judge({}, 15).state == UNKNOWN
    assert contention.judge({"others_cpu": [1.0] * 10}, 15).state == UNKNOWN  # 10 rounds for 15 samples
    assert contention.judge({"others_cpu": None}, 15).state == UNKNOWN


def test_a_gpu_round_is_disturbed_by_a_neighbour_or_a_clock_below_the_comparisons_own():
    clocks = [97.0] * 15
    clocks[3] = 80.0  # 17 % below the median round
    neighbours = [0.0] * 15
    neighbours[7] = 1.0
    reasons = contention.disturbances({"gpu_clock": clocks, "gpu_neighbours": neighbours})
    assert [i for i, r in enumerate(reasons) if r] == [3, 7]
    assert "SM clock 80 % of max" in reasons[3][0] and "other process(es) on the GPU" in reasons[7][0]
    # a clock every round shares (a power-capped kernel) is the work's own, not a disturbance
    assert not any(contention.disturbances({"gpu_clock": [70.0] * 15}))


# --- the loader and the tables -------------------------------------------------------------

COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
           "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples"]
UNITS = {"track_seconds": "seconds", "track_speedup": "x", "track_interference": "% of CPU time to other processes",
         "track_preemptions": "preemptions/s"}
CLASS = "bench_contiguous.AdamStep"


def write_run(root: Path, machine: str, sha: str, when_ms: int, ratios: list[float], others: list[float] | None,
              preemptions: list[float] | None = None) -> None:
    """One asv result file of a flat-buffer Adam comparison (speedlib against forloop) with
    its rounds' counters, as `speedlib run` leaves it, and the environment record."""
    params = [["'resnet50'"], ["'forloop'", "'speedlib'"]]
    entries = {}
    n = len(ratios)

    def entry(values, samples):
        return [values, params, "v1", when_ms, 1.0, [None, None], [None, None], [None, None], [None, None],
                [1, 1], [n, n], samples]

    entries[f"{CLASS}.track_seconds"] = entry([0.03, 0.01], [[0.03] * n, [0.03 / r for r in ratios]])
    entries[f"{CLASS}.track_speedup"] = entry([float("nan"), sorted(ratios)[n // 2]], [None, ratios])
    for name, values in (("track_interference", others), ("track_preemptions", preemptions)):
        if values is not None:
            entries[f"{CLASS}.{name}"] = entry([values[0]] * 2, [values, values])
    mdir = root / machine
    (mdir / "environment").mkdir(parents=True, exist_ok=True)
    (mdir / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))
    data = {"commit_hash": sha, "env_name": "existing-py", "date": when_ms - 3_600_000, "params": {}, "python": "3",
            "requirements": {}, "env_vars": {}, "result_columns": COLUMNS, "results": entries, "durations": {},
            "version": 2}
    (mdir / f"{sha[:8]}-existing-py.json").write_text(json.dumps(data))
    recorded = pd.Timestamp(when_ms + 60_000, unit="ms", tz="UTC").isoformat()
    record = {"commit": sha, "recorded_at": recorded, "command": "speedlib run", "gpu_model": None, "gpu_count": 0,
              "torch": "2.14.1", "cpu_model": "test CPU", "cpu_cores": 2, "torch_threads": 2}
    with (mdir / "environment" / f"{sha[:8]}.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")
    listing = {"version": 2, **{f"{CLASS}.{m}": {"name": f"{CLASS}.{m}", "type": "track", "unit": u, "version": "v1",
                                                 "param_names": ["workload", "variant"], "params": params}
                                for m, u in UNITS.items()}}
    (root / "benchmarks.json").write_text(json.dumps(listing))


STEADY = [4.0, 4.1, 3.9, 4.05, 3.95, 4.0, 4.02, 3.98, 4.0, 4.01, 3.99, 4.0, 4.03, 3.97, 4.0]


@pytest.fixture
def tree(tmp_path) -> Path:
    """Three commits of one machine: idle; two disturbed rounds; busy throughout (the newest)."""
    day = 86_400_000
    write_run(tmp_path, "m", "a" * 40, 1_790_000_000_000, STEADY, [1.0] * 15, [2.0] * 15)
    blips = list(STEADY)
    blips[4], blips[9] = 30.0, 25.0  # what a busy neighbour did to two rounds
    others = [1.0] * 15
    others[4] = others[9] = 55.0
    write_run(tmp_path, "m", "b" * 40, 1_790_000_000_000 + day, blips, others, [2.0] * 15)
    write_run(tmp_path, "m", "c" * 40, 1_790_000_000_000 + 2 * day, [r * 3 for r in STEADY], [50.0] * 15,
              [400.0] * 15)
    return tmp_path


def test_the_loader_attaches_the_verdict_and_keeps_the_counters_out_of_the_results(tree):
    m = load_results(tree).measured
    assert not m["benchmark"].str.contains("track_interference|track_preemptions").any()
    states = m[m["benchmark"].str.endswith("track_speedup")].set_index("commit")["contention"]
    assert states.to_dict() == {"a" * 40: CLEAN, "b" * 40: DROPPED, "c" * 40: CONTENDED}


def test_the_paired_estimate_leaves_the_disturbed_rounds_out(tree):
    p = report.paired(load_results(tree).measured).set_index("commit")
    idle, blipped = p.loc["a" * 40], p.loc["b" * 40]
    kept = [r for i, r in enumerate(STEADY) if i not in (4, 9)]
    assert blipped["dropped"] == 2 and blipped["n"] == 13
    assert blipped["ratio"] == pytest.approx(paired.ratio_estimate(kept).ratio)
    assert abs(blipped["ratio"] / idle["ratio"] - 1) < 0.02  # the blips no longer move it
    busy = p.loc["c" * 40]
    assert busy["dropped"] == 0 and busy["n"] == 15 and busy["contention"] == CONTENDED


def test_every_export_marks_a_contended_result_and_says_why(tree):
    t = report.paired_table(report.latest(load_results(tree).measured))
    row = t.frame.iloc[0]
    assert row["speedup"].endswith(report.CONTENDED) and report.CONTENDED in row["commit"]
    assert row["machine state"].startswith(f"{report.CONTENDED} contended: 15 of 15 rounds disturbed")
    assert "kept 1.0 of 2 CPUs busy" in row["machine state"]
    md = report.to_markdown(t)
    assert report.CONTENDED_NOTE.split(":")[0] in md and "400 preemptions/s" in md
    assert "machine state ‡ contended in 1 of 1 results" in md  # the provenance footer too
    csv = pd.read_csv(io.StringIO(report.to_csv(t)))
    assert csv["contended"].tolist() == [True] and csv["earlier_version"].tolist() == [False]
    assert csv["technique"].tolist() == ["contiguous"] and csv["contention"].tolist() == [CONTENDED]
    assert report.CONTENDED in report.to_latex(t)


def test_claims_cite_the_newest_clean_result_instead_of_a_contended_one(tree):
    m = load_results(tree).measured
    cited = report.citable(m)
    assert set(cited.loc[cited["benchmark"].str.endswith("track_speedup"), "commit"]) == {"b" * 40}
    claims = report.claims_table(m)
    mine = claims.data[claims.data["technique"] == "contiguous"]
    assert mine["commit"].tolist() == ["b" * 40] and mine["contended"].tolist() == [False]
    assert mine["ratio"].iloc[0] == pytest.approx(4.0, rel=0.02)
    # with no clean result at all, the contended one is shown, marked
    only_busy = m[m["commit"] == "c" * 40]
    claims = report.claims_table(only_busy)
    row = claims.frame[claims.frame["technique"] == "contiguous"].iloc[0]
    assert row["measured"].endswith(report.CONTENDED) and report.CONTENDED_NOTE in claims.notes


def test_the_headline_cites_the_newest_clean_result_and_says_the_latest_was_contended(tree):
    m = load_results(tree).measured
    g = headline.grid(m)
    step = next(q.label for q in headline.QUESTIONS if q.key == "contiguous-step")
    cell = g.frame.loc[g.frame["question"] == step].iloc[0, 2]
    # commit b's 4.0x, its two blips left out
    assert cell.startswith("4")
    assert report.CONTENDED not in cell
    assert any(f"commit {'b' * 8}" in n and f"the latest, {'c' * 8}, was contended" in n for n in g.notes)
    assert g.frame.columns.tolist()[:2] == ["technique", "question"] and len(g.frame) == len(headline.QUESTIONS)
    assert "machine state when measured: m: quiet but for disturbed rounds, left out (2 in all)" in g.notes
    busy = headline.grid(m[m["commit"] == "c" * 40])  # no clean result at all: shown, marked
    cell = busy.frame.loc[busy.frame["question"] == step].iloc[0, 2]
    # the mark stands right after the figure it qualifies, where a reader quoting the lead looks
    assert cell.startswith(f"12x [11.9, 12.1] {report.CONTENDED} N=15")
    assert report.CONTENDED_NOTE in busy.notes


def test_history_compares_around_a_contended_result_and_the_gate_refuses_it(tree, capsys):
    m = load_results(tree).measured
    bench = f"{CLASS}.track_speedup"
    h = report.history(m, bench).set_index("commit")
    assert h.loc["c" * 40, "left_out"] and pd.isna(h.loc["c" * 40, "change"])  # 3x the others: no verdict
    t = report.history_table(m, bench)
    busy = t.frame[t.frame["commit"].str.startswith("c" * 8)].iloc[0]
    assert busy["commit"].endswith(report.CONTENDED) and busy["flag"].startswith(f"{report.CONTENDED} contended")
    assert any("compared with the last one measured on a quiet one" in n for n in t.notes)
    # the gate: a change to a contended commit could be the machine's
    assert cli.main(["report", "--results", str(tree), "--fail-on-regression", "a" * 8, "c" * 8]) == 2
    err = capsys.readouterr().err
    assert "contended machine" in err and f"m at {'c' * 8}" in err and "--require-quiet" in err
    assert cli.main(["report", "--results", str(tree), "--fail-on-regression", "a" * 8, "b" * 8]) in (0, 1)


def test_the_claims_command_and_machine_comparisons_see_contention(tree, capsys):
    # `report --table claims` cites commit b's quiet result, not the latest (contended) c's
    assert cli.main(["report", "--results", str(tree), "--table", "claims", "--format", "csv"]) == 0
    claims = pd.read_csv(io.StringIO(capsys.readouterr().out))
    mine = claims[claims["technique"] == "contiguous"]
    assert mine["commit"].tolist() == ["b" * 40] and mine["contention"].tolist() == [DROPPED]
    # one machine against another: contended on either side is marked
    m = load_results(tree).measured
    other = m.assign(machine="n", result_id=m["result_id"] + "n", contention=CLEAN)
    both = pd.concat([m, other], ignore_index=True)
    rows = report.compare_machines(both, "m", "n")
    assert report.contended(rows).all()  # m, the reference side, is contended at its latest commit
    t = report.speedup_comparison(both, "m", "n")
    assert t.frame["m"].str.endswith(report.CONTENDED).all() and not t.frame["n"].str.contains(report.CONTENDED).any()


def test_results_without_counters_load_as_before_and_say_so(tmp_path):
    write_run(tmp_path, "m", "a" * 40, 1_790_000_000_000, STEADY, None)
    m = load_results(tmp_path).measured
    assert set(m["contention"]) == {UNKNOWN}
    t = report.paired_table(m)
    assert t.frame["machine state"].tolist() == ["not recorded"]
    assert t.frame["speedup"].iloc[0].startswith(f"{paired.ratio_estimate(STEADY).ratio:.3g}x")


def test_the_dashboard_chart_cross_hatches_a_contended_bar(tree):
    pytest.importorskip("plotly")
    from speedbench.report.charts import ratio_chart  # noqa: PLC0415 - plotly, optional
    s = report.paired(load_results(tree).measured).assign(label="m", case=lambda d: d["commit"].str[:1])
    fig = ratio_chart(s, "case", "label", "t")
    shapes = list(fig.data[0].marker.pattern.shape)
    assert shapes == ["", "", "x"]  # commits a, b (clean, dropped) and c (contended)
    assert list(fig.data[0].text) == ["", "", report.CONTENDED]  # and the mark beside the bar
    assert "cross-hatched" in fig.layout.annotations[0].text


# --- end to end: the same comparison idle and beside one busy loop per core ------------------

BUSY_BENCH = '''
from benchmarks import common


class Busy(common.Paired):
    """Thousands of small operations against one: contention slows the first far more."""

    params = (["w"], ["many", "one"])
    param_names = ["workload", "variant"]
    baseline = "many"
    pairs, warmup, number = 12, 1, 4

    def setup_cache(self):
        return self.measure_all()

    def steps(self, workload):
        import torch

        x = torch.ones(1 << 18)
        ys = [torch.ones(256) for _ in range(2000)]

        def many():
            for y in ys:
                y.mul_(1.0001)

        return torch.device("cpu"), {"many": many, "one": lambda: x.mul_(1.0001)}
'''


@pytest.mark.slow
def test_a_run_beside_busy_loops_is_marked_contended_and_an_idle_run_is_not(tmp_path):
    """The busy half always holds. The idle run is only as idle as the host: on a shared one
    speedlib rightly marks it contended, so its half is asserted only where the pre-flight
    check finds the host quiet before and after it, and skipped with what the check saw."""
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_project(repo)
    (repo / "benchmarks" / "bench_busy.py").write_text(BUSY_BENCH)
    commit_all(repo, "busy")

    def measure(results: str) -> subprocess.CompletedProcess:
        out = run_cli("run", "--bench", r"^bench_busy\.", "--results-dir", results, cwd=repo, home=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
        return out

    def others_seen() -> str | None:
        """What the pre-flight check found busy on the host now, None where it is quiet."""
        found = preflight.check()
        return found.busy_line() if found.busy else None

    seen = {"before": others_seen()}
    said = {"idle": measure("idle").stdout}
    seen["after"] = others_seen()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        said["busy"] = measure("busy").stdout
    finally:
        for p in spinners:
            p.kill()
            p.wait()

    host_busy = [f"{when} the idle run: {what}" for when, what in seen.items() if what]
    for name, contended in (("busy", True),) + (() if host_busy else (("idle", False),)):
        results = repo / name
        # the run says so as it ends, and the environment record keeps the summary
        assert ("1 of 1 measurements contended (bench_busy.Busy('w'))" in said[name]) == contended, said[name]
        (record_file,) = results.glob("*/environment/*.jsonl")
        summary = json.loads(record_file.read_text().splitlines()[-1])["interference"]
        assert summary["rounds"] == 12 and len(summary["contended"]) == int(contended)
        # the result file: one counter per round beside the rounds' ratios
        (file,) = [f for f in results.glob("*/*.json") if f.name != "machine.json"]
        data = json.loads(file.read_text())
        # strict=False: asv's format drops a row's trailing nulls, so a row may be shorter than the columns
        record = dict(zip(data["result_columns"], data["results"]["bench_busy.Busy.track_interference"], strict=False))
        others = record["samples"][1]
        limit = contention.others_limit(os.cpu_count())  # one torch thread per CPU
        assert len(others) == 12 and (min(others) > limit) == contended, others
        # the loader's verdict, the report's mark and the CSV's column
        m = load_results(results).measured
        state = m.loc[m["benchmark"] == "bench_busy.Busy.track_speedup", "contention"].dropna().iloc[0]
        assert (state == CONTENDED) == contended and state != UNKNOWN
        md = run_cli("report", "--results", name, "--table", "paired", cwd=repo, home=tmp_path)
        assert md.returncode == 0 and (report.CONTENDED in md.stdout) == contended, md.stdout
        csv = run_cli("report", "--results", name, "--table", "paired", "--format", "csv", cwd=repo, home=tmp_path)
        table = pd.read_csv(io.StringIO(csv.stdout))
        assert table["contended"].tolist() == [contended]
    if host_busy:
        pytest.skip("the busy run was marked contended; the idle run's half is not asserted: the pre-flight "
                    f"check found the host busy {'; '.join(host_busy)}")


def test_the_table_after_a_run_marks_contended_rows(tree, capsys):
    suite._print_table(tree, "m", ["c" * 40])
    rows = [line for line in capsys.readouterr().out.splitlines() if "track_speedup" in line]
    assert rows and all(line.rstrip().endswith("‡ contended") for line in rows)
    suite._print_table(tree, "m", ["a" * 40])
    assert "contended" not in capsys.readouterr().out


def test_verdicts_are_stored_as_their_words(tree):
    """The verdicts are an enum of strings: frames, CSV exports and environment records hold
    the words ("clean", "contended", ...), as files written before the enum did."""
    assert [str(s) for s in contention.State] == ["clean", "dropped", "contended", "unknown"]
    m = load_results(tree).measured
    assert set(m["contention"]) <= {"clean", "dropped", "contended"} and "contended" in set(m["contention"])
    assert set(pd.read_csv(io.StringIO(m[["contention"]].to_csv(index=False)))["contention"]) == set(m["contention"])
    said = json.dumps(contention.summary({"a": {"others_cpu": [90.0] * 9}}, 2))
    assert '"verdicts": {"contended": 1}' in said and '"contended": ["a"]' in said
