"""`speedlib slot` checks everything it will write before its first GPU second (issue 54): a
planted verdict path (a link, a directory, a FIFO, a device), a gpu-tests that is a file, an
archive that is a FIFO or lies among the results, a name too long; and its --minutes within a
clear bound. Each is one line, exit 2, and the GPU tests never start."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from speedbench.cli import parser as cli
from speedbench.run import slot, suite

SHA = "a" * 40
ABOUT = {"commit": SHA, "machine": "m", "started_at": 1, "duration_s": 1.0, "command": "python3 -m pytest -m gpu",
         "torch": "2.14.1", "gpu": None}


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A slot on a results tree `results/` (machine m, commit SHA) whose GPU tests fail the test if they start."""
    from speedbench.measure import hardware  # noqa: PLC0415 - torch: only these tests need the identity stubbed

    results = tmp_path / "results"
    (results / "m").mkdir(parents=True)
    (tmp_path / suite.CONFIG).write_text("{}")
    archive = tmp_path / "out" / "slot.tar.gz"
    monkeypatch.setattr(slot, "_check", lambda options, root: suite.RunOptions(allow_dirty=True,
                                                                                archive=options.archive))
    monkeypatch.setattr(suite, "resolve_commits", lambda root, commits: [SHA])
    monkeypatch.setattr(suite, "_check_machine", lambda *a: None)
    monkeypatch.setattr(suite, "_results_dir", lambda *a: results)
    monkeypatch.setattr(hardware, "identity", lambda: {"machine": "m"})
    monkeypatch.setattr(slot, "gpu_tests", lambda *a: pytest.fail("the GPU tests started"))
    return tmp_path, results, archive


def refused(tmp_path: Path, archive: Path) -> str:
    began = time.monotonic()
    with pytest.raises(suite.SuiteError) as e:
        slot.run(slot.SlotOptions(archive, allow_dirty=True), root=tmp_path)
    assert time.monotonic() - began < 30  # a FIFO's open would wait for a reader
    assert "\n" not in str(e.value)
    return str(e.value)


def verdict(results: Path) -> Path:
    return results / "m" / "gpu-tests" / f"{SHA[:8]}.json"


@pytest.mark.parametrize("kind", ["link", "directory", "fifo", "device"])
def test_a_planted_verdict_path_is_refused_before_the_gpu_tests(planted, kind):
    tmp_path, results, archive = planted
    path = verdict(results)
    path.parent.mkdir(parents=True)
    if kind == "link":
        path.symlink_to(tmp_path / "elsewhere.json")
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's
    said = refused(tmp_path, archive)
    assert f"{SHA[:8]}.json" in said and "nothing was run or changed" in said and "free some space" not in said
    assert not archive.exists()


def test_a_gpu_tests_file_where_its_directory_goes_is_refused_before_the_gpu_tests(planted):
    tmp_path, results, archive = planted
    (results / "m" / "gpu-tests").write_text("")
    assert "is a file where a directory goes" in refused(tmp_path, archive)


def test_an_archive_that_is_a_fifo_is_refused_at_once(planted):
    tmp_path, results, archive = planted
    archive.parent.mkdir()
    os.mkfifo(archive)
    said = refused(tmp_path, archive)
    assert said == (f"--archive {archive} is a FIFO: opening it waits until something reads it, and the slot must "
                    "end within its minutes; name a file")


def test_an_archive_among_the_results_is_refused_before_the_gpu_tests(planted):
    tmp_path, results, _ = planted
    assert "is inside the results tree" in refused(tmp_path, results / "m" / "slot.tar.gz")


@pytest.mark.parametrize("minutes", ["1e9", "inf", "nan", "-1", "0", "1441", "soon"])
def test_minutes_out_of_bounds_are_one_line(minutes, capsys, monkeypatch):
    monkeypatch.setattr(slot, "run", lambda *a, **k: pytest.fail("the slot started"))
    assert cli.main(["slot", "--archive", "a.tar.gz", "--minutes", minutes]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("speedlib slot: --minutes must be a number of minutes above 0 and at most 1440 (a day), got ")


def test_a_deadline_within_the_bound_arms_its_timer():
    with slot._Deadline(time.monotonic() + slot.MAX_MINUTES * 60) as timer:  # 1e9 minutes overflowed this timer
        assert not timer.hit


def test_an_archive_name_too_long_is_one_line(tmp_path, capsys):
    long = str(tmp_path / ("a" * 300 + ".tar.gz"))
    assert cli.main(["slot", "--archive", long, "--minutes", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "bytes long, over the 255" in err


@pytest.mark.parametrize("rel", ["benchmarks.json", "m/machine.json", "m/chunk-times.jsonl"])
def test_a_fifo_where_the_run_writes_is_refused_before_the_gpu_tests(planted, rel):
    tmp_path, results, archive = planted
    os.mkfifo(results / rel)  # asv (or the chunk times) would wait on it, past the slot's end
    assert "is a directory or special file where a file goes" in refused(tmp_path, archive)


def test_a_listing_that_is_a_fifo_is_refused_by_the_plan_not_skipped(tmp_path):
    from speedbench.run import plan  # noqa: PLC0415 - pandas, as the run loads it

    results = tmp_path / "results"
    results.mkdir()
    os.mkfifo(results / "benchmarks.json")
    with pytest.raises(plan.PlanError, match="is not a regular file"):
        plan.benchmark_listing(tmp_path, results)  # it priced from the checkout's listing without a word
