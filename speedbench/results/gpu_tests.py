"""The GPU tests' verdicts `speedlib slot` keeps beside a machine's results
(`<machine>/gpu-tests/<commit8>.json`), and their joining onto the rows measured at that
commit on that machine.

CI has no GPU, so a slot is where the GPU-only tests (`pytest -m gpu`) run; a figure measured
at a commit whose GPU tests failed on that machine must not read as clean. One JSON object
per machine and commit (the slot writes it whole, speedbench/run/slot.py):

    commit       the full hash the tests ran at (the checkout's HEAD)
    machine      the machine directory it belongs to
    started_at   when the tests started, ms since the epoch (as asv's started_at)
    duration_s   how long they took
    passed, failed, skipped, errors    pytest's own counts (errors: setup, teardown, collection)
    failures     the ids of the tests that failed or erred
    command      the pytest command line
    torch, gpu   torch's version and the GPU's model name (null where unknown)
    rehearsal    true where the slot ran on a machine without a GPU: a rehearsal of the command,
                 whose results `speedlib merge` files only when asked (--rehearsal); verdicts
                 from before it was written count as one where `gpu` is null
    exit_status  pytest's exit status (128 + N: stopped by signal N)
    finished     whether pytest ended its session itself (false: stopped at the slot's time limit,
                 or killed, e.g. by a test that crashed the process; that test is then in failures)

Apart from speedbench.results.load because these files are not asv's: their own format, checks
and problems, read through speedbench.results.files like every other file. Each row gets
`gpu_tests` (a status from STATUSES) and `gpu_tests_note` (the verdict in words).
"""

from __future__ import annotations

import math
from enum import StrEnum
from pathlib import Path

from speedbench.results.common import Problem, _is_number, _to_float, printable
from speedbench.results.environment import NoGpuModel
from speedbench.results.files import (
    _children,
    _NotJson,
    _parse_json,
    _read,
    _real_dir,
    _subdirectory,
    _Unreadable,
    _utf8_name,
)
from speedbench.results.tree import GPU_TESTS_DIR


class GpuTests(StrEnum):
    """What a row's `gpu_tests` column holds: the verdict's status, or why there is none."""

    PASSED = "passed"
    FAILED = "failed"
    INCOMPLETE = "incomplete"
    NONE_RAN = "none ran"
    NOT_RECORDED = "not recorded"
    NOT_APPLICABLE = "not applicable"


PASSED, FAILED, INCOMPLETE, NONE_RAN = GpuTests.PASSED, GpuTests.FAILED, GpuTests.INCOMPLETE, GpuTests.NONE_RAN
NOT_RECORDED, NOT_APPLICABLE = GpuTests.NOT_RECORDED, GpuTests.NOT_APPLICABLE
STATUSES = tuple(GpuTests)
_COUNTS = ("passed", "failed", "skipped", "errors")
# The failing tests a note names before it says "and N more": the file holds them all.
_NAMED = 5


def check_verdict(obj, machine: str, stem: str) -> dict:
    """`obj` if it is a verdict of `machine` filed under `stem` (its commit's first 8
    characters); ValueError says what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    commit = obj.get("commit")
    if not (isinstance(commit, str) and len(commit) in (40, 64) and all(c in "0123456789abcdef" for c in commit)):
        raise ValueError("'commit' is not a full commit hash (40 or 64 lower-case hex digits)")
    if commit[:8] != stem:
        raise ValueError(f"filed under {printable(stem)!r} but holds commit {commit[:8]}")
    if obj.get("machine") != machine:
        raise ValueError(f"holds machine {printable(obj.get('machine'))!r}, not {printable(machine)!r}, the directory "
                         "it is in")
    for key in _COUNTS:
        if not (isinstance(obj.get(key), int) and not isinstance(obj[key], bool) and obj[key] >= 0):
            raise ValueError(f"'{key}' is not a count (a whole number >= 0)")
    for key in ("started_at", "duration_s"):
        if not (_is_number(obj.get(key)) and math.isfinite(_to_float(obj[key])) and obj[key] >= 0):
            raise ValueError(f"'{key}' is not a finite number >= 0")
    if not (isinstance(obj.get("exit_status"), int) and not isinstance(obj["exit_status"], bool)):
        raise ValueError("'exit_status' is not a whole number")
    if not isinstance(obj.get("finished"), bool):
        raise ValueError("'finished' is not true or false")
    failures = obj.get("failures")
    if not (isinstance(failures, list) and all(isinstance(f, str) for f in failures)):
        raise ValueError("'failures' is not a list of test ids")
    if len(failures) > obj["failed"] + obj["errors"]:
        raise ValueError(f"names {len(failures)} failing tests but counts {obj['failed']} failed and "
                         f"{obj['errors']} errors")
    if not isinstance(obj.get("command"), str):
        raise ValueError("'command' is not text")
    for key in ("torch", "gpu"):
        if not (obj.get(key) is None or isinstance(obj[key], str)):
            raise ValueError(f"'{key}' is neither text nor null")
    if "rehearsal" in obj and not isinstance(obj["rehearsal"], bool):
        raise ValueError("'rehearsal' is not true or false")
    return obj


def rehearsal(verdict: dict) -> bool:
    """Whether a slot rehearsed without a GPU wrote `verdict` (see the module's docstring); a
    flag that is not true or false counts as one: only a GPU host's explicit false clears it."""
    if not isinstance(verdict, dict):
        return False
    if "rehearsal" in verdict:
        return verdict["rehearsal"] is not False
    return verdict.get("gpu") is None


def status(verdict: dict) -> str:
    """FAILED where any test failed or erred; INCOMPLETE where pytest did not end on its own
    or ended on something other than its tests (exit 2-4: interrupted, internal or usage
    error); NONE_RAN where no test passed (every one skipped: no GPU visible); else PASSED."""
    if verdict["failed"] or verdict["errors"]:
        return FAILED
    if not verdict["finished"] or verdict["exit_status"] not in (0, 1, 5):
        return INCOMPLETE
    return PASSED if verdict["passed"] else NONE_RAN


def describe(verdict: dict) -> str:
    """The verdict in a few words, failing tests named: what a note, a provenance line and a
    dashboard cell say."""
    counts = ", ".join(f"{verdict[k]} {k if k != 'errors' else 'error(s)'}" for k in _COUNTS if verdict[k])
    ran = sum(verdict[k] for k in _COUNTS)
    took = f"{verdict['duration_s']:.0f} s"
    said = {PASSED: f"passed ({counts}) in {took}",
            FAILED: f"failed: {verdict['failed'] + verdict['errors']} of {ran} ({counts}) in {took}",
            INCOMPLETE: f"incomplete: pytest stopped before the end (exit status {verdict['exit_status']}) after "
                        f"{took}, {counts or 'no test reported'} so far",
            NONE_RAN: f"none ran ({counts or 'no test selected'}) in {took}"}[status(verdict)]
    failures = [printable(f) for f in verdict["failures"]]
    if failures:
        more = len(failures) - _NAMED
        said += ": " + "; ".join(failures[:_NAMED]) + (f"; and {more} more" if more > 0 else "")
    return said


def _verdicts(machine_dir: Path, root_real: Path, problems: list[Problem]) -> dict[str, dict]:
    """commit -> its verdict, for the verdicts under `machine_dir`; a file that cannot be one is
    reported and left out (its commit's rows then read "not recorded")."""
    verdicts: dict[str, dict] = {}
    directory = machine_dir / GPU_TESTS_DIR
    if not _subdirectory(directory, root_real, problems):
        return verdicts
    real = _real_dir(directory, root_real)
    for file in _children(directory, problems):
        if file.suffix != ".json" or not _utf8_name(file, "GPU test verdict", problems):
            continue
        try:
            verdict = check_verdict(_parse_json(_read(file, root_real, real)), machine_dir.name, file.stem)
        except _Unreadable as e:
            problems.append(Problem(str(file), f"unreadable ({e}); this commit's GPU tests read as not recorded"))
            continue
        except (_NotJson, ValueError) as e:  # _NotJson is a ValueError too
            problems.append(Problem(str(file), f"not a GPU test verdict ({e}); this commit's GPU tests read as not "
                                               "recorded"))
            continue
        verdicts[verdict["commit"]] = verdict
    return verdicts


def _join_gpu_tests(rows: list[dict], verdicts: dict[str, dict]) -> None:
    """Each row gets its commit's verdict on its machine; without one, NOT_APPLICABLE on a CPU
    machine (its environment record names no GPU) and NOT_RECORDED elsewhere: a GPU run from
    before the slot recorded verdicts is no pass. A CPU machine's verdict where every GPU test
    skipped (a slot rehearsed without a GPU) is NOT_APPLICABLE too; one where a test failed stands."""
    said: dict[str, tuple[str, str]] = {}
    for row in rows:
        verdict = verdicts.get(row["commit"])
        cpu = row.get("gpu") == NoGpuModel.CPU_ONLY
        if verdict is not None and cpu and status(verdict) == NONE_RAN:  # a slot rehearsed on a CPU
            row["gpu_tests"] = NOT_APPLICABLE
            row["gpu_tests_note"] = f"not applicable (no GPU: the {verdict['skipped']} GPU tests skipped)"
        elif verdict is not None:
            if row["commit"] not in said:
                said[row["commit"]] = (status(verdict), describe(verdict))
            row["gpu_tests"], row["gpu_tests_note"] = said[row["commit"]]
        elif cpu:
            row["gpu_tests"], row["gpu_tests_note"] = NOT_APPLICABLE, "not applicable (no GPU)"
        else:
            row["gpu_tests"], row["gpu_tests_note"] = NOT_RECORDED, "not recorded (no GPU test verdict for this commit)"
