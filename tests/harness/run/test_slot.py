"""`speedlib slot` on CPU: pytest's own tally (speedbench/run/slot_pytest.py) of passes, failures,
errors, a crash and a time limit; the verdict written whole and refused when the loader would
refuse it; the `gpu` marker of tests/conftest.py; and the whole slot rehearsed offline in a
scratch checkout (a failing GPU test, two chunks, a chunk stopped at the slot's deadline)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from speedbench.results.gpu_tests import FAILED, INCOMPLETE, PASSED, check_verdict, status
from speedbench.results.load import load_results
from speedbench.run import errors, slot, suite
from speedbench.run.slot_pytest import TALLY

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[3]
SHA = "c" * 40
ABOUT = {"commit": SHA, "machine": "m", "started_at": 1, "duration_s": 1.0, "command": "python3 -m pytest -m gpu",
         "torch": "2.14.1", "gpu": None}

PLANTED = '''
import os
import time

import pytest


def test_passes():
    pass


def test_fails():
    assert 1 == 2


@pytest.fixture
def broken():
    raise RuntimeError("setup fails")


def test_errors_in_setup(broken):
    pass


@pytest.mark.skip(reason="not here")
def test_skipped():
    pass


@pytest.mark.xfail(reason="known")
def test_xfails():
    assert False


def test_z_crashes_or_hangs():
    if os.environ.get("PLANTED") == "crash":
        os._exit(3)  # what a CUDA fault does to the interpreter
    if os.environ.get("PLANTED") == "hang":
        time.sleep(120)
'''


def tally_of(tmp_path: Path, mode: str = "") -> tuple[dict, int]:
    (tmp_path / "test_planted.py").write_text(PLANTED)
    tally = tmp_path / "tally.json"
    env = {**os.environ, TALLY: str(tally), "PLANTED": mode, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "speedbench.run.slot_pytest", "-p", "no:cacheprovider",
                           "-q", "test_planted.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return json.loads(tally.read_text()), done.returncode


def test_the_tally_counts_as_pytest_does(tmp_path):
    tally, code = tally_of(tmp_path)
    assert code == 1
    assert {k: tally[k] for k in ("passed", "failed", "skipped", "errors", "finished", "exit_status", "running")} == {
        "passed": 2, "failed": 1, "skipped": 2, "errors": 1, "finished": True, "exit_status": 1, "running": None}
    assert tally["failures"] == ["test_planted.py::test_fails", "test_planted.py::test_errors_in_setup"]


def test_a_test_that_kills_pytest_is_named_as_an_error(tmp_path):
    tally, code = tally_of(tmp_path, "crash")
    assert code == 3 and not tally["finished"] and tally["running"] == "test_planted.py::test_z_crashes_or_hangs"
    v = slot.verdict_from_tally(tally, False, code, **ABOUT)
    assert v["errors"] == 2 and v["failures"][-1] == "test_planted.py::test_z_crashes_or_hangs"
    assert v["exit_status"] == 3 and status(check_verdict(v, "m", SHA[:8])) == FAILED


def test_tests_stopped_at_the_limit_are_incomplete_not_failed():
    tally = {"passed": 3, "failed": 0, "skipped": 0, "errors": 0, "failures": [], "running": "t.py::slow",
             "finished": False, "exit_status": None}
    v = slot.verdict_from_tally(tally, True, 143, **ABOUT)
    assert (v["errors"], v["failures"], v["exit_status"]) == (0, [], 143)  # the stopped test is no failure
    assert status(check_verdict(v, "m", SHA[:8])) == INCOMPLETE


def test_pytest_that_never_reported_is_an_error():
    v = slot.verdict_from_tally(None, False, 4, **ABOUT)
    assert (v["passed"], v["errors"], v["failures"], v["finished"]) == (0, 1, [], False)
    assert status(check_verdict(v, "m", SHA[:8])) == FAILED


def test_the_slot_runs_the_gpu_tests_under_a_time_limit(tmp_path, monkeypatch):
    """gpu_tests() itself: the selection is `-m gpu` through the checkout's conftest, counted by
    the plugin; a hang is stopped at the limit and the tests before it are kept."""
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "tests")
    (tmp_path / "tests" / "test_planted.py").write_text(
        "import time\nimport pytest\n\n"
        "@pytest.mark.gpu(devices=0)\ndef test_a():\n    pass\n\n"  # devices=0: runs here, a stand-in for a GPU test
        "@pytest.mark.gpu(devices=99, reason='needs 99 GPUs')\ndef test_b():\n    pass\n\n"
        "def test_not_selected():\n    assert False\n\n"
        "@pytest.mark.gpu(devices=0)\ndef test_z_hangs():\n    time.sleep(120)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    v = slot.gpu_tests(tmp_path, SHA, "m", {"torch": "t", "gpu_model": None}, limit=45)
    assert (v["passed"], v["skipped"], v["failed"], v["errors"], v["finished"]) == (1, 1, 0, 0, False)
    assert v["command"] == "python3 -m pytest -m gpu -p speedbench.run.slot_pytest -p no:cacheprovider -q -rfEs"
    assert v["duration_s"] < 90 and status(check_verdict(v, "m", SHA[:8])) == INCOMPLETE


def test_a_verdict_is_written_whole_and_never_one_the_loader_refuses(tmp_path):
    path = tmp_path / "m" / "gpu-tests" / f"{SHA[:8]}.json"
    good = slot.verdict_from_tally({"passed": 1, "finished": True, "exit_status": 0}, False, 0, **ABOUT)
    slot.write_verdict(path, good)
    assert json.loads(path.read_text()) == good and status(good) == PASSED
    with pytest.raises(ValueError, match="not 'other'"):
        slot.write_verdict(tmp_path / "other" / "gpu-tests" / f"{SHA[:8]}.json", good)
    assert not (tmp_path / "other").exists()
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no partial file left beside it


def test_a_slot_refuses_to_start_without_what_it_needs(tmp_path, monkeypatch):
    with pytest.raises(suite.SuiteError, match="--minutes must be a number of minutes above 0 and at most 1440"):
        slot._check(slot.SlotOptions(tmp_path / "a.tar.gz", minutes=float("nan")), ROOT)
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pytest" else find(name, *a))
    with pytest.raises(suite.SuiteError, match="pytest not installed here"):
        slot._check(slot.SlotOptions(tmp_path / "a.tar.gz"), ROOT)


# --- the gpu marker (tests/conftest.py) -------------------------------------------------------

MARKED = '''
import pytest


@pytest.mark.gpu(reason="needs a CUDA GPU; the CPU twin covers it", devices=99)
def test_marked():
    pass


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu(devices=99))])
def test_param(device):
    pass


@pytest.mark.skipif(True, reason="needs a CUDA GPU")
def test_own_skipif():
    pass


def test_skips_in_its_body():
    pytest.skip("DataParallel needs two GPUs")


def test_own_skip_that_is_no_need():
    pytest.skip("a GPU machine is named after its GPU")
'''


@pytest.fixture
def marked(pytester):
    # in a process of its own: an inline run drops what it imported (torch, through the conftest)
    # from sys.modules afterwards, and torch cannot be imported twice in one process
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    pytester.makepyfile(test_marked=MARKED)
    return pytester


def test_minus_m_gpu_selects_exactly_the_marked_tests(marked):
    out = marked.runpytest_subprocess("-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider")
    selected = sorted(line for line in out.outlines if "::" in line)
    assert selected == ["test_marked.py::test_marked", "test_marked.py::test_param[cuda]"]


def test_a_gpu_test_without_the_marker_fails_saying_so(marked):
    out = marked.runpytest_subprocess("-rsfE", "-p", "no:cacheprovider")
    out.assert_outcomes(passed=1, skipped=3, failed=1, errors=1)
    text = out.stdout.str()
    assert re.search(r"test_marked.py:\d+: needs a CUDA GPU; the CPU twin covers it", text)  # the test's own file
    for name in ("test_own_skipif", "test_skips_in_its_body"):
        assert f"{name} skipped for want of a GPU" in text and "without the gpu marker" in text
    assert "test_own_skip_that_is_no_need skipped for want" not in text


# --- the whole slot, rehearsed offline ---------------------------------------------------------

REHEARSAL_CHUNKS = r'''
CHUNKS = (
    ("headline-one", "a planted benchmark", (r"bench_planted\.Offline\.track_ok\(1\)",)),
    ("rest", "everything else", (r"bench_planted\.",)),
)
'''
REHEARSAL_BENCH = '''
import time


class Offline:
    params = [1, 2]

    def track_ok(self, n):
        return n


class Slow:
    timeout = 600

    def track_wait(self):
        time.sleep(300)  # the slot's deadline stops it
        return 1
'''
REHEARSAL_TESTS = '''
import pytest


@pytest.mark.gpu(reason="needs a CUDA GPU")
def test_on_a_gpu():
    pass


@pytest.mark.gpu(devices=0)  # runs anywhere: the rehearsal's stand-in for a GPU test that fails
def test_fails():
    assert 1 == 2
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.mark.slow
def test_an_offline_slot_archives_its_verdict_and_the_chunks_before_its_deadline(tmp_path):
    """A source tree without .git, git restored from a bundle, asv and the tree on PYTHONPATH
    (as wheels in a --target dir are): the slot runs the GPU tests (one fails), the headline
    chunk, then the rest until its deadline stops the slow benchmark; one archive holds the
    verdict and the headline chunk's results, and the report marks them."""
    source = tmp_path / "source"
    for name in ("speedlib", "speedbench", "benchmarks"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "bench_*.py"))
    shutil.copy(ROOT / "asv.conf.json", source)
    shutil.copy(ROOT / "pyproject.toml", source)
    (source / "benchmarks" / "chunks.py").write_text(REHEARSAL_CHUNKS)
    (source / "benchmarks" / "bench_planted.py").write_text(REHEARSAL_BENCH)
    (source / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", source / "tests")
    (source / "tests" / "test_planted.py").write_text(REHEARSAL_TESTS)
    git(source, "init", "-q", "-b", "main")
    git(source, "add", "-A")
    git(source, "commit", "-qm", "rehearsal")
    sha = git(source, "rev-parse", "HEAD")
    git(source, "bundle", "create", str(tmp_path / "speedlib.bundle"), "main")
    host = tmp_path / "host"
    shutil.copytree(source, host, ignore=shutil.ignore_patterns(".git"))
    for args in (["init", "-q", "-b", "main"], ["fetch", "-q", str(tmp_path / "speedlib.bundle"), "main"],
                 ["reset", "-q", "FETCH_HEAD"]):
        git(host, *args)

    archive = tmp_path / "out" / "slot.tar.gz"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(host)}
    out = subprocess.run([sys.executable, "-m", "speedlib", "slot", "--archive", str(archive), "--minutes", "2"],
                         cwd=host, env=env, capture_output=True, text=True, timeout=300)
    said = out.stdout + out.stderr
    assert out.returncode == slot.GPU_TESTS_FAILED, said
    for line in ("step 1 of 3: the GPU tests", "GPU tests failed: 1 of 2 (1 failed, 1 skipped)",
                 "step 2 of 3: the headline chunks (headline-one)", "step 2 took", "step 3 of 3: the other chunks",
                 "stopped at the slot's time limit", "chunks run: headline-one",
                 "left for a later command: speedlib run --chunk rest"):
        assert line in said, line
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "unpacked", filter="data")
    machine = next(n.split("/")[1] for n in names if "/gpu-tests/" in n)
    assert f"results/{machine}/gpu-tests/{sha[:8]}.json" in names
    assert any(n.startswith(f"results/{machine}/{sha[:8]}-") for n in names)  # the headline chunk's results
    verdict = json.loads((tmp_path / "unpacked" / "results" / machine / "gpu-tests" / f"{sha[:8]}.json").read_text())
    assert verdict["failures"] == ["tests/test_planted.py::test_fails"] and verdict["commit"] == sha
    rows = load_results(tmp_path / "unpacked" / "results").measured
    assert set(rows["gpu_tests"]) == {FAILED}  # a verdict on file counts, CPU machine or not
    # no GPU here: a rehearsal, which says so and which merge files only when asked (issue 50)
    assert verdict["rehearsal"] is True and "no GPU here: this is a rehearsal" in said
    into = tmp_path / "checkout-results"
    refused = subprocess.run([sys.executable, "-m", "speedlib", "merge", str(archive), "--into", str(into)],
                             cwd=host, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "rehearsed without a GPU" in refused.stderr and not into.exists()
    kept = subprocess.run([sys.executable, "-m", "speedlib", "merge", str(archive), "--into", str(into),
                           "--rehearsal"], cwd=host, env=env, capture_output=True, text=True, timeout=120)
    assert kept.returncode == 0, kept.stderr


def test_a_slot_refuses_a_gpu_tests_link_out_of_the_tree_before_it_writes_the_verdict(tmp_path, monkeypatch):
    """The verdict is the slot's first write: a planted gpu-tests link must not take it out of the tree."""
    from speedbench.measure import hardware  # noqa: PLC0415 - torch: only this test needs the identity stubbed

    sha = "a" * 40
    results, outside = tmp_path / "results", tmp_path / "outside"
    (results / "m").mkdir(parents=True)
    outside.mkdir()
    (results / "m" / "gpu-tests").symlink_to(outside)
    (tmp_path / suite.CONFIG).write_text("{}")
    monkeypatch.setattr(slot, "_check", lambda options, root: suite.RunOptions(allow_dirty=True))
    monkeypatch.setattr(suite, "resolve_commits", lambda root, commits: [sha])
    monkeypatch.setattr(suite, "_check_machine", lambda *a: None)
    monkeypatch.setattr(suite, "_results_dir", lambda *a: results)
    monkeypatch.setattr(hardware, "identity", lambda: {"machine": "m"})
    monkeypatch.setattr(slot, "gpu_tests", lambda *a: slot.verdict_from_tally(
        {"passed": 1, "finished": True, "exit_status": 0}, False, 0, **ABOUT))
    with pytest.raises(suite.SuiteError, match=r"gpu-tests is a link .* nothing was run or changed"):
        slot.run(slot.SlotOptions(tmp_path / "a.tar.gz", allow_dirty=True), root=tmp_path)
    assert list(outside.iterdir()) == [] and not (tmp_path / "a.tar.gz").exists()


def _documented_block(marker: str) -> str:
    """The bash block under `<!-- offline: {marker} -->` in docs/gpu-slots.md."""
    text = (ROOT / "docs" / "gpu-slots.md").read_text(encoding="utf-8")
    found = re.search(rf"<!-- offline: {re.escape(marker)} -->\s*```bash\n(.*?)```", text, flags=re.S)
    assert found, f"docs/gpu-slots.md has no block marked 'offline: {marker}'"
    return found.group(1)


def _unmet_requirements(site: Path, python: str, host_has: set[str]) -> list[str]:
    """Requirements of the distributions installed in `site` that neither `site` nor the
    host (`host_has`) meets, markers read for `python` ("3.12")."""
    from importlib.metadata import Distribution  # noqa: PLC0415 - only this test reads wheels' metadata

    from packaging.requirements import Requirement  # noqa: PLC0415 - as above
    from packaging.utils import canonicalize_name  # noqa: PLC0415 - as above

    dists = [Distribution.at(p) for p in site.glob("*.dist-info")]
    have = {canonicalize_name(d.metadata["Name"]) for d in dists} | {canonicalize_name(n) for n in host_has}
    unmet = []
    for d in dists:
        for line in d.requires or []:
            req = Requirement(line)
            env = {"python_version": python, "python_full_version": f"{python}.0", "extra": ""}
            if (req.marker is None or req.marker.evaluate(env)) and canonicalize_name(req.name) not in have:
                unmet.append(f"{d.metadata['Name']} needs {req.name}")
    return unmet


@pytest.mark.slow
def test_the_documented_offline_sequence_works_as_written(tmp_path):
    """Issue 50: docs/gpu-slots.md's offline install failed on every host (`--target` without
    `--no-deps` looked for torch among the wheels; pytest's pygments was not in the list). Its two
    blocks run here as written: the wheels downloaded for this Python, the tree copied without
    .git, the wheels installed into a directory of their own, git restored from the bundle and
    the slot started (cut to a minute, `/tmp/site` a scratch directory). The wheels are the whole
    closure: every requirement is met by them or the host's torch, and the suite's and the tests'
    packages import from them alone."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    src = tmp_path / "src"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(src)], check=True)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path), "SLOT_PYTHON": python}
    env.pop("PYTHONPATH", None)
    fetched = subprocess.run(["bash", "-euo", "pipefail", "-c", _documented_block("where the network is")], cwd=src,
                             env=env, capture_output=True, text=True, timeout=600)
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    assert (src / ".whl" / "speedlib.bundle").is_file() and len(list((src / ".whl").glob("*.whl"))) >= 20

    host = tmp_path / "host"
    shutil.copytree(src, host, ignore=shutil.ignore_patterns(".git"))  # what a lent machine gets, .whl carried
    site, out = tmp_path / "site", tmp_path / "out"
    out.mkdir()
    block = _documented_block("on the host")
    assert "--minutes 8.6" in block and "/tmp/site" in block and "timeout -s INT 545" in block
    block = block.replace("/tmp/site", str(site)).replace("--minutes 8.6", "--minutes 1").replace("545", "200")
    ran = subprocess.run(["bash", "-uo", "pipefail", "-c", block], cwd=host, env={**env, "OUT": str(out)},
                         capture_output=True, text=True, timeout=600)
    said = ran.stdout + ran.stderr
    # no GPU here: a rehearsal whose tests skip or run out of their 20 s, and no chunk fits what is left
    assert ran.returncode in (slot.GPU_TESTS_FAILED, errors.CHUNKS_LEFT), said[-3000:]
    assert "step 1 of 3: the GPU tests" in said and "this is a rehearsal" in said
    with tarfile.open(out / "slot.tar.gz") as tar:
        verdicts = [n for n in tar.getnames() if "/gpu-tests/" in n]
        assert len(verdicts) == 1
        assert json.load(tar.extractfile(verdicts[0]))["rehearsal"] is True

    assert _unmet_requirements(site, python, host_has={"torch"}) == []
    alone = subprocess.run([sys.executable, "-S", "-c", "import asv, asv_runner, pytest, pygments, pynvml, yaml"],
                           env={"PYTHONPATH": str(site), "PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert alone.returncode == 0, alone.stderr
