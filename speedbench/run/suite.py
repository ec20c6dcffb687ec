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
another torch/CUDA build without --new-build, is refused (speedbench.results.machines), and one run
at a time writes to a results directory: a second one refuses to start (the results tree's
lock, speedbench.results.tree). Each run first removes the scratch directories and commit
worktrees that runs killed outright left behind (`prune_stale`).
A benchmark that fails does not stop the run: the other results, the environment records
and the archive are still written, and the failures are listed at the end (`RunResult.failed`).

This module is the run itself: the loop over chunks and commits; every path it writes, the
lock and the writable check are the results tree's (speedbench/results/tree.py). Beside it,
and re-exported here as `suite.X`: the run's options and what it checks before it measures
(speedbench/run/preconditions.py), the checkout, its commits and the run's scratch directories
(speedbench/run/checkout.py), asv under the supervisor and the signals that stop it
(speedbench/run/asv_process.py), and the records a run reads and writes beside asv's results
(speedbench/run/records.py). Tests patch `suite._asv`, `suite._run_commit`, `suite._preflight`
and the like: the run calls them through this module's names.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from speedbench.chunks import load_chunks
from speedbench.measure import interference
from speedbench.results import merge, problems, safekeep
from speedbench.results.common import printable
from speedbench.results.listing import combinations
from speedbench.results.load import format_table, load_results
from speedbench.results.tree import ResultsError, ResultsTree
from speedbench.run import plan
from speedbench.run.asv_process import (  # noqa: F401 - re-exported: tests patch and call them as suite.X
    Interrupted,
    _asv,
    _raise_interrupted,
    stopped_by_signals,
)
from speedbench.run.checkout import (  # noqa: F401 - re-exported: cli.py and tests use them as suite.X
    _CHECKOUT_PARTS,
    _HARNESS_PARTS,
    CONFIG,
    RESTORE_GIT,
    _claim,
    _dirty,
    _git,
    _library_at,
    find_root,
    prune_stale,
    resolve_commits,
)
from speedbench.run.errors import SuiteError
from speedbench.run.preconditions import (  # tests patch and call them as suite.X: the run calls them from here
    QUICK_ENV,
    RunOptions,
    _check_machine,
    _check_writable,
    _locked,
    _preflight,
    _results_dir,
    _steps,
    check_archive,
    check_options,
    check_versions,
)
from speedbench.run.records import (
    _record_environment,
    _writing,
    failed_benchmarks,
    interference_counters,
    pack_results,
)
from speedbench.stats import contention

__all__ = ["RunOptions", "RunResult", "run", "failed_benchmarks", "find_root", "resolve_commits",
           "pack_results", "check_options", "prune_stale"]


@dataclass
class RunResult:
    results_dir: Path
    machine: str
    failed: list[str]  # one printable line per benchmark that failed: "<commit> <name> ..."
    not_run: list[str] = field(default_factory=list)  # chunks left out to keep within the budget


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
    if not options.quick:  # a smoke run files nothing
        check_versions(root)
    steps = _steps(options, root)  # a bad chunk name is refused before any work
    results_dir = _results_dir(options, root, json.loads((root / CONFIG).read_text()))
    if not options.quick:
        _check_writable(results_dir, f"the results directory {printable(str(results_dir))}",
                        "give the run another with --results-dir")
        check_archive(options, results_dir)  # now that the tree it must stay out of is known
    if options.budget_minutes is not None:  # priced from the listing: a torn one is refused now, not mid-run
        _listing(root, root / "results" if options.quick else results_dir)
    # A quick run writes to a scratch directory of its own: nothing to lock.
    lock = contextlib.nullcontext() if options.quick else _locked(results_dir)
    # SIGINT and SIGTERM (Ctrl+C, a time limit, a batch system) unwind the run: asv is
    # stopped, worktrees and the scratch directories are removed, the lock released.
    with stopped_by_signals(), lock:
        for stale in prune_stale(root):
            print(f"speedlib run: removed {printable(str(stale))}, left by a run that was killed", flush=True)
        if not options.quick:
            _recover(results_dir)
        return _run(options, root, argv, shas, steps)


def _run(options: RunOptions, root: Path, argv: Sequence[str], shas: list[str], steps: list) -> RunResult:
    from speedbench.measure import hardware  # noqa: PLC0415 - imports torch; keep `speedlib --help` fast

    identity = hardware.identity()
    _check_machine(options, root, identity)  # before the pre-flight check, which may wait
    if not options.quick:  # a FIFO where asv writes its listing held the run; a directory failed it after the work
        tree = ResultsTree(_results_dir(options, root, json.loads((root / CONFIG).read_text())))
        try:
            for sha in shas:
                tree.machine(options.machine or identity["machine"]).check_run_writes(sha)
        except ResultsError as e:
            raise SuiteError(f"{e}; nothing was run or changed") from None
    checked = _preflight(options)  # before anything is measured, and before asv starts
    env = hardware.environment()
    env["preflight"] = checked.record()  # in every commit's environment record
    # The verdict itself, where the loader reads it: a run that started busy has every figure
    # marked (speedbench.results.across_rows), whatever its own rounds' counters say.
    env["busy_at_start"] = env["preflight"].get("busy_at_start", "")
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
                    each, why = _chunk_seconds(chunk, root, results_dir, machine)
                    cost = each * len(shas)
                    if cost > left:
                        not_run.append(chunk.name)
                        print(f"\nspeedlib run: chunk {chunk.name} (about {cost / 60:.1f} min: {why}) does not fit "
                              f"the {max(left, 0) / 60:.1f} min left of --budget-minutes: not run", flush=True)
                        continue
                print(f"\n=== chunk {chunk.name}: {chunk.about}", flush=True)
            for i, sha in enumerate(shas, 1):
                began = time.monotonic()
                failed += _run_commit(options, root, conf_path, results_dir, machine, env, argv, sha,
                                      f"[{i}/{len(shas)}]", bench)
                if chunk is not None:  # the next budget decision for this chunk uses this, not a guess
                    with _writing(ResultsTree(results_dir).machine(machine).chunk_times):
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
        combinations(listing, skipped)
    for line in skipped:
        print(f"speedlib run: not priced: {printable(line)}", flush=True)


def _chunk_seconds(chunk, root: Path, results_dir: Path, machine: str) -> tuple[float, str]:
    """What `chunk` may take here for one commit, and why (see plan.chunk_cost)."""
    listing = _listing(root, results_dir)
    names = combinations(listing) if listing is not None else {}  # none: only a class start is known
    per_combination, _ = plan.seconds_per_combination(load_chunks(root), names, results_dir, machine)
    return plan.chunk_cost(chunk, names, results_dir, machine, per_combination)


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
        selected = plan.with_counters(bench, _listed(root, results_dir))  # every figure with its counters
        for b in selected:
            asv_args += ["--bench", b]
        started_ms = int(time.time() * 1000)
        # The commit's `speedlib` first; then this checkout, for the harness (`speedbench`)
        # where no console script's install put it on the path (an offline GPU host).
        path = os.pathsep.join(dict.fromkeys([str(lib), str(root)]))
        process_env = {**os.environ, "ASV_PYTHONPATH": path}
        process_env.pop(QUICK_ENV, None)  # blank here (check_options): only --quick makes a run quick
        if options.quick:  # paired comparisons: one round each (benchmarks/common.py)
            process_env[QUICK_ENV] = "1"
        load_start = interference.load_average()
        status = _asv_keeping_results(asv_args, process_env, root, Path(results_dir), machine, sha)
    found = []
    if status == 2:
        # asv also exits 2 on errors of its own (a bad argument): then it saved no failure.
        found = failed_benchmarks(results_dir, machine, sha, started_ms)
        if not found:
            raise SuiteError(f"asv exited with status 2 at {sha[:8]} but recorded no failed benchmark: "
                             "see its output above")
    from speedbench.measure import hardware  # noqa: PLC0415 - torch; already imported by _run()

    # What else the machine did while this commit was measured: said at once, and kept.
    counters = contention.summary(interference_counters(results_dir, machine, sha, started_ms),
                                  env.get("cpu_cores"), env.get("torch_threads"))
    print(f"speedlib run: {sha[:8]}: {contention.summary_line(counters)}", flush=True)
    unlisted = set(plan.with_counters(bench, _listed(root, results_dir))) - set(selected)
    if unlisted:  # asv has listed them now, as it started: the next run selects their counters
        print(f"speedlib run: {sha[:8]}: --bench selected benchmarks the listing did not name before this run, "
              "so their interference counters were not selected with them: their figures have no contention "
              "verdict; run again to measure them with their counters", flush=True)
    # Clocks and temperature as this commit's benchmarks left them, not as the run began.
    env = {**env, "gpu_state": hardware.gpu_state(), "load_start": load_start,
           "load_end": interference.load_average(), "interference": counters}
    _record_environment(ResultsTree(results_dir).machine(machine).environment_record(sha), sha, env,
                        ["speedlib", *argv])
    return found


def _listed(root: Path, results_dir: Path) -> dict[str, list[str]]:
    """The selectable names of the benchmark listing (speedbench.results.listing); none where there is
    no listing or it cannot be read: asv writes a new one as it starts."""
    try:
        listing = plan.benchmark_listing(root, results_dir)
        return combinations(listing) if listing is not None else {}
    except (plan.PlanError, OSError, ValueError):
        return {}


def _asv_keeping_results(asv_args: list[str], env: dict, root: Path, results_dir: Path, machine: str,
                         sha: str) -> int:
    """`_asv(asv_args)` with asv's files in `results_dir` copied first and put back where it
    leaves them torn (speedbench.results.safekeep): asv rewrites them in place, so a full disk, a
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
    machine): its snapshot is still in `results_dir`; finish a merge stopped between its renames.
    Under the results lock, so that run or merge is gone."""
    try:
        lines = safekeep.recover(results_dir)
    except safekeep.SnapshotError as e:
        raise SuiteError(printable(str(e))) from None
    for line in lines:
        print(f"speedlib run: a run was killed while asv wrote here: {printable(line)}", flush=True)
    # and a `speedlib merge` stopped between its renames: finished, so no run reads a half-merged tree
    try:
        lines = merge.recover(results_dir)
    except merge.MergeError as e:
        raise SuiteError(str(e)) from None
    for line in lines:
        print(f"speedlib run: {printable(line)}", flush=True)


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


def _print_table(results_dir: Path, machine: str, shas: Sequence[str] | None = None) -> None:
    loaded = load_results(results_dir)
    df = loaded.measured
    df = df[df["machine"] == machine]
    if shas is not None:
        df = df[df["commit"].isin(list(shas))]
    if df.empty:
        print("\nno measured results to show", flush=True)
    else:
        columns = ("commit", "benchmark", "params", "value", "unit")
        busy = df["contention"].eq(contention.CONTENDED)
        if busy.any():  # the line above the table says so too, but a figure copied from here must carry it
            df, columns = df.assign(state=busy.map({True: "‡ contended", False: ""})), (*columns, "state")
        print("\n" + format_table(df, columns), flush=True)
    # Also, and above all, when they leave nothing to show: damaged results one by one, the
    # older results the loader set aside or kept in one line.
    hint = f"speedlib report --results {printable(str(results_dir))} --verbose lists them"
    for line in problems.lines(loaded.problems, hint=hint):
        print(line, flush=True)
