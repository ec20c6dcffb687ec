"""Hand-set benchmark versions (issue 50): each benchmark's fingerprint of the code it measures
(speedbench.run.fingerprint), the ledger that holds them (benchmarks/versions.json,
speedbench.run.ledger), `speedlib versions`, and the recovery of results set aside by asv's
hashed versions (speedbench.run.recover)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from project_bits import ROOT, commit_all, git

from speedbench.run import fingerprint as fp
from speedbench.run import ledger, recover

# --- the project's own benchmarks ---------------------------------------------------------


def test_every_benchmark_measures_what_its_version_was_recorded_with():
    findings = ledger.check(ROOT)
    assert len(findings) >= 30, "the check found too few benchmark classes"
    assert all(f.ok for f in findings), ledger.describe(findings)


def test_asv_reads_the_ledger_versions_and_the_committed_listing_holds_them():
    """What asv itself discovers at this checkout (its version for every benchmark) is the
    ledger's, and results/benchmarks.json, which decides what is current, says the same."""
    found = recover._discover_tree(ROOT)
    book = ledger.load(ROOT)["benchmarks"]
    assert found, "asv discovered no benchmark"
    wrong = {name: v for name, v in found.items() if book[name.rsplit(".", 1)[0]]["version"] != v}
    assert not wrong, f"asv versions differ from the ledger: {sorted(wrong)[:5]}"
    listing = json.loads((ROOT / "results" / "benchmarks.json").read_text(encoding="utf-8"))
    stale = [name for name in found if listing.get(name, {}).get("version") != found[name]]
    assert not stale, f"the committed listing holds other versions for {stale[:5]}"


# --- a small tree of our own ---------------------------------------------------------------

COMMON = '''
"""The shared base."""
import itertools

class Measured:
    params = []

    def measure_all(self):
        combos = itertools.product(*self.params) if self.params else [()]
        return {c: self.measure_one(*c) for c in combos}
'''

WORKLOADS = '''
"""Workloads."""
def _build(width):
    return [width] * 2

def get(name):
    return WORKLOADS[name]()

def small():
    return _build(4)

WORKLOADS = {"small": small}
EXTRA = (1,)
'''

BENCH = '''
"""A toy benchmark."""
from benchmarks import common

SIZES = [1, 2]

class Toy(common.Measured):
    """Times nothing much."""

    version = "1"
    params = (SIZES,)

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, size: int):
        from speedbench.measure import workloads
        import speedlib
        pairs = list(zip(workloads.get("small"), [size] * 2))
        return sum(a * b for a, b in pairs) + speedlib.VALUE + len(getattr(workloads, "EXTRA", ()))

    def track_value(self, cache, size):
        return cache[(size,)]
'''


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


@pytest.fixture
def toy(tmp_path) -> Path:
    _write(tmp_path, {
        "asv.conf.json": '{"version": 1, "benchmark_dir": "benchmarks", "results_dir": "results", "repo": "."}',
        "benchmarks/__init__.py": "", "benchmarks/common.py": COMMON, "benchmarks/bench_toy.py": BENCH,
        "speedbench/__init__.py": "", "speedbench/_api.py": "def lazy(name, api):\n    return [], None\n",
        "speedbench/measure/__init__.py": "from speedbench._api import lazy\n"
                                          "__all__, __getattr__ = lazy(__name__, {'workloads': ('get',)})\n",
        "speedbench/measure/workloads.py": WORKLOADS,
        "speedlib/__init__.py": "VALUE = 1\n",
    })
    return tmp_path


def _digest(root: Path) -> fp.Fingerprint:
    return fp.fingerprint(fp.SourceTree.directory(root), "bench_toy.Toy")


def _edit(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {rel}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def test_the_fingerprint_follows_the_workloads_and_base_classes_it_calls(toy):
    pieces = _digest(toy).pieces
    for label in ("benchmarks.bench_toy.Toy", "benchmarks.bench_toy.SIZES", "benchmarks.common.Measured",
                  "speedbench.measure.workloads.get", "speedbench.measure.workloads.WORKLOADS",
                  "speedbench.measure.workloads.small", "speedbench.measure.workloads._build"):
        assert label in pieces, f"{label} missing from {sorted(pieces)}"
    assert not any(label.startswith("speedlib") for label in pieces), "speedlib is asv's to track, not a version's"


@pytest.mark.parametrize("rel, old, new", [
    ("benchmarks/bench_toy.py", '"""Times nothing much."""', '"""Times nothing much, now documented better."""'),
    ("benchmarks/bench_toy.py", "    def setup_cache(self):", "    # a comment\n    def setup_cache(self):"),
    ("benchmarks/bench_toy.py", "[size] * 2))", "[size] * 2, strict=True))"),
    ("benchmarks/bench_toy.py", "size: int):", "size):"),
    ("benchmarks/bench_toy.py", 'version = "1"', 'version = "7"'),
    ("benchmarks/bench_toy.py", "        return sum(a * b for a, b in pairs) + speedlib.VALUE",
     "        return sum(a * b\n                   for a, b in pairs) + speedlib.VALUE"),
    # an import moved to the module's top: imports are followed, not hashed
    ("benchmarks/bench_toy.py", "from benchmarks import common\n",
     "from benchmarks import common\nfrom speedbench.measure import workloads\n"),
    ("speedbench/measure/workloads.py", "def _build(width):", "def _build(width):\n    # why\n    'doc'"),
    ("speedlib/__init__.py", "VALUE = 1", "VALUE = 2"),
])
def test_what_cannot_change_a_measurement_leaves_the_fingerprint(toy, rel, old, new):
    before = _digest(toy)
    _edit(toy, rel, old, new)
    assert _digest(toy).digest == before.digest


@pytest.mark.parametrize("rel, old, new, named", [
    ("speedbench/measure/workloads.py", "return [width] * 2", "return [width] * 3",
     "changed speedbench.measure.workloads._build"),
    ("benchmarks/bench_toy.py", "SIZES = [1, 2]", "SIZES = [1, 2, 4]", "changed benchmarks.bench_toy.SIZES"),
    ("benchmarks/bench_toy.py", "return cache[(size,)]", "return cache[(size,)] * 2",
     "changed benchmarks.bench_toy.Toy"),
    ("benchmarks/common.py", "{c: self.measure_one(*c)", "{c: self.measure_one(*c) + 0",
     "changed benchmarks.common.Measured"),
    # asked for by getattr with a constant name: followed as an attribute
    ("speedbench/measure/workloads.py", "EXTRA = (1,)", "EXTRA = (1, 2)", "changed speedbench.measure.workloads.EXTRA"),
])
def test_a_change_to_what_is_measured_changes_it_and_is_named(toy, rel, old, new, named):
    before = _digest(toy)
    _edit(toy, rel, old, new)
    after = _digest(toy)
    assert after.digest != before.digest
    assert named in fp.changes(before.pieces, after.pieces)


def test_a_definition_that_moves_keeps_it_and_one_that_moves_and_changes_is_named_where_it_went(toy):
    before = _digest(toy)
    _edit(toy, "speedbench/measure/workloads.py", "def _build(width):\n    return [width] * 2\n",
          "from speedbench.measure.shapes import _build\n")
    _write(toy, {"speedbench/measure/shapes.py": "def _build(width):\n    return [width] * 2\n"})
    moved = _digest(toy)
    assert moved.digest == before.digest
    assert "speedbench.measure.shapes._build" in moved.pieces
    _edit(toy, "speedbench/measure/shapes.py", "* 2", "* 5")
    assert fp.changes(before.pieces, _digest(toy).pieces) == [
        "changed speedbench.measure.shapes._build (was speedbench.measure.workloads._build)"]


# --- the ledger and `speedlib versions` ----------------------------------------------------


def _versions(root: Path, *args: str) -> subprocess.CompletedProcess:
    # -P: the toy tree's own speedbench/ must not shadow the harness under test
    return subprocess.run([sys.executable, "-P", "-m", "speedbench.cli", "versions", *args], cwd=root,
                          capture_output=True, text=True, timeout=300)


def test_a_benchmark_without_a_ledger_entry_or_its_own_version_is_named(toy):
    assert [(f.benchmark, f.ok) for f in ledger.check(toy)] == [("bench_toy.Toy", False)]
    assert "is not in benchmarks/versions.json" in ledger.check(toy)[0].says
    _edit(toy, "benchmarks/bench_toy.py", '    version = "1"\n', "")
    assert "sets no version of its own" in ledger.check(toy)[0].says


def test_speedlib_versions_names_a_changed_measurement_and_records_a_bump_or_the_same(toy):
    out = _versions(toy, "--bump", "--why", "first")
    assert out.returncode == 0, out.stderr
    assert _versions(toy).returncode == 0
    _edit(toy, "speedbench/measure/workloads.py", "return [width] * 2", "return [width] * 3")
    out = _versions(toy)
    assert out.returncode == 1
    assert "bench_toy.Toy measures with other code than version 1" in out.stdout
    assert "changed speedbench.measure.workloads._build" in out.stdout
    assert _versions(toy, "--same").returncode == 2  # no why: refused
    out = _versions(toy, "--same", "bench_toy.Toy", "--why", "a wider list, the same timing")
    assert out.returncode == 0, out.stderr
    assert _versions(toy).returncode == 0
    entry = ledger.load(toy)["benchmarks"]["bench_toy.Toy"]
    assert entry["version"] == "1" and len(entry["versions"]["1"]["fingerprints"]) == 2
    _edit(toy, "benchmarks/bench_toy.py", "SIZES = [1, 2]", "SIZES = [1, 2, 8]")
    out = _versions(toy, "--bump", "bench_toy.Toy", "--why", "a third size")
    assert out.returncode == 0, out.stderr
    assert 'version = "2"' in (toy / "benchmarks" / "bench_toy.py").read_text(encoding="utf-8")
    assert ledger.load(toy)["benchmarks"]["bench_toy.Toy"]["versions"]["2"]["why"] == "a third size"
    assert _versions(toy).returncode == 0
    assert _versions(toy, "--bump", "bench_toy.Nope", "--why", "x").returncode == 2


def test_a_new_benchmark_class_is_recorded_with_a_version_written_into_it(toy):
    _write(toy, {"benchmarks/bench_more.py": "from benchmarks import common\n\n\nclass More(common.Measured):\n"
                                             '    """New."""\n\n    def track_x(self, cache):\n        return 1\n'})
    assert _versions(toy, "--bump", "--why", "new").returncode == 0
    text = (toy / "benchmarks" / "bench_more.py").read_text(encoding="utf-8")
    assert '    """New."""\n\n    version = "1"' in text
    assert all(f.ok for f in ledger.check(toy))


# --- recovering results of hashed versions ---------------------------------------------------


def _result_file(machine_dir: Path, sha: str, versions: dict[str, str], started_ms: int) -> Path:
    machine_dir.mkdir(parents=True, exist_ok=True)
    (machine_dir / "machine.json").write_text('{"machine": "m", "version": 1}')
    doc = {"commit_hash": sha, "env_name": "existing-py", "date": started_ms, "params": {"machine": "m"},
           "python": "3", "requirements": {}, "env_vars": {},
           "result_columns": ["result", "params", "version", "started_at", "duration"],
           "results": {name: [[1.0, 2.0], [["1", "2"]], v, started_ms, 1.0] for name, v in versions.items()},
           "durations": {}, "version": 2}
    path = machine_dir / f"{sha[:8]}-existing-py.json"
    path.write_text(json.dumps(doc))
    return path


def test_results_of_a_hashed_version_come_back_where_their_code_is_accepted(toy):
    """A result measured before versions were set by hand carries asv's hash of the source;
    where the ledger accepts the code that produced it, it gets the hand-set version. Code that
    differs from a version's only in a comment is that version's; code that measures otherwise
    stays aside until judged the same (--same --at), and a hash no commit gives stays aside."""
    _edit(toy, "benchmarks/bench_toy.py", '    version = "1"\n', "")
    _edit(toy, "speedbench/measure/workloads.py", "return [width] * 2", "return [width] * 3")
    git(toy, "init", "-q", "-b", "main")
    commit_all(toy, "hashed versions, another workload")
    old = git(toy, "rev-parse", "HEAD")
    hashed = recover._discover_tree(toy)["bench_toy.Toy.track_value"]
    assert len(hashed) == 64, "asv's own hash of the source"
    _edit(toy, "speedbench/measure/workloads.py", "return [width] * 3", "return [width] * 2")
    _edit(toy, "benchmarks/bench_toy.py", "return cache[(size,)]", "return cache[(size,)]  # measured in setup_cache")
    commit_all(toy, "the workload of today, and a comment")
    moved = git(toy, "rev-parse", "HEAD")
    rehashed = recover._discover_tree(toy)["bench_toy.Toy.track_value"]
    assert rehashed != hashed, "asv's hash follows the text"
    assert _versions(toy, "--bump", "--why", "hand-set").returncode == 0
    commit_all(toy, "hand-set versions")
    results = toy / "results"
    now_ms = int(git(toy, "log", "-1", "--format=%ct")) * 1000 + 1000
    kept = _result_file(results / "m", old, {"bench_toy.Toy.track_value": hashed}, now_ms)
    back = _result_file(results / "m", moved, {"bench_toy.Toy.track_value": rehashed}, now_ms)
    stranger = _result_file(results / "m", "f" * 40, {"bench_toy.Toy.track_value": "0" * 64}, now_ms)
    for sha in (old, moved):
        record = results / "m" / "environment" / f"{sha[:8]}.jsonl"
        record.parent.mkdir(exist_ok=True)
        record.write_text(json.dumps({"recorded_at": "2100-01-01T00:00:00+00:00", "command": "speedlib run"}) + "\n")
    (results / "benchmarks.json").write_text(json.dumps({"bench_toy.Toy.track_value": {"version": rehashed}}))

    def version_of(path: Path) -> str:
        return json.loads(path.read_text())["results"]["bench_toy.Toy.track_value"][2]

    found = recover.recover(toy, [results], say=lambda line: None)
    assert found.rewritten == {str(back): 1}
    assert version_of(back) == "1"
    assert version_of(kept) == hashed and version_of(stranger) == "0" * 64
    assert found.kept == {"its code is not accepted as any version": 1,
                          "no commit's benchmarks give this asv version (uncommitted code, or another repository)": 1}
    assert json.loads((results / "benchmarks.json").read_text())["bench_toy.Toy.track_value"]["version"] == "1"
    assert ledger.load(toy)["benchmarks"]["bench_toy.Toy"]["versions"]["1"]["asv"] == {rehashed: moved[:8]}
    # the older workload judged the same measurement (say, a list the timing does not see): it comes back too
    judged = _versions(toy, "--same", "bench_toy.Toy", "--at", old, "--why", "the list's length is not timed")
    assert judged.returncode == 0, judged.stderr
    assert recover.recover(toy, [results], say=lambda line: None).rewritten == {str(kept): 1}
    assert version_of(kept) == "1" and version_of(stranger) == "0" * 64


def test_a_run_refuses_to_file_results_under_a_version_that_does_not_describe_them(toy):
    """`speedlib run` and `speedlib slot` check the ledger before measuring (a slot before its
    GPU tests): a benchmark whose code changed without a bump would file its results as the
    old measurement. One the ledger does not know yet gets asv's hash, which misfiles nothing."""
    from speedbench.run import preconditions  # noqa: PLC0415 - the run's checks, only here
    from speedbench.run.errors import SuiteError  # noqa: PLC0415 - as above

    preconditions.check_versions(toy)  # not in the ledger yet: asv's hash, no refusal
    assert _versions(toy, "--bump", "--why", "first").returncode == 0
    preconditions.check_versions(toy)
    _edit(toy, "speedbench/measure/workloads.py", "return [width] * 2", "return [width] * 3")
    with pytest.raises(SuiteError, match=r"1 benchmark\(s\) would file results under a version that does not "
                                         r"describe them: bench_toy.Toy .*changed speedbench.measure.workloads._build"):
        preconditions.check_versions(toy)
