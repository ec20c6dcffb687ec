"""`speedlib run` and `speedlib dashboard` against hostile input and rough handling: bad
options are refused up front in one line, damaged plan files are reported and never crash,
a second Ctrl+C does not cut the cleanup short, and nothing is left behind in the temporary
directory or listening on a port.

asv is stood in by a small fake package (`python -m asv` finds it first on PYTHONPATH), so
nothing here measures anything."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from speedbench.chunks import Chunk, load_chunks
from speedbench.cli import dashboard as dashboard_cli
from speedbench.cli import parser as cli
from speedbench.results import safekeep
from speedbench.results.common import printable
from speedbench.results.tree import ResultsTree
from speedbench.run import plan, suite

ROOT = Path(__file__).resolve().parents[3]
SHA = "0123456789abcdef" * 2 + "01234567"
LINUX_PROC = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="the supervisor and the death signal are Linux's (/proc, prctl)")


def _commit(repo: Path, message: str) -> None:
    for args in (["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def checkout(tiny_checkout) -> Path:
    return tiny_checkout  # tests/conftest.py's


def _one_line(err: str, prefix: str) -> None:
    assert err.count("\n") == 1 and err.startswith(prefix) and "Traceback" not in err, err


# --- 1. dashboard options -------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--port", "70000"], "--port must be a whole number from 1 to 65535, got '70000'"),
    (["--port", "0"], "--port must be a whole number from 1 to 65535, got '0'"),
    (["--port", "http"], "--port must be a whole number from 1 to 65535, got 'http'"),
    (["--address", "not..an..address"],
     "--address 'not..an..address' is neither an IP address nor a host name this machine resolves"),
    (["--address", "bad\x1b[2J"], "--address 'bad\\x1b[2J' is neither an IP address"),
])
def test_bad_dashboard_options_are_refused_with_one_line(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("Streamlit was started"))
    assert cli.main(["dashboard", "--results", str(tmp_path), "--no-browser", *args]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    _one_line(out.err, "speedlib dashboard: ")
    assert message in out.err and "\x1b" not in out.err


# --- 2. unwritable results directory and archive ----------------------------------------------

def test_a_results_directory_that_cannot_be_written_is_refused_before_any_work(checkout, unwritable, monkeypatch):
    monkeypatch.setattr(suite, "_run", lambda *a, **k: pytest.fail("the run started"))
    for results in (unwritable, unwritable / "speedlib-results"):
        with pytest.raises(suite.SuiteError, match="cannot be written") as refused:
            suite.run(suite.RunOptions(results_dir=results, allow_dirty=True), root=checkout)
        assert "\n" not in str(refused.value) and str(results) in str(refused.value)
        assert not (unwritable / "speedlib-results").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, where no file can be made whatever the mode")
def test_a_place_whose_mode_allows_writing_but_that_takes_no_file_is_refused_up_front(monkeypatch, capsys):
    """/proc's mode lets root write, and os.access says yes; only making a file says no."""
    monkeypatch.setattr(suite, "run", lambda *a, **k: pytest.fail("the run started"))
    assert cli.main(["run", "--archive", "/proc/run.tar.gz"]) == 2
    _one_line(capsys.readouterr().err,
              "speedlib run: --archive /proc/run.tar.gz cannot be written: no file can be made")
    with pytest.raises(suite.SuiteError, match="no file can be made in /proc"):
        suite.check_options(suite.RunOptions(archive=Path("/proc/new/run.tar.gz")))


def test_an_archive_that_cannot_be_written_is_refused_before_any_work(unwritable, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(suite, "run", lambda *a, **k: pytest.fail("the run started"))
    (tmp_path / "a-file").write_text("")
    for archive in (unwritable / "run.tar.gz", unwritable / "new" / "run.tar.gz", tmp_path / "a-file" / "run.tar.gz"):
        assert cli.main(["run", "--archive", str(archive)]) == 2
        err = capsys.readouterr().err
        _one_line(err, "speedlib run: --archive ")
        assert str(archive) in err


def test_a_writable_archive_place_is_accepted(tmp_path):
    suite.check_options(suite.RunOptions(archive=tmp_path / "not" / "yet" / "there.tar.gz"))
    suite.check_options(suite.RunOptions(archive=Path("relative.tar.gz")))


# --- 3. damaged benchmarks.json and chunk-times.jsonl -------------------------------------------

@pytest.mark.parametrize("content, what", [
    (b'{"version": 2, "bench_a.A.track_x": {"par', "not valid JSON"),
    (b'\xff\xfe{"version": 2}', "not UTF-8 text"),
    (b"[1, 2]", "not a JSON object"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
])
def test_a_listing_that_cannot_be_read_is_one_line_for_the_plan(tmp_path, monkeypatch, capsys, content, what):
    monkeypatch.chdir(ROOT)
    (tmp_path / "benchmarks.json").write_bytes(content)
    assert cli.main(["run", "--plan", "--chunk", "all", "--results-dir", str(tmp_path), "--machine", "m"]) == 2
    err = capsys.readouterr().err
    _one_line(err, f"speedlib run: {tmp_path / 'benchmarks.json'}: ")
    assert what in err


def test_a_listing_torn_by_a_killed_run_points_the_plan_to_the_copy_it_left(tmp_path, monkeypatch, capsys):
    """After a SIGKILL the listing's copy is in the snapshot, and the next run puts it back:
    'restore it from git' would throw away results filed against the listing on disk."""
    monkeypatch.chdir(ROOT)
    (tmp_path / "benchmarks.json").write_text('{"version": 2}')
    safekeep.take(tmp_path, "m", SHA)  # what a run does before asv starts; then it was killed
    (tmp_path / "benchmarks.json").write_bytes(b'{"version": 2, "bench_a.A.tr')
    assert cli.main(["run", "--plan", "--chunk", "all", "--results-dir", str(tmp_path), "--machine", "m"]) == 2
    err = capsys.readouterr().err
    _one_line(err, f"speedlib run: {tmp_path / 'benchmarks.json'}: ")
    assert f"a killed run left its copy in {tmp_path / safekeep.SNAPSHOT}" in err and "from git" not in err


@pytest.mark.parametrize("params", ["5", "[[1, 2]]", '[["1"], "23"]'])
def test_a_benchmark_the_listing_describes_wrongly_is_named_in_one_line_by_the_plan(tmp_path, monkeypatch, capsys,
                                                                                     params):
    monkeypatch.chdir(ROOT)
    (tmp_path / "benchmarks.json").write_text(f'{{"version": 2, "bench_a.A.track_\\u001b[2J": {{"params": {params}}}}}')
    assert cli.main(["run", "--plan", "--chunk", "all", "--results-dir", str(tmp_path), "--machine", "m"]) == 0
    err = capsys.readouterr().err
    _one_line(err, f"speedlib run: {tmp_path / 'benchmarks.json'}: bench_a.A.track_\\x1b[2J: ")


def test_a_damaged_listing_refuses_a_budgeted_run_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(suite, "_run", lambda *a, **k: pytest.fail("the run started"))
    (tmp_path / "benchmarks.json").write_bytes(b'{"version": 2, "bench_a.A.tr')
    options = suite.RunOptions(results_dir=tmp_path, chunks=["all"], budget_minutes=10, allow_dirty=True)
    with pytest.raises(suite.SuiteError, match="benchmarks.json: not valid JSON") as refused:
        suite.run(options, root=ROOT)
    assert "\n" not in str(refused.value)


def _bad_chunk_times(results: Path, good: str, bad: str) -> Path:
    """A chunk-times.jsonl with one good line for `good` and every kind of bad line for `bad`."""
    path = ResultsTree(results).machine("m").chunk_times
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"chunk": good, "commit": SHA, "seconds": 100.0, "launch": plan.LAUNCH_METHOD}).encode()]
    for seconds in (float("nan"), float("inf"), -5.0, 1e308, "soon", True, None):
        record = {"chunk": bad, "commit": SHA, "seconds": seconds, "launch": plan.LAUNCH_METHOD}
        lines.append(json.dumps(record).encode())
    lines += [b'{"chunk": "' + bad.encode() + b'", "seconds": 1\xff}', b"[1, 2]",
              b'{"chunk": "' + bad.encode() + b'", "sec']
    path.write_bytes(b"\n".join(lines))
    return path


def test_bad_chunk_times_are_ignored_and_reported_once_by_the_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    good, bad = (c.name for c in load_chunks(ROOT)[:2])
    shutil.copy(ROOT / "results" / "benchmarks.json", tmp_path)
    path = _bad_chunk_times(tmp_path, good, bad)
    assert cli.main(["run", "--plan", "--chunk", "all", "--results-dir", str(tmp_path), "--machine", "m"]) == 0
    out = capsys.readouterr()
    _one_line(out.err, f"speedlib run: {path}: 10 of 11 line(s)")
    assert "as if they were absent" in out.err
    rows = {line.split()[0]: line for line in out.out.splitlines() if line.startswith("  ")}
    assert "the longest measured run here" in rows[good] and "estimate" in rows[bad]
    assert "nan min" not in out.out and "inf min" not in out.out


def test_a_chunk_time_that_is_not_a_finite_positive_number_does_not_price_the_chunk(tmp_path):
    chunk = Chunk("c", "", r"^(?:a\.B\.time_x)")
    names = {"a.B.time_x": ["a.B.time_x(1)", "a.B.time_x(2)"]}
    estimate = plan.chunk_cost(chunk, names, tmp_path, "m")
    path = ResultsTree(tmp_path).machine("m").chunk_times
    path.parent.mkdir(parents=True)
    for seconds in (float("nan"), float("-inf"), -1.0, 1e308, plan.MAX_CHUNK_SECONDS + 1):
        path.write_text(json.dumps({"chunk": "c", "commit": SHA, "seconds": seconds, "launch": plan.LAUNCH_METHOD}))
        assert plan.chunk_cost(chunk, names, tmp_path, "m") == estimate
        assert plan.seconds_per_combination([chunk], names, tmp_path, "m") == (plan.SECONDS_PER_COMBINATION, "default")
    assert plan.chunk_times_note(tmp_path, "m").startswith(f"{path}: 1 of 1 line(s)")
    path.write_text(json.dumps({"chunk": "c", "commit": SHA, "seconds": 42.0, "launch": plan.LAUNCH_METHOD}) + "\n")
    assert plan.chunk_times_note(tmp_path, "m") is None


def test_a_budgeted_run_is_not_driven_by_bad_chunk_times_and_says_so_once(tmp_path, monkeypatch, capsys):
    """A NaN chunk time 'fits' any budget (nan > left is False): the chunk must be priced by
    its estimate instead, and the bad lines named once, not once per chunk."""
    from speedbench.measure import hardware  # noqa: PLC0415 - torch, only for this test: the rest of the file needs none

    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(ROOT / "results" / "benchmarks.json", results)
    chunks = load_chunks(ROOT)
    path = _bad_chunk_times(results, chunks[0].name, chunks[1].name)
    ran = []
    monkeypatch.setattr(suite, "_check_machine", lambda *a: None)
    monkeypatch.setattr(suite, "_preflight", lambda options: SimpleNamespace(record=lambda: {}))
    monkeypatch.setattr(hardware, "environment", lambda: {"machine": "m"})
    monkeypatch.setattr(suite, "_register_machine", lambda *a, **k: None)
    monkeypatch.setattr(suite, "_run_commit", lambda *a: ran.append(a[-1]) or [])
    monkeypatch.setattr(suite, "_print_table", lambda *a, **k: None)
    options = suite.RunOptions(results_dir=results, machine="m", chunks=["all"], budget_minutes=0.5)
    result = suite._run(options, ROOT, [], [SHA], suite._steps(options, ROOT))
    assert ran == [] and result.not_run == [c.name for c in chunks]
    out = capsys.readouterr().out
    assert out.count(str(path)) == 1 and "as if they were absent" in out


def test_a_budgeted_run_names_the_benchmarks_its_prices_leave_out(tmp_path, monkeypatch, capsys):
    """A benchmark whose listed parameters multiply out past the limit is left out of every
    chunk's price (speedbench.results.listing.combinations): the run says so once, as --plan does."""
    from speedbench.measure import hardware  # noqa: PLC0415 - torch, only for this test: the rest of the file needs none

    results = tmp_path / "results"
    results.mkdir()
    listing = json.loads((ROOT / "results" / "benchmarks.json").read_text())
    name = next(n for n, b in listing.items() if isinstance(b, dict) and b.get("params"))
    listing[name]["params"] = [[repr(str(i)) for i in range(30)]] * 8
    (results / "benchmarks.json").write_text(json.dumps(listing))
    monkeypatch.setattr(suite, "_check_machine", lambda *a: None)
    monkeypatch.setattr(suite, "_preflight", lambda options: SimpleNamespace(record=lambda: {}))
    monkeypatch.setattr(hardware, "environment", lambda: {"machine": "m"})
    monkeypatch.setattr(suite, "_register_machine", lambda *a, **k: None)
    monkeypatch.setattr(suite, "_run_commit", lambda *a: [])
    monkeypatch.setattr(suite, "_print_table", lambda *a, **k: None)
    options = suite.RunOptions(results_dir=results, machine="m", chunks=["all"], budget_minutes=0.01)
    suite._run(options, ROOT, [], [SHA], suite._steps(options, ROOT))
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "not priced" in line]
    assert len(said) == 1 and said[0].startswith(f"speedlib run: not priced: {name}: ") and "over the limit" in said[0]


# --- 4. --budget-minutes ---------------------------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0", "soon"])
def test_a_budget_that_is_not_a_positive_number_is_refused_up_front(monkeypatch, capsys, value):
    monkeypatch.setattr(suite, "run", lambda *a, **k: pytest.fail("the run started"))
    assert cli.main(["run", "--chunk", "all", f"--budget-minutes={value}"]) == 2
    err = capsys.readouterr().err
    _one_line(err, "speedlib run: --budget-minutes must be a positive, finite number of minutes, got ")


def test_run_itself_refuses_a_budget_that_is_not_a_positive_number():
    for value in (float("nan"), float("inf"), -5.0, 0.0):
        with pytest.raises(suite.SuiteError, match="--budget-minutes must be a positive, finite number of minutes"):
            suite.check_options(suite.RunOptions(chunks=["all"], budget_minutes=value))


# --- 5, 6. two Ctrl+C; asv's scratch files -------------------------------------------------------

# Stands in for asv: what a stopped asv leaves in $TMPDIR (its forkserver's socket, a
# benchmark's working directory), then, per FAKE_ASV: exit at once, or wait to be stopped and
# take a while to stop.
FAKE_ASV = '''
import os, signal, socket, sys, tempfile, time
from pathlib import Path

marks = Path(os.environ["MARKS"])
server = tempfile.mkdtemp(prefix="asv-forkserver-")
socket.socket(socket.AF_UNIX).bind(os.path.join(server, "socket"))
tempfile.mkdtemp()
if os.environ["FAKE_ASV"] == "exit":
    sys.exit(0)


def stopping(signum, frame):
    (marks / "stopping").write_text("")
    time.sleep(2)
    (marks / "stopped").write_text("")
    sys.exit(1)


signal.signal(signal.SIGTERM, stopping)
(marks / "ready").write_text(str(os.getpid()))
time.sleep(300)
'''


@pytest.fixture
def fake_asv(tmp_path) -> dict:
    """Environment variables under which `python -m asv` is the stand-in; MARKS is where it
    says what it does."""
    package = tmp_path / "fake" / "asv"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(FAKE_ASV)
    marks = tmp_path / "marks"
    marks.mkdir()
    return {"PYTHONPATH": os.pathsep.join([str(package.parent), str(ROOT)]), "MARKS": str(marks)}


@pytest.fixture
def short_tmp() -> Path:
    """An empty directory with a short path, for a TMPDIR: a Unix socket's path (asv's
    forkserver makes one there) holds at most 107 bytes, and pytest's tmp_path is long."""
    path = Path(tempfile.mkdtemp(prefix="speedlib-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _wait_for(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


@LINUX_PROC
def test_what_asv_leaves_in_the_temporary_directory_goes_with_it(tmp_path, fake_asv, short_tmp, monkeypatch):
    system_tmp = short_tmp
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    env = {**os.environ, **fake_asv, "TMPDIR": str(system_tmp), "FAKE_ASV": "exit"}
    assert suite._asv(["run"], env=env, cwd=tmp_path) == 0
    assert list(system_tmp.iterdir()) == []


@LINUX_PROC
def test_what_a_stopped_asv_leaves_in_the_temporary_directory_goes_with_it(tmp_path, fake_asv, short_tmp, monkeypatch):
    system_tmp = short_tmp
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    env = {**os.environ, **fake_asv, "TMPDIR": str(system_tmp), "FAKE_ASV": "slow-stop"}
    ready = Path(fake_asv["MARKS"]) / "ready"
    stopper = threading.Thread(target=lambda: _wait_for(ready.exists, 60) and os.kill(os.getpid(), signal.SIGTERM))
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGTERM, suite._raise_interrupted)
    try:
        stopper.start()
        with pytest.raises(suite.Interrupted):
            suite._asv(["run"], env=env, cwd=tmp_path)
    finally:
        stopper.join()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert (Path(fake_asv["MARKS"]) / "stopped").exists()
    assert list(system_tmp.iterdir()) == []


# Runs `speedlib` with the run's commit work stood in: a worktree of the commit and a (fake)
# asv under the supervisor, as a run has them while it measures.
INTERRUPTIBLE = '''
import sys
from speedbench.cli import parser as cli
from speedbench.run import suite


def _run(options, root, argv, shas, steps):
    with suite._library_at(root, shas[0], use_checkout=False):
        suite._asv(["run"], cwd=root)
    return suite.RunResult(root, "m", [])


suite._run = _run
sys.exit(cli.main(sys.argv[1:]))
'''


@LINUX_PROC
def test_a_second_ctrl_c_while_asv_is_stopped_still_ends_cleanly_with_130(checkout, tmp_path, fake_asv, short_tmp):
    script = tmp_path / "bin" / "speedlib_run.py"
    script.parent.mkdir()
    script.write_text(INTERRUPTIBLE)
    run_tmp = short_tmp
    marks = Path(fake_asv["MARKS"])
    env = {**os.environ, **fake_asv, "TMPDIR": str(run_tmp), "FAKE_ASV": "slow-stop"}
    # Output to files, not pipes: asv inherits them, and reading a pipe to its end would wait
    # for asv too, hiding a speedlib that exits before asv has stopped.
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, str(script), "run", "--commits", "HEAD", "--allow-dirty",
                                 "--results-dir", str(tmp_path / "results")], cwd=checkout, env=env,
                                stdout=stdout, stderr=stderr)
    try:
        assert _wait_for(lambda: (marks / "ready").exists() or proc.poll() is not None, 120)
        assert proc.poll() is None, err.read_text()
        proc.send_signal(signal.SIGINT)
        assert _wait_for((marks / "stopping").exists, 60), "asv was never told to stop"
        proc.send_signal(signal.SIGINT)  # while asv is still stopping
        proc.wait(timeout=120)
        # asv had stopped before speedlib ended
        stopped_first = (marks / "stopped").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        _wait_for((marks / "stopped").exists, 10)
    err = err.read_text()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.splitlines()[-1].startswith("speedlib run: stopped by SIGINT"), err
    assert stopped_first, "speedlib ended while asv was still stopping"
    # and its scratch is gone: the commit's worktree, what asv left in the temporary directory
    assert list(run_tmp.iterdir()) == []
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=checkout, capture_output=True, text=True).stdout
    assert len(worktrees.splitlines()) == 1, worktrees


# --- 7, 8. git data in messages ------------------------------------------------------------------

def test_the_dirty_tree_refusal_names_a_modified_file_whole(checkout, monkeypatch):
    monkeypatch.setattr(suite, "_run", lambda *a, **k: pytest.fail("the run started"))
    (checkout / "speedlib" / "__init__.py").write_text("# edited\n")  # porcelain: " M speedlib/__init__.py"
    (checkout / "benchmarks" / "bench new\x1b[2J.py").write_text("")
    with pytest.raises(suite.SuiteError, match="uncommitted changes") as refused:
        suite.run(suite.RunOptions(), root=checkout)
    message = str(refused.value)
    assert "(speedlib/__init__.py, " in message and "benchmarks/bench new\\x1b[2J.py" in message
    assert "\x1b" not in message and '"' not in message  # the name as it is, not git's quoting


def test_a_commit_subject_is_printed_escaped(checkout, tmp_path, monkeypatch, capsys):
    (checkout / "speedlib" / "NOTE.txt").write_text("x")
    _commit(checkout, "evil \x1b]0;pwned\x07 \x1b[2J subject")
    monkeypatch.setattr(suite, "_asv", lambda *a, **k: 0)
    head = suite.resolve_commits(checkout, None)[0]
    suite._run_commit(suite.RunOptions(), checkout, tmp_path / "asv.conf.json", tmp_path, "m", {}, [], head,
                      "[1/1]", [])
    out = capsys.readouterr().out
    assert f"[1/1] {head[:8]} evil \\x1b]0;pwned\\x07 \\x1b[2J subject" in out
    assert "\x1b" not in out and "\x07" not in out


def test_what_git_says_about_a_bad_range_is_escaped_and_one_line(checkout):
    with pytest.raises(suite.SuiteError) as refused:
        suite.resolve_commits(checkout, "HEAD..no\x1b[2Jsuch")
    assert "\x1b" not in str(refused.value) and "\n" not in str(refused.value)
    assert "no\\x1b[2Jsuch" in str(refused.value)


# --- 9. the dashboard dies with speedlib ---------------------------------------------------------

def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _streamlit_on(port: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"streamlit" in cmdline and str(port).encode() in cmdline:
                pids.append(int(entry.name))
    return pids


@LINUX_PROC
def test_streamlit_stops_listening_when_speedlib_dashboard_is_killed(tmp_path):
    pytest.importorskip("streamlit")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "speedlib", "dashboard", "--results", str(tmp_path),
                             "--port", str(port), "--no-browser"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert _wait_for(lambda: _listening(port) or proc.poll() is not None, 180)
        assert proc.poll() is None and _listening(port), "the dashboard never served"
        proc.kill()  # SIGKILL: speedlib gets no chance to stop Streamlit itself
        proc.wait()
        assert _wait_for(lambda: not _listening(port), 10), "Streamlit outlived speedlib dashboard"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _streamlit_on(port):
            os.kill(pid, signal.SIGKILL)


def test_the_dashboard_link_brackets_an_ipv6_address():
    assert dashboard_cli._url("::1", 8501) == "http://[::1]:8501"
    assert dashboard_cli._url("127.0.0.1", 8501) == "http://127.0.0.1:8501"


def test_a_machine_the_results_do_not_hold_is_named_with_those_they_do(capsys):
    assert cli.main(["report", "--results", str(ROOT / "results"), "--machine", "../x"]) == 1
    last = capsys.readouterr().err.splitlines()[-1]  # after the line that counts older result files
    assert last.startswith("speedlib report: no measured results for machine ../x; the results hold ")
    assert "cpu-2core-intel-xeon" in last


def test_a_noise_table_against_a_missing_directory_says_it_is_missing(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert cli.main(["report", "--results", str(ROOT / "results"), "--table", "noise", "--against", str(missing)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"speedlib report: no results directory at {missing} (--against)"


# --- 9. settings from the environment, a closed pipe, Ctrl+C twice, paths on the terminal -----

@pytest.mark.parametrize("value", ["cuda", "cuda:0", "cuda:7"])
def test_a_cuda_device_this_machine_lacks_is_one_line_before_a_run(value, monkeypatch, capsys):
    """Issue 54: every benchmark failed, with no word about the device."""
    import torch  # noqa: PLC0415 - only these tests ask torch what it sees

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(value.partition(":")[2] or 0) < count:
        pytest.skip(f"this machine has {value}")
    monkeypatch.setenv("SPEEDLIB_DEVICE", value)
    monkeypatch.setattr(suite, "run", lambda *a, **k: pytest.fail("the run started"))
    from speedbench.run import slot  # noqa: PLC0415 - as the CLI loads it

    monkeypatch.setattr(slot, "run", lambda *a, **k: pytest.fail("the slot started"))
    for command in (["run", "--quick"], ["slot", "--archive", "a.tar.gz"]):
        assert cli.main(command) == 2
        out = capsys.readouterr()
        _one_line(out.err, f"speedlib {command[0]}: $SPEEDLIB_DEVICE={value} asks for a CUDA device, and torch sees ")


@pytest.mark.parametrize("value", ["abc", "0", "-2", "4\x1b[2J", str(10**30),
                                   pytest.param("9" * 5000, id="nines-5000")])
def test_a_bad_speedlib_threads_is_one_line_from_env_and_run(value, monkeypatch, capsys):
    """Both used to end in preflight.benchmark_threads' ValueError traceback; 10**30 was taken (issue 54)."""
    from speedbench.measure import hardware  # noqa: PLC0415 - imports torch, which only these tests need

    monkeypatch.setenv("SPEEDLIB_THREADS", value)
    monkeypatch.setattr(hardware, "environment", lambda: pytest.fail("the record was made"))
    monkeypatch.setattr(suite, "run", lambda *a, **k: pytest.fail("the run started"))
    for command in (["env"], ["run", "--quick"]):
        assert cli.main(command) == 2
        out = capsys.readouterr()
        assert out.out == ""
        _one_line(out.err, f"speedlib {command[0]}: $SPEEDLIB_THREADS must be a positive integer, at most ")
        assert "\x1b" not in out.err and len(out.err) < 300


@pytest.mark.parametrize("value", ["junk", "meta", "cuda:x", "CPU", "cpu\x1b[2J"])
def test_a_device_the_benchmarks_cannot_measure_on_is_refused_before_the_run(value, monkeypatch, capsys):
    """junk failed every benchmark without a reason (status 3); meta measured nothing and
    exited 0, filing timings of no-op kernels."""
    from speedbench.measure import instruments  # noqa: PLC0415 - imports torch, which only these tests need

    monkeypatch.setenv("SPEEDLIB_DEVICE", value)
    monkeypatch.setattr(suite, "run", lambda *a, **k: pytest.fail("the run started"))
    assert cli.main(["run", "--quick"]) == 2
    err = capsys.readouterr().err
    _one_line(err, f"speedlib run: $SPEEDLIB_DEVICE must be cpu, cuda or cuda:N (the device to measure on), "
                   f"got {value!r}")
    with pytest.raises(ValueError, match="SPEEDLIB_DEVICE must be cpu, cuda or cuda:N"):
        instruments.device()  # a benchmark started some other way refuses it too
    for good in ("cpu", " "):
        monkeypatch.setenv("SPEEDLIB_DEVICE", good)
        assert instruments.device().type in ("cpu", "cuda")


def test_a_reader_that_has_gone_ends_report_quietly_as_cat_does(tmp_path):
    """`speedlib report | head`: BrokenPipeError's traceback (and an "Exception ignored"
    at exit) became a quiet exit with 128 + SIGPIPE, what a shell shows for `cat`."""
    read, write = os.pipe()
    os.close(read)  # every write to stdout now fails with EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "speedbench.cli", "report", "--results", str(ROOT / "results"),
                               "--table", "results"], cwd=ROOT, stdout=write, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    finally:
        os.close(write)
    assert proc.returncode == cli.READER_GONE == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr and "ignored" not in proc.stderr


SECOND_CTRL_C = '''
import os, signal, sys
from speedbench.cli import parser as cli
from speedbench.results import load

def interrupted(path):
    raise KeyboardInterrupt  # the first Ctrl+C, while results load

load.load_results = interrupted
sys.argv = ["speedlib", "report", "--results", sys.argv[1]]
status = cli.main()  # as the `speedlib` command calls it
os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl+C, after it said it stopped
sys.exit(status)
'''


def test_a_second_ctrl_c_after_the_first_stopped_a_command_still_exits_130(tmp_path, monkeypatch, capsys):
    """It escaped as a KeyboardInterrupt once the first one's handling was over: a traceback
    and status -2 (killed by SIGINT) after "stopped by Ctrl+C"."""
    proc = subprocess.run([sys.executable, "-c", SECOND_CTRL_C, str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "speedlib report: stopped by Ctrl+C\n"
    # A program that calls main() itself (here, pytest) gets its own handler back.
    from speedbench.results import load  # noqa: PLC0415 - as the subprocess above patches it, here in-process

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(load, "load_results", interrupted)
    # Python's own handler to start from: a runner started in the background (`cmd &`) inherits
    # SIGINT ignored, and main() rightly gave that back
    caller = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert cli.main(["report", "--results", str(tmp_path)]) == 130
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, caller)
    assert capsys.readouterr().err == "speedlib report: stopped by Ctrl+C\n"


def test_the_dashboard_start_up_lines_print_paths_escaped(tmp_path, monkeypatch, capsys):
    """An escape sequence in a results path reached the terminal raw."""
    missing = tmp_path / "gone\x1b[2J"
    assert cli.main(["dashboard", "--results", str(missing), "--no-browser"]) == 2
    err = capsys.readouterr().err
    _one_line(err, "speedlib dashboard: no results directory at ")
    assert "\x1b" not in err and "gone\\x1b[2J" in err
    results = tmp_path / "res\x1b]0;owned\x07ults"
    results.mkdir()
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda cmd, **k: started.append(cmd) or SimpleNamespace(
        wait=lambda: 0, poll=lambda: None, terminate=lambda: None))
    monkeypatch.setattr(dashboard_cli, "_cannot_listen", lambda address, port: None)
    monkeypatch.setattr(dashboard_cli, "_wait_until_listening", lambda *a, **k: True)
    assert cli.main(["dashboard", "--results", str(results), "--no-browser", "--port", "8599"]) == 0
    out = capsys.readouterr().out
    shown = printable(results.resolve())
    assert started and out == f"speedlib dashboard: serving {shown} on http://127.0.0.1:8599 (Ctrl+C stops it)\n"
    assert "\x1b" not in out and "\x07" not in out


def test_a_results_dir_in_a_symlink_loop_or_over_long_is_refused_in_one_line(tmp_path):
    """A --results-dir that cannot be resolved (a loop of links, a name over the file system's
    limit) is refused before any work, naming the option, not a RuntimeError or OSError."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for path, why in ((tmp_path / "a" / "results", "loop of symbolic links"),
                      (tmp_path / ("r" * 300), "File name too long")):
        with pytest.raises(suite.SuiteError, match=f"--results-dir .* cannot be used: .*{why}"):
            suite.check_options(suite.RunOptions(results_dir=path))


def test_an_over_long_machine_name_says_how_long_it_may_be():
    with pytest.raises(suite.SuiteError, match="--machine is 300 characters long: .* at most 100 characters"):
        suite.check_options(suite.RunOptions(machine="m" * 300))
    suite.check_options(suite.RunOptions(machine="m" * 100))  # the longest name a directory takes here
