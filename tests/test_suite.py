"""speedlib.suite.failed_benchmarks: which benchmarks of this run asv recorded as failed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import speedlib
from speedlib import suite

SHA = "0123456789abcdef" * 2 + "01234567"
COLUMNS = ["result", "params", "version", "started_at", "duration"]


def write(tmp_path, results: dict, sha: str = SHA) -> None:
    machine = tmp_path / "m"
    machine.mkdir(exist_ok=True)
    data = {"commit_hash": sha, "result_columns": COLUMNS, "results": results, "version": 2}
    (machine / f"{sha[:8]}-existing-py.json").write_text(json.dumps(data))


def test_failed_benchmarks_of_this_run_only(tmp_path):
    write(tmp_path, {
        "b.S.track_ok": [[1.0], [], "v", 2000, 0.1],
        "b.S.track_broken": [None, [], "v", 2000, 0.1],  # null, not a list: failed before any value
        "b.S.track_some": [[1.0, None, float("nan")], [["1", "2", "3"]], "v", 2000, 0.1],  # NaN is a skip
        "b.S.track_earlier": [None, [], "v", 999, 0.1],  # failed in an earlier run of this commit
    })
    assert suite.failed_benchmarks(tmp_path, "m", SHA, since_ms=1000) == [
        f"{SHA[:8]} b.S.track_broken",
        f"{SHA[:8]} b.S.track_some for 1 of 3 parameter sets: (2)",
    ]
    assert f"{SHA[:8]} b.S.track_earlier" in suite.failed_benchmarks(tmp_path, "m", SHA)
    assert suite.failed_benchmarks(tmp_path, "m", "f" * 40) == []
    assert suite.failed_benchmarks(tmp_path, "m", SHA[:8] + "f" * 32) == []  # same prefix, other commit


def test_failed_benchmark_names_are_escaped(tmp_path):
    # Benchmark code chooses names and parameter reprs: they must not restyle the terminal or add lines.
    write(tmp_path, {"b.S.track_\x1b[2J": [[None], [["'a\nb'"]], "v", 1, 0.1]})
    (line,) = suite.failed_benchmarks(tmp_path, "m", SHA)
    assert line == f"{SHA[:8]} b.S.track_\\x1b[2J for 1 of 1 parameter sets: ('a\\nb')"
    assert line.isprintable()


def test_python_dash_m_runs_the_cli_without_a_console_script(tmp_path):
    """An offline GPU host may have the source tree on PYTHONPATH and no installed script."""
    root = Path(__file__).resolve().parents[1]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "speedlib", "--version"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert speedlib.__version__ in out.stdout
