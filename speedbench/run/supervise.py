"""Run one command so that nothing it starts outlives it: `python supervise.py LEADER -- CMD...`.

Why: asv starts every benchmark process through a helper that gives it a process group
of its own (so asv can kill it on a timeout). Stopping asv, or asv's process group, therefore
leaves the benchmark running: on a GPU it keeps the device busy and writes results nobody
packs. Killing "the group" cannot work; killing "the tree" can, provided the tree stays
connected while it is being killed.

This file is run as a script by `speedbench.run.suite` (no speedbench import: it must start fast
and work in any interpreter). It
- marks itself a child subreaper (Linux prctl), so any process of the tree whose parent dies
  (asv, once signalled) is re-parented to this supervisor instead of to init: the tree can
  still be walked from here;
- asks the kernel for SIGTERM when LEADER (the speedlib process) dies, even by SIGKILL;
- on SIGTERM/SIGINT, or when the command ends, stops every descendant: SIGTERM first, so
  torchrun's agent can stop its own workers, then SIGKILL for whatever is left after the
  grace period, and reaps them all;
- exits with the command's status (128 + N when the command died of signal N, or when the
  supervisor itself was stopped by signal N).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 10.0  # how long descendants get to exit on SIGTERM before SIGKILL
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class Stopped(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False  # not Linux: only the direct child can be stopped


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send this process `signum` when its parent dies, even by SIGKILL
    (Linux prctl; False elsewhere). Also a child's preexec_fn uses it (speedlib dashboard)."""
    return _prctl(_PR_SET_PDEATHSIG, signum)


def descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of `root`, read from /proc; parents before children."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name is in parentheses and may itself hold ") "; split at the last one.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _reap() -> None:
    """Collect exited children (orphans re-parented here included) so they leave no zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_tree(grace: float = GRACE_S) -> None:
    """SIGTERM every descendant (newcomers too) for up to `grace` seconds, then SIGKILL the rest."""
    me = os.getpid()
    signalled: set[int] = set()
    deadline = time.monotonic() + grace
    while True:
        _reap()
        alive = descendants(me)
        if not alive:
            return
        late = time.monotonic() >= deadline
        for pid in alive:
            if late or pid not in signalled:
                try:
                    os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
                except ProcessLookupError:
                    pass
                signalled.add(pid)
        time.sleep(0.05)


def _raise_stopped(signum: int, frame) -> None:
    raise Stopped(signum)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: supervise.py LEADER_PID -- COMMAND...", file=sys.stderr)
        return 2
    leader, cmd = int(argv[0]), argv[2:]
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _raise_stopped)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    die_with_parent(signal.SIGTERM)
    status = None
    try:
        if os.getppid() != leader:  # the leader died before the death signal was armed
            raise Stopped(signal.SIGTERM)
        child = subprocess.Popen(cmd)
        while status is None:
            # Wait for any child: orphans re-parented here are reaped on the way.
            pid, raw = os.waitpid(-1, 0)
            if pid == child.pid:
                status = os.waitstatus_to_exitcode(raw)
                status = 128 - status if status < 0 else status
    except Stopped as stop:
        status = 128 + stop.signum
    except FileNotFoundError as exc:
        print(f"supervise.py: cannot run {cmd[0]}: {exc}", file=sys.stderr)
        status = 127
    finally:
        # Ignore further signals while the tree is being stopped: a second Ctrl+C or
        # SIGTERM must not leave it half-stopped.
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        stop_tree()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
