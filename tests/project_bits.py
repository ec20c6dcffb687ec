"""A scratch copy of this project for end-to-end runs of the `speedlib` command (the CLI,
contention and slot tests use it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home)}  # asv keeps its machine file in $HOME
    return subprocess.run([sys.executable, "-m", "speedbench.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def registered_machine(out: subprocess.CompletedProcess) -> str:
    """The asv machine name the run announced: it depends on the hardware (cpu-2core-intel-xeon, h100-sxm-80gb)."""
    return re.search(r"^speedlib run: machine (\S+), ", out.stdout, flags=re.M).group(1)


def copy_project(repo: Path) -> None:
    for name in ("speedlib", "speedbench", "benchmarks"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "asv.conf.json", repo)
    git(repo, "init", "-q", "-b", "main")


def commit_all(repo: Path, message: str) -> None:
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)
