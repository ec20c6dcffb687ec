"""The supervisor that asv runs under: nothing asv starts may outlive a stopped run.

asv gives each benchmark process a process group of its own, so these trees put a
grandchild in a new group or session on purpose: stopping a group would miss it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speedbench.run import supervise

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(),
                                reason="the supervisor walks the process tree through Linux's /proc")

SUPERVISE = str(Path(supervise.__file__))


def _alive_with(token: str) -> list[int]:
    """Live processes whose command line holds `token` (a zombie's command line is empty)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return [p for p in pids if p != os.getpid()]


def _wait_for(check, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.1)
    return check()


def _tree(token: str, *, then_exit: bool = False) -> list[str]:
    """A stand-in for asv: a child in a new session (as asv's benchmark processes are in a
    new group) which starts a grandchild of its own; all carry `token`."""
    grandchild = f"import time; time.sleep(300)  # {token}"
    child = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {grandchild!r}]); "
             f"time.sleep(300)  # {token}")
    stand_in = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}], "
                f"start_new_session=True); time.sleep({0 if then_exit else 300})  # {token}")
    return [sys.executable, "-c", stand_in]


@pytest.mark.parametrize("code", [0, 2, 3])
def test_the_commands_exit_status_is_the_supervisors(code):
    cmd = [sys.executable, SUPERVISE, str(os.getpid()), "--", sys.executable, "-c", f"raise SystemExit({code})"]
    assert subprocess.run(cmd, timeout=60).returncode == code


def test_a_command_killed_by_a_signal_reads_as_128_plus_the_signal():
    cmd = [sys.executable, SUPERVISE, str(os.getpid()), "--", sys.executable, "-c",
           "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    assert subprocess.run(cmd, timeout=60).returncode == 128 + signal.SIGKILL


def test_a_missing_command_and_bad_usage_are_refused():
    missing = subprocess.run([sys.executable, SUPERVISE, str(os.getpid()), "--", "/no/such/program"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 127 and "/no/such/program" in missing.stderr
    usage = subprocess.run([sys.executable, SUPERVISE, "1"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage" in usage.stderr


def test_sigterm_stops_descendants_in_other_sessions(tmp_path):
    token = f"supervised-{tmp_path.name}-term"
    proc = subprocess.Popen([sys.executable, SUPERVISE, str(os.getpid()), "--", *_tree(token)])
    try:
        assert _wait_for(lambda: len(_alive_with(token)) == 4), "the stand-in tree never came up"  # with the supervisor
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert _wait_for(lambda: not _alive_with(token), 20) and _alive_with(token) == []
    finally:
        for pid in _alive_with(token):
            os.kill(pid, signal.SIGKILL)


def test_descendants_left_behind_by_a_finished_command_are_stopped(tmp_path):
    """The stand-in exits at once, orphaning its session-leading child: the supervisor, a
    subreaper, still finds and stops it, and reports the command's own status."""
    token = f"supervised-{tmp_path.name}-orphan"
    try:
        done = subprocess.run([sys.executable, SUPERVISE, str(os.getpid()), "--", *_tree(token, then_exit=True)],
                              timeout=60)
        assert done.returncode == 0
        assert _wait_for(lambda: not _alive_with(token), 20) and _alive_with(token) == []
    finally:
        for pid in _alive_with(token):
            os.kill(pid, signal.SIGKILL)


def test_a_leader_killed_outright_takes_the_whole_tree_with_it(tmp_path):
    """SIGKILL gives speedlib no chance to unwind: the kernel's death signal reaches the
    supervisor, which stops the tree, the grandchild in its own session included."""
    token = f"supervised-{tmp_path.name}-leader"
    leader = (f"import os, subprocess, sys, time; "
              f"subprocess.Popen([sys.executable, {SUPERVISE!r}, str(os.getpid()), '--', *{_tree(token)!r}], "
              f"process_group=0); time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", leader])
    try:
        # leader, supervisor, tree
        assert _wait_for(lambda: len(_alive_with(token)) == 5), "the stand-in tree never came up"
        proc.kill()
        proc.wait()
        assert _wait_for(lambda: not _alive_with(token), 20) and _alive_with(token) == []
    finally:
        for pid in _alive_with(token):
            os.kill(pid, signal.SIGKILL)


def test_descendants_that_ignore_sigterm_are_killed_after_the_grace_period(tmp_path):
    token = f"supervised-{tmp_path.name}-stubborn"
    stubborn = f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)  # {token}"
    script = tmp_path / "stop.py"
    script.write_text(f"""
import subprocess, sys, time
sys.path.insert(0, {str(Path(SUPERVISE).parent)!r})
import supervise
subprocess.Popen([sys.executable, "-c", {stubborn!r}], start_new_session=True)
time.sleep(2)  # let it install its handler
start = time.monotonic()
supervise.stop_tree(grace=1.0)
print(round(time.monotonic() - start, 1))
""")
    try:
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert 1.0 <= float(out.stdout) < 20, "SIGKILL came before the grace period ended, or never"
        assert _alive_with(token) == []
    finally:
        for pid in _alive_with(token):
            os.kill(pid, signal.SIGKILL)


def test_descendants_lists_parents_before_children(tmp_path):
    token = f"supervised-{tmp_path.name}-list"
    proc = subprocess.Popen(_tree(token))
    try:
        assert _wait_for(lambda: len(_alive_with(token)) == 3)
        found = supervise.descendants(proc.pid)
        assert sorted(found) == sorted(p for p in _alive_with(token) if p != proc.pid)
        child = next(p for p in found if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]
                     == str(proc.pid))
        assert found.index(child) == 0
    finally:
        proc.kill()
        proc.wait()
        for pid in _alive_with(token):
            os.kill(pid, signal.SIGKILL)
