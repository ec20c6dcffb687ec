"""What a `speedlib run` records about the machine its figures were measured on (issue 42):
the interference counters of every figure whatever --bench names, the pre-flight check's
"busy at start", and samples the loader cannot use, said rather than dropped.

asv stands in as `suite._asv`: it "measures" what the --bench regexes select of a small
listing, with counters the test chooses, so no verdict depends on how busy this machine is.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from pathlib import Path

from speedbench.measure import preflight
from speedbench.results.listing import combinations
from speedbench.results.load import load_results
from speedbench.run import plan, suite
from speedbench.stats import contention

ROOT = Path(__file__).resolve().parents[3]
CLASS = "bench_contiguous.AdamStep"
PARAMS = [["'mlp'"], ["'forloop'", "'speedlib'"]]
UNITS = {"track_seconds": "seconds", "track_speedup": "x", "track_interference": "% of CPU time to other processes",
         "track_preemptions": "preemptions/s"}
COLUMNS = ["result", "params", "version", "started_at", "duration", "samples"]
ROUNDS = 10
NARROW = rf"^{re.escape(CLASS)}\.track_speedup"  # the selection: one method of the class
ENV = {"cpu_cores": 2, "torch_threads": 2, "cpu_model": "test CPU", "torch": "2.14.1"}
QUIET, BUSY = [1.0] * ROUNDS, [60.0] * ROUNDS  # % of a 2-CPU machine to others: 0.02 and 1.2 CPUs


def _listing(results: Path) -> None:
    results.mkdir(parents=True, exist_ok=True)
    listing = {f"{CLASS}.{m}": {"name": f"{CLASS}.{m}", "type": "track", "unit": u, "version": "v1",
                                "param_names": ["workload", "variant"], "params": PARAMS} for m, u in UNITS.items()}
    (results / "benchmarks.json").write_text(json.dumps({"version": 2, **listing}))


def _samples(method: str, variant: str, others: list[float]) -> list[float] | None:
    if method == "track_interference":
        return others
    if method == "track_preemptions":
        return [20.0] * ROUNDS
    if method == "track_seconds":
        return [0.04 if variant == "'forloop'" else 0.01] * ROUNDS
    return None if variant == "'forloop'" else [4.0] * ROUNDS  # track_speedup: the baseline's is no ratio


def _asv_measuring(results: Path, others: list[float], asked: list[list[str]]):
    """`suite._asv` for `asv run`: every combination its --bench regexes select of the listing,
    written as asv writes a commit's results, with `others` as each round's share to others."""
    def asv(args, *, env=None, cwd=None, failures_ok=False):
        if args[0] != "run":
            return 0
        regexes = [args[i + 1] for i, a in enumerate(args) if a == "--bench"]
        asked.append(regexes)
        machine, sha = args[args.index("--machine") + 1], args[args.index("--set-commit-hash") + 1]
        entries = {}
        for method in UNITS:
            name = f"{CLASS}.{method}"
            combos = list(itertools.product(*PARAMS))
            picked = [any(re.search(r, f"{name}({', '.join(c)})") for r in regexes) for c in combos]
            if not any(picked):
                continue
            samples = [_samples(method, c[-1], others) if p else None for c, p in zip(combos, picked, strict=True)]
            values = [sorted(s)[len(s) // 2] if s else float("nan") for s in samples]
            entries[name] = [values, PARAMS, "v1", int(time.time() * 1000), 1.0, samples]
        mdir = results / machine
        mdir.mkdir(parents=True, exist_ok=True)
        (mdir / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))
        (mdir / f"{sha[:8]}-existing-py.json").write_text(json.dumps(
            {"commit_hash": sha, "env_name": "existing-py", "result_columns": COLUMNS, "results": entries,
             "version": 2}))
        return 0
    return asv


def _run_commit(tmp_path: Path, monkeypatch, others: list[float], bench: list[str], env: dict | None = None):
    """One commit of a run selecting `bench`, measured with `others`; the regexes asv was given."""
    from speedbench.measure import hardware  # noqa: PLC0415 - torch: only the tests that run a commit need it

    results, asked = tmp_path / "results", []
    _listing(results)
    monkeypatch.setattr(suite, "_asv", _asv_measuring(results, others, asked))
    monkeypatch.setattr(hardware, "gpu_state", lambda: [])
    head = suite.resolve_commits(ROOT, None)[0]
    suite._run_commit(suite.RunOptions(bench=bench), ROOT, tmp_path / "asv.conf.json", results, "m",
                      {**ENV, **(env or {})}, [], head, "[1/1]", bench)
    return results, asked[0]


def _figure(results: Path):
    """The issue's figure: speedlib against the for-loop, as the loader gives it."""
    m = load_results(results).measured
    (row,) = m[(m["metric"] == "speedup") & (m["variant"] == "speedlib")].itertuples()
    return row


def test_a_selection_of_one_method_still_records_its_figures_counters(tmp_path, monkeypatch, capsys):
    """`--bench '^bench_contiguous\\.AdamStep\\.track_speedup'` beside busy loops recorded "no interference
    counters were recorded", and the figure was unmarked: the counters' own methods were not selected."""
    results, asked = _run_commit(tmp_path, monkeypatch, BUSY, [NARROW])
    out = capsys.readouterr().out
    assert "no interference counters were recorded" not in out
    assert f"{contention.MARK} 1 of 1 measurements contended" in out
    assert asked[0] == NARROW and any("track_interference" in r for r in asked[1:])
    row = _figure(results)
    assert row.contention == contention.CONTENDED and row.contention_note.startswith("contended: 10 of 10 rounds")


def test_the_counters_added_are_those_of_the_combinations_selected(tmp_path):
    _listing(tmp_path)
    names = combinations(tmp_path / "benchmarks.json")
    one = rf"^{re.escape(CLASS)}\.track_speedup\('mlp', 'speedlib'\)"
    combo = re.escape("('mlp', 'speedlib')")
    assert plan.with_counters([one], names) == [one, *(rf"^{re.escape(CLASS)}\.{m}(?:{combo})$"
                                                       for m in ("track_interference", "track_preemptions"))]
    assert plan.with_counters([rf"^{re.escape(CLASS)}\."], names) == [rf"^{re.escape(CLASS)}\."]  # all selected
    assert plan.with_counters([], names) == []  # no --bench: everything, counters too
    assert plan.with_counters([r"^other\."], names) == [r"^other\."]


def test_a_class_the_listing_did_not_name_is_said_to_have_no_counters(tmp_path, monkeypatch, capsys):
    """A class added since the listing was written cannot have its counters selected: the run says so."""
    results, asked = tmp_path / "results", []
    _listing(results)
    listing = json.loads((results / "benchmarks.json").read_text())
    (results / "benchmarks.json").write_text(json.dumps({"version": 2}))  # asv lists the class only as it starts
    measure = _asv_measuring(results, QUIET, asked)

    def asv(args, **kwargs):
        (results / "benchmarks.json").write_text(json.dumps(listing))
        return measure(args, **kwargs)

    from speedbench.measure import hardware  # noqa: PLC0415 - torch: only the tests that run a commit need it

    monkeypatch.setattr(suite, "_asv", asv)
    monkeypatch.setattr(hardware, "gpu_state", lambda: [])
    monkeypatch.setattr(plan, "benchmark_listing", lambda root, results_dir: results / "benchmarks.json")
    head = suite.resolve_commits(ROOT, None)[0]
    suite._run_commit(suite.RunOptions(bench=[NARROW]), ROOT, tmp_path / "c.json", results, "m", ENV, [], head,
                      "[1/1]", [NARROW])
    assert asked == [[NARROW]]
    out = capsys.readouterr().out
    assert "their interference counters were not selected with them" in out and "run again" in out


def test_a_run_that_started_busy_has_its_figures_marked_whatever_its_rounds_say(tmp_path, monkeypatch):
    """The pre-flight verdict is stored with the run (its environment records) and marks its
    figures, even where every round's counters came out quiet."""
    busy = "other processes used 95 % of the machine's 2 CPU(s) over 1.0 s (python3 95 %)"
    results, _ = _run_commit(tmp_path, monkeypatch, QUIET, [NARROW], {"busy_at_start": busy})
    row = _figure(results)
    assert row.contention == contention.CONTENDED
    assert row.contention_note == f"contended: the machine was busy as the run started ({busy})"
    quiet, _ = _run_commit(tmp_path / "quiet", monkeypatch, QUIET, [NARROW], {"busy_at_start": ""})
    assert _figure(quiet).contention == contention.CLEAN


def test_the_run_stores_the_pre_flight_verdict_in_every_commits_record(tmp_path, monkeypatch, capsys):
    from speedbench.measure import hardware  # noqa: PLC0415 - torch: only the tests that run a commit need it

    busy = preflight.Finding("busy", "bad", "other processes used 90 % of the machine's 2 CPU(s) over 1.0 s",
                             "stop them", True)
    monkeypatch.setattr(preflight, "check", lambda: preflight.Report([busy]))
    monkeypatch.setattr(hardware, "identity", lambda: {"machine": "m"})
    monkeypatch.setattr(hardware, "environment", lambda: {**ENV, "machine": "m", "os": "Linux", "cpu_model": "x"})
    monkeypatch.setattr(suite, "_check_machine", lambda *a: None)
    monkeypatch.setattr(suite, "_register_machine", lambda *a: None)
    monkeypatch.setattr(suite, "_print_table", lambda *a, **k: None)
    envs = []
    monkeypatch.setattr(suite, "_run_commit", lambda options, root, conf, results, machine, env, *a: envs.append(env)
                        or [])
    head = suite.resolve_commits(ROOT, None)[0]
    suite._run(suite.RunOptions(results_dir=tmp_path), ROOT, [], [head, head], [(None, [])])
    assert [e["busy_at_start"] for e in envs] == [busy.what] * 2
    assert all(e["preflight"]["busy"] for e in envs)
    assert f"every figure of this run is marked {contention.MARK} contended" in capsys.readouterr().out


def test_samples_the_loader_cannot_use_are_said_not_dropped(tmp_path, monkeypatch, capsys):
    """A figure whose stored samples held a NaN lost them (no per-round estimate, no interval, no
    verdict) without a word: `speedlib run`'s table and `speedlib report` now name it."""
    results, _ = _run_commit(tmp_path, monkeypatch, QUIET, [NARROW])
    path = next((results / "m").glob("*-existing-py.json"))
    data = json.loads(path.read_text())
    data["results"][f"{CLASS}.track_speedup"][-1][1][3] = float("nan")  # one round of speedlib's ratios
    path.write_text(json.dumps(data))
    loaded = load_results(results)
    (problem,) = [p for p in loaded.problems if "samples" in str(p)]
    assert "1 benchmark(s) whose samples are not all finite numbers" in str(problem)
    assert f"{CLASS}.track_speedup" in str(problem) and not problem.expected
    capsys.readouterr()
    suite._print_table(results, "m")
    assert "whose samples are not all finite numbers" in capsys.readouterr().out
