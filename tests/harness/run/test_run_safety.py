"""`speedlib run` and the results directory: a full disk or a kill loses nothing.

asv rewrites its files in place (truncate, then write): the listing (benchmarks.json), the
machine's machine.json and a commit's result file. These tests stand in for asv with a fake
`asv` package that writes the way asv 0.6 does, in the order it does (machine.json, the
listing, then the commit's results), so that a full disk tears a file at a known point, and a
SIGKILL finds the listing already rewritten. speedlib's own files (environment records,
chunk times, the archive) must be replaced whole or not at all.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speedbench.chunks import Chunk
from speedbench.results.load import load_results
from speedbench.results.tree import ResultsTree
from speedbench.run import plan, suite

ROOT = Path(__file__).resolve().parents[3]
SHA = "0123456789abcdef" * 2 + "01234567"
COLUMNS = ["result", "params", "version", "started_at", "duration"]

# `python -m asv` with this package first on PYTHONPATH. FAKE_ASV says what it does:
# ok: writes like a whole asv run; fill-before-listing / fill-before-results: fills the disk
# (other work on the machine) before rewriting that file, and dies of the OSError as asv does;
# fail-after-results: saves everything, then exits 1; hang: rewrites the listing, says so in
# FAKE_ASV_READY (its pid), and waits to be killed.
FAKE_ASV = r'''
import json, os, sys, time
from pathlib import Path

args = sys.argv[1:]
if args[0] == "machine":
    sys.exit(0)
opt = lambda name: args[args.index(name) + 1]
results = Path(json.loads(Path(opt("--config")).read_text())["results_dir"])
machine, sha, mode = opt("--machine"), opt("--set-commit-hash"), os.environ["FAKE_ASV"]


def write_json(path, data):  # asv.util.write_json: open("w") truncates, then json.dump writes
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=4, sort_keys=True)


def fill_disk():
    fd = os.open(results.parent / "ballast", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


machine_json = results / machine / "machine.json"
old = json.loads(machine_json.read_text()) if machine_json.exists() else {"machine": machine, "version": 1}
write_json(machine_json, old)
if mode == "fill-before-listing":
    fill_disk()
# The checkout's listing: more benchmarks than the one on disk (big enough that it cannot
# fit in what the old one freed), and without the one the results on disk were filed against.
write_json(results / "benchmarks.json",
           {**{f"bench_b.B{i}.track_y": {"version": "2", "unit": "s", "params": []} for i in range(400)},
            "version": 2})
if mode == "hang":
    Path(os.environ["FAKE_ASV_READY"]).write_text(str(os.getpid()))
    time.sleep(300)
if mode == "fill-before-results":
    fill_disk()
result_file = results / machine / f"{sha[:8]}-existing-py.json"
data = json.loads(result_file.read_text()) if result_file.exists() else {
    "commit_hash": sha, "result_columns": ["result", "params", "version", "started_at", "duration"],
    "results": {}, "version": 2}
for i in range(400):
    data["results"][f"bench_b.B{i}.track_y"] = [[1.5], [], "2", int(time.time() * 1000), 0.1]
write_json(result_file, data)
sys.exit(1 if mode == "fail-after-results" else 0)
'''


@pytest.fixture
def fake_asv(tmp_path, monkeypatch):
    """Makes `python -m asv` the fake above; call it with the mode."""
    package = tmp_path / "fake-asv" / "asv"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(FAKE_ASV)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(package.parent), str(ROOT)]))
    return lambda mode: monkeypatch.setenv("FAKE_ASV", mode)


@pytest.fixture
def checkout(tiny_checkout) -> tuple[Path, str]:
    """tests/conftest.py's tiny_checkout, and its HEAD."""
    return tiny_checkout, suite.resolve_commits(tiny_checkout, None)[0]


def _results(base: Path, sha: str, earlier: bool = True) -> Path:
    """A results directory as a run left it: the listing, machine m, and (earlier) a result file of `sha`."""
    results = base / "results"
    (results / "m").mkdir(parents=True)
    (results / "benchmarks.json").write_text(json.dumps(
        {"bench_a.A.track_x": {"version": "1", "unit": "s", "params": []}, "version": 2}, indent=4))
    (results / "m" / "machine.json").write_text(json.dumps({"machine": "m", "version": 1}, indent=4))
    if earlier:  # several KiB, as a real commit's results are
        data = {"commit_hash": sha, "result_columns": COLUMNS, "version": 2,
                "results": {f"bench_a.A{i}.track_x": [[1.0], [], "1", 1000, 0.1] for i in range(100)}}
        (results / "m" / f"{sha[:8]}-existing-py.json").write_text(json.dumps(data, indent=4))
    return results


def _files(results: Path) -> dict[str, bytes]:
    """Every file under `results`, hidden ones too, by relative path."""
    return {str(p.relative_to(results)): p.read_bytes() for p in sorted(results.rglob("*")) if p.is_file()}


def _run_commit(root: Path, sha: str, results: Path, conf_dir: Path) -> list[str]:
    conf = conf_dir / "asv.conf.json"
    conf.write_text(json.dumps({"results_dir": str(results)}))
    return suite._run_commit(suite.RunOptions(), root, conf, results, "m", {}, [], sha, "[1/1]", [])


# --- asv's files: a snapshot before asv runs, put back when it fails ---------------------

@pytest.mark.parametrize("earlier", [True, False], ids=["earlier-results", "first-run"])
@pytest.mark.parametrize("fill", ["fill-before-listing", "fill-before-results"])
def test_a_full_disk_while_asv_writes_leaves_the_results_as_they_were(small_disk, checkout, fake_asv, tmp_path,
                                                                      fill, earlier):
    """The disk fills while asv runs: the listing or the commit's result file is torn (cut at
    a page, or 0 bytes). Afterwards every file is as it was before the run, a result file the
    run created is gone, and the error is one line that says the disk is full."""
    root, sha = checkout
    results = _results(small_disk, sha, earlier)
    before = _files(results)
    fake_asv(fill)
    with pytest.raises(suite.SuiteError) as raised:
        _run_commit(root, sha, results, tmp_path)
    message = str(raised.value)
    assert "\n" not in message and "full" in message and "status 1" in message, message
    assert (small_disk / "ballast").stat().st_size > 0  # the disk was full when the files were put back
    assert _files(results) == before  # byte for byte; no 0-byte file, no snapshot left over


def test_a_full_disk_before_asv_starts_runs_nothing_and_changes_nothing(small_disk, checkout, fake_asv, tmp_path):
    """No room to keep a copy of asv's files: asv is not started, and the line says so."""
    root, sha = checkout
    results = _results(small_disk, sha)
    before = _files(results)
    fd = os.open(small_disk / "ballast", os.O_WRONLY | os.O_CREAT)
    with pytest.raises(OSError):
        while True:
            os.write(fd, b"\0" * 4096)
    os.close(fd)
    fake_asv("ok")
    with pytest.raises(suite.SuiteError) as raised:
        _run_commit(root, sha, results, tmp_path)
    message = str(raised.value)
    assert "\n" not in message and "full" in message and "nothing was run" in message, message
    assert _files(results) == before


def test_asvs_files_are_kept_when_it_succeeds(checkout, fake_asv, tmp_path, monkeypatch):
    from speedbench.measure import hardware  # noqa: PLC0415 - torch: the file's other tests need none

    monkeypatch.setattr(hardware, "gpu_state", lambda: [])
    root, sha = checkout
    results = _results(tmp_path, sha)
    before = _files(results)
    fake_asv("ok")
    assert _run_commit(root, sha, results, tmp_path) == []
    after = _files(results)
    assert after["benchmarks.json"] != before["benchmarks.json"]  # asv's new listing
    saved = json.loads(after[f"m/{sha[:8]}-existing-py.json"])["results"]
    assert "bench_a.A0.track_x" in saved and "bench_b.B0.track_y" in saved
    assert not [name for name in after if name.startswith(".")]  # no snapshot left


def test_results_asv_saved_before_it_failed_are_kept_with_their_listing(checkout, fake_asv, tmp_path):
    """asv saves a commit's results last: a whole result file after a failure is this run's
    results, and the listing it was saved with stays beside it."""
    root, sha = checkout
    results = _results(tmp_path, sha)
    before = _files(results)
    fake_asv("fail-after-results")
    with pytest.raises(suite.SuiteError, match="status 1"):
        _run_commit(root, sha, results, tmp_path)
    after = _files(results)
    saved = json.loads(after[f"m/{sha[:8]}-existing-py.json"])["results"]
    assert "bench_a.A0.track_x" in saved and "bench_b.B0.track_y" in saved
    assert after["benchmarks.json"] != before["benchmarks.json"]
    assert "bench_b.B0.track_y" in json.loads(after["benchmarks.json"])
    assert not [name for name in after if name.startswith(".")]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                    reason="stopping asv when speedlib is killed needs Linux (the supervisor's prctl and /proc)")
def test_a_run_killed_outright_has_its_files_put_back_by_the_next_run(checkout, fake_asv, tmp_path, monkeypatch,
                                                                      capsys):
    """SIGKILL gives speedlib no chance to put the listing back; the copy it took stays on
    disk, and the next `speedlib run` puts it back before anything else, and says so."""
    root, sha = checkout
    results = _results(tmp_path, sha)
    before = _files(results)
    fake_asv("hang")
    ready = tmp_path / "asv-ready"
    monkeypatch.setenv("FAKE_ASV_READY", str(ready))
    conf = tmp_path / "asv.conf.json"
    conf.write_text(json.dumps({"results_dir": str(results)}))
    script = ("import sys; from pathlib import Path; from speedbench.run import suite; "
              "suite._run_commit(suite.RunOptions(), Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), 'm', "
              "{}, [], sys.argv[4], '[1/1]', [])")
    speedlib = subprocess.Popen([sys.executable, "-c", script, str(root), str(conf), str(results), sha])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline and speedlib.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), "the fake asv never rewrote the listing"
    finally:
        speedlib.send_signal(signal.SIGKILL)
        speedlib.wait()
    asv_pid = int(ready.read_text())
    deadline = time.monotonic() + 30  # the supervisor stops asv once speedlib is gone
    while Path(f"/proc/{asv_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _files(results)["benchmarks.json"] != before["benchmarks.json"]  # the kill left asv's listing

    monkeypatch.setattr(suite, "_run", lambda *a, **k: "ran")
    assert suite.run(suite.RunOptions(results_dir=results, allow_dirty=True), root=root) == "ran"
    assert _files(results) == before
    said = [line for line in capsys.readouterr().out.splitlines() if "benchmarks.json" in line]
    assert len(said) == 1 and "put back" in said[0] and "killed" in said[0], said


def test_a_put_back_that_fails_keeps_the_copy_and_says_where(checkout, tmp_path, monkeypatch, capsys):
    """Putting the listing back fails (the disk is full): one line names the copy kept from
    before the run, the copy is whole, and the next run puts it back."""
    root, sha = checkout
    results = _results(tmp_path, sha)
    before = _files(results)
    listing = results / "benchmarks.json"

    def torn_asv(*args, **kwargs):
        listing.write_text('{"version": 2, "bench_b.B.tr')
        raise suite.SuiteError("asv exited with status 1: python -m asv run")

    real_replace = os.replace

    def full_disk_replace(src, dst, *args, **kwargs):
        if Path(dst) == listing:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(suite, "_asv", torn_asv)
    monkeypatch.setattr(os, "replace", full_disk_replace)
    with pytest.raises(suite.SuiteError) as raised:
        _run_commit(root, sha, results, tmp_path)
    monkeypatch.setattr(os, "replace", real_replace)
    message = str(raised.value)
    assert "\n" not in message and "full" in message and "benchmarks.json" in message, message
    kept = [p for p in results.rglob("*") if p.is_file() and p.read_bytes() == before["benchmarks.json"]]
    assert len(kept) == 1 and str(kept[0].parent) in message  # the copy, whole, where the line says

    monkeypatch.setattr(suite, "_run", lambda *a, **k: "ran")
    assert suite.run(suite.RunOptions(results_dir=results, allow_dirty=True), root=root) == "ran"
    assert _files(results) == before
    assert "put back" in capsys.readouterr().out


def test_a_failed_asv_that_dropped_a_commits_earlier_results_has_them_put_back(checkout, tmp_path, monkeypatch,
                                                                              capsys):
    """asv adds to a commit's result file and never drops from it: a whole file with fewer
    results after a failure is not this run's to keep."""
    root, sha = checkout
    results = _results(tmp_path, sha)
    before = _files(results)
    result_file = results / "m" / f"{sha[:8]}-existing-py.json"

    def dropping_asv(*args, **kwargs):
        result_file.write_text(json.dumps({"commit_hash": sha, "result_columns": COLUMNS, "version": 2,
                                           "results": {"bench_b.B.track_y": [[2.0], [], "2", 2000, 0.1]}}))
        raise suite.SuiteError("asv exited with status 1: python -m asv run")

    monkeypatch.setattr(suite, "_asv", dropping_asv)
    with pytest.raises(suite.SuiteError, match="status 1"):
        _run_commit(root, sha, results, tmp_path)
    assert _files(results) == before
    assert "entries lost" in capsys.readouterr().out


def test_a_snapshot_whose_journal_cannot_be_read_stops_the_run_with_one_line(checkout, tmp_path, monkeypatch):
    """A journal this run cannot trust (here: paths outside the results directory) is not
    acted on: the run refuses, and everything stays where it is."""
    root, _ = checkout
    results = _results(tmp_path, SHA)
    journal = results / ".speedlib-snapshot" / "journal"
    journal.parent.mkdir()
    journal.write_text(json.dumps({"commit": SHA, "patterns": ["../*"], "before": {"../outside": "saved"}}))
    (tmp_path / "outside").write_text("torn")
    before = _files(tmp_path)
    monkeypatch.setattr(suite, "_run", lambda *a, **k: pytest.fail("the run started"))
    with pytest.raises(suite.SuiteError) as raised:
        suite.run(suite.RunOptions(results_dir=results, allow_dirty=True), root=root)
    assert "\n" not in str(raised.value) and "journal cannot be read" in str(raised.value)
    assert _files(tmp_path) == before


def test_speedlib_report_says_a_killed_run_left_its_copy_behind(checkout, tmp_path, monkeypatch):
    """Until the next `speedlib run` puts the files back, the loader says why the listing may
    read as damaged, and where the good copy is."""
    root, sha = checkout
    results = _results(tmp_path, sha)

    def killed_asv(*args, **kwargs):
        (results / "benchmarks.json").write_text('{"version": 2, "bench_b.B.tr')
        raise SystemExit("killed")  # stands in for the end of a SIGKILLed process: nothing after it runs

    monkeypatch.setattr(suite, "_asv", killed_asv)
    monkeypatch.setattr(suite, "_settle", lambda *a, **k: None)
    with pytest.raises(SystemExit):
        _run_commit(root, sha, results, tmp_path)
    said = [p for p in load_results(results).problems if ".speedlib-snapshot" in p.path]
    assert len(said) == 1 and "killed" in said[0].reason and "speedlib run" in said[0].reason
    assert not any(".speedlib-snapshot" in p.path for p in load_results(_results(tmp_path / "clean", sha)).problems)


def test_a_snapshot_left_before_asv_started_is_removed_quietly(checkout, tmp_path, monkeypatch, capsys):
    """Killed while copying (no journal yet): asv never ran, so the copies are only removed."""
    root, _ = checkout
    results = _results(tmp_path, SHA)
    before = _files(results)
    (results / ".speedlib-snapshot").mkdir()
    (results / ".speedlib-snapshot" / "benchmarks.json.saved").write_text("{")
    monkeypatch.setattr(suite, "_run", lambda *a, **k: "ran")
    assert suite.run(suite.RunOptions(results_dir=results, allow_dirty=True), root=root) == "ran"
    assert _files(results) == before and "put back" not in capsys.readouterr().out


# --- speedlib's own files: replaced whole or not at all ---------------------------------

class _HalfWritten:
    """A file whose write stores half of what it was given, then fails as on a full disk."""

    def __init__(self, f):
        self._f = f

    def write(self, data):
        self._f.write(data[:len(data) // 2])
        self._f.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


@pytest.fixture
def full_disk_writes(monkeypatch):
    real_open = Path.open

    def opened(self, mode="r", *args, **kwargs):
        f = real_open(self, mode, *args, **kwargs)
        return _HalfWritten(f) if set(mode) & set("wax+") else f

    monkeypatch.setattr(Path, "open", opened)


def test_an_environment_record_that_cannot_be_written_leaves_the_old_ones(tmp_path, monkeypatch, request):
    path = ResultsTree(tmp_path).machine("m").environment_record(SHA)
    suite._record_environment(path, SHA, {"torch": "2.4"}, ["speedlib", "run"])
    old = path.read_bytes()
    request.getfixturevalue("full_disk_writes")
    with pytest.raises(suite.SuiteError) as raised:
        suite._record_environment(path, SHA, {"torch": "2.5"}, ["speedlib", "run"])
    assert "\n" not in str(raised.value) and "full" in str(raised.value)
    assert path.read_bytes() == old
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # nothing half-written beside it


def test_a_chunk_time_that_cannot_be_written_leaves_the_old_ones(tmp_path, request):
    plan.record_chunk_time(tmp_path, "m", "c", SHA, 42.0)
    path = ResultsTree(tmp_path).machine("m").chunk_times
    old = path.read_bytes()
    request.getfixturevalue("full_disk_writes")
    with pytest.raises(OSError):
        plan.record_chunk_time(tmp_path, "m", "c", SHA, 7.0)
    assert path.read_bytes() == old
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_a_record_appended_after_a_torn_line_stands_on_its_own(tmp_path):
    """A run killed by the old, appending code left a line without its end: the next record
    must not be glued to it (and lost with it)."""
    chunk = Chunk("c", "", r"^(?:a\.B\.)")
    path = ResultsTree(tmp_path).machine("m").chunk_times
    path.parent.mkdir(parents=True)
    path.write_text('{"chunk": "c", "seco')
    plan.record_chunk_time(tmp_path, "m", "c", SHA, 42.0)
    assert plan.chunk_cost(chunk, {"a.B.x": ["a.B.x"]}, tmp_path, "m") == (42.0, "the longest measured run here")
    env = ResultsTree(tmp_path).machine("m").environment_record(SHA)
    env.parent.mkdir(parents=True)
    env.write_text('{"commit": "0123')
    suite._record_environment(env, SHA, {}, ["speedlib", "run"])
    assert json.loads(env.read_text().splitlines()[-1])["commit"] == SHA


def test_an_archive_that_does_not_fit_leaves_the_previous_one(small_disk, tmp_path):
    results = _results(tmp_path, SHA)
    dest = small_disk / "results.tar.gz"
    dest.write_bytes(b"the previous archive")
    ballast = small_disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)
    with pytest.raises(OSError):  # room for a few KiB: the archive of 100 KiB of noise does not fit
        while True:
            os.write(fd, b"\0" * 4096)
    os.close(fd)
    os.truncate(ballast, ballast.stat().st_size - 8192)
    (results / "m" / f"{SHA[:8]}-existing-py.json").write_bytes(json.dumps({"noise": os.urandom(50_000).hex()})
                                                                .encode())
    with pytest.raises(suite.SuiteError) as raised:
        suite.pack_results(results, "m", [SHA], dest)
    assert "\n" not in str(raised.value) and "full" in str(raised.value)
    assert dest.read_bytes() == b"the previous archive"
    assert sorted(p.name for p in small_disk.iterdir()) == ["ballast", "results.tar.gz"]
