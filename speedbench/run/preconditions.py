"""`speedlib run`'s options and what the run checks before it measures: the options themselves,
the chunks they name, the results directory (writable, locked), the machine directory, the pre-flight check."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from speedbench.chunks import ChunkError, load_chunks
from speedbench.measure import preflight
from speedbench.results import machines, outputs
from speedbench.results.common import printable
from speedbench.results.tree import ResultsError, ResultsTree, machine_name_refused
from speedbench.run import plan
from speedbench.run.checkout import CONFIG
from speedbench.run.errors import SuiteError
from speedbench.stats import contention


@dataclass
class RunOptions:
    quick: bool = False
    commits: str | None = None  # None: HEAD; "A..B": every commit in the range; "REV": one
    bench: Sequence[str] = field(default_factory=list)
    machine: str | None = None
    results_dir: Path | None = None  # default: the config's results_dir
    allow_dirty: bool = False
    show_stderr: bool = False
    archive: Path | None = None  # also pack what the run wrote into this .tar.gz
    chunks: Sequence[str] = ()  # benchmarks/chunks.py names (or "all"), run in suite order
    budget_minutes: float | None = None  # with chunks: start no chunk that would not fit
    require_quiet: bool = False  # refuse to measure when the pre-flight check finds the machine busy
    wait_quiet: float | None = None  # seconds to wait for a busy machine to settle before measuring
    new_build: bool = False  # file a torch/CUDA build the machine directory has not recorded (machines.py)


# What tells the benchmarks to measure one round per comparison (benchmarks/common.py QUICK):
# set by `--quick` for its own benchmark processes, whose results go to scratch and are never
# filed. Left in the shell, it would make a real run's figures one round each, filed as results.
QUICK_ENV = "SPEEDLIB_QUICK"


def check_versions(root: Path) -> None:
    """Refuse to measure where a benchmark's results would be filed under a version that does
    not describe them: its code changed since the version was recorded (benchmarks/versions.json),
    and older results of that version would be compared with them as the same measurement."""
    from speedbench.run import ledger  # noqa: PLC0415 - reads every benchmark's source: only when a run starts

    try:
        wrong = [f for f in ledger.check(Path(root)) if f.misfiles]
    except (ledger.LedgerError, ledger.FingerprintError) as e:
        raise SuiteError(f"the benchmarks' versions cannot be checked: {printable(str(e))}") from None
    if wrong:
        first = wrong[0]
        more = ", ..." if len(first.changed) > 3 else ""
        changed = f" ({', '.join(first.changed[:3])}{more})" if first.changed else ""
        raise SuiteError(f"{len(wrong)} benchmark(s) would file results under a version that does not describe them: "
                         f"{printable(first.benchmark)} {first.says}{changed}; see speedlib versions")


def check_options(options: RunOptions) -> None:
    """Refuse, with one line, options that would fail or misfile results later in the run."""
    quick = os.environ.get(QUICK_ENV)
    if not options.quick and quick is not None and quick.strip():
        raise SuiteError(f"${QUICK_ENV} is set ({QUICK_ENV}={printable(quick)}): the benchmarks would measure "
                         "one round per comparison and this run would file those as results; unset it "
                         f"(unset {QUICK_ENV}), or use --quick for a smoke run that saves nothing")
    if options.machine is not None and (why := machine_name_refused(options.machine)):  # merge's rule too
        raise SuiteError(f"--machine {why}")
    for regex in options.bench:
        try:
            re.compile(regex)
        except re.error as e:
            raise SuiteError(f"--bench '{printable(regex)}' is not a regular expression: {e}") from None
    if options.commits is not None:
        # git would read a leading dash as one of its own options (rev-list --all, --output=...).
        if not options.commits or any(part.startswith("-") for part in options.commits.split("..")):
            raise SuiteError(f"--commits '{printable(options.commits)}' is not a revision or a range A..B")
    if options.results_dir is not None:
        try:  # a symlink loop (RuntimeError before Python 3.13), a name over 255 bytes or a path over 4096 (OSError)
            options.results_dir.resolve().exists()
        except (OSError, RuntimeError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else "it is a loop of symbolic links"
            raise SuiteError(f"--results-dir {printable(str(options.results_dir))} cannot be used: {why}") from None
    if options.results_dir is not None and options.results_dir.exists() and not options.results_dir.is_dir():
        raise SuiteError(f"--results-dir {printable(str(options.results_dir))} exists and is not a directory")
    if options.wait_quiet is not None and not (math.isfinite(options.wait_quiet) and options.wait_quiet > 0):
        raise SuiteError(f"--wait-quiet must be a positive, finite number of seconds, got {options.wait_quiet:g}")
    # nan would start every chunk (nothing is > nan), a negative budget none
    budget = options.budget_minutes
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise SuiteError(f"--budget-minutes must be a positive, finite number of minutes, got {budget:g}")
    check_archive(options, options.results_dir)


# Why an archive may not be a FIFO: opening one waits until something reads it.
RUN_IN_CHUNKS = "a run in chunks writes its archive after every chunk, and a FIFO's reader takes only the first"


def check_archive(options: RunOptions, results_dir: Path | None, deadline: str | None = None) -> None:
    """--archive checked by the one output rule (speedbench.results.outputs) before anything runs,
    as the file written last: not among the results (`results_dir`'s or any tree's files), not a
    directory, a FIFO only where it is written once and nothing must end by a deadline."""
    if options.archive is None:
        return
    if deadline is None and (options.chunks or options.budget_minutes is not None):
        deadline = RUN_IN_CHUNKS
    try:
        outputs.file_output(options.archive, "--archive", [results_dir] if results_dir is not None else [], deadline)
    except outputs.OutputRefused as e:
        raise SuiteError(str(e)) from None


def _check_writable(directory: Path, what: str, instead: str) -> None:
    """The results tree's writable check (speedbench.results.tree), its refusal a SuiteError."""
    try:
        ResultsTree(directory).check_writable(what, instead)
    except ResultsError as e:
        raise SuiteError(str(e)) from None


def _results_dir(options: RunOptions, root: Path, conf: dict) -> Path:
    return (options.results_dir or root / conf.get("results_dir", "results")).resolve()


@contextlib.contextmanager
def _locked(results_dir: Path):
    """The results tree's lock held for the block; a refusal (another run or merge holds it)
    is a SuiteError, exit 2, like every precondition of the run."""
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(ResultsTree(results_dir).lock())
        except ResultsError as e:
            raise SuiteError(str(e)) from None
        yield


def _check_machine(options: RunOptions, root: Path, identity: dict) -> None:
    """Refuse (SuiteError) to file this run under a machine directory whose environment records
    name other hardware, or another torch/CUDA build without --new-build (speedbench.results.machines).
    A quick run files nothing."""
    if options.quick:
        return
    machine = options.machine or identity["machine"]
    results_dir = _results_dir(options, root, json.loads((root / CONFIG).read_text()))
    try:
        note = machines.check_directory(results_dir, machine, identity, options.new_build)
    except machines.MachineMismatch as e:
        raise SuiteError(str(e)) from None
    if note:
        print(f"speedlib run: {note}", flush=True)


def _preflight(options: RunOptions):
    """The pre-flight check (speedbench/measure/preflight.py): its findings that are not ok, then one
    summary line. --wait-quiet checks again until a busy machine settles; --require-quiet
    refuses to measure on one (SuiteError: exit 2). Otherwise a busy machine is measured on,
    with a warning; the environment record keeps the findings either way."""
    report = preflight.check()
    waited = options.wait_quiet is not None and report.busy
    if waited:
        print(f"speedlib run: busy: {printable(report.busy_line())}", flush=True)
        print(f"speedlib run: waiting up to {options.wait_quiet:g} s for the machine to settle", flush=True)
        report = preflight.wait_until_quiet(options.wait_quiet, report,
                                            say=lambda line: print(f"speedlib run: {printable(line)}", flush=True))
    for finding in report.findings:
        if finding.level != "ok":
            print(f"speedlib run: {finding.level}: {printable(finding.line())}", flush=True)
    print(f"speedlib run: {report.summary()} (speedlib env --check lists every check)", flush=True)
    if report.busy:
        still = f"still busy after --wait-quiet {options.wait_quiet:g} s" if waited else "the machine is busy"
        if options.require_quiet:
            raise SuiteError(f"{still} ({printable(report.busy_line())}), and --require-quiet refuses to measure "
                             "on a busy machine: stop the other work"
                             + ("" if waited else ", or give it time with --wait-quiet SECONDS"))
        print(f"speedlib run: {still}; measuring anyway, and ratios may come out inflated (--require-quiet "
              "refuses instead)", flush=True)
        print(f"speedlib run: every figure of this run is marked {contention.MARK} contended: the machine was busy "
              "as it started", flush=True)
    elif waited:
        print("speedlib run: the machine is quiet now", flush=True)
    return report


def _steps(options: RunOptions, root: Path) -> list:
    """(chunk or None, --bench regexes) per asv invocation over the commits."""
    if not options.chunks:
        if options.budget_minutes is not None:
            raise SuiteError("--budget-minutes chooses among chunks: name them with --chunk (or --chunk all)")
        return [(None, list(options.bench))]
    if options.bench:
        raise SuiteError("--bench and --chunk both select benchmarks: use one of them")
    try:
        chunks = plan.select_chunks(load_chunks(root), list(options.chunks))
    except ChunkError as e:
        raise SuiteError(str(e)) from e
    return [(c, [c.regex]) for c in chunks]
