"""Drive asv the way speedlib's results need it (`speedlib run`).

asv with an `existing` environment (torch is preinstalled on GPU machines and cannot be
installed per commit) saves results only with `--set-commit-hash` and refuses commit
ranges, so this module: registers the machine under a name that says the hardware,
records the environment beside the results, and walks commit ranges itself with one
`git worktree` per commit, pointing the benchmark processes at that commit's library
(`speedlib/` only) through ASV_PYTHONPATH while the benchmarks and the harness that times
them (`speedbench/`) come from the current checkout.
`--quick` smoke runs go to a scratch directory and never touch `results/`.
Options are checked before any work (a bad --bench regex, a --machine that is not a plain
name, option-like --commits, an --archive that is a directory, a --results-dir that is a
file), so is the machine directory: one whose environment records name other hardware, or
another torch/CUDA build without --new-build, is refused (speedbench.machines), and one run
at a time writes to a results directory: a second one refuses to start
(`_ResultsLock`). Each run first removes the scratch directories and commit worktrees that
runs killed outright left behind (`prune_stale`).
A benchmark that fails does not stop the run: the other results, the environment records
and the archive are still written, and the failures are listed at the end (`RunResult.failed`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import importlib.util
import itertools
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from speedbench import plan, safekeep, supervise
from speedbench.results import printable

try:
    import fcntl
except ImportError:  # not a POSIX system: runs are not locked against each other
    fcntl = None

__all__ = ["RunOptions", "RunResult", "run", "failed_benchmarks", "find_root", "resolve_commits",
           "environment_record_path", "pack_results", "check_options", "prune_stale"]

CONFIG = "asv.conf.json"


class SuiteError(RuntimeError):
    """A `speedlib run` precondition failed; the message says how to fix it."""


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


@dataclass
class RunResult:
    results_dir: Path
    machine: str
    failed: list[str]  # one printable line per benchmark that failed: "<commit> <name> ..."
    not_run: list[str] = field(default_factory=list)  # chunks left out to keep within the budget


def find_root(start: Path | None = None) -> Path:
    """The directory holding asv.conf.json, from `start` (default: cwd) upwards."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / CONFIG).is_file():
            return d
    raise SuiteError(f"no {CONFIG} in {here} or its parents: run speedlib from a speedlib checkout")


def _git(root: Path, *args: str, strip: bool = True) -> str:
    """git's output; `strip=False` keeps it byte for byte (porcelain output starts with a
    status column that may be a space). A failure is one printable line, git's first (the
    rest is advice or a usage screen): git echoes revisions as given, and --commits comes
    from the command line."""
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True)
    except subprocess.CalledProcessError as e:
        said = (e.stderr.strip().splitlines() or [""])[0]
        raise SuiteError(printable(f"git {' '.join(args)} failed: {said}")) from e
    return out.stdout.strip() if strip else out.stdout


# A source tree copied to an offline host (a batch node, a borrowed GPU) often arrives
# without .git; asv files results under commits, so git history has to come back first.
RESTORE_GIT = ("git init -q -b main && git fetch -q BUNDLE main && git reset -q FETCH_HEAD "
               "(BUNDLE made where the history is: git bundle create speedlib.bundle main)")


def resolve_commits(root: Path, spec: str | None) -> list[str]:
    """Full hashes, oldest first: HEAD, every commit of 'A..B', or one revision."""
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True, text=True)
    # A copy without .git inside some other repository would find that one's HEAD.
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != Path(root).resolve():
        raise SuiteError(f"{root} is not a git checkout, and results are filed under commits: restore its "
                         f"history from a bundle: {RESTORE_GIT}")
    if not spec:
        return [_git(root, "rev-parse", "HEAD")]
    if ".." in spec:
        shas = _git(root, "rev-list", "--reverse", spec).split()
        if not shas:
            raise SuiteError(f"commit range {spec!r} is empty")
        return shas
    return [_git(root, "rev-parse", "--verify", f"{spec}^{{commit}}")]


# An asv machine name is a directory under results/: one path component, nothing that
# climbs out (..), hides (a leading dot) or reads as an option (a leading dash).
_MACHINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


def check_options(options: RunOptions) -> None:
    """Refuse, with one line, options that would fail or misfile results later in the run."""
    if options.machine is not None and (not _MACHINE_NAME.fullmatch(options.machine) or ".." in options.machine):
        raise SuiteError(f"--machine '{printable(options.machine)}' is not a plain name: use letters, digits and "
                         ". _ + - (no path separators, no '..', not starting with '.' or '-')")
    for regex in options.bench:
        try:
            re.compile(regex)
        except re.error as e:
            raise SuiteError(f"--bench '{printable(regex)}' is not a regular expression: {e}") from None
    if options.commits is not None:
        # git would read a leading dash as one of its own options (rev-list --all, --output=...).
        if not options.commits or any(part.startswith("-") for part in options.commits.split("..")):
            raise SuiteError(f"--commits '{printable(options.commits)}' is not a revision or a range A..B")
    if options.archive is not None and options.archive.is_dir():
        raise SuiteError(f"--archive {printable(str(options.archive))} is a directory: name the .tar.gz file to write")
    if options.results_dir is not None and options.results_dir.exists() and not options.results_dir.is_dir():
        raise SuiteError(f"--results-dir {printable(str(options.results_dir))} exists and is not a directory")
    if options.wait_quiet is not None and not (math.isfinite(options.wait_quiet) and options.wait_quiet > 0):
        raise SuiteError(f"--wait-quiet must be a positive, finite number of seconds, got {options.wait_quiet:g}")
    # nan would start every chunk (nothing is > nan), a negative budget none
    if options.budget_minutes is not None and not (math.isfinite(options.budget_minutes) and options.budget_minutes > 0):
        raise SuiteError(f"--budget-minutes must be a positive, finite number of minutes, got {options.budget_minutes:g}")
    if options.archive is not None:  # else found out only when the first chunk or the whole run is packed
        _check_writable(options.archive.parent, f"--archive {printable(str(options.archive))}",
                        "name a file in a directory you can write to")


def _check_writable(directory: Path, what: str, instead: str) -> None:
    """SuiteError, one line, unless this user can write to `directory` or create it (its
    nearest existing ancestor is a writable directory). Asked before anything is measured:
    asv and the archive would find out only after the run, and its results with nowhere to go."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise SuiteError(f"{what} cannot be written: {printable(str(existing))} is not a directory; {instead}")
    if not os.access(existing, os.W_OK | os.X_OK):  # a read-only mount too, for root as well
        raise SuiteError(f"{what} cannot be written: {printable(str(existing))} is read-only for this user; {instead}")
    # os.access says yes to root wherever the mode allows, and /proc or a full quota says no
    # only when a file is made: one is made, and removed at once.
    try:
        fd, probe = tempfile.mkstemp(prefix=".speedlib-probe-", dir=existing)
    except OSError as e:
        raise SuiteError(f"{what} cannot be written: no file can be made in {printable(str(existing))} "
                         f"({e.strerror or e}); {instead}") from None
    os.close(fd)
    os.unlink(probe)


def _results_dir(options: RunOptions, root: Path, conf: dict) -> Path:
    return (options.results_dir or root / conf.get("results_dir", "results")).resolve()


class _ResultsLock:
    """Context manager: an exclusive lock on a results directory (the directory itself: no
    lock file to commit), held until the run ends however it ends (the kernel drops it with
    the process). Two runs writing one directory would each rewrite a commit's result file,
    and the one finishing last would keep only its own benchmarks: the second one refuses.
    A directory created only to be locked is removed again if the run left it empty."""

    def __init__(self, results_dir: Path):
        self.results_dir = results_dir
        self.fd: int | None = None
        self.created = False

    def __enter__(self) -> _ResultsLock:
        if fcntl is None:
            return self
        self.created = not self.results_dir.exists()
        try:
            self.results_dir.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.results_dir, os.O_RDONLY)
        except OSError as e:  # run() checked that it can be written; this is what changed since
            raise SuiteError(f"cannot use {printable(str(self.results_dir))} for results ({e.strerror or e}): give "
                             "the run another with --results-dir") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(self.fd)
            self.fd = None
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise SuiteError(f"cannot lock {printable(str(self.results_dir))} against other runs "
                                 f"({e.strerror or e}): give the run another --results-dir") from None
            raise SuiteError(f"another speedlib run is writing to {printable(str(self.results_dir))}: wait for "
                             "it to finish, or give this one its own --results-dir") from None
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
        if self.created:
            try:
                self.results_dir.rmdir()  # only if empty: a failed first run leaves nothing behind
            except OSError:
                pass


# What a run takes from the checkout: everything for a plain run (filed under HEAD); with
# --commits the library comes from each commit, the benchmarks, harness and config still
# from the checkout.
_CHECKOUT_PARTS = ("speedlib", "speedbench", "benchmarks", CONFIG)
_HARNESS_PARTS = ("speedbench", "benchmarks", CONFIG)
# Python's caches appear beside any module that ran (a scratch copy has no .gitignore).
_NOT_CODE = (":(exclude,glob)**/__pycache__/**", ":(exclude,glob)**/*.pyc")


def _dirty(root: Path, parts: Sequence[str] = _CHECKOUT_PARTS) -> list[str]:
    """The paths of changed and untracked files under `parts`: an untracked benchmark runs as
    surely as an edited one. Read with -z: each entry is 'XY path' exactly (no quoting, no
    stripped status column), a rename's original path following as an entry of its own."""
    out = _git(root, "status", "--porcelain", "-z", "--untracked-files=all", "--", *parts, *_NOT_CODE,
               strip=False)
    entries = iter(out.split("\0"))
    paths = []
    for entry in entries:
        if len(entry) < 4:
            continue  # the empty string after the last NUL
        paths.append(entry[3:])
        if entry[0] in "RC":
            next(entries, None)  # the path it was renamed or copied from
    return paths


def environment_record_path(results_dir: Path, machine: str, sha: str) -> Path:
    """Where a run's environment record goes: beside asv's files, one JSON line per run.

    Not a .json file in the machine directory, which asv would try to read as a result.
    """
    return results_dir / machine / "environment" / f"{sha[:8]}.jsonl"


def _record_environment(path: Path, sha: str, env: dict, command: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "commit": sha,
        "recorded_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(command),
        **env,
    }
    with _writing(path):  # appended: a rerun never loses the last record
        safekeep.append_line(path, json.dumps(record, sort_keys=True))


@contextlib.contextmanager
def _writing(path: Path):
    """An OSError while speedlib writes one of its own files (safekeep writes them whole or
    not at all) as one line that says the file is unharmed."""
    try:
        yield
    except OSError as e:
        raise SuiteError(f"could not write {printable(str(path))} ({e.strerror or e}){safekeep.disk_full(e)}; it is as it was "
                         "before: free some space and run again") from None


class Interrupted(SuiteError):
    """SIGINT or SIGTERM stopped the run; asv and its benchmark processes were stopped too."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}: asv and its benchmarks were stopped; "
                         "results of finished chunks and commits are kept")
        self.signum = signum


# asv runs under this supervisor; see its docstring for why stopping asv's process group
# is not enough (asv gives every benchmark process a group of its own).
_SUPERVISE = Path(supervise.__file__)


def _asv(args: list[str], *, env: dict | None = None, cwd: Path, failures_ok: bool = False) -> int:
    """asv's exit status: 0, or 2 when `failures_ok` (`asv run`: some benchmark failed, the
    results were saved). Any other status means asv itself failed, and raises.

    When this run is stopped (Ctrl+C, a SIGTERM from a time limit, even a SIGKILL), asv and
    every process it started are stopped with it instead of running on, holding the GPU and
    writing results nobody packs."""
    cmd = [sys.executable, "-m", "asv", *args]
    # asv and its benchmarks leave files in $TMPDIR, stopped or not (the forkserver's socket
    # directory, benchmark working directories, torchrun's error files): they get a directory
    # of this run's, removed once the supervisor has stopped them all. After a SIGKILL the
    # next run's prune_stale removes it (its owner file says whose it was).
    with tempfile.TemporaryDirectory(prefix="speedlib-asv-", ignore_cleanup_errors=True) as tmp:
        _claim(Path(tmp))
        env = dict(os.environ if env is None else env)
        if len(os.fsencode(tmp)) <= _TMPDIR_MAX:
            env["TMPDIR"] = tmp
        # The supervisor gets a process group of its own so that a terminal's Ctrl+C reaches
        # speedlib alone, which then stops the supervisor in order. asv's own per-benchmark
        # progress lines stream straight through.
        proc = subprocess.Popen([sys.executable, str(_SUPERVISE), str(os.getpid()), "--", *cmd],
                                cwd=cwd, env=env, process_group=0)
        try:
            returncode = proc.wait()
        except BaseException:
            _stop_supervisor(proc)
            raise
    if returncode != 0 and not (failures_ok and returncode == 2):
        raise SuiteError(f"asv exited with status {returncode}: {shlex.join(cmd)}")
    return returncode


# asv's forkserver listens on $TMPDIR/asv-forkserver-XXXXXXXX/socket, and a Unix socket's path
# holds at most 107 bytes: under a TMPDIR so long that the directory above would overflow it,
# asv keeps the caller's.
_TMPDIR_MAX = 107 - len("/asv-forkserver-XXXXXXXX/socket")


def _stop_supervisor(proc: subprocess.Popen) -> None:
    """SIGTERM the supervisor, which stops asv's whole tree; SIGKILL its group if it hangs."""
    try:
        proc.terminate()
        proc.wait(timeout=supervise.GRACE_S + 10)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


_STOPPING = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _stopped_by_signals():
    """While the run lasts, SIGINT and SIGTERM raise Interrupted. Only the main thread may set
    handlers: elsewhere the caller's stay."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, _raise_interrupted) for signum in _STOPPING}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _raise_interrupted(signum: int, frame) -> None:
    # The first signal stops the run. Stopping asv (up to its grace period) and removing the
    # worktrees and scratch take a while; a second Ctrl+C raised in the middle of that would
    # cut the cleanup short and leave asv running. From here on both only say to wait.
    for each in _STOPPING:
        signal.signal(each, _still_stopping)
    raise Interrupted(signum)


def _still_stopping(signum: int, frame) -> None:
    try:  # os.write, not print: the code this interrupts may be inside a print to stderr
        os.write(2, f"speedlib run: still stopping asv and removing the run's scratch (up to "
                    f"{supervise.GRACE_S + 10:.0f} s)\n".encode())
    except OSError:
        pass


def failed_benchmarks(results_dir: Path, machine: str, sha: str, since_ms: int = 0) -> list[str]:
    """One printable line per benchmark of `sha` that asv recorded as failed (result null)
    and that started at `since_ms` or later: the result file keeps earlier runs' entries of
    the commit, and a failure from one of those is not this run's."""
    lines = []
    for path in sorted((Path(results_dir) / machine).glob(f"{sha[:8]}-*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("commit_hash") != sha:
            continue
        for name, entry in sorted(data.get("results", {}).items()):
            record = dict(zip(data["result_columns"], entry))
            if not isinstance(record.get("started_at"), (int, float)) or record["started_at"] < since_ms:
                continue
            params = record.get("params") or []
            combos = list(itertools.product(*params))  # a benchmark without parameters has one, ()
            values = record.get("result")
            values = values if isinstance(values, list) else [values] * len(combos)
            bad = [c for c, v in zip(combos, values) if v is None]
            if not bad:
                continue
            line = f"{sha[:8]} {name}"
            if params:  # which parameter sets, as asv prints them (reprs)
                line += f" for {len(bad)} of {len(combos)} parameter sets: " + "; ".join(
                    f"({', '.join(c)})" for c in bad)
            lines.append(printable(line))  # names come from benchmark code
    return lines


def _register_machine(conf: Path, root: Path, name: str, env: dict) -> None:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    _asv([
        "machine", "--yes", "--config", str(conf), "--machine", name,
        "--os", env["os"], "--arch", platform.machine(), "--cpu", env["cpu_model"],
        "--num_cpu", str(env["cpu_cores"]), "--ram", str(ram),
    ], cwd=root)


def _write_config(conf: dict, root: Path, results_dir: Path, scratch: Path) -> Path:
    """A copy of asv.conf.json with absolute paths, so asv can run from anywhere."""
    conf = dict(conf)
    conf["repo"] = str(root)
    conf["benchmark_dir"] = str(root / conf.get("benchmark_dir", "benchmarks"))
    conf["results_dir"] = str(results_dir)
    conf["html_dir"] = str(scratch / "html")
    conf["env_dir"] = str(scratch / "env")
    path = scratch / CONFIG
    path.write_text(json.dumps(conf, indent=2))
    return path


def run(options: RunOptions, root: Path | None = None, argv: Sequence[str] = ()) -> RunResult:
    """Run the suite; return where the results went and which benchmarks failed.

    A failed benchmark is reported, not raised: the rest of the run is worth keeping."""
    root = root or find_root()
    if importlib.util.find_spec("asv") is None or importlib.util.find_spec("asv_runner") is None:
        raise SuiteError('asv is not installed here: python3 -m pip install -e ".[bench]"')
    if options.quick and options.archive is not None:
        raise SuiteError("--archive packs saved results, and a --quick run saves none")
    check_options(options)
    shas = resolve_commits(root, options.commits)
    if not options.quick and not options.allow_dirty:
        parts = _CHECKOUT_PARTS if options.commits is None else _HARNESS_PARTS
        changed = _dirty(root, parts)
        if changed:
            shown = ", ".join(printable(path) for path in changed[:3]) + (", ..." if len(changed) > 3 else "")
            raise SuiteError(
                f"uncommitted changes or untracked files in {', '.join(parts)} ({shown}): results would be "
                "filed under a commit that did not produce them. Commit first, use --quick for a "
                "smoke run, or pass --allow-dirty."
            )
    steps = _steps(options, root)  # a bad chunk name is refused before any work
    results_dir = _results_dir(options, root, json.loads((root / CONFIG).read_text()))
    if not options.quick:
        _check_writable(results_dir, f"the results directory {printable(str(results_dir))}",
                        "give the run another with --results-dir")
    if options.budget_minutes is not None:  # priced from the listing: a torn one is refused now, not mid-run
        _listing(root, root / "results" if options.quick else results_dir)
    # A quick run writes to a scratch directory of its own: nothing to lock.
    lock = contextlib.nullcontext() if options.quick else _ResultsLock(results_dir)
    # SIGINT and SIGTERM (Ctrl+C, a time limit, a batch system) unwind the run: asv is
    # stopped, worktrees and the scratch directories are removed, the lock released.
    with _stopped_by_signals(), lock:
        for stale in prune_stale(root):
            print(f"speedlib run: removed {printable(str(stale))}, left by a run that was killed", flush=True)
        if not options.quick:
            _recover(lock.results_dir)
        return _run(options, root, argv, shas, steps)


def _run(options: RunOptions, root: Path, argv: Sequence[str], shas: list[str], steps: list) -> RunResult:
    from speedbench import measure  # noqa: PLC0415 - imports torch; keep `speedlib --help` fast

    _check_machine(options, root, measure.identity())  # before the pre-flight check, which may wait
    checked = _preflight(options)  # before anything is measured, and before asv starts
    env = measure.environment()
    env["preflight"] = checked.record()  # in every commit's environment record
    machine = options.machine or env["machine"]
    with tempfile.TemporaryDirectory(prefix="speedlib-run-") as tmp:
        scratch = Path(tmp)
        _claim(scratch)
        conf = json.loads((root / CONFIG).read_text())
        results_dir = scratch / "results" if options.quick else _results_dir(options, root, conf)
        conf_path = _write_config(conf, root, results_dir, scratch)
        _register_machine(conf_path, root, machine, env)
        print(f"speedlib run: machine {machine}, {len(shas)} commit(s), results -> "
              f"{'scratch (quick run, not saved)' if options.quick else results_dir}", flush=True)
        if options.budget_minutes is not None:  # said once here, not once per chunk priced
            _say_what_prices_leave_out(root, results_dir, machine)
        failed: list[str] = []
        started, not_run = time.monotonic(), []
        for chunk, bench in steps:
            if chunk is not None:
                if options.budget_minutes is not None:
                    # Chunks are in order of importance; one that does not fit is left for a
                    # later command, and a cheaper one after it may still fit.
                    left = options.budget_minutes * 60 - (time.monotonic() - started)
                    cost = _chunk_seconds(chunk, root, results_dir, machine) * len(shas)
                    if cost > left:
                        not_run.append(chunk.name)
                        print(f"\nspeedlib run: chunk {chunk.name} (about {cost / 60:.1f} min) does not fit the "
                              f"{max(left, 0) / 60:.1f} min left of --budget-minutes: not run", flush=True)
                        continue
                print(f"\n=== chunk {chunk.name}: {chunk.about}", flush=True)
            for i, sha in enumerate(shas, 1):
                began = time.monotonic()
                failed += _run_commit(options, root, conf_path, results_dir, machine, env, argv, sha,
                                      f"[{i}/{len(shas)}]", bench)
                if chunk is not None:  # the next budget decision for this chunk uses this, not a guess
                    with _writing(plan.chunk_times_path(results_dir, machine)):
                        plan.record_chunk_time(results_dir, machine, chunk.name, sha, time.monotonic() - began)
            if chunk is not None and options.archive is not None and not options.quick:
                # After every chunk: a command killed in the next one keeps this archive.
                pack_results(results_dir, machine, shas, options.archive)
                print(f"speedlib run: chunk {chunk.name} packed into {options.archive}", flush=True)
        if not_run:
            print(f"\nspeedlib run: left for a later command: --chunk {' --chunk '.join(not_run)}", flush=True)
            if len(not_run) == len(steps) and options.archive is not None:
                print("speedlib run: no chunk fit the budget, so nothing ran and nothing was packed", flush=True)
        if options.quick:
            _print_table(results_dir, machine)
            _print_failed(failed)
            return RunResult(results_dir, machine, failed, not_run)
    _print_table(results_dir, machine, shas)
    if options.archive is not None and not options.chunks:  # chunks were packed one by one
        packed = pack_results(results_dir, machine, shas, options.archive)
        print(f"\nspeedlib run: packed {packed}: unpack it in a checkout's root and commit results/", flush=True)
    _print_failed(failed)
    return RunResult(results_dir, machine, failed, not_run)


def _check_machine(options: RunOptions, root: Path, identity: dict) -> None:
    """Refuse (SuiteError) to file this run under a machine directory whose environment records
    name other hardware, or another torch/CUDA build without --new-build (speedbench.machines).
    A quick run files nothing."""
    from speedbench import machines  # noqa: PLC0415

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
    """The pre-flight check (speedbench/preflight.py): its findings that are not ok, then one
    summary line. --wait-quiet checks again until a busy machine settles; --require-quiet
    refuses to measure on one (SuiteError: exit 2). Otherwise a busy machine is measured on,
    with a warning; the environment record keeps the findings either way."""
    from speedbench import preflight  # noqa: PLC0415

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
        chunks = plan.select_chunks(plan.load_chunks(root), list(options.chunks))
    except plan.PlanError as e:
        raise SuiteError(str(e)) from e
    return [(c, [c.regex]) for c in chunks]


def _listing(root: Path, results_dir: Path) -> Path | None:
    """plan.benchmark_listing; a listing it cannot read is a SuiteError (one line)."""
    try:
        return plan.benchmark_listing(root, results_dir)
    except plan.PlanError as e:
        raise SuiteError(str(e)) from None


def _say_what_prices_leave_out(root: Path, results_dir: Path, machine: str) -> None:
    """The chunk times and listed benchmarks a budget's prices leave out (as `--plan` says them):
    a chunk priced without them may not fit where the budget said it would."""
    note = plan.chunk_times_note(results_dir, machine)
    if note:
        print(f"speedlib run: {note}", flush=True)
    listing, skipped = _listing(root, results_dir), []
    if listing is not None:
        plan.combinations(listing, skipped)
    for line in skipped:
        print(f"speedlib run: not priced: {printable(line)}", flush=True)


def _chunk_seconds(chunk, root: Path, results_dir: Path, machine: str) -> float:
    """What `chunk` should take here for one commit (see plan.chunk_cost)."""
    listing = _listing(root, results_dir)
    if listing is None:
        return 0.0  # nothing known about the suite yet: run it and learn
    names = plan.combinations(listing)
    per_combination, _ = plan.seconds_per_combination(plan.load_chunks(root), names, results_dir, machine)
    return plan.chunk_cost(chunk, names, results_dir, machine, per_combination)[0]


def _run_commit(options: RunOptions, root: Path, conf_path: Path, results_dir: Path, machine: str, env: dict,
                argv: Sequence[str], sha: str, counter: str, bench: Sequence[str]) -> list[str]:
    """One `asv run` of `bench` at `sha`; the failed benchmarks it recorded."""
    subject = _git(root, "log", "-1", "--format=%s", sha)
    print(f"\n{counter} {sha[:8]} {printable(subject)}", flush=True)  # anyone's commit may restyle a terminal
    with _library_at(root, sha, use_checkout=options.commits is None) as lib:
        asv_args = [
            "run", "--config", str(conf_path), "--machine", machine,
            "--environment", f"existing:{sys.executable}", "--set-commit-hash", sha,
            "--launch-method", plan.LAUNCH_METHOD, "--record-samples",
        ]
        if options.quick:
            asv_args.append("--quick")
        if options.show_stderr:
            asv_args.append("--show-stderr")
        for b in bench:
            asv_args += ["--bench", b]
        started_ms = int(time.time() * 1000)
        # The commit's `speedlib` first; then this checkout, for the harness (`speedbench`)
        # where no console script's install put it on the path (an offline GPU host).
        path = os.pathsep.join(dict.fromkeys([str(lib), str(root)]))
        process_env = {**os.environ, "ASV_PYTHONPATH": path}
        if options.quick:  # paired comparisons: one round each (benchmarks/common.py)
            process_env["SPEEDLIB_QUICK"] = "1"
        from speedbench.interference import load_average  # noqa: PLC0415

        load_start = load_average()
        status = _asv_keeping_results(asv_args, process_env, root, Path(results_dir), machine, sha)
    found = []
    if status == 2:
        # asv also exits 2 on errors of its own (a bad argument): then it saved no failure.
        found = failed_benchmarks(results_dir, machine, sha, started_ms)
        if not found:
            raise SuiteError(f"asv exited with status 2 at {sha[:8]} but recorded no failed benchmark: "
                             "see its output above")
    from speedbench import contention, interference, measure  # noqa: PLC0415 - torch; already imported by _run()

    # What else the machine did while this commit was measured: said at once, and kept.
    counters = contention.summary(interference_counters(results_dir, machine, sha, started_ms),
                                  env.get("cpu_cores"), env.get("torch_threads"))
    print(f"speedlib run: {sha[:8]}: {contention.summary_line(counters)}", flush=True)
    # Clocks and temperature as this commit's benchmarks left them, not as the run began.
    env = {**env, "gpu_state": measure.gpu_state(), "load_start": load_start,
           "load_end": interference.load_average(), "interference": counters}
    _record_environment(environment_record_path(results_dir, machine, sha), sha, env, ["speedlib", *argv])
    return found


def interference_counters(results_dir: Path, machine: str, sha: str, since_ms: int = 0) -> dict[str, dict]:
    """The interference counters (benchmarks/common.py `_Interference`) that asv recorded for
    `sha` from `since_ms` on, one entry per measurement: a paired configuration's rounds are
    stored once per variant, and counted once."""
    from speedbench.contention import COUNTER_METRICS  # noqa: PLC0415

    found: dict[tuple, dict] = {}
    for path in sorted((Path(results_dir) / machine).glob(f"{sha[:8]}-*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # unreadable: `speedlib report` names it; the run goes on
        if not isinstance(data, dict) or data.get("commit_hash") != sha:
            continue
        for name, entry in (data.get("results") or {}).items():
            cls, _, method = name.rpartition(".")
            metric = COUNTER_METRICS.get(method.removeprefix("track_"))
            record = dict(zip(data.get("result_columns") or [], entry if isinstance(entry, list) else []))
            started = record.get("started_at")
            if metric is None or not isinstance(started, (int, float)) or started < since_ms:
                continue
            params = record.get("params") or []
            for combo, samples in zip(itertools.product(*params), record.get("samples") or []):
                if isinstance(samples, list) and samples and all(isinstance(v, (int, float)) for v in samples):
                    found.setdefault((cls, combo), {})[metric] = samples
    unique: dict[str, tuple[str, dict]] = {}
    for (cls, combo), counters in found.items():
        # named by the parameters before the variant where that tells them apart (a paired
        # configuration), else by all of them (one launch per parameter set)
        label = f"{cls}({', '.join(combo[:-1] or combo)})"
        unique.setdefault(json.dumps([cls, sorted(counters.items())]), (label, counters))
    out: dict[str, dict] = {}
    for label, counters in unique.values():
        out[label if label not in out else f"{label} {len(out)}"] = counters
    return out


def _asv_keeping_results(asv_args: list[str], env: dict, root: Path, results_dir: Path, machine: str,
                         sha: str) -> int:
    """`_asv(asv_args)` with asv's files in `results_dir` copied first and put back where it
    leaves them torn (speedbench.safekeep): asv rewrites them in place, so a full disk, a
    Ctrl+C or a time limit would otherwise cut the listing or a commit's earlier results."""
    try:
        snapshot = safekeep.take(results_dir, machine, sha)
    except safekeep.SnapshotError as e:
        raise SuiteError(printable(str(e))) from None
    try:
        status = _asv(asv_args, env=env, cwd=root, failures_ok=True)
    except BaseException as e:
        # asv failed (not stopped by a signal): was the disk full? Asked before putting back,
        # which frees what the torn files took.
        full = _full_disk(results_dir) if type(e) is SuiteError else ""
        _settle(snapshot, failed=True)
        if full:
            raise SuiteError(f"{e}{full}") from None
        raise
    _settle(snapshot, failed=False)
    return status


def _recover(results_dir: Path) -> None:
    """Put back what asv left torn in a run that was killed outright (SIGKILL, a lost
    machine): its snapshot is still in `results_dir`. Under the results lock, so that run is gone."""
    try:
        lines = safekeep.recover(results_dir)
    except safekeep.SnapshotError as e:
        raise SuiteError(printable(str(e))) from None
    for line in lines:
        print(f"speedlib run: a run was killed while asv wrote here: {printable(line)}", flush=True)


def _settle(snapshot, failed: bool) -> None:
    """safekeep.settle after an asv run, each file it put back or removed said in one line."""
    try:
        lines = safekeep.settle(snapshot, failed)
    except safekeep.SnapshotError as e:
        raise SuiteError(printable(str(e))) from None
    for line in lines:
        print(f"speedlib run: asv {'stopped' if failed else 'ran'}: {printable(line)}", flush=True)


def _full_disk(results_dir: Path) -> str:
    """What to add to asv's failure when the disk holding the results has (next to) no room
    left: then that is why asv failed, and its files were put back."""
    try:
        st = os.statvfs(results_dir)
    except (OSError, AttributeError):
        return ""
    free = st.f_bavail * st.f_frsize
    if free >= _FULL_BELOW:
        return ""
    return (f"; the disk holding {printable(str(results_dir))} is full ({free // 1024} KiB free): what asv tore "
            "there was put back; free some space and run again")


# Less free space than this reads as a full disk: a write fails with ENOSPC once no block is
# free, and asv exiting frees little; a disk this full fails the next run anyway.
_FULL_BELOW = 1 << 20


def _print_failed(failed: Sequence[str]) -> None:
    if failed:  # last, so that asv's long output above does not bury it
        print(f"\nspeedlib run: {len(failed)} benchmark(s) failed "
              "(asv's output above says why):", file=sys.stderr, flush=True)
        for line in failed:
            print(f"  FAILED {line}", file=sys.stderr, flush=True)


def pack_results(results_dir: Path, machine: str, shas: Sequence[str], dest: Path) -> Path:
    """One .tar.gz of what a run wrote, laid out as `results/...` so that unpacking it in a
    checkout's root adds it there: the machine's result files and environment records for
    `shas`, its machine.json, and benchmarks.json (the benchmark versions asv compares)."""
    results_dir, dest = Path(results_dir), Path(dest)
    machine_dir = results_dir / machine
    files = [results_dir / "benchmarks.json", machine_dir / "machine.json", machine_dir / "chunk-times.jsonl"]
    for sha in shas:
        files += sorted(machine_dir.glob(f"{sha[:8]}-*.json"))
        files.append(environment_record_path(results_dir, machine, sha))
    missing = [str(f) for f in files[:2] if not f.is_file()]
    if missing or len(files) == 3 + len(shas):
        raise SuiteError(f"nothing to pack for {machine} in {results_dir}: missing {missing or 'result files'}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed: a run killed while packing, or a full disk, keeps the
    # previous archive whole.
    with _writing(dest), safekeep.written_whole(dest) as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for f in files:
            if f.is_file():
                tar.add(f, arcname=str(Path("results") / f.relative_to(results_dir)))
    return dest


# In each scratch directory a run makes (its asv config, a commit's worktree): the run's pid,
# so that a later run can tell what a killed one left behind.
_OWNER = "owner.pid"


def _claim(scratch: Path) -> None:
    (scratch / _OWNER).write_text(str(os.getpid()))


def _owner_gone(scratch: Path) -> bool:
    """Whether the run that made `scratch` has ended. A directory without an owner file is
    not known to be a run's (or is being set up): left alone."""
    try:
        pid = int((scratch / _OWNER).read_text())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


def prune_stale(root: Path) -> list[Path]:
    """Remove what runs killed outright (SIGKILL, a lost machine) left: their scratch
    directories and commit worktrees under the temporary directory, where the owner process
    is gone; then `git worktree prune` forgets worktrees whose directory no longer exists."""
    removed = []
    for scratch in sorted(Path(tempfile.gettempdir()).glob("speedlib-*")):
        if scratch.is_symlink() or not scratch.is_dir() or not _owner_gone(scratch):
            continue
        if (scratch / "tree").exists():
            subprocess.run(["git", "worktree", "remove", "--force", str(scratch / "tree")], cwd=root,
                           capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
        removed.append(scratch)
    subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)
    return removed


class _library_at:
    """Context manager: a directory on whose path `speedlib` is the package at commit `sha`,
    and nothing else.

    The commit is checked out as a worktree, but the directory handed to the benchmarks
    holds only a link to its `speedlib/`: a commit's own `speedbench/` (timers, memory
    counters, workloads) must never replace the checkout's, or a harness change would
    show up as a technique's regression."""

    def __init__(self, root: Path, sha: str, use_checkout: bool):
        self.root, self.sha, self.use_checkout = root, sha, use_checkout
        self.scratch: Path | None = None

    def __enter__(self) -> Path:
        if self.use_checkout:
            return self.root
        self.scratch = Path(tempfile.mkdtemp(prefix=f"speedlib-{self.sha[:8]}-"))
        try:
            _claim(self.scratch)
            tree, only_library = self.scratch / "tree", self.scratch / "path"
            _git(self.root, "worktree", "add", "--detach", "--force", str(tree), self.sha)
            only_library.mkdir()
            (only_library / "speedlib").symlink_to(tree / "speedlib", target_is_directory=True)
        except BaseException:  # a failed or interrupted set-up: no __exit__ will remove it
            self.__exit__()
            raise
        return only_library

    def __exit__(self, *exc) -> None:
        if self.scratch is not None:
            # A group of its own: a Ctrl+C at the terminal during the cleanup must not kill it.
            subprocess.run(["git", "worktree", "remove", "--force", str(self.scratch / "tree")],
                           cwd=self.root, capture_output=True, process_group=0)
            shutil.rmtree(self.scratch, ignore_errors=True)


def _print_table(results_dir: Path, machine: str, shas: Sequence[str] | None = None) -> None:
    from speedbench.results import format_table, load_results  # noqa: PLC0415

    loaded = load_results(results_dir)
    df = loaded.measured
    df = df[df["machine"] == machine]
    if shas is not None:
        df = df[df["commit"].isin(list(shas))]
    if df.empty:
        print("\nno measured results to show", flush=True)
    else:
        columns = ("commit", "benchmark", "params", "value", "unit")
        busy = df["contention"].eq("contended")
        if busy.any():  # the line above the table says so too, but a figure copied from here must carry it
            df, columns = df.assign(state=busy.map({True: "‡ contended", False: ""})), (*columns, "state")
        print("\n" + format_table(df, columns), flush=True)
    from speedbench import problems  # noqa: PLC0415

    # Also, and above all, when they leave nothing to show: damaged results one by one, the
    # older results the loader set aside or kept in one line.
    hint = f"speedlib report --results {printable(str(results_dir))} --verbose lists them"
    for line in problems.lines(loaded.problems, hint=hint):
        print(line, flush=True)
