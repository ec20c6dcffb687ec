"""`speedlib slurm`: the suite as a Slurm job array, then a merge job.

The fast tests need no Slurm: they read the scripts, run them under bash with a fake
Python and a fake sbatch that record their arguments. The end-to-end test starts a real
one-node cluster (tests/slurm_cluster.py) where slurmctld, slurmd and munged are installed,
submits a three-chunk suite to it and reads the merged results with `speedlib report` and
`asv publish`. Without those binaries, or when the cluster cannot start, it skips, saying
why (with the daemons' log tails), unless SPEEDLIB_REQUIRE_SLURM=1 (CI), where it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from speedbench.cli import parser as cli
from speedbench.results.load import load_results
from speedbench.run import plan, slurm

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests"))  # slurm_cluster.py
import slurm_cluster  # noqa: E402 - found through the line above

REQUIRE = os.environ.get("SPEEDLIB_REQUIRE_SLURM") == "1"
MACHINE = "slurm-test"
# Spaces, quotes, a dollar, a backtick and a glob in every path the scripts name.
HOSTILE = "sh ared 'q' \"d\" $HOME `x` * 100%s"  # % : a printf format must never hold a path

TINY = {
    "bench_a.py": ("class A:\n    def track_one(self):\n        return 1\n\n"
                   "    def track_two(self):\n        return 2\n"),
    "bench_b.py": ("class B:\n    params = [1, 2]\n    param_names = ['size']\n\n"
                   "    def track_n(self, size):\n        return size\n"),
    "bench_c.py": "class C:\n    def track_c(self):\n        return 3\n",
    "chunks.py": ('CHUNKS = (\n    ("first", "bench_a", (r"bench_a\\.",)),\n'
                  '    ("second", "bench_b", (r"bench_b\\.",)),\n    ("rest", "the rest", (r"",)),\n)\n'),
    "__init__.py": "",
}
# The listing a run writes first thing; committed, so that the chunks can be priced before any run.
LISTING = {"bench_a.A.track_one": {"params": []}, "bench_a.A.track_two": {"params": []},
           "bench_b.B.track_n": {"params": [["1", "2"]]}, "bench_c.C.track_c": {"params": []}, "version": 2}
CHUNK_NAMES = ["first", "second", "rest"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def suite_repo(tmp_path_factory) -> Path:
    """A committed checkout of this harness with a three-chunk suite that runs in seconds."""
    repo = tmp_path_factory.mktemp("suite") / "check out 'x'"
    for name in ("speedlib", "speedbench"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "asv.conf.json", repo)
    for name, text in TINY.items():
        (repo / "benchmarks").mkdir(exist_ok=True)
        (repo / "benchmarks" / name).write_text(text)
    (repo / "results").mkdir()
    (repo / "results" / "benchmarks.json").write_text(json.dumps(LISTING))
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "tiny suite")
    return repo


def slurm_cli(*args: str, cwd: Path, monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.chdir(cwd)
    status = cli.main(["slurm", *args])
    out = capsys.readouterr()
    return status, out.out, out.err


# --- fakes ------------------------------------------------------------------------------

FAKE = """#!/bin/bash
# records its arguments (one JSON list a line) and its working directory
{python} -c 'import json, os, sys; print(json.dumps([os.getcwd(), *sys.argv[1:]]))' "$@" >> {log}
{body}
"""


def fake(path: Path, log: Path, body: str = "") -> Path:
    path.write_text(FAKE.format(python=sys.executable, log=json.dumps(str(log)), body=body))
    path.chmod(0o755)
    return path


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch) -> Path:
    """An sbatch on PATH that answers --parsable with job ids 100, 101, ... (the second with a cluster)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "sbatch.log"
    counter = tmp_path / "sbatch.count"
    counter.write_text("100")
    fake(bindir / "sbatch", log, f'n=$(cat {counter}); echo $((n + 1)) > {counter}; '
                                 'if [ "$n" = 100 ]; then echo "$n"; else echo "$n;cluster"; fi')
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return log


# --- fast tests: no Slurm -------------------------------------------------------------------

def test_time_limit_is_the_longest_chunk_with_headroom_and_a_floor():
    assert slurm.time_limit_minutes([10.0, 20.0]) == slurm.FLOOR_MINUTES
    assert slurm.time_limit_minutes([600.0, 1200.0]) == 33  # 1200 x 1.5 + 180 = 1980 s
    assert slurm.time_limit_minutes([1200.5]) == 34  # rounded up


def test_dry_run_writes_quoted_scripts_with_one_task_per_chunk(suite_repo, tmp_path, monkeypatch, capsys):
    shared, into = tmp_path / HOSTILE, tmp_path / f"into {HOSTILE}"
    status, out, err = slurm_cli("--shared", str(shared), "--machine", MACHINE, "--into", str(into),
                                 "--gres", "gpu:h100:1", "--partition", "gpu", "--account", "lab",
                                 cwd=suite_repo, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0, err
    array = (shared / "array.sh").read_text()
    assert "#SBATCH --array=0-2\n" in array and "#SBATCH --gres=gpu:h100:1\n" in array
    assert "#SBATCH --partition=gpu\n" in array and "#SBATCH --account=lab\n" in array
    assert "CHUNKS=(first second rest)\n" in array
    assert f"#SBATCH --time={slurm.FLOOR_MINUTES}\n" in array  # seconds-long chunks: the floor
    assert "#SBATCH --gpus" not in array
    assert all(not line.startswith("#SBATCH") or HOSTILE not in line for line in array.splitlines())
    for name in ("array.sh", "merge.sh", "submit.sh"):
        script = shared / name
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, name
        assert script.read_text() in out or name == "submit.sh"
    assert "nothing submitted" in out
    no_gpu = slurm_cli("--shared", str(tmp_path / "cpu"), "--chunk", "first", cwd=suite_repo,
                       monkeypatch=monkeypatch, capsys=capsys)
    cpu_array = (tmp_path / "cpu" / "array.sh").read_text()
    assert no_gpu[0] == 0 and "#SBATCH --array=0-0\n" in cpu_array
    assert "gres" not in cpu_array and "--gpus" not in cpu_array and "--machine" not in cpu_array


def test_the_array_script_runs_its_tasks_chunk_with_every_path_intact(suite_repo, tmp_path, monkeypatch, capsys):
    shared = tmp_path / HOSTILE
    status, _, err = slurm_cli("--shared", str(shared), "--machine", MACHINE, "--gpus", "2", cwd=suite_repo,
                               monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0, err
    assert "#SBATCH --gpus=2\n" in (shared / "array.sh").read_text()
    log = tmp_path / "python.log"
    python = fake(tmp_path / "python", log, 'if [ "$1 $2" = "-m site" ]; then echo /nowhere; fi')
    scratch = tmp_path / "node tmp"
    scratch.mkdir()
    env = {**os.environ, "SPEEDLIB_PYTHON": str(python), "SLURM_ARRAY_TASK_ID": "1", "SLURM_JOB_ID": "7",
           "TMPDIR": str(scratch)}
    env.pop("PYTHONUSERBASE", None)
    done = subprocess.run(["bash", str(shared / "array.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    (site, run) = calls(log)
    task = Path(run[-3]).parent  # the task's own scratch: slurm-speedlib-<job>.<random>, made by mktemp
    assert task.parent == scratch and task.name.startswith("slurm-speedlib-7.")
    assert site[1:] == ["-m", "site", "--user-base"]
    assert run == [str(suite_repo), "-m", "speedlib", "run", "--chunk", "second",
                   "--archive", str(shared / "archives" / "second.tar.gz"),
                   "--results-dir", str(task / "results"), "--machine", MACHINE]
    assert not task.exists()  # node-local scratch removed on exit
    # A checkout moved to another commit since submission is refused: results would be misfiled.
    git(suite_repo, "commit", "-q", "--allow-empty", "-m", "later")
    try:
        moved = subprocess.run(["bash", str(shared / "array.sh")], env=env, capture_output=True, text=True)
    finally:
        git(suite_repo, "reset", "-q", "--hard", "HEAD~1")
    assert moved.returncode == 2 and "not " in moved.stderr and "as submitted" in moved.stderr
    assert len(calls(log)) == 3  # only the site lookup ran


def test_the_merge_script_merges_what_came_back_and_names_what_did_not(suite_repo, tmp_path, monkeypatch, capsys):
    shared, into = tmp_path / HOSTILE, tmp_path / "merged 'results'"
    assert slurm_cli("--shared", str(shared), "--into", str(into), "--machine", MACHINE, cwd=suite_repo,
                     monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    for chunk in ("first", "rest"):
        (shared / "archives" / f"{chunk}.tar.gz").write_bytes(b"archive")
    log = tmp_path / "python.log"
    python = fake(tmp_path / "python", log)
    env = {**os.environ, "SPEEDLIB_PYTHON": str(python), "SLURM_JOB_ID": "8", "TMPDIR": str(tmp_path)}
    done = subprocess.run(["bash", str(shared / "merge.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert "no archive from chunk second (task 1)" in done.stderr and "1 of 3 chunk(s) missing" in done.stderr
    assert f"its task log is in {shared}/logs" in done.stderr  # the path as it is, its % included
    merge, report = calls(log)[1:]
    assert merge[1:] == ["-m", "speedlib", "merge", str(shared / "archives" / "first.tar.gz"),
                         str(shared / "archives" / "rest.tar.gz"), "--into", str(into)]
    assert report[1:] == ["-m", "speedlib", "report", "--results", str(into)]
    (shared / "archives" / "second.tar.gz").write_bytes(b"archive")
    done = subprocess.run(["bash", str(shared / "merge.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "every chunk merged" in done.stdout, done.stderr


def test_submit_wires_the_merge_after_the_array(suite_repo, tmp_path, monkeypatch, capsys, fake_sbatch):
    shared = tmp_path / HOSTILE
    status, out, err = slurm_cli("--shared", str(shared), "--chunk", "first", "second", "--submit",
                                 "--extra-sbatch=--qos=high", cwd=suite_repo, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0, err
    array, merge = calls(fake_sbatch)
    assert array == [str(shared / "logs"), "--parsable", "--qos=high", str(shared / "array.sh")]
    assert merge == [str(shared / "logs"), "--parsable", "--dependency=afterany:100", str(shared / "merge.sh")]
    assert "array job 100" in out and "merge job 101 " in out and "squeue -j 100,101" in out
    assert "slurm-100_1.out" in out and "slurm-101.out" in out
    # submit.sh does the same, for a user who submits later by hand
    fake_sbatch.unlink()
    done = subprocess.run(["bash", str(shared / "submit.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert [c[1:3] for c in calls(fake_sbatch)] == [["--parsable", "--qos=high"],
                                                    ["--parsable", "--dependency=afterany:102"]]


def test_an_earlier_archive_is_moved_aside_not_merged_again(suite_repo, tmp_path, monkeypatch, capsys):
    shared = tmp_path / "shared"
    assert slurm_cli("--shared", str(shared), cwd=suite_repo, monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    (shared / "archives" / "first.tar.gz").write_bytes(b"old")
    status, _, err = slurm_cli("--shared", str(shared), cwd=suite_repo, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0 and "moved 1 archive(s)" in err
    assert not (shared / "archives" / "first.tar.gz").exists()
    assert [p.read_bytes() for p in (shared / "archives").glob("earlier-*/first.tar.gz")] == [b"old"]


def test_two_submissions_in_one_second_keep_both_earlier_archives(suite_repo, tmp_path, monkeypatch, capsys):
    """Issue 54: both set their archives aside under earlier-<second>, and the second moved its over the first's."""
    import datetime as dt  # noqa: PLC0415 - only this test stops the clock

    class Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=tz)

    monkeypatch.setattr(slurm._dt, "datetime", Frozen)
    shared = tmp_path / "shared"
    assert slurm_cli("--shared", str(shared), cwd=suite_repo, monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    for content in (b"first run", b"second run"):
        (shared / "archives" / "first.tar.gz").write_bytes(content)
        status, _, err = slurm_cli("--shared", str(shared), cwd=suite_repo, monkeypatch=monkeypatch, capsys=capsys)
        assert status == 0 and "moved 1 archive(s)" in err, err
    kept = {p.parent.name: p.read_bytes() for p in (shared / "archives").glob("earlier-*/first.tar.gz")}
    assert kept == {"earlier-20260102T030405": b"first run", "earlier-20260102T030405-2": b"second run"}


def test_a_shared_directory_among_the_results_is_refused(suite_repo, tmp_path, monkeypatch, capsys):
    into = tmp_path / "results"
    (into / MACHINE).mkdir(parents=True)
    status, out, err = slurm_cli("--shared", str(into / MACHINE / "slurm"), "--into", str(into), cwd=suite_repo,
                                 monkeypatch=monkeypatch, capsys=capsys)
    assert status == 2 and err.count("\n") == 1 and "is inside the results tree" in err, err
    assert not (into / MACHINE / "slurm").exists()


def test_time_limit_comes_from_recorded_chunk_times(suite_repo, tmp_path, monkeypatch, capsys):
    into = tmp_path / "results"
    plan.record_chunk_time(into, MACHINE, "second", "0" * 40, 1200.0)
    status, out, err = slurm_cli("--shared", str(tmp_path / "s"), "--into", str(into), "--machine", MACHINE,
                                 cwd=suite_repo, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0, err
    array = (tmp_path / "s" / "array.sh").read_text()
    assert "#SBATCH --time=33\n" in array  # 1200 s x 1.5 + 180 s
    assert "#   task 1: second: 20.0 min (the longest measured run here)" in array
    assert "task 0: first:" in array and "estimate x" in array


@pytest.mark.parametrize("args, says", [
    (["--chunk", "nope"], "unknown chunk 'nope'"),
    (["--gpus", "0"], "--gpus must be a positive whole number"),
    (["--gpus", "1", "--gres", "gpu:1"], "not allowed with argument"),
    (["--partition", "a b"], "--partition 'a b' is not a Slurm name"),
    (["--machine", "../x"], "is not a plain name"),
    (["--extra-sbatch=qos"], "is not an sbatch option"),
    (["--bundle", "/nonexistent"], "is not a file"),
])
def test_bad_input_is_one_line_and_status_2(suite_repo, tmp_path, monkeypatch, capsys, args, says):
    monkeypatch.chdir(suite_repo)
    with pytest.raises(SystemExit) if "not allowed" in says else _nothing() as raised:
        status = cli.main(["slurm", "--shared", str(tmp_path / "s"), *args])
    err = capsys.readouterr().err
    if raised is None:
        assert status == 2 and len(err.strip().splitlines()) == 1
    assert says in err


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_submit_without_sbatch_and_unwritable_or_unpriced_input_are_refused(suite_repo, tmp_path, monkeypatch,
                                                                            capsys):
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    status, _, err = slurm_cli("--shared", str(tmp_path / "s"), "--submit", cwd=suite_repo,
                               monkeypatch=monkeypatch, capsys=capsys)
    assert status == 2 and "--submit needs sbatch" in err and len(err.splitlines()) == 1
    monkeypatch.setenv("PATH", path)
    (tmp_path / "file").write_text("")
    status, _, err = slurm_cli("--shared", str(tmp_path / "file" / "s"), cwd=suite_repo, monkeypatch=monkeypatch,
                               capsys=capsys)
    assert status == 2 and "--shared" in err and "cannot be written" in err
    # no listing anywhere and no recorded time: no time limit can be set
    bare = tmp_path / "bare"
    shutil.copytree(suite_repo, bare)
    (bare / "results" / "benchmarks.json").unlink()
    git(bare, "commit", "-qam", "no listing")
    status, _, err = slurm_cli("--shared", str(tmp_path / "s"), "--into", str(tmp_path / "r"), cwd=bare,
                               monkeypatch=monkeypatch, capsys=capsys)
    assert status == 2 and "chunk first has no time estimate" in err and len(err.splitlines()) == 1
    # a checkout with uncommitted changes: every task's run would refuse it
    dirty = tmp_path / "dirty"
    shutil.copytree(suite_repo, dirty)
    (dirty / "benchmarks" / "bench_a.py").write_text("# edited\n")
    status, _, err = slurm_cli("--shared", str(tmp_path / "s"), "--machine", MACHINE, cwd=dirty,
                               monkeypatch=monkeypatch, capsys=capsys)
    assert status == 2 and "uncommitted changes" in err


def test_a_scratch_directory_another_user_made_first_is_never_used(suite_repo, tmp_path, monkeypatch, capsys):
    """Issue 42: the tasks took ${TMPDIR}/slurm-speedlib-$SLURM_JOB_ID with mkdir -p, so one another
    user made first was used, and the home/.gitconfig planted in it (core.fsmonitor) ran a command
    as the task's user when git read the checkout's status (speedlib run's uncommitted-changes check)."""
    shared = tmp_path / "shared"
    assert slurm_cli("--shared", str(shared), "--machine", MACHINE, cwd=suite_repo, monkeypatch=monkeypatch,
                     capsys=capsys)[0] == 0
    scratch = tmp_path / "node tmp"
    planted = scratch / "slurm-speedlib-7"
    (planted / "home").mkdir(parents=True)
    (planted / "tmp").mkdir()
    ran = tmp_path / "planted command ran"
    (planted / "home" / ".gitconfig").write_text(f"[core]\n\tfsmonitor = \"touch '{ran}'; false\"\n")
    log = tmp_path / "python.log"
    # the run's first git command in the checkout, under the HOME the script gave it
    python = fake(tmp_path / "python", log, 'if [ "$2" = speedlib ]; then git status --porcelain >/dev/null; '
                                            'echo "$HOME" > "$OLDPWD/../home.txt"; fi')
    env = {**os.environ, "SPEEDLIB_PYTHON": str(python), "SLURM_ARRAY_TASK_ID": "0", "SLURM_JOB_ID": "7",
           "TMPDIR": str(scratch), "PYTHONUSERBASE": str(tmp_path)}
    env.pop("SLURM_TMPDIR", None)
    done = subprocess.run(["bash", str(shared / "array.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not ran.exists(), "the planted .gitconfig ran its command"
    run = calls(log)[-1]
    task = Path(run[run.index("--results-dir") + 1]).parent
    assert task != planted and task.parent == scratch and task.name.startswith("slurm-speedlib-7.")
    assert (planted / "home" / ".gitconfig").exists()  # another user's directory: neither used nor removed
    assert not task.exists()  # the task's own, removed on exit


def test_a_scratch_directory_that_is_not_private_is_refused(suite_repo, tmp_path, monkeypatch, capsys):
    """mktemp makes the directory 0700; the script checks owner and mode before it uses it, so a
    mktemp that handed back another directory (here a stand-in on PATH) stops the task."""
    shared = tmp_path / "shared"
    assert slurm_cli("--shared", str(shared), cwd=suite_repo, monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "mktemp").write_text(f"#!/bin/bash\necho '{open_dir}'\n")
    (bindir / "mktemp").chmod(0o755)
    log = tmp_path / "python.log"
    env = {**os.environ, "SPEEDLIB_PYTHON": str(fake(tmp_path / "python", log)), "SLURM_ARRAY_TASK_ID": "0",
           "SLURM_JOB_ID": "7", "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(shared / "array.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"speedlib slurm: {open_dir} is not a private directory of this user (mode 0700): not used" in done.stderr
    assert calls(log) == [] and open_dir.is_dir()  # nothing ran, and the directory is left as it was


def test_a_planted_script_link_is_replaced_never_followed(suite_repo, tmp_path, monkeypatch, capsys):
    """Issue 42: a planted SHARED/array.sh link had its target rewritten and made 0755."""
    shared = tmp_path / "shared"
    shared.mkdir()
    victims = {}
    for name in ("array.sh", "merge.sh", "submit.sh", "speedlib.bundle"):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_text("mine\n")
        victims[name].chmod(0o600)
        (shared / name).symlink_to(victims[name])
    bundle = tmp_path / "speedlib.bundle"
    git(suite_repo, "bundle", "create", str(bundle), "main")
    status, _, err = slurm_cli("--shared", str(shared), "--bundle", str(bundle), cwd=suite_repo,
                               monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0, err
    for name, victim in victims.items():
        assert victim.read_text() == "mine\n" and (victim.stat().st_mode & 0o777) == 0o600, name
        assert not (shared / name).is_symlink() and (shared / name).is_file(), name
    assert (shared / "array.sh").stat().st_mode & 0o777 == 0o755
    assert (shared / "speedlib.bundle").read_bytes() == bundle.read_bytes()


@pytest.mark.parametrize("folder", ["logs", "archives"])
def test_a_folder_that_is_a_file_is_one_line(suite_repo, tmp_path, monkeypatch, capsys, folder):
    """Issue 42: a traceback (FileExistsError) when SHARED/logs or SHARED/archives was a file."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / folder).write_text("a file\n")
    status, out, err = slurm_cli("--shared", str(shared), cwd=suite_repo, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err == (f"speedlib slurm: {shared / folder} is not a directory: speedlib slurm keeps its {folder} "
                   "there; move it away or give another --shared\n")
    assert (shared / folder).read_text() == "a file\n"


def test_a_full_disk_while_writing_the_scripts_is_one_line(suite_repo, full_disk, monkeypatch, capsys):
    """Issue 42: a full disk ended `speedlib slurm` in a traceback; a script is written whole or
    not at all (no torn array.sh left to submit)."""
    shared = full_disk / "shared"
    status, _, err = slurm_cli("--shared", str(shared), cwd=suite_repo, monkeypatch=monkeypatch, capsys=capsys)
    assert status == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("speedlib slurm: cannot write ") and "(No space left on device): the disk is full: " in err
    assert [p.name for p in shared.iterdir() if p.is_file()] == []  # no script, torn or whole


def test_a_quick_setting_left_in_the_environment_is_refused(suite_repo, tmp_path, monkeypatch, capsys):
    """Every task's speedlib run would refuse $SPEEDLIB_QUICK (sbatch passes the environment on):
    refused here, before anything is written or submitted."""
    monkeypatch.setenv("SPEEDLIB_QUICK", "1")
    status, _, err = slurm_cli("--shared", str(tmp_path / "s"), cwd=suite_repo, monkeypatch=monkeypatch,
                               capsys=capsys)
    assert status == 2 and len(err.splitlines()) == 1 and "$SPEEDLIB_QUICK is set" in err
    assert not (tmp_path / "s" / "array.sh").exists()


# --- a real cluster -------------------------------------------------------------------------

def _unavailable(reason: str):
    if REQUIRE:
        pytest.fail(f"SPEEDLIB_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")  # the daemons stop when this file's tests are done
def cluster(tmp_path_factory):
    missing = slurm_cluster.missing_binaries()
    if missing:
        _unavailable(f"no {', '.join(missing)} here (apt-get install slurm-wlm munge)")
    if os.getuid() != 0:
        _unavailable("a test cluster needs root (slurmd starts jobs as their user)")
    running = cluster_obj = slurm_cluster.Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        running.start()
    except slurm_cluster.ClusterError as e:
        _unavailable(f"the test cluster did not start: {e}")
    yield cluster_obj
    cluster_obj.stop()


def _wait_for(cluster, jobs: list[str], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")
    while True:
        states = {}
        for job in jobs:
            states.update(cluster.job_state(job))
        if states and all(state in ended for state, _ in states.values()):
            return states
        if time.monotonic() > deadline:
            pytest.fail(f"jobs still not done after {timeout:.0f} s: {states}{cluster.log_tails()}")
        time.sleep(2)


def _logs(shared: Path) -> str:
    return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted((shared / "logs").glob("*.out")))


@pytest.mark.slow
def test_the_suite_runs_as_a_job_array_and_merges_on_a_real_cluster(request, suite_repo, tmp_path):
    cluster = request.getfixturevalue("cluster")
    home = tmp_path / "home"
    home.mkdir()
    env = {**cluster.env, "HOME": str(home)}
    bundle = tmp_path / "speedlib.bundle"
    git(suite_repo, "bundle", "create", str(bundle), "main")
    runs = {
        # offline nodes: the checkout restored from a bundle into node-local scratch, every chunk
        "bundle": (tmp_path / HOSTILE, tmp_path / "merged 'bundle'", ["--bundle", str(bundle)]),
        # a shared checkout: one chunk, run in place
        "shared": (tmp_path / "shared checkout", tmp_path / "merged shared", ["--chunk", "second"]),
    }
    jobs = {}
    for name, (shared, into, extra) in runs.items():
        out = subprocess.run([sys.executable, "-m", "speedlib", "slurm", "--shared", str(shared), "--machine", MACHINE,
                              "--into", str(into), "--submit", *extra], cwd=suite_repo, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        ids = out.stdout.split("submitted array job ")[1].split()[0], out.stdout.split("merge job ")[1].split()[0]
        assert f"squeue -j {ids[0]},{ids[1]}" in out.stdout
        jobs[name] = ids
    states = _wait_for(cluster, [i for ids in jobs.values() for i in ids], timeout=900)
    for name, (array, merge) in jobs.items():
        shared, into, _ = runs[name]
        tasks = {k: v for k, v in states.items() if k.startswith(f"{array}_")}
        assert len(tasks) == (3 if name == "bundle" else 1), states
        assert all(v == ("COMPLETED", "0:0") for v in tasks.values()), f"{states}\n{_logs(shared)}"
        assert states[merge] == ("COMPLETED", "0:0"), f"{states}\n{_logs(shared)}"
        assert "every chunk merged" in (shared / "logs" / f"slurm-{merge}.out").read_text()
    # every chunk's results in the merged tree, read by the loader, speedlib report and asv publish
    expected = {"bundle": {"bench_a.A.track_one", "bench_a.A.track_two", "bench_b.B.track_n", "bench_c.C.track_c"},
                "shared": {"bench_b.B.track_n"}}
    for name, (_shared, into, _) in runs.items():
        loaded = load_results(into)
        assert set(loaded.measured["benchmark"]) == expected[name], loaded.measured
        assert set(loaded.measured["machine"]) == {MACHINE} and not loaded.problems
        report = subprocess.run([sys.executable, "-m", "speedlib", "report", "--results", str(into)],
                                cwd=suite_repo, env=env, capture_output=True, text=True, timeout=300)
        assert report.returncode == 0 and "track_n" in report.stdout, report.stderr
    into = runs["bundle"][1]
    conf = tmp_path / "publish" / "asv.conf.json"
    conf.parent.mkdir()
    conf.write_text(json.dumps({**json.loads((suite_repo / "asv.conf.json").read_text()), "repo": str(suite_repo),
                                "results_dir": str(into), "html_dir": str(tmp_path / "publish" / "html")}))
    pub = subprocess.run([sys.executable, "-m", "asv", "publish", "--config", str(conf)], cwd=suite_repo, env=env,
                         capture_output=True, text=True, timeout=300)
    assert pub.returncode == 0, pub.stdout + pub.stderr
    assert (tmp_path / "publish" / "html" / "index.html").is_file()


def test_a_submission_without_a_gpu_request_says_so(suite_repo, tmp_path, monkeypatch, capsys):
    """The suite is about GPUs: without --gpus or --gres the tasks may land on CPU nodes, and
    every GPU-only comparison would come back "needs a GPU" with no word of why."""
    status, _, err = slurm_cli("--shared", str(tmp_path / "s"), "--machine", MACHINE, cwd=suite_repo,
                               monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0 and "no GPU requested" in err and "--gpus 1" in err
    status, _, err = slurm_cli("--shared", str(tmp_path / "g"), "--machine", MACHINE, "--gpus", "1", cwd=suite_repo,
                               monkeypatch=monkeypatch, capsys=capsys)
    assert status == 0 and "no GPU requested" not in err
