"""speedbench.results.load: every asv result file -> one tidy frame; bad files skipped and reported."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from pathlib import Path

import pytest

from speedbench.results import load as results_load
from speedbench.results import synthetic
from speedbench.results.common import _is_number, _to_float
from speedbench.results.load import COLUMNS, format_table, load_results, metric_kind

ROOT = Path(__file__).resolve().parents[3]
TIME = "bench_contiguous.OptimizerStep.time_adam_step"


@pytest.fixture
def tree(tmp_path) -> Path:
    synthetic.write_results(tmp_path, commits=2, machines=2)
    return tmp_path


def first_result(tree: Path) -> Path:
    return sorted((tree / "synthetic-h100").glob("*-existing-*.json"))[0]


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def snapshot(tree: Path) -> dict:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in tree.rglob("*") if p.is_file()}


def test_tidy_frame_has_one_row_per_parameter_set(tree):
    loaded = load_results(tree)
    assert loaded.problems == []
    df = loaded.measured
    assert set(COLUMNS) <= set(df.columns)
    # 2 machines x 2 commits x 3 benchmarks x (2 workloads x 3 variants)
    assert len(df) == 2 * 2 * 3 * 6 and loaded.not_measured.empty
    row = df[(df["benchmark"] == TIME) & (df["workload"] == "mlp") & (df["variant"] == "fused")].iloc[0]
    assert row["technique"] == "contiguous" and row["suite"] == "OptimizerStep" and row["metric"] == "adam_step"
    assert row["kind"] == "time" and row["unit"] == "seconds" and row["params"] == "workload=mlp, variant=fused"
    assert row["n"] == 10 and len(row["samples"]) == 10
    assert row["iqr"] == pytest.approx(row["q75"] - row["q25"])
    assert row["ci99_low"] <= row["value"] <= row["ci99_high"]
    assert row["gpu"].startswith("NVIDIA H100") and row["torch"] == "2.11.0+cu128" and row["driver"] == "550.54.15"
    assert re.fullmatch(r"[0-9a-f]{12}", row["result_id"]) and row["commit_date"].year == 2026
    assert df["result_id"].is_unique  # each ID names one measured result
    track = df[df["kind"] == "memory"].iloc[0]
    assert track["n"] == 1 and math.isnan(track["ci99_low"])


def test_result_ids_survive_asv_rewriting_the_file(tree):
    """A later run adds a benchmark to the commit's file (asv rewrites it): the results that
    were there keep their IDs."""
    path = first_result(tree)
    full = json.loads(path.read_text())
    edit(path, lambda d: d["results"].pop(TIME))  # the first run: time_adam_step not yet measured
    before = load_results(tree).measured
    before = before[before["file"] == str(path)].set_index(["benchmark", "params"])["result_id"]
    path.write_text(json.dumps(full, indent=1))  # rewritten with the benchmark added, laid out anew
    after = load_results(tree).measured
    after = after[after["file"] == str(path)].set_index(["benchmark", "params"])["result_id"]
    assert len(before) == 12 and len(after) == 18
    assert after[before.index].equals(before)


def test_a_rerun_of_the_same_result_gets_a_new_id(tree):
    path = first_result(tree)
    ids = load_results(tree).measured.set_index(["file", "benchmark", "params"])["result_id"]
    edit(path, lambda d: d["results"][TIME].__setitem__(3, d["results"][TIME][3] + 1))  # started 1 ms later
    again = load_results(tree).measured.set_index(["file", "benchmark", "params"])["result_id"]
    moved = again.index.get_level_values("benchmark") == TIME
    moved &= again.index.get_level_values("file") == str(path)
    assert (again[moved] != ids[again.index[moved]]).all() and moved.sum() == 6
    assert again[~moved].equals(ids[again.index[~moved]])


def test_metric_kinds():
    assert metric_kind("time", "seconds") == "time"
    assert metric_kind("track", "bytes") == "memory"
    assert metric_kind("track", "GB/s") == "bandwidth"
    assert metric_kind("track", "samples/s") == "throughput"
    assert metric_kind("track", "% of memory bandwidth") == "fraction of floor"


def test_committed_results_load(tmp_path):
    loaded = load_results(ROOT / "results")
    df = loaded.measured
    assert not df.empty and set(df["machine"]) >= {"cpu-2core-intel-xeon", "cpu-2core-amd-epyc"}
    assert set(df["technique"]) >= {"contiguous"} and df["torch"].notna().all()
    # peak GPU memory is skipped on a CPU machine, kept apart from the measured rows (older
    # runs' rows of since-rewritten benchmarks are set aside as outdated, not as skipped)
    skipped = loaded.not_measured
    memory = skipped[(skipped["metric"] == "peak_memory") & (skipped["status"] != "outdated")]
    assert not memory.empty and (memory["status"] == "skipped").all()
    cpus = {"cpu-2core-intel-xeon", "cpu-2core-amd-epyc"}
    assert set(memory["machine"]) == cpus | {"h200-141gb"}
    # on a GPU only what cannot run is skipped: channels_last needs 4-D activations, a transformer has 3-D
    on_gpu = memory[~memory["machine"].isin(cpus)]
    assert (on_gpu["workload"] == "transformer").all() and on_gpu["variant"].str.endswith("_channels_last").all()


def test_loader_never_writes(tree):
    first_result(tree).write_text("{ truncated")
    before = snapshot(tree)
    load_results(tree)
    assert snapshot(tree) == before


def test_truncated_json_is_skipped_and_reported(tree):
    bad = first_result(tree)
    bad.write_text(bad.read_text()[:500])
    loaded = load_results(tree)
    assert [p.path for p in loaded.problems] == [str(bad)]
    assert "not valid JSON" in loaded.problems[0].reason
    assert str(bad) not in set(loaded.measured["file"])
    assert len(loaded.measured) == 4 * 18 - 18  # one file of 18 rows gone, the other three intact


@pytest.mark.parametrize("change, reason", [
    (lambda d: d.update(results=[1, 2]), "'results' missing or not a dict"),
    (lambda d: d.update(version=1), "format version 1"),
    (lambda d: d.update(result_columns=[["result"], "params"]), "'result_columns' is not a list of strings"),
    (lambda d: d.update(date=1e20), "'date' 1e+20 is out of the range of dates"),
])
def test_wrong_file_layout_skips_the_file(tree, change, reason):
    bad = first_result(tree)
    edit(bad, change)
    loaded = load_results(tree)
    assert len(loaded.problems) == 1 and loaded.problems[0].path == str(bad)
    assert reason in loaded.problems[0].reason
    assert str(bad) not in set(loaded.measured["file"])


@pytest.mark.parametrize("change, reason", [
    (lambda e: e.__setitem__(0, "fast"), "neither a number nor null"),
    (lambda e: e.__setitem__(0, [1.0, 2.0]), "2 results for 6 parameter sets"),
    (lambda e: e.__setitem__(1, "mlp"), "'params' is not a list"),
    (lambda e: e.__setitem__(5, {"a": 1}), "'stats_ci_99_a' is not a list"),
    (lambda e: e.__setitem__(10, [float("inf")] * 6), "'stats_repeat' holds an infinite or overflowing number"),
    (lambda e: e.__setitem__(3, 1e30), "'started_at' 1e+30 is out of the range of dates"),
    (lambda e: e.__setitem__(2, 7), "'version' is not a string"),
])
def test_wrong_types_skip_the_entry_and_keep_the_rest_of_the_file(tree, change, reason):
    bad = first_result(tree)
    edit(bad, lambda d: change(d["results"][TIME]))
    loaded = load_results(tree)
    assert len(loaded.problems) == 1 and loaded.problems[0].path == str(bad)
    assert reason in loaded.problems[0].reason and TIME in loaded.problems[0].reason
    mine = loaded.measured[loaded.measured["file"] == str(bad)]
    assert len(mine) == 12 and TIME not in set(mine["benchmark"])  # the two other benchmarks' rows
    assert len(loaded.measured) == 72 - 6


@pytest.mark.parametrize("value", [float("inf"), 0.0, -0.001, 10**400])
def test_impossible_timings_are_not_measured(tree, value):
    bad = first_result(tree)
    edit(bad, lambda d: d["results"][TIME][0].__setitem__(2, value))
    loaded = load_results(tree)
    invalid = loaded.not_measured[loaded.not_measured["status"] == "invalid"]
    assert len(invalid) == 1 and invalid.iloc[0]["params"] == "workload=mlp, variant=speedlib"
    assert len(loaded.measured) == 71
    assert [p.path for p in loaded.problems] == [str(bad)] and "set aside as not measured" in loaded.problems[0].reason


def test_an_infinite_interval_is_kept_as_asv_writes_it(tree):
    """asv's --quick runs have one sample: their 99 % interval is (-Infinity, Infinity)."""
    bad = first_result(tree)
    edit(bad, lambda d: (d["results"][TIME].__setitem__(5, [float("-inf")] * 6),
                         d["results"][TIME].__setitem__(6, [float("inf")] * 6)))
    loaded = load_results(tree)
    assert loaded.problems == [] and len(loaded.measured) == 72
    mine = loaded.measured[(loaded.measured["file"] == str(bad)) & (loaded.measured["benchmark"] == TIME)]
    assert (mine["ci99_low"] == float("-inf")).all() and (mine["ci99_high"] == float("inf")).all()


def test_a_parameter_named_like_a_column_does_not_overwrite_it(tree):
    edit(tree / "benchmarks.json", lambda d: d[TIME].__setitem__("param_names", ["machine", "variant"]))
    loaded = load_results(tree)
    mine = loaded.measured[loaded.measured["benchmark"] == TIME]
    assert set(mine["machine"]) == {"synthetic-h100", "synthetic-h200"}
    assert set(mine["param_machine"]) == {"mlp", "resnet50"} and "machine=mlp, variant=fused" in set(mine["params"])
    assert any("param_<name>" in p.reason and "machine" in p.reason for p in loaded.problems)


def test_a_wrong_entry_in_benchmarks_json_skips_only_its_results(tree):
    edit(tree / "benchmarks.json", lambda d: d[TIME].__setitem__("unit", 5))
    loaded = load_results(tree)
    assert len(loaded.measured) == 72 - 4 * 6 and TIME not in set(loaded.measured["benchmark"])
    assert any(p.path == str(tree / "benchmarks.json") and "'unit' is 5, not a string" in p.reason
               for p in loaded.problems)


def test_top_level_not_an_object(tree):
    bad = first_result(tree)
    bad.write_text("[1, 2, 3]")
    assert "top level is list" in load_results(tree).problems[0].reason


def test_unknown_benchmark_is_skipped_the_rest_of_the_file_kept(tree):
    bad = first_result(tree)
    edit(bad, lambda d: d["results"].__setitem__("bench_gone.Old.time_x", d["results"][TIME]))
    loaded = load_results(tree)
    assert len(loaded.problems) == 1 and "bench_gone.Old.time_x" in loaded.problems[0].reason
    assert "not in benchmarks.json" in loaded.problems[0].reason
    assert (loaded.measured["file"] == str(bad)).sum() == 18


def test_missing_benchmarks_json(tree):
    (tree / "benchmarks.json").unlink()
    loaded = load_results(tree)
    assert loaded.measured.empty and set(COLUMNS) <= set(loaded.measured.columns)
    assert "benchmarks.json" in loaded.problems[0].path and "missing" in loaded.problems[0].reason


def test_unreadable_benchmarks_json(tree):
    (tree / "benchmarks.json").write_text("{")
    loaded = load_results(tree)
    assert loaded.measured.empty and "unreadable" in loaded.problems[0].reason


def test_nan_and_null_results_are_kept_apart(tree):
    bad = first_result(tree)

    def change(d):
        d["results"][TIME][0][0] = float("nan")  # json writes NaN, as asv does for a skip
        d["results"][TIME][0][1] = None
    edit(bad, change)
    loaded = load_results(tree)
    assert loaded.problems == []
    apart = loaded.not_measured.set_index("params")["status"].to_dict()
    assert apart == {"workload=mlp, variant=forloop": "skipped", "workload=mlp, variant=fused": "failed"}
    assert loaded.measured["value"].notna().all() and len(loaded.measured) == 72 - 2


def test_whole_benchmark_failed(tree):
    edit(first_result(tree), lambda d: d["results"][TIME].__setitem__(0, None))
    loaded = load_results(tree)
    assert (loaded.not_measured["status"] == "failed").sum() == 6


def test_older_benchmark_version_is_set_aside(tree):
    bad = first_result(tree)
    edit(bad, lambda d: d["results"][TIME].__setitem__(2, "0" * 64))
    loaded = load_results(tree)
    assert "older version" in loaded.problems[0].reason and TIME in loaded.problems[0].reason
    outdated = loaded.not_measured
    assert len(outdated) == 6 and (outdated["status"] == "outdated").all() and outdated["value"].notna().all()
    assert not ((loaded.measured["file"] == str(bad)) & (loaded.measured["benchmark"] == TIME)).any()


def _version_of(path: Path, version: str, started_ms: int) -> None:
    def change(d):
        d["results"][TIME][2] = version
        d["results"][TIME][3] = started_ms  # started_at: which run came last
    edit(path, change)


def test_a_machine_keeps_its_newest_earlier_version_until_it_measures_the_current_one(tree):
    """A GPU measured once, then the benchmark's code changed: its numbers stay, flagged, and
    only the version it measured last (one version per machine, so no history mixes them)."""
    newer, older = sorted((tree / "synthetic-h100").glob("*-existing-*.json"))
    _version_of(older, "1" * 64, 1_780_000_000_000)
    _version_of(newer, "2" * 64, 1_790_000_000_000)
    loaded = load_results(tree)
    h100 = loaded.measured[(loaded.measured["machine"] == "synthetic-h100") & (loaded.measured["benchmark"] == TIME)]
    assert len(h100) == 6 and set(h100["file"]) == {str(newer)} and h100["earlier_version"].all()
    apart = loaded.not_measured
    assert set(apart["file"]) == {str(older)} and (apart["status"] == "outdated").all() and len(apart) == 6
    # the other machine measured the current version: nothing of it is flagged
    assert not loaded.measured.loc[loaded.measured["machine"] != "synthetic-h100", "earlier_version"].any()
    reasons = {Path(p.path).name: p.reason for p in loaded.problems}
    assert "set aside" in reasons[older.name] and "kept, the newest this machine has" in reasons[newer.name]
    assert all(p.expected for p in loaded.problems)


def test_not_a_machine_directory(tree):
    stray = tree / "stray"
    stray.mkdir()
    (stray / "x.json").write_text("{}")
    loaded = load_results(tree)
    assert [p.path for p in loaded.problems] == [str(stray)] and len(loaded.measured) == 72


def test_missing_directory_and_empty_directory(tmp_path):
    assert "no results directory" in load_results(tmp_path / "nope").problems[0].reason
    loaded = load_results(tmp_path)
    assert loaded.measured.empty and loaded.not_measured.empty


def test_environment_record_of_the_run_that_produced_the_result(tree):
    """A rerun appends a second record; each result gets the record written after it started."""
    result = first_result(tree)
    sha = json.loads(result.read_text())["commit_hash"]
    env_file = tree / "synthetic-h100" / "environment" / f"{sha[:8]}.jsonl"
    first = json.loads(env_file.read_text())
    later = {**first, "recorded_at": "2030-01-01T00:00:00+00:00", "torch": "9.9.9", "driver": "999.1"}
    with env_file.open("a") as f:
        f.write(json.dumps(later) + "\n")
    df = load_results(tree).measured
    assert set(df[df["file"] == str(result)]["torch"]) == {"2.11.0+cu128"}  # not the later run's
    edit(result, lambda d: d["results"][TIME].__setitem__(3, 1_893_456_000_000 + 1))  # started in 2030
    df = load_results(tree).measured
    mine = df[df["file"] == str(result)]
    assert set(mine[mine["benchmark"] == TIME]["torch"]) == {"9.9.9"}
    assert set(mine[mine["benchmark"] != TIME]["torch"]) == {"2.11.0+cu128"}


def test_missing_or_bad_environment_record(tree):
    env_dir = tree / "synthetic-h100" / "environment"
    files = sorted(env_dir.glob("*.jsonl"))
    files[0].unlink()
    files[1].write_text("not json\n" + files[1].read_text())
    loaded = load_results(tree)
    reasons = [p.reason for p in loaded.problems]
    assert any("no environment record" in r for r in reasons)
    assert any("environment record skipped" in r for r in reasons)
    assert (loaded.measured["gpu"] == "unknown").sum() == 18


def test_environment_lines_stand_alone(tree):
    """Invalid UTF-8, a time without a timezone and a GPU name that is not text are each
    reported; the rest of the record and the other lines are kept."""
    result = first_result(tree)
    sha = json.loads(result.read_text())["commit_hash"]
    env_file = tree / "synthetic-h100" / "environment" / f"{sha[:8]}.jsonl"
    good = json.loads(env_file.read_text())
    naive = {**good, "recorded_at": "2030-01-01T00:00:00", "gpu_model": 5, "torch": "9.9.9"}
    env_file.write_bytes(b"\xff\xfe{not utf-8}\n" + env_file.read_bytes() + json.dumps(naive).encode() + b"\n")
    loaded = load_results(tree)
    reasons = {p.path: p.reason for p in loaded.problems}
    assert "not UTF-8 text (invalid start byte at byte 0)" in reasons[f"{env_file}:1"]
    assert "gpu_model, recorded_at" in reasons[f"{env_file}:3"]
    assert len(loaded.measured) == 72
    mine = loaded.measured[loaded.measured["file"] == str(result)]
    assert set(mine["torch"]) == {"9.9.9"} and set(mine["gpu"]) == {"unknown"}  # not "CPU only": the name was unusable
    assert all(isinstance(g, str) for g in loaded.measured["gpu"])


def test_control_characters_in_names_are_escaped_in_the_table_and_problems(tree):
    (tree / "synthetic-h100").rename(tree / "evil\x1b[2J")
    (tree / "evil\x1b[2J" / "x\x07.json").write_text("{")
    loaded = load_results(tree)
    text = format_table(loaded.measured)
    assert "\x1b" not in text and "evil\\x1b[2J" in text
    assert len(loaded.problems) == 1
    assert str(loaded.problems[0]).startswith(f"{tree}/evil\\x1b[2J/x\\x07.json: not valid JSON, truncated? (")


def test_result_ids_hash_exactly_the_json_key_they_always_hashed():
    """An ID names a result for good: the faster key writer must give json.dumps's bytes."""
    def reference(machine, commit, benchmark, params, started_at):
        ok = _is_number(started_at) and math.isfinite(_to_float(started_at))
        key = json.dumps([machine, commit, benchmark, list(params), int(started_at) if ok else None])
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    rng = random.Random(0)

    def text() -> str:
        return "".join(chr(rng.choice([rng.randint(0, 127), rng.randint(0, 0xD7FF), rng.randint(0xD800, 0xDFFF)]))
                       for _ in range(rng.randint(0, 8)))

    cases = [("cpu-2core", "a" * 40, "bench_x.A.track_seconds", ("'mlp'", "1"), 1763880000000),
             ('q"\\\n\u2028', "", "", (), None), ("m", "c", "b", ("x",), float("inf")), ("m", "c", "b", ("x",), True)]
    cases += [(text(), text(), text(), tuple(text() for _ in range(rng.randint(0, 3))),
               rng.choice([None, 0, 1763880000123, 2.5e12, "x", -1])) for _ in range(3000)]
    for case in cases:
        assert results_load.result_id(*case) == reference(*case), case
