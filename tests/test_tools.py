"""The scripts under tools/ that the docs cite still run (at a small size)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_checkpoint_watch_cost_runs_its_three_variants_at_a_small_size():
    """docs/techniques/checkpoint.md cites it; it swaps the watch classes where the checkpoint
    builds them, so a move of those classes breaks this test rather than the tool."""
    out = subprocess.run([sys.executable, "tools/checkpoint_watch_cost.py", "1", "1", "10"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["shipped / no generator watch", "shipped / neither"]
    assert all("batch 1, depth 10, N=1" in line for line in lines)


def test_checkpoint_watch_cost_refuses_bad_arguments_in_one_line():
    out = subprocess.run([sys.executable, "tools/checkpoint_watch_cost.py", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "usage:" in out.stderr
