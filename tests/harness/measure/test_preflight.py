"""speedbench.measure.preflight, `speedlib env --check`, and the check `speedlib run` makes first.

The machine is never loaded: busy machines are fake /proc trees whose counters a fake sleep
advances, or a check stood in by a report that says "busy". GPUs are a fake NVML module.
"""

from __future__ import annotations

import functools
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from speedbench.cli import parser as cli
from speedbench.measure import preflight
from speedbench.results import synthetic
from speedbench.results.common import printable
from speedbench.results.load import load_results
from speedbench.run import suite
from speedbench.stats import contention

ROOT = Path(__file__).resolve().parents[3]
TICKS = round(1 / preflight._TICK)  # /proc's ticks per second
SELF = 500  # this process's pid in the fake /proc


def _write_proc(root: Path, machine_busy_s: float, steal_s: float, procs: dict[int, tuple]) -> None:
    """A /proc with an aggregate `cpu` line (2 CPUs) and one stat file per process:
    pid -> (name, parent pid, CPU seconds, kernel thread?)."""
    busy = round(machine_busy_s * TICKS)
    steal = round(steal_s * TICKS)
    # user nice system idle iowait irq softirq steal: all busy time as user, less the steal
    (root / "stat").write_text(f"cpu  {busy - steal} 0 0 99999 0 0 0 {steal} 0 0\ncpu0 0\ncpu1 0\n")
    for pid, (name, ppid, seconds, kernel) in procs.items():
        (root / str(pid)).mkdir(exist_ok=True)
        ticks = round(seconds * TICKS)
        flags = preflight._PF_KTHREAD if kernel else 0
        # utime (field 14) carries all the ticks, stime (15) none
        (root / str(pid) / "stat").write_text(
            f"{pid} ({name}) S {ppid} {pid} {pid} 0 -1 {flags} 0 0 0 0 {ticks} 0 0 0 20 0 1 0 100 0 0\n")
        (root / str(pid) / "comm").write_text(f"{name}\n")


BEFORE = {1: ("systemd", 0, 5.0, False), 2: ("kthreadd", 0, 0.0, True), 40: ("kworker/0:1", 2, 1.0, True),
          100: ("python3", 1, 10.0, False), 101: ("chromium", 1, 3.0, False), 102: ("chromium", 101, 2.0, False),
          103: ("tmux: a) b", 1, 0.0, False), 300: ("gone", 1, 4.0, False),
          SELF: ("speedlib", 1, 2.0, False), 501: ("asv", SELF, 1.0, False)}
# One second later: what each process used meanwhile (seconds); 300 ended, 200 started.
USED = {100: 0.8, 101: 0.1, 102: 0.05, 103: 0.02, 40: 0.3, SELF: 0.3, 501: 0.2}
STARTED = {200: ("make", 1, 0.04, False)}


def fake_proc(tmp_path: Path) -> tuple[Path, object, object, float]:
    """(root, sleep, clock, machine busy seconds over the sample): the sleep turns the /proc
    tree into its state one second later, and the clock says one second passed."""
    root = tmp_path / "proc"
    root.mkdir()
    _write_proc(root, 100.0, 1.0, BEFORE)
    busy = sum(USED.values()) + sum(p[2] for p in STARTED.values())
    now = [0.0]

    def sleep(seconds):
        after = {pid: (name, ppid, used + USED.get(pid, 0.0), kernel)
                 for pid, (name, ppid, used, kernel) in BEFORE.items() if pid != 300}
        _write_proc(root, 100.0 + busy, 1.0, {**after, **STARTED})
        (root / "300" / "stat").unlink()
        now[0] += seconds

    return root, sleep, lambda: now[0], busy


def test_the_sample_counts_other_processes_and_leaves_out_this_one_its_children_and_the_kernel(tmp_path):
    root, sleep, clock, busy = fake_proc(tmp_path)
    sample = preflight.sample_processes(1.0, str(root), SELF, sleep, clock)
    capacity = 2 * 1.0  # 2 CPUs for one second
    own = USED[SELF] + USED[501]
    assert sample.cpus == 2 and sample.seconds == 1.0
    assert sample.others == pytest.approx(100 * (busy - own) / capacity, abs=0.6)  # a tick is 0.5 %
    names = dict(sample.top)
    assert list(names) == ["python3", "chromium", "make"][:preflight.TOP]  # busiest first
    assert names["python3"] == pytest.approx(100 * USED[100] / capacity, abs=0.6)
    assert names["chromium"] == pytest.approx(100 * (USED[101] + USED[102]) / capacity, abs=0.6)  # summed by name
    # a process that started during the sample spent all its time inside it
    assert names["make"] == pytest.approx(100 * STARTED[200][2] / capacity, abs=0.6)
    assert not {"speedlib", "asv", "kworker/0:1", "gone"} & set(names)


def test_a_busy_sample_is_bad_and_names_the_busiest(tmp_path):
    root, sleep, clock, _ = fake_proc(tmp_path)
    report = preflight.check(1.0, proc=str(root), sysfs=tmp_path / "nosys", nvml=_no_nvml(),
                             nvidia_gpus=str(tmp_path / "nogpus"), threads=lambda: (2, 2, None),
                             load=lambda: 0.1, pid=SELF, sleep=sleep, clock=clock)
    busy = report.findings[0]
    assert busy.check == "busy" and busy.level == "bad" and busy.busy and report.busy
    assert busy.data["others_cpu"] > busy.data["busy_above"] == 25.0  # half a core of 2, both threads busy
    assert "python3 40 % (pid " in busy.line() and "speedlib run --wait-quiet" in busy.todo
    assert report.level == "bad" and "the machine is busy" in report.summary()
    threads = next(f for f in report.findings if f.check == "threads")
    assert threads.level == "warn" and "SPEEDLIB_THREADS" in threads.todo  # 2 threads, 1 CPU free
    json.dumps(report.record())  # goes into the environment record as it is


# On 2 CPUs with 2 benchmark threads, busy from half a core (25 %), a warning from 0.1 core (5 %);
# with 1 thread, one CPU is free: busy from 1.5 cores (75 %). On 16 CPUs and 16 threads, one
# busy process (6.25 %) is already more than half a core.
@pytest.mark.parametrize("cpus, threads, others, level", [
    (2, 2, 5.0, "ok"), (2, 2, 5.5, "warn"), (2, 2, 25.0, "warn"), (2, 2, 25.5, "bad"),
    (2, 1, 50.0, "ok"), (2, 1, 55.5, "warn"), (2, 1, 75.5, "bad"), (16, 16, 6.25, "bad"), (16, None, 6.25, "bad")])
def test_busy_where_a_measured_round_would_count_as_disturbed(cpus, threads, others, level):
    finding = preflight._busy_finding(preflight.Sample(1.0, cpus, others, 0.0, []), threads)
    assert finding.level == level and finding.busy == (level != "ok")
    assert preflight.Report([finding]).busy == (level == "bad")  # only bad holds a run back
    rounds = contention.judge({"others_cpu": [others] * 9}, 9, cpus, threads)  # the same rule
    assert (rounds.state == contention.CONTENDED) == (level == "bad")


def test_steal_is_named_and_no_proc_stat_is_said_plainly():
    assert "hypervisor steal 30 %" in preflight._busy_finding(preflight.Sample(1.0, 2, 40.0, 30.0, [])).what
    assert "not checked" in preflight._busy_finding(None).what


def test_load_warns_only_above_its_threshold():
    assert preflight._load_finding(preflight.LOAD_WARN * 4 - 0.01, 4).level == "ok"
    warn = preflight._load_finding(preflight.LOAD_WARN * 4, 4)
    assert warn.level == "warn" and not warn.busy and "check again" in warn.todo
    assert preflight._load_finding(None, 4) is None


def test_threads_against_the_cpus_free():
    half_taken = preflight.Sample(1.0, 4, 25.0, 0.0, [])  # one of 4 CPUs taken
    assert preflight._threads_finding(3, 4, half_taken, None).level == "ok"
    warn = preflight._threads_finding(4, 4, half_taken, None)
    assert warn.level == "warn" and warn.data["free_cpus"] == 3 and "SPEEDLIB_THREADS" in warn.todo
    assert preflight._threads_finding(8, 4, None, None).level == "warn"  # more threads than CPUs
    bad = preflight._threads_finding(None, 4, None, "$SPEEDLIB_THREADS must be a positive integer, got 'x'")
    assert bad.level == "bad" and not bad.busy
    assert "not checked" in preflight._threads_finding(None, 4, None, None).what  # no torch


def test_a_bad_speedlib_threads_is_bad(monkeypatch):
    monkeypatch.setenv("SPEEDLIB_THREADS", "zero")
    usable, threads, error = preflight._usable_and_threads()
    assert usable >= 1 and threads is None and "SPEEDLIB_THREADS" in error


def test_a_powersave_governor_warns(tmp_path):
    for cpu in ("cpu0", "cpu1"):
        (tmp_path / cpu / "cpufreq").mkdir(parents=True)
        (tmp_path / cpu / "cpufreq" / "scaling_governor").write_text("powersave\n")
    (tmp_path / "cpufreq").mkdir()
    (tmp_path / "cpufreq" / "boost").write_text("1\n")
    finding = preflight._cpufreq_finding(preflight.cpu_frequency_policy(tmp_path))
    assert finding.level == "warn" and "governor powersave, turbo/boost on" in finding.what
    assert "performance" in finding.todo
    (tmp_path / "cpu0" / "cpufreq" / "scaling_governor").write_text("performance\n")
    (tmp_path / "cpu1" / "cpufreq" / "scaling_governor").write_text("performance\n")
    assert preflight._cpufreq_finding(preflight.cpu_frequency_policy(tmp_path)).level == "ok"


# --- /proc and sysfs readings that no kernel writes (damaged or planted) ----------------------

def test_a_process_whose_counters_no_kernel_writes_is_left_out_of_the_sample(tmp_path):
    """A 400-digit utime made an OverflowError; the process is now left out, as one that
    ended while being read, and the others are counted as before."""
    root, sleep, clock, _ = fake_proc(tmp_path)

    def sleep_then_plant(seconds):
        sleep(seconds)
        stat = root / "100" / "stat"
        stat.write_text(stat.read_text().replace(f" {round(10.8 * TICKS)} ", f" {'9' * 400} ", 1))

    sample = preflight.sample_processes(1.0, str(root), SELF, sleep_then_plant, clock)
    assert "9" * 400 in (root / "100" / "stat").read_text()  # the planted counter was read
    names = dict(sample.top)
    assert "python3" not in names and "chromium" in names


def test_a_proc_stat_whose_counters_no_kernel_writes_is_no_sample(tmp_path):
    root, sleep, clock, _ = fake_proc(tmp_path)
    (root / "stat").write_text(f"cpu  {'9' * 400} 0 0 99999 0 0 0 0 0 0\ncpu0 0\ncpu1 0\n")
    assert preflight.sample_processes(1.0, str(root), SELF, sleep, clock) is None
    assert preflight._busy_finding(None).level == "ok"  # said as not checked, never raised


@pytest.mark.parametrize("governor, shown", [("performancé", "performanc\\xc3\\xa9"),
                                             ("\x1b[2Jpowersave", "\\x1b[2Jpowersave")])
def test_a_governor_no_kernel_writes_is_recorded_escaped_and_never_raises(tmp_path, governor, shown):
    """A non-ASCII governor was a UnicodeDecodeError; an escape sequence must reach no terminal."""
    (tmp_path / "cpu0" / "cpufreq").mkdir(parents=True)
    (tmp_path / "cpu0" / "cpufreq" / "scaling_governor").write_bytes(governor.encode() + b"\n")
    (tmp_path / "cpufreq").mkdir()
    (tmp_path / "cpufreq" / "boost").write_bytes("1é\n".encode())
    policy = preflight.cpu_frequency_policy(tmp_path)
    assert policy["cpu_boost"] is False  # not the "1" that says on
    finding = preflight._cpufreq_finding(policy)
    assert printable(finding.line()) == f"cpufreq: governor {shown}, turbo/boost off"
    assert json.loads(json.dumps(policy)) == policy  # the environment record keeps it as text


def test_a_cpu_model_line_that_is_not_utf8_does_not_end_the_run(monkeypatch):
    from speedbench.measure import hardware  # noqa: PLC0415 - imports torch, which this file needs nowhere else

    def fake_open(path, encoding=None, errors=None):
        assert path == "/proc/cpuinfo"
        return io.TextIOWrapper(io.BytesIO(b"processor\t: 0\nmodel name\t: Xeon \xff Gold\n"), encoding=encoding,
                                errors=errors)

    monkeypatch.setattr(hardware, "open", fake_open, raising=False)  # found before the builtin
    assert hardware.cpu_model() == "Xeon \ufffd Gold"


# --- GPUs, through a fake NVML ---------------------------------------------------------

class FakeNvml:
    """The few pynvml calls the check makes, over made-up devices: per index a dict with
    clock (MHz), max clock, reasons (bit mask), pids computing on it, persistence (0/1)."""

    NVML_CLOCK_SM = 1

    def __init__(self, devices: list[dict]):
        self.devices = devices

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.devices[index]

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return handle["max"]

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return handle["clock"]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return handle["reasons"]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=pid) for pid in handle["pids"]]

    def nvmlDeviceGetPersistenceMode(self, handle):
        return handle["persistence"]


def _no_nvml():
    class Absent(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")
    return Absent([])


def test_gpu_findings_from_nvml(tmp_path):
    _write_proc(tmp_path, 0.0, 0.0, {4242: ("trainer", 1, 0.0, False)})
    thermal = 0x20
    nvml = FakeNvml([
        {"clock": 990, "max": 1980, "reasons": thermal, "pids": [4242, 777], "persistence": 0},
        {"clock": 345, "max": 1980, "reasons": 0x1, "pids": [], "persistence": 1},  # idle: a low clock is fine
    ])
    findings = preflight._gpu_findings(nvml, str(tmp_path / "nogpus"), str(tmp_path))
    gpu0 = [f for f in findings if f.check == "gpu0"]
    levels = {f.level for f in gpu0}
    assert levels == {"bad", "warn"}
    others = next(f for f in gpu0 if f.level == "bad")
    assert others.busy and "2 other process(es) compute on GPU 0 (trainer, pid 777)" in others.what
    assert any("software thermal slowdown" in f.what and "50 %" in f.what for f in gpu0)
    assert any("persistence mode is off" in f.what and f.todo == "sudo nvidia-smi -pm 1" for f in gpu0)
    gpu1 = [f for f in findings if f.check == "gpu1"]
    assert len(gpu1) == 1 and gpu1[0].level == "ok" and not gpu1[0].busy
    assert preflight.Report(findings).busy


def test_without_nvml_a_gpu_that_is_there_is_said_and_none_is_silence(tmp_path):
    assert preflight._gpu_findings(_no_nvml(), str(tmp_path / "absent"), str(tmp_path)) == []
    (tmp_path / "gpus" / "0000:3b:00.0").mkdir(parents=True)
    [finding] = preflight._gpu_findings(_no_nvml(), str(tmp_path / "gpus"), str(tmp_path))
    assert finding.level == "warn" and "not possible" in finding.what and "nvidia-ml-py" in finding.todo


# --- on this machine -------------------------------------------------------------------

def test_a_real_short_check_on_this_machine():
    start = time.monotonic()
    report = preflight.check(sample_s=0.3)
    assert time.monotonic() - start < 3
    checks = [f.check for f in report.findings]
    assert checks[0] == "busy" and {"cpufreq", "threads"} <= set(checks)
    assert all(f.level in preflight.LEVELS and "\n" not in f.line() for f in report.findings)
    record = json.loads(json.dumps(report.record()))
    assert record["level"] == report.level and len(record["findings"]) == len(report.findings)


def test_env_check_works_without_torch():
    """A viewer-only install: the thread check is skipped with a note, the rest runs."""
    code = ("import sys; sys.modules['torch'] = None; from speedbench import cli; "
            "sys.exit(cli.main(['env', '--check']))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 1), out.stderr
    assert "threads: not checked: PyTorch is not installed" in out.stdout
    assert out.stdout.rstrip().splitlines()[-1].startswith("pre-flight check: ")


# --- waiting ---------------------------------------------------------------------------

BUSY = preflight.Report([preflight.Finding("busy", "bad", "other processes used 90 % of the machine's 2 CPU(s) "
                                                          "over 1.0 s (stress 90 %)", "stop them or wait", True)])
QUIET = preflight.Report([preflight.Finding("busy", "ok", "other processes used 1 % of the machine's 2 CPU(s)")])


def test_the_record_says_what_was_busy_at_start():
    """The run files it with every commit's results (issue 42): the loader marks their figures by it."""
    assert BUSY.record()["busy_at_start"] == BUSY.busy_line() == BUSY.findings[0].what
    assert QUIET.record()["busy_at_start"] == ""


class FakeTime:
    def __init__(self):
        self.now = 0.0

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_waiting_says_how_it_goes_and_stops_when_quiet():
    t, said = FakeTime(), []
    reports = iter([BUSY] * 7 + [QUIET])
    report = preflight.wait_until_quiet(60, BUSY, lambda: next(reports), said.append, t.clock, t.sleep)
    assert not report.busy and t.now == 8 * preflight.PAUSE_S
    assert len(said) == 1 and said[0].startswith("still busy after 10 of 60 s: other processes")


def test_waiting_runs_out_of_time():
    t, said = FakeTime(), []
    report = preflight.wait_until_quiet(25, BUSY, lambda: BUSY, said.append, t.clock, t.sleep)
    assert report.busy and t.now == 25
    assert [line.split(":")[0] for line in said] == ["still busy after 10 of 25 s", "still busy after 20 of 25 s"]
    with pytest.raises(ValueError, match="positive number"):
        preflight.wait_until_quiet(0, BUSY)


# --- the command line ------------------------------------------------------------------

@pytest.mark.parametrize("report, status", [(QUIET, 0), (BUSY, 1)])
def test_env_check_prints_every_finding_and_exits_1_when_something_is_bad(report, status, monkeypatch, capsys):
    monkeypatch.setattr(preflight, "check", lambda: report)
    assert cli.main(["env", "--check"]) == status
    out = capsys.readouterr().out.splitlines()
    assert out[:-1] == [f"{f.level:<4}  {f.line()}" for f in report.findings]
    assert out[-1] == report.summary()


def test_help_names_the_new_options_and_exit_status(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    out = capsys.readouterr().out
    assert "--require-quiet" in out and "--wait-quiet SECONDS" in out
    with pytest.raises(SystemExit):
        cli.main(["env", "--help"])
    out = capsys.readouterr().out
    assert "--check" in out and "  1  --check found something bad" in out


@pytest.fixture
def measuring(monkeypatch):
    """`speedlib run --quick` in this checkout with asv stood in: the env each commit would
    record. Nothing is measured, no stale scratch is pruned."""
    from speedbench.measure import hardware  # noqa: PLC0415 - torch, only for this test: the rest of the file needs none

    recorded = []
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(suite, "prune_stale", lambda root: [])
    monkeypatch.setattr(hardware, "environment", lambda: {"machine": "m"})
    monkeypatch.setattr(suite, "_register_machine", lambda *a, **k: None)
    monkeypatch.setattr(suite, "_run_commit",
                        lambda options, root, conf, results, machine, env, *a: recorded.append(env) or [])
    monkeypatch.setattr(suite, "_print_table", lambda *a, **k: None)
    return recorded


def _fake_waiting(monkeypatch, reports):
    t = FakeTime()
    monkeypatch.setattr(preflight, "check", lambda: next(reports))
    monkeypatch.setattr(preflight, "wait_until_quiet",
                        functools.partial(preflight.wait_until_quiet, clock=t.clock, sleep=t.sleep))


def test_run_refuses_a_busy_machine_with_require_quiet(measuring, monkeypatch, capsys):
    monkeypatch.setattr(preflight, "check", lambda: BUSY)
    assert cli.main(["run", "--quick", "--require-quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the machine is busy (other processes used 90 %" in err
    assert "--require-quiet refuses" in err and "--wait-quiet SECONDS" in err
    assert measuring == []  # nothing was measured


def test_run_on_a_busy_machine_goes_on_with_a_warning_and_records_the_check(measuring, monkeypatch, capsys):
    monkeypatch.setattr(preflight, "check", lambda: BUSY)
    assert cli.main(["run", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "speedlib run: bad: busy: other processes used 90 %" in out and "measuring anyway" in out
    [env] = measuring
    assert env["preflight"]["busy"] is True and env["preflight"]["findings"][0]["check"] == "busy"


def test_wait_quiet_waits_then_measures(measuring, monkeypatch, capsys):
    _fake_waiting(monkeypatch, iter([BUSY] * 6 + [QUIET]))
    assert cli.main(["run", "--quick", "--require-quiet", "--wait-quiet", "60"]) == 0
    out = capsys.readouterr().out
    assert "waiting up to 60 s for the machine to settle" in out and "still busy after 10 of 60 s" in out
    assert "the machine is quiet now" in out
    assert measuring[0]["preflight"]["busy"] is False


def test_wait_quiet_that_runs_out(measuring, monkeypatch, capsys):
    _fake_waiting(monkeypatch, iter([BUSY] * 100))
    assert cli.main(["run", "--quick", "--require-quiet", "--wait-quiet", "25"]) == 2
    captured = capsys.readouterr()
    assert captured.out.count("still busy after") == 2
    assert "still busy after --wait-quiet 25 s" in captured.err and measuring == []
    _fake_waiting(monkeypatch, iter([BUSY] * 100))
    assert cli.main(["run", "--quick", "--wait-quiet", "25"]) == 0  # without --require-quiet: measured anyway
    assert "still busy after --wait-quiet 25 s; measuring anyway" in capsys.readouterr().out
    assert len(measuring) == 1


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf"])
def test_a_bad_wait_quiet_is_refused_in_one_line(value, monkeypatch, capsys):
    monkeypatch.setattr(suite, "run", lambda *a, **k: pytest.fail("the run started"))
    assert cli.main(["run", "--wait-quiet", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--wait-quiet must be a positive, finite number of seconds" in err


def test_records_with_and_without_the_check_load_alike(tmp_path):
    """Old environment records have no `preflight`; new ones do. Both load, with no problem."""
    synthetic.write_results(tmp_path, commits=2, machines=1)
    records = sorted(tmp_path.glob("*/environment/*.jsonl"))
    lines = records[0].read_text().splitlines()
    checked = [json.dumps({**json.loads(line), "preflight": preflight.Report([BUSY.findings[0]]).record()})
               for line in lines]
    records[0].write_text("\n".join(checked) + "\n")
    loaded = load_results(tmp_path)
    assert loaded.problems == [] and not loaded.measured.empty
    assert loaded.measured["gpu"].ne("unknown").all()  # every row still has its record
