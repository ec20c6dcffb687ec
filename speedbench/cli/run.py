"""`speedlib run`: its options, the plan it prints, and the exit status it ends with."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from speedbench.chunks import ChunkError, load_chunks
from speedbench.results.common import printable
from speedbench.results.tree import BENCHMARKS
from speedbench.run.asv_process import Interrupted, stopped_by_signals
from speedbench.run.errors import BENCHMARKS_FAILED, CHUNKS_LEFT, missing_torch, settings_refused

RUN_EXIT_STATUS = """exit status:
  0  every selected chunk ran and no benchmark failed
  2  the run stopped: a precondition or asv itself failed (the message says which; a busy
     machine under --require-quiet is one); commits already walked keep their results
  3  some benchmarks failed, listed at the end; every other result, the environment records
     and the --archive were written
  4  no benchmark failed, but --budget-minutes left chunks for a later command (listed; with
     none run, there is no archive)
  130, 143  stopped by Ctrl+C or SIGTERM: asv and its benchmarks were stopped, the chunks
     archived so far are kept"""


def _cmd_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    # SIGINT and SIGTERM stop the run from its first line: one that comes while the suite loads
    # (pandas, then torch: seconds) ends it with its line and status, as one that comes later does,
    # instead of killing it without a word.
    with stopped_by_signals():
        try:
            return _run_command(args, argv)
        except Interrupted as e:
            print(f"speedlib run: {e}", file=sys.stderr)
            return 128 + e.signum


def _run_command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from speedbench.run import suite  # noqa: PLC0415 - pandas; `speedlib --help` loads none

    options = suite.RunOptions(
        quick=args.quick,
        commits=args.commits,
        bench=args.bench or [],
        machine=args.machine,
        results_dir=Path(args.results_dir) if args.results_dir else None,
        allow_dirty=args.allow_dirty,
        show_stderr=args.show_stderr,
        archive=Path(args.archive) if args.archive else None,
        chunks=args.chunk or (),
        new_build=args.new_build,
        require_quiet=args.require_quiet,
    )
    try:
        options.wait_quiet = _number(args.wait_quiet, "--wait-quiet", "seconds")
        options.budget_minutes = _number(args.budget_minutes, "--budget-minutes", "minutes")
        suite.check_options(options)  # also inside run(); here it is refused before asv or torch load
    except Interrupted:
        raise  # a SuiteError too, but said by _cmd_run with its own status
    except suite.SuiteError as e:
        print(f"speedlib run: {e}", file=sys.stderr)
        return 2
    if args.plan:
        return _print_plan(options)
    if settings_refused("run", device=True) or missing_torch("run"):
        return 2
    try:
        result = suite.run(options, argv=argv)
    except Interrupted:
        raise
    except KeyboardInterrupt:
        print(f"speedlib run: {suite.Interrupted(2)}", file=sys.stderr)
        return 130
    except suite.SuiteError as e:
        print(f"speedlib run: {e}", file=sys.stderr)
        return 2
    if result.failed:
        return BENCHMARKS_FAILED
    return CHUNKS_LEFT if result.not_run else 0


def _number(text: str | None, option: str, unit: str) -> float | None:
    """A number of `unit` from the command line; one line (SuiteError) if it is not one
    (suite.check_options refuses one that is not finite and positive)."""
    from speedbench.run import suite  # noqa: PLC0415 - pandas; `speedlib --help` loads none

    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise suite.SuiteError(f"{option} must be a positive, finite number of {unit}, "
                               f"got '{printable(text)}'") from None


def _print_plan(options) -> int:
    from speedbench.results.listing import combinations  # noqa: PLC0415 - pandas; `speedlib --help` loads none
    from speedbench.run import plan, suite  # noqa: PLC0415 - as above

    try:
        root = suite.find_root()
        chunks = plan.select_chunks(load_chunks(root), list(options.chunks) or ["all"])
    except Interrupted:
        raise
    except (suite.SuiteError, ChunkError) as e:
        print(f"speedlib run: {e}", file=sys.stderr)
        return 2
    results_dir = options.results_dir or root / "results"
    if options.machine is None:
        from speedbench.measure import hardware  # noqa: PLC0415 - torch, only to name this machine

        options.machine = hardware.machine_name()
    try:
        listing = plan.benchmark_listing(root, results_dir)
    except plan.PlanError as e:
        print(f"speedlib run: {e}", file=sys.stderr)
        return 2
    if listing is None:
        print(f"speedlib run: no {BENCHMARKS} in {results_dir} or the checkout to count the benchmarks from; "
              "run the suite once", file=sys.stderr)
        return 2
    skipped: list[str] = []
    names = combinations(listing, skipped)
    for line in skipped:  # benchmarks the listing describes in a way that cannot be priced
        print(f"speedlib run: {printable(str(listing))}: {printable(line)}", file=sys.stderr)
    note = plan.chunk_times_note(results_dir, options.machine)
    if note:
        print(f"speedlib run: {note}", file=sys.stderr)
    per_combination, basis = plan.seconds_per_combination(load_chunks(root), names, results_dir, options.machine)
    worst = max(per_combination, plan.SECONDS_PER_COMBINATION)
    print(f"chunks on {options.machine}, per commit, at the worst known: a chunk's longest measured run on this "
          f"machine where there is one, else per class {plan.SECONDS_PER_CLASS:.0f} s + {worst:.1f} s per parameter "
          f"combination (the larger of {per_combination:.1f} s, {basis}, and {plan.SECONDS_PER_COMBINATION:.1f} s) + "
          f"{plan.SECONDS_PER_REPORT} s per reporting process (method x combination), times {plan.HEADROOM} headroom")
    total = bare = 0.0
    for chunk in chunks:
        seconds, source = plan.chunk_cost(chunk, names, results_dir, options.machine, per_combination)
        total += seconds
        # measured times carry no headroom; only the estimates do
        bare += seconds if source.startswith("the longest measured run") else seconds / plan.HEADROOM
        print(f"  {chunk.name:18s} {seconds / 60:6.1f} min  {source}: {chunk.about}")
    print(f"  {'all':18s} {total / 60:6.1f} min ({bare / 60:.1f} min without the headroom)")
    return 0


def add_parser(sub) -> None:
    run = sub.add_parser("run", help="run the asv suite on this machine and save the results",
                         epilog=RUN_EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--quick", action="store_true",
                     help="smoke run: every benchmark once, results to a scratch directory (never results/)")
    run.add_argument("--commits", metavar="RANGE",
                     help="'A..B' runs every commit in the range (oldest first), 'REV' one commit; "
                          "default: the checkout as it is, filed under HEAD")
    run.add_argument("--bench", "-b", action="append", metavar="REGEX",
                     help="only benchmarks matching REGEX (asv's --bench; repeatable)")
    run.add_argument("--machine", help="asv machine name (default: from the hardware, e.g. h100-sxm-80gb, "
                                        "cpu-2core-intel-xeon); a directory that recorded other hardware is refused")
    run.add_argument("--new-build", action="store_true",
                     help="file the run under its machine although the torch/CUDA build differs from the one "
                          "last recorded there: a new environment, which history and the regression gate do not "
                          "compare across (without it such a run is refused)")
    run.add_argument("--results-dir", help="where results go (default: asv.conf.json's results_dir)")
    run.add_argument("--allow-dirty", action="store_true",
                     help="run although speedlib/ or benchmarks/ have uncommitted changes")
    run.add_argument("--show-stderr", action="store_true", help="show the benchmarks' stderr")
    run.add_argument("--archive", metavar="FILE.tar.gz",
                     help="also pack the run's results (result files, environment records, machine.json, "
                          "benchmarks.json) into one archive, to carry them off a GPU machine")
    run.add_argument("--chunk", action="append", metavar="NAME",
                     help="run this chunk of the suite (benchmarks/chunks.py; repeatable; 'all': every chunk, "
                          "headline first); each chunk is archived as it finishes")
    run.add_argument("--budget-minutes", metavar="M",
                     help="with --chunk: start only chunks whose cost (this machine's recorded durations, else "
                          "an estimate) fits in what is left of M minutes")
    run.add_argument("--plan", action="store_true",
                     help="print the chunks and what each should cost here, and run nothing")
    run.add_argument("--require-quiet", action="store_true",
                     help="refuse to start (exit 2) when the pre-flight check finds the machine busy: other "
                          "processes taking CPU time or the GPU (speedlib env --check shows what it sees)")
    run.add_argument("--wait-quiet", metavar="SECONDS",
                     help="when the machine is busy, check again until it settles or SECONDS pass; then measure "
                          "anyway with a warning, or with --require-quiet refuse")
    run.set_defaults(func=_cmd_run)
