"""`speedlib slot`: one command for a short GPU slot (9 minutes by default) that checks itself.

In order, on the checkout as it is (its HEAD):
1. the GPU-only tests, `python3 -m pytest -m gpu` (every test marked `gpu`: tests/conftest.py),
   under a time limit. Their verdict, counted by pytest itself (speedbench/run/slot_pytest.py),
   is written whole to `results/<machine>/gpu-tests/<commit8>.json` (the format:
   speedbench/results/gpu_tests.py) and packed into the archive at once;
2. the headline chunks (`--chunk headline`), priced against the time left (`--budget-minutes`);
3. the other chunks, against what is left then.
Steps 2 and 3 are `speedbench.run.suite.run`, which rewrites the archive after every chunk. At the
slot's deadline the chunk still running is stopped as Ctrl+C stops it (asv and its benchmarks
with it), so the chunks archived before it are kept and the command ends within its minutes.
The archive is the one `speedlib run --archive` writes, the verdict in it: `speedlib merge`
reads it. Each step says when it starts, how long it took and how much of the slot is left.

Imports only the standard library at load (the CLI builds every parser on each call); torch,
asv and the suite load when a slot runs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from speedbench.chunks import load_chunks
from speedbench.results import safekeep
from speedbench.results.atomic import written_whole
from speedbench.results.common import printable
from speedbench.results.tree import ResultsError, ResultsTree
from speedbench.run.asv_process import _SUPERVISE, _stop_supervisor
from speedbench.run.slot_pytest import TALLY

DEFAULT_MINUTES = 9.0
# The longest slot taken: a day. A GPU slot is minutes; a number past this is a typo (1e9 minutes
# overflowed the deadline's timer, and the slot ran with none).
MAX_MINUTES = 24 * 60.0
# Why the slot's archive cannot be a FIFO (speedbench.results.outputs): opening one waits for a reader.
WITHIN_MINUTES = "the slot must end within its minutes"
# The GPU tests' limit: 146 of them took 43 s on an H200. A hung test must not eat the slot.
TESTS_LIMIT_S = 180.0
# Kept at the end of the slot to stop a chunk the deadline cuts short: asv's supervisor gives
# its processes 10 s (speedbench/run/supervise.py), then worktrees and scratch are removed.
STOP_S = 30.0
# A step with less than this left is not started: asv's start-up alone takes most of it.
MIN_STEP_S = 45.0
# The exit status for GPU tests that failed or did not finish (run's own: 2, 3, 4, 130, 143).
GPU_TESTS_FAILED = 5
# The tests as a reader reruns them (the slot runs them with its own interpreter).
PYTEST = ("python3", "-m", "pytest", "-m", "gpu", "-p", "speedbench.run.slot_pytest", "-p", "no:cacheprovider", "-q",
          "-rfEs")

@dataclass
class SlotOptions:
    archive: Path
    machine: str | None = None
    minutes: float = DEFAULT_MINUTES
    results_dir: Path | None = None
    allow_dirty: bool = False
    show_stderr: bool = False


@dataclass
class SlotResult:
    verdict: dict
    verdict_file: Path
    ran: list[str] = field(default_factory=list)  # chunks run to the end
    left: list[str] = field(default_factory=list)  # chunks not started, or stopped at the deadline
    failed: list[str] = field(default_factory=list)  # benchmarks that failed, as speedlib run lists them


def _say(text: str) -> None:
    print(f"speedlib slot: {text}", flush=True)


def run(options: SlotOptions, root: Path | None = None, argv: list[str] | tuple = ()) -> SlotResult:
    """The slot; SuiteError (one line) when it cannot start, suite.Interrupted when a signal
    other than its own deadline stops it."""
    from speedbench.measure import hardware  # noqa: PLC0415 - torch, asv: only when a slot runs
    from speedbench.results.gpu_tests import NONE_RAN, status  # noqa: PLC0415 - pandas, as for suite
    from speedbench.run import suite  # noqa: PLC0415 - torch, asv: only when a slot runs

    began = time.monotonic()
    deadline = began + options.minutes * 60
    root = root or suite.find_root()
    run_options = _check(options, root)
    sha = suite.resolve_commits(root, None)[0]
    if not options.allow_dirty:  # the verdict describes the commit only if the tests are the commit's
        changed = suite._dirty(root, (*suite._CHECKOUT_PARTS, "tests"))
        if changed:
            shown = ", ".join(suite.printable(c) for c in changed[:3])
            raise suite.SuiteError(f"uncommitted changes in the checkout ({shown}): the GPU tests and "
                                   "results would be filed under a commit that did not produce them. Commit first, "
                                   "or pass --allow-dirty.")
    identity = hardware.identity()
    run_options.machine = options.machine or identity["machine"]
    suite._check_machine(run_options, root, identity)  # before the verdict is filed under it
    results_dir = suite._results_dir(run_options, root, json.loads((root / suite.CONFIG).read_text()))
    machine = run_options.machine
    _check_writes(run_options, results_dir, machine, sha)  # every write of the slot, before its first GPU second
    _say(f"{machine}, commit {sha[:8]}, {options.minutes:g} min: the GPU tests, then the headline chunks, then "
         f"the others; everything goes into {options.archive}")
    if identity.get("gpu_model") is None:
        _say("no GPU here: this is a rehearsal of the command; its verdict says so, and speedlib merge files its "
             "results only with --rehearsal")

    limit = min(TESTS_LIMIT_S, options.minutes * 60 / 3)
    _say(f"step 1 of 3: the GPU tests ({shlex.join(PYTEST)}), at most {limit:.0f} s")
    with suite.stopped_by_signals():
        verdict = gpu_tests(root, sha, machine, identity, limit)
    path = ResultsTree(results_dir).machine(machine).verdict(sha)
    with suite._locked(results_dir):
        try:  # checked before the tests; again now, since the tree may have changed while they ran
            safekeep.refuse_links(results_dir, machine, sha)  # a planted gpu-tests link must not take the verdict out
            ResultsTree(results_dir).machine(machine).check_run_writes(sha)
        except (safekeep.SnapshotError, ResultsError) as e:
            raise suite.SuiteError(f"the GPU tests ran ({_words(verdict)}), but their verdict cannot be written: "
                                   f"{str(e).removesuffix('; nothing was run or changed')}") from None
        write_verdict(path, verdict)
        _pack_verdict(results_dir, path, options.archive)
    _say(f"step 1 took {verdict['duration_s']:.0f} s: GPU tests {_words(verdict)}; verdict in {path}, packed into "
         f"{options.archive}; {(deadline - time.monotonic()) / 60:.1f} min left")

    if status(verdict) == NONE_RAN and identity.get("gpu_model"):
        _say("warning: no GPU test ran on a machine with a GPU: the tests saw none (CUDA_VISIBLE_DEVICES?)")
    result = SlotResult(verdict, path)
    _chunks(result, run_options, root, results_dir, sha, deadline, list(argv))
    _say(f"done in {(time.monotonic() - began) / 60:.1f} min: GPU tests {_words(verdict)}; chunks run: "
         f"{', '.join(result.ran) or 'none'}")
    if result.left:
        _say(f"left for a later command: speedlib run --chunk {' --chunk '.join(result.left)} --archive "
             "ANOTHER.tar.gz")
    _say(f"merge {options.archive} into a checkout with: speedlib merge {options.archive}")
    return result


def _check(options: SlotOptions, root: Path):
    """The run options the chunks will use, checked before anything runs; SuiteError else."""
    from speedbench.run import suite  # noqa: PLC0415 - pandas: `speedlib --help` builds this command's parser

    if not (math.isfinite(options.minutes) and 0 < options.minutes <= MAX_MINUTES):
        raise suite.SuiteError(f"--minutes must be a number of minutes above 0 and at most {MAX_MINUTES:g} (a day), "
                               f"got {options.minutes:g}")
    missing = [name for name in ("asv", "asv_runner", "pytest") if importlib.util.find_spec(name) is None]
    if missing:  # found out now, not after the tests have spent part of the slot
        raise suite.SuiteError(f"{' and '.join(missing)} not installed here: a slot runs the GPU tests with pytest and "
                               "the suite with asv (offline hosts: wheels into a --target dir on PYTHONPATH, "
                               "docs/gpu-slots.md)")
    run_options = suite.RunOptions(machine=options.machine, results_dir=options.results_dir,
                                   allow_dirty=options.allow_dirty, show_stderr=options.show_stderr,
                                   archive=options.archive)
    suite.check_options(run_options)
    suite.check_versions(root)  # before the GPU tests: a refusal after them wastes their minutes
    return run_options


def _check_writes(run_options, results_dir: Path, machine: str, sha: str) -> None:
    """SuiteError, one line, where anything the slot writes cannot be written, found before the
    GPU tests spend the slot's first minutes: the results tree (writable, not a link out of it, no
    directory, FIFO or device where its files go, the verdict's among them) and the archive (the
    one output rule: not among the results, not a FIFO, which would wait past the slot's end)."""
    from speedbench.run import suite  # noqa: PLC0415 - pandas: `speedlib --help` builds this command's parser

    suite._check_writable(results_dir, f"the results directory {printable(str(results_dir))}",
                          "give the slot another with --results-dir")
    suite.check_archive(run_options, results_dir, WITHIN_MINUTES)
    try:
        safekeep.refuse_links(results_dir, machine, sha)
        ResultsTree(results_dir).machine(machine).check_run_writes(sha)
    except (safekeep.SnapshotError, ResultsError) as e:
        raise suite.SuiteError(f"{str(e).removesuffix('; nothing was run or changed')}; nothing was run or "
                               "changed") from None


def gpu_tests(root: Path, sha: str, machine: str, identity: dict, limit: float) -> dict:
    """Run the GPU tests under `limit` seconds; their verdict (the format in
    speedbench/results/gpu_tests.py). pytest runs under the suite's supervisor, so nothing it
    starts (DDP workers, DataLoader processes) outlives it or the slot."""

    command = [sys.executable, *PYTEST[1:]]
    with tempfile.TemporaryDirectory(prefix="speedlib-slot-") as tmp:
        tally_file = Path(tmp) / "tally.json"
        started_ms, began = int(time.time() * 1000), time.monotonic()
        proc = subprocess.Popen([sys.executable, str(_SUPERVISE), str(os.getpid()), "--", *command], cwd=root,
                                env={**os.environ, TALLY: str(tally_file)}, process_group=0)
        stopped = False
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            stopped = True
            _say(f"the GPU tests ran past {limit:.0f} s: stopped; the tests that finished are counted")
            _stop_supervisor(proc)
        except BaseException:
            _stop_supervisor(proc)
            raise
        duration = time.monotonic() - began
        tally = _read_tally(tally_file)
    return verdict_from_tally(tally, stopped, proc.returncode, commit=sha, machine=machine, started_at=started_ms,
                              duration_s=round(duration, 1), command=shlex.join(PYTEST), torch=identity.get("torch"),
                              gpu=identity.get("gpu_model"), rehearsal=identity.get("gpu_model") is None)


def _read_tally(path: Path) -> dict | None:
    try:
        tally = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # pytest never got as far as the first test (or never started)
    return tally if isinstance(tally, dict) else None


def verdict_from_tally(tally: dict | None, stopped: bool, returncode: int, **about) -> dict:
    """The verdict from the plugin's tally. pytest that died on its own (not stopped at the
    limit) without finishing was killed by what it ran: the test running then is an error,
    named among the failures (none is named where it died between tests or before the first)."""
    tally = tally or {}
    failures = list(tally.get("failures") or [])
    errors = int(tally.get("errors") or 0)
    finished = bool(tally.get("finished"))
    if not finished and not stopped:
        errors += 1
        if tally.get("running") and tally["running"] not in failures:
            failures.append(tally["running"])
        _say(f"pytest ended without finishing (exit status {returncode})"
             + (f" while {tally['running']} ran: counted as an error" if tally.get("running") else
                ": counted as an error; its output above says why"))
    return {**about, "passed": int(tally.get("passed") or 0), "failed": int(tally.get("failed") or 0),
            "skipped": int(tally.get("skipped") or 0), "errors": errors, "failures": failures,
            "exit_status": int(tally["exit_status"]) if finished else returncode, "finished": finished}


def write_verdict(path: Path, verdict: dict) -> None:
    """`path` holds `verdict` whole, or is as it was (SuiteError says why not). The verdict is
    checked as the loader will check it: a slot never files one the loader would refuse."""
    from speedbench.results.gpu_tests import check_verdict  # noqa: PLC0415 - pandas: `speedlib --help` builds this command's parser
    from speedbench.run import suite  # noqa: PLC0415 - pandas: `speedlib --help` builds this command's parser

    check_verdict(verdict, path.parent.parent.name, path.stem)
    with suite._writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with written_whole(path, streams=False) as f:
            f.write((json.dumps(verdict, indent=1, sort_keys=True) + "\n").encode("utf-8"))


def _pack_verdict(results_dir: Path, verdict_file: Path, archive: Path) -> None:
    """The archive with the verdict alone, laid out as `speedlib run --archive` lays it out:
    a slot whose chunks all fail or run out of time still carries its GPU tests off the host
    (the first chunk that finishes rewrites it with its results, the verdict kept)."""
    from speedbench.run import suite  # noqa: PLC0415 - pandas: `speedlib --help` builds this command's parser

    with suite._writing(archive):
        ResultsTree(results_dir).pack([verdict_file], archive)


class _Deadline:
    """SIGINT to this process at `at` (time.monotonic()): the run stops as Ctrl+C stops it, and
    `hit` tells the slot it was its own deadline, not a person."""

    def __init__(self, at: float):
        self.hit = False
        self._timer = threading.Timer(max(at - time.monotonic(), 0.0), self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        self.hit = True
        os.kill(os.getpid(), signal.SIGINT)

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()


def _chunks(result: SlotResult, run_options, root: Path, results_dir: Path, sha: str, deadline: float,
            argv: list[str]) -> None:
    """Steps 2 and 3: the headline chunks, then the others, each `suite.run` priced against the
    time left; the deadline stops whatever runs then, and what had finished is kept."""
    from speedbench.run import plan, suite  # noqa: PLC0415 - pandas: `speedlib --help` builds this command's parser

    names = [c.name for c in plan.select_chunks(load_chunks(root), ["all"])]
    headline = [n for n in names if n.startswith("headline")]
    steps = [("the headline chunks", headline), ("the other chunks", [n for n in names if n not in headline])]
    machine = run_options.machine
    done_before = len(_finished(results_dir, machine, sha))
    began, timer = time.monotonic(), _Deadline(deadline - STOP_S)
    try:
        with suite.stopped_by_signals(), timer:
            for number, (what, chunks) in enumerate(steps, 2):
                left = deadline - STOP_S - time.monotonic()
                if left < MIN_STEP_S:
                    _say(f"step {number} of 3: no time left for {what}")
                    result.left += chunks
                    continue
                _say(f"step {number} of 3: {what} ({', '.join(chunks)}), priced against the {left / 60:.1f} min left")
                began = time.monotonic()
                options = suite.RunOptions(**{**vars(run_options), "chunks": chunks, "budget_minutes": left / 60})
                run = suite.run(options, root=root, argv=argv)
                result.ran += [c for c in chunks if c not in run.not_run]
                result.left += run.not_run
                result.failed += run.failed
                _say(f"step {number} took {time.monotonic() - began:.0f} s; "
                     f"{max(deadline - time.monotonic(), 0) / 60:.1f} min of the slot left")
    except suite.Interrupted:
        if not timer.hit:
            raise
        done = _finished(results_dir, machine, sha)[done_before:]
        counted = set(result.ran) | set(result.left)
        result.ran += [c for c in names if c in done and c not in counted]
        result.left += [c for c in names if c not in done and c not in counted]
        print(flush=True)  # asv's progress line may be open
        _say(f"stopped at the slot's time limit, {time.monotonic() - began:.0f} s into the step: the chunk then "
             "running is lost, the ones archived before it are kept")


def _finished(results_dir: Path, machine: str, sha: str) -> list[str]:
    """The chunks recorded as finished for `sha`, oldest first: speedlib run records a chunk's
    time when its asv run ends, just before packing it."""
    done = []
    for line in ResultsTree(results_dir).machine(machine).chunk_time_lines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("commit") == sha:
            done.append(entry.get("chunk"))
    return done


def _words(verdict: dict) -> str:
    from speedbench.results.gpu_tests import describe  # noqa: PLC0415 - pandas: `speedlib --help` builds this command's parser

    return describe(verdict)
