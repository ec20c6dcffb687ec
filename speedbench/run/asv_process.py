"""asv as a `speedlib run` starts it: under the supervisor (speedbench/run/supervise.py), with a
temporary directory of its own, and stopped with everything it started when the run is
stopped (SIGINT, SIGTERM: `Interrupted`).

Apart from speedbench/run/suite.py (which re-exports these names) because it is process and
signal handling, and reads on its own: what `_asv` starts and how it is stopped, not what
asv is asked to measure. Tests stand in for asv by patching `suite._asv`: suite.py calls
it through its own name, so keep calling it from there.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from speedbench.run import supervise
from speedbench.run.checkout import _claim
from speedbench.run.errors import SuiteError


class Interrupted(SuiteError):
    """SIGINT or SIGTERM stopped the run; asv and its benchmark processes were stopped too."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}: asv and its benchmarks were stopped; "
                         "results of finished chunks and commits are kept")
        self.signum = signum


# asv runs under this supervisor; see its docstring for why stopping asv's process group
# is not enough (asv gives every benchmark process a group of its own).
_SUPERVISE = Path(supervise.__file__)


def _asv(args: list[str], *, env: dict | None = None, cwd: Path, failures_ok: bool = False) -> int:
    """asv's exit status: 0, or 2 when `failures_ok` (`asv run`: some benchmark failed, the
    results were saved). Any other status means asv itself failed, and raises.

    When this run is stopped (Ctrl+C, a SIGTERM from a time limit, even a SIGKILL), asv and
    every process it started are stopped with it instead of running on, holding the GPU and
    writing results nobody packs."""
    cmd = [sys.executable, "-m", "asv", *args]
    # asv and its benchmarks leave files in $TMPDIR, stopped or not (the forkserver's socket
    # directory, benchmark working directories, torchrun's error files): they get a directory
    # of this run's, removed once the supervisor has stopped them all. After a SIGKILL the
    # next run's prune_stale removes it (its owner file says whose it was).
    with tempfile.TemporaryDirectory(prefix="speedlib-asv-", ignore_cleanup_errors=True) as tmp:
        _claim(Path(tmp))
        env = dict(os.environ if env is None else env)
        if len(os.fsencode(tmp)) <= _TMPDIR_MAX:
            env["TMPDIR"] = tmp
        # The supervisor gets a process group of its own so that a terminal's Ctrl+C reaches
        # speedlib alone, which then stops the supervisor in order. asv's own per-benchmark
        # progress lines stream straight through.
        proc = subprocess.Popen([sys.executable, str(_SUPERVISE), str(os.getpid()), "--", *cmd],
                                cwd=cwd, env=env, process_group=0)
        try:
            returncode = proc.wait()
        except BaseException:
            _stop_supervisor(proc)
            raise
    if returncode != 0 and not (failures_ok and returncode == 2):
        raise SuiteError(f"asv exited with status {returncode}: {shlex.join(cmd)}")
    return returncode


# asv's forkserver listens on $TMPDIR/asv-forkserver-XXXXXXXX/socket, and a Unix socket's path
# holds at most 107 bytes: under a TMPDIR so long that the directory above would overflow it,
# asv keeps the caller's.
_TMPDIR_MAX = 107 - len("/asv-forkserver-XXXXXXXX/socket")


def _stop_supervisor(proc: subprocess.Popen) -> None:
    """SIGTERM the supervisor, which stops asv's whole tree; SIGKILL its group if it hangs."""
    try:
        proc.terminate()
        proc.wait(timeout=supervise.GRACE_S + 10)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


_STOPPING = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stopped_by_signals():
    """While the run lasts, SIGINT and SIGTERM raise Interrupted. Only the main thread may set
    handlers: elsewhere the caller's stay. Inside a block that set them already (`speedlib run`
    sets them on its first line, before the suite loads) they stay as that block left them: a
    second signal still only says to wait."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) in (_raise_interrupted, _still_stopping):
        yield
        return
    previous = {signum: signal.signal(signum, _raise_interrupted) for signum in _STOPPING}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _raise_interrupted(signum: int, frame) -> None:
    # The first signal stops the run. Stopping asv (up to its grace period) and removing the
    # worktrees and scratch take a while; a second Ctrl+C raised in the middle of that would
    # cut the cleanup short and leave asv running. From here on both only say to wait.
    for each in _STOPPING:
        signal.signal(each, _still_stopping)
    raise Interrupted(signum)


def _still_stopping(signum: int, frame) -> None:
    try:  # os.write, not print: the code this interrupts may be inside a print to stderr
        os.write(2, f"speedlib run: still stopping asv and removing the run's scratch (up to "
                    f"{supervise.GRACE_S + 10:.0f} s)\n".encode())
    except OSError:
        pass
