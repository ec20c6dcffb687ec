"""A one-node Slurm cluster in a temporary directory, for tests/harness/run/test_slurm.py.

munged, slurmctld and slurmd run as this user (root in CI) in the foreground, each in a
process group of its own, with every file (key, sockets, state, spool, logs) under one
directory and free ports; client commands find it through $SLURM_CONF. No cgroups, no
accounting: ProctrackType=proctrack/linuxproc, TaskPlugin=task/none.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "sinfo", "squeue", "scontrol", "scancel")


class ClusterError(RuntimeError):
    """The cluster could not start; the message ends with the daemons' log tails."""


def missing_binaries() -> list[str]:
    return [name for name in (*DAEMONS, *CLIENTS) if _which(name) is None]


def _which(name: str) -> str | None:
    # the daemons live in /usr/sbin, which a non-root PATH often leaves out
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.procs: dict[str, subprocess.Popen] = {}
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- set-up -------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> None:
        try:
            self._start_munge()
            self._write_conf()
            for daemon in ("slurmctld", "slurmd"):
                args = [_which(daemon), "-D", "-f", str(self.conf)]
                if daemon == "slurmd":
                    args += ["-N", self.node]
                self._spawn(daemon, args)
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise

    def _start_munge(self) -> None:
        key, self.munge_socket = self.root / "munge.key", self.root / "munge.socket"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn("munged", [_which("munged"), "-F", "-f", f"--key-file={key}", f"--socket={self.munge_socket}",
                               f"--pid-file={self.root / 'munged.pid'}", f"--log-file={self.root / 'munged.log'}",
                               f"--seed-file={self.root / 'munged.seed'}"])
        self._wait(lambda: self.munge_socket.exists(), 20, "munged did not create its socket")

    def _write_conf(self) -> None:
        for d in ("state", "spool"):
            (self.root / d).mkdir(exist_ok=True)
        user = _user()
        lines = {
            "ClusterName": "speedlibtest",
            "SlurmctldHost": f"{self.node}(127.0.0.1)",
            "SlurmctldPort": _free_port(),
            "SlurmdPort": _free_port(),
            "SlurmUser": user,
            "SlurmdUser": user,
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "StateSaveLocation": self.root / "state",
            "SlurmdSpoolDir": self.root / "spool",
            "SlurmctldPidFile": self.root / "slurmctld.pid",
            "SlurmdPidFile": self.root / "slurmd.pid",
            "SlurmctldLogFile": self.root / "slurmctld.log",
            "SlurmdLogFile": self.root / "slurmd.log",
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/filetxt",
            "JobCompLoc": self.root / "jobcomp.txt",
            "MpiDefault": "none",
            "ReturnToService": 2,
            "MinJobAge": 3600,
            "SchedulerType": "sched/backfill",
            "SlurmdTimeout": 300,
        }
        text = "".join(f"{k}={v}\n" for k, v in lines.items())
        text += (f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN\n"
                 f"PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP\n")
        self.conf.write_text(text)

    def _spawn(self, name: str, args: list[str]) -> None:
        out = open(self.root / f"{name}.stdout", "wb")
        self.procs[name] = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True, cwd=self.root)
        out.close()

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ClusterError(f"{name} exited with status {proc.returncode}{self.log_tails()}")
            if ready():
                return
            time.sleep(0.3)
        raise ClusterError(f"{what} within {timeout:.0f} s{self.log_tails()}")

    def _wait_idle(self, timeout: float) -> None:
        def idle() -> bool:
            out = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
            return out.returncode == 0 and out.stdout.strip().rstrip("*") == "idle"
        self._wait(idle, timeout, f"sinfo did not show node {self.node} idle")

    # -- use ----------------------------------------------------------------------------
    def run(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([_which(args[0]), *args[1:]], env=self.env, capture_output=True, text=True,
                              check=check, timeout=60, **kw)

    def log_tails(self, lines: int = 15) -> str:
        tails = []
        for name in ("munged.log", "munged.stdout", "slurmctld.log", "slurmctld.stdout", "slurmd.log",
                     "slurmd.stdout"):
            path = self.root / name
            if path.is_file():
                text = path.read_text(errors="replace").strip().splitlines()[-lines:]
                if text:
                    tails.append(f"--- {name}:\n" + "\n".join(text))
        return ("\n" + "\n".join(tails)) if tails else ""

    def job_state(self, job_id: str) -> dict[str, str]:
        """Per job id in `scontrol show job` (an array: one per task), its JobState and ExitCode."""
        out = self.run("scontrol", "-o", "show", "job", job_id, check=False)
        states = {}
        for line in out.stdout.splitlines():
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            job = (f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}" if "ArrayTaskId" in fields
                   else fields.get("JobId", "?"))  # an array task has a JobId of its own
            states[job] = (
                fields.get("JobState", "?"), fields.get("ExitCode", "?"))
        return states

    # -- tear-down ----------------------------------------------------------------------
    def stop(self) -> None:
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            self.run("scancel", "--full", "--user", _user(), check=False)
            time.sleep(1)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None:
                continue
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.procs.clear()


def _user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name
