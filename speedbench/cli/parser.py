"""The `speedlib` command: `run` the asv suite, print the `env` record, `report` results,
open the `dashboard`; `merge`, `slurm` and `slot` (a short GPU slot) add their own."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from speedlib import __version__
from speedbench import CHECKOUT

# Not 2 (the run stopped early), so that a script can tell that the run finished and its
# results and archive are there to collect.
BENCHMARKS_FAILED = 3
CHUNKS_LEFT = 4
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


ENV_EXIT_STATUS = """exit status:
  0  the record was printed; with --check, no check found anything bad (warnings may remain)
  1  --check found something bad: the machine is busy, a GPU has other processes on it, or
     $SPEEDLIB_THREADS is not a positive integer
  2  the record needs PyTorch, which is not installed (--check does not)"""


def _cmd_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from speedbench.run import suite  # noqa: PLC0415 - keeps `speedlib --help` free of torch

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
    except suite.SuiteError as e:
        print(f"speedlib run: {e}", file=sys.stderr)
        return 2
    if args.plan:
        return _print_plan(options)
    if _missing_torch("run"):
        return 2
    try:
        result = suite.run(options, argv=argv)
    except suite.Interrupted as e:
        print(f"speedlib run: {e}", file=sys.stderr)
        return 128 + e.signum
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
    from speedbench.run import suite  # noqa: PLC0415
    from speedbench.results.load import printable  # noqa: PLC0415

    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise suite.SuiteError(f"{option} must be a positive, finite number of {unit}, got '{printable(text)}'") from None


def _print_plan(options) -> int:
    from speedbench.run import plan  # noqa: PLC0415
    from speedbench.run import suite  # noqa: PLC0415
    from speedbench.results.load import printable  # noqa: PLC0415 - the listing's names come from a file

    try:
        root = suite.find_root()
        chunks = plan.select_chunks(plan.load_chunks(root), list(options.chunks) or ["all"])
    except (suite.SuiteError, plan.PlanError) as e:
        print(f"speedlib run: {e}", file=sys.stderr)
        return 2
    results_dir = options.results_dir or root / "results"
    if options.machine is None:
        from speedbench.measure import devices as measure  # noqa: PLC0415 - imports torch, only to name this machine

        options.machine = measure.machine_name()
    try:
        listing = plan.benchmark_listing(root, results_dir)
    except plan.PlanError as e:
        print(f"speedlib run: {e}", file=sys.stderr)
        return 2
    if listing is None:
        print(f"speedlib run: no benchmarks.json in {results_dir} or the checkout to count the benchmarks from; "
              "run the suite once", file=sys.stderr)
        return 2
    skipped: list[str] = []
    names = plan.combinations(listing, skipped)
    for line in skipped:  # benchmarks the listing describes in a way that cannot be priced
        print(f"speedlib run: {printable(str(listing))}: {printable(line)}", file=sys.stderr)
    note = plan.chunk_times_note(results_dir, options.machine)
    if note:
        print(f"speedlib run: {note}", file=sys.stderr)
    per_combination, basis = plan.seconds_per_combination(plan.load_chunks(root), names, results_dir,
                                                          options.machine)
    print(f"chunks on {options.machine}, per commit: a chunk's measured time on this machine where there is one, "
          f"else per class {plan.SECONDS_PER_CLASS:.0f} s + {per_combination:.1f} s per parameter combination "
          f"({basis}) + {plan.SECONDS_PER_REPORT} s per reporting process (method x combination), "
          f"times {plan.HEADROOM} headroom")
    total = bare = 0.0
    for chunk in chunks:
        seconds, source = plan.chunk_cost(chunk, names, results_dir, options.machine, per_combination)
        total += seconds
        # measured times (repriced ones too) carry no headroom; only the estimates do
        bare += seconds if source.startswith("measured chunk time") else seconds / plan.HEADROOM
        print(f"  {chunk.name:18s} {seconds / 60:6.1f} min  {source}: {chunk.about}")
    print(f"  {'all':18s} {total / 60:6.1f} min ({bare / 60:.1f} min without the headroom)")
    return 0


def _missing_torch(command: str) -> bool:
    """Measuring needs torch; viewing results does not, so a viewer-only install (the
    README's first command) has none. Say so in one line instead of a traceback."""
    import importlib.util  # noqa: PLC0415

    if importlib.util.find_spec("torch") is not None:
        return False
    print(f"speedlib {command}: PyTorch is not installed, and measuring needs it: "
          'python3 -m pip install -e ".[bench]" (report and dashboard work without it)', file=sys.stderr)
    return True


def _cmd_env(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if args.check:
        return _check()
    if _missing_torch("env"):
        return 2
    from speedbench.measure import devices as measure  # noqa: PLC0415

    print(json.dumps(measure.environment(), indent=2, sort_keys=True))
    return 0


def _check() -> int:
    """`speedlib env --check`: every pre-flight check, one line each, then a summary; 1 if
    one of them is bad. Needs no torch (the thread check is then skipped, with a note)."""
    from speedbench.measure import preflight  # noqa: PLC0415
    from speedbench.results.load import printable  # noqa: PLC0415 - process names come from /proc

    report = preflight.check()
    width = max(len(level) for level in preflight.LEVELS)
    for finding in report.findings:
        print(f"{finding.level:<{width}}  {printable(finding.line())}")
    print(report.summary())
    return 1 if report.level == "bad" else 0


def _cmd_report(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from speedbench.results import cache  # noqa: PLC0415
    from speedbench import report  # noqa: PLC0415
    from speedbench.results.load import format_table, printable  # noqa: PLC0415

    path = Path(args.results)
    if not path.is_dir():
        print(f"speedlib report: no results directory at {path}", file=sys.stderr)
        return 2
    loaded = cache.load(path)
    df = loaded.measured
    if args.machine:
        known = sorted(set(df["machine"]))
        df = df[df["machine"] == args.machine]
    _print_problems(loaded.problems, args.verbose, "speedlib report: ")
    if args.fail_on_regression:
        return _regression_gate(report, df, args)
    if args.machine and df.empty and known:  # a typo, most likely: say which names there are
        print(f"speedlib report: no measured results for machine {printable(args.machine)}; the results hold "
              f"{', '.join(printable(m) for m in known)}", file=sys.stderr)
        return 1
    if df.empty:
        print("no measured results", file=sys.stderr)
        return 1
    if args.writeup:
        from speedbench.report import writeup  # noqa: PLC0415

        rerun = None
        if args.against:
            if not Path(args.against).is_dir():
                print(f"speedlib report: no results directory at {args.against}", file=sys.stderr)
                return 2
            rerun = _second_run(args.against, args.verbose)
        print(writeup.writeup(df, rerun), end="")
        return 0
    if args.table == "results":
        if args.output:
            print("speedlib report: --output writes an export; --table results prints every measured value "
                  "(redirect it), pick another --table to export", file=sys.stderr)
            return 2
        print(format_table(df))
        return 0
    if args.table == "noise":
        if not args.against:
            print("speedlib report: --table noise needs --against DIR, the results of a second run of the same "
                  "commit on the same machine", file=sys.stderr)
            return 2
        if not Path(args.against).is_dir():
            print(f"speedlib report: no results directory at {printable(args.against)} (--against)", file=sys.stderr)
            return 2
        second = _second_run(args.against, args.verbose)
        table = report.noise_table(df, second[second["machine"] == args.machine] if args.machine else second)
        if table.frame.empty:
            print("speedlib report: no time benchmark was measured in both runs (same machine, commit and "
                  "parameters)", file=sys.stderr)
            return 1
    elif args.table == "history":
        if args.benchmark not in set(df["benchmark"]):
            names = ", ".join(printable(b) for b in sorted(set(df["benchmark"])))  # names from result files
            print(f"speedlib report: --benchmark must name one of: {names}", file=sys.stderr)
            return 2
        table = report.history_table(df, args.benchmark)
    else:
        rows = df if args.all_commits else report.latest(df)
        if args.table == "claims":  # all commits: a contended latest result gives way to an earlier quiet one
            rows = df
        if args.table == "headline":  # the overview's "At a glance" grid: it picks each machine's results itself
            from speedbench.report import headline  # noqa: PLC0415

            table = headline.grid(df)
        else:
            table = {"paired": report.paired_table, "speedup": report.speedup_table, "memory": report.memory_table,
                     "floor": report.floor_table, "claims": report.claims_table}[args.table](rows)
    return _export(report, table, args)


def _export(report, table, args: argparse.Namespace) -> int:
    """Print `table` in --format, or write it to --output. CSV is plain data: its provenance
    (commits, machines, run dates, the Reproduce command) goes to X.provenance.txt beside
    --output X.csv, and to stderr where the CSV goes to stdout."""
    text = {"md": report.to_markdown, "csv": report.to_csv, "tex": report.to_latex}[args.format](table)
    footer = report.csv_provenance(table) if args.format == "csv" else None
    if not args.output:
        print(text, end="")
        if footer:
            print(footer, end="", file=sys.stderr)
        return 0
    from speedbench.results import safekeep  # noqa: PLC0415 - only when writing

    try:  # each file whole or as it was: a full disk or a kill leaves no torn export
        for path, content in ((Path(args.output), text), (report.provenance_path(args.output), footer)):
            if content is not None:  # no footer beside md or tex
                with safekeep.written_whole(path) as f:
                    f.write(content.encode("utf-8"))
    except OSError as e:
        print(f"speedlib report: cannot write {args.output}: {e.strerror or e}{safekeep.disk_full(e)}", file=sys.stderr)
        return 2
    beside = f" and its provenance to {report.provenance_path(args.output)}" if footer else ""
    print(f"speedlib report: wrote {args.output}{beside}", file=sys.stderr)
    return 0


def _second_run(directory: str, verbose: bool = False):
    """The measured rows of --against DIR, a second run; as for --results, a damaged file is
    never silent."""
    from speedbench.results.load import load_results, printable  # noqa: PLC0415

    again = load_results(Path(directory))
    _print_problems(again.problems, verbose, f"speedlib report: --against {printable(directory)}: ")
    return again.measured


def _print_problems(problems, verbose: bool, prefix: str) -> None:
    """On stderr: every damaged or incomplete result (always), the older results the loader
    set aside or kept in one summary line, or one by one with --verbose (speedbench.results.problems)."""
    from speedbench.results import problems as told  # noqa: PLC0415

    shown = told.lines(problems, verbose)
    for line in shown[:-1]:
        print(line, file=sys.stderr)
    if shown:
        print(prefix + shown[-1], file=sys.stderr)  # the summary names the command (or --against DIR)


def _regression_gate(report, df, args: argparse.Namespace) -> int:
    """--fail-on-regression A B: the significant changes from A to B; exit 1 on a regression."""
    from speedbench.results.load import printable  # noqa: PLC0415

    if args.machine and df.empty:
        print(f"speedlib report: no measured results for machine {args.machine}", file=sys.stderr)
        return 2
    try:
        table = report.change_table(df, *args.fail_on_regression)
    except ValueError as e:
        print(f"speedlib report: {printable(str(e))}", file=sys.stderr)  # it may quote commits from result files
        return 2
    if _export(report, table, args):
        return 2
    return 1 if (table.frame["verdict"] == "regression").any() else 0


def _cmd_dashboard(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import importlib.util  # noqa: PLC0415
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    bad = _bad_port(args.port) or _bad_address(args.address)
    if bad:
        print(f"speedlib dashboard: {bad}", file=sys.stderr)
        return 2
    port = int(args.port)
    app = CHECKOUT / "dashboard" / "app.py"
    if not app.is_file():
        print(f"speedlib dashboard: no dashboard at {app}: run it from a checkout "
              "(python3 -m pip install -e \".[dashboard]\")", file=sys.stderr)
        return 2
    if importlib.util.find_spec("streamlit") is None:
        print('speedlib dashboard: Streamlit is not installed: python3 -m pip install -e ".[dashboard]"', file=sys.stderr)
        return 2
    results = Path(args.results).resolve()
    if not results.is_dir():
        print(f"speedlib dashboard: no results directory at {results}", file=sys.stderr)
        return 2
    unavailable = _cannot_listen(args.address, port)
    if unavailable:
        print(f"speedlib dashboard: cannot listen on {args.address}:{port} ({unavailable}); is a dashboard "
              "already running there? Pass another --port.", file=sys.stderr)
        return 2
    # The results directory is fixed here, at start-up, and never read from the URL.
    env = {**os.environ, "SPEEDLIB_RESULTS": str(results)}
    # Always headless: a Streamlit that is not headless asks for an e-mail address on its
    # first run and, with no terminal to answer (CI, ssh -T, a batch job), exits 255 with
    # nothing served. The browser is opened from here instead, once the port is bound.
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.address", args.address,
           "--server.port", str(port), "--browser.gatherUsageStats", "false",
           "--server.headless", "true",
           # a results viewer, not an app being developed: no "Deploy" button, no developer menu
           "--client.toolbarMode", "viewer"]
    url = _url(args.address, port)
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_dies_with(os.getpid()))
    # A SIGTERM to speedlib (kill, a service manager) must stop Streamlit too, not orphan it.
    import signal  # noqa: PLC0415

    def _stop(signum, frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        if not _wait_until_listening(proc, args.address, port, timeout=STARTUP_TIMEOUT_S):
            if proc.poll() is None:
                proc.terminate()
                print(f"speedlib dashboard: Streamlit did not listen on {url} within {STARTUP_TIMEOUT_S:.0f} s; "
                      "stopped it", file=sys.stderr)
            else:
                print(f"speedlib dashboard: Streamlit exited with status {proc.returncode} before serving "
                      f"{url} (its messages are above)", file=sys.stderr)
            proc.wait()
            return 2
        print(f"speedlib dashboard: serving {results} on {url} (Ctrl+C stops it)", flush=True)
        if not args.no_browser:
            _open_browser(url)
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def _url(address: str, port: int) -> str:
    """The dashboard's address as a browser takes it: an IPv6 address in brackets."""
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


STARTUP_TIMEOUT_S = 120.0  # Streamlit imports pandas and plotly: seconds on a cold, busy machine


def _bad_port(text: str) -> str | None:
    """Why `text` is no port to serve on, or None. Not 0: the system would pick one, and the
    URL printed could not name it."""
    from speedbench.results.load import printable  # noqa: PLC0415

    try:
        if 1 <= int(text) <= 65535:
            return None
    except ValueError:
        pass
    return f"--port must be a whole number from 1 to 65535, got '{printable(text)}'"


def _bad_address(address: str) -> str | None:
    """Why `address` is no address to serve on, or None: an IP address, or a host name this
    machine resolves (asked of the resolver, as Streamlit will)."""
    import ipaddress  # noqa: PLC0415
    import socket  # noqa: PLC0415

    from speedbench.results.load import printable  # noqa: PLC0415

    try:
        ipaddress.ip_address(address)
        return None
    except ValueError:
        pass
    try:
        socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
        return None
    except (OSError, UnicodeError):  # UnicodeError: not even a host name (an empty label: "a..b")
        return (f"--address '{printable(address)}' is neither an IP address nor a host name this machine resolves: "
                "pass one such as 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)")


def _dies_with(parent: int):
    """A preexec_fn for Streamlit: the kernel stops it (SIGTERM, which Streamlit handles by
    shutting down) when speedlib dies, even by SIGKILL, where speedlib cannot stop it
    itself and it would go on serving the port. Linux only (prctl); None elsewhere."""
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from speedbench.run import supervise  # noqa: PLC0415

    if not sys.platform.startswith("linux"):
        return None

    def arm() -> None:
        supervise.die_with_parent(signal.SIGTERM)
        if os.getppid() != parent:  # speedlib died before the signal was armed
            os._exit(1)

    return arm


def _wait_until_listening(proc, address: str, port: int, timeout: float) -> bool:
    """True once something accepts connections on address:port while `proc` runs; False when
    `proc` exits first or `timeout` seconds pass. The URL is printed only after this, so a
    script that reads it can connect at once."""
    import socket  # noqa: PLC0415
    import time  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=1):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def _open_browser(url: str) -> None:
    """Open `url` where a browser can show it: on macOS and Windows, or under a Linux/BSD
    display server. Elsewhere (ssh, containers, CI) the printed URL is the way in."""
    import os  # noqa: PLC0415
    import webbrowser  # noqa: PLC0415

    if sys.platform in ("darwin", "win32") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        try:
            webbrowser.open(url)
        except webbrowser.Error:
            pass  # the URL is printed already


def _cannot_listen(address: str, port: int) -> str | None:
    """Why a server could not listen on address:port, or None. Asked before Streamlit starts:
    it would print its banner first and then fail, or quietly take another port. SO_REUSEADDR
    as a server sets it: a port left in TIME_WAIT is free, one with a listener is not."""
    import socket  # noqa: PLC0415

    try:
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
    except OSError as e:  # socket.gaierror too: an address that does not resolve
        return e.strerror or str(e)
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speedlib", description=__doc__)
    parser.add_argument("--version", action="version", version=f"speedlib {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

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

    env = sub.add_parser("env", help="print this machine's environment record as JSON", epilog=ENV_EXIT_STATUS,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    env.add_argument("--check", action="store_true",
                     help="instead, check whether this machine is fit to measure on now: other processes' CPU "
                          "use, load, CPU frequency governor, torch threads against free CPUs, GPU state; one "
                          "line each with what to do (needs no PyTorch)")
    env.set_defaults(func=_cmd_env)

    report = sub.add_parser("report", help="print a results table (with its provenance footer)")
    report.add_argument("--results", default="results", help="results directory (default: results)")
    report.add_argument("--machine", help="only this machine")
    report.add_argument("--table", default="results",
                        choices=["results", "headline", "paired", "speedup", "memory", "floor", "claims", "history",
                                 "noise"],
                        help="results: every measured value; headline: the overview's 'At a glance' grid; the "
                             "others as in the dashboard (default: results)")
    report.add_argument("--format", default="md", choices=["md", "csv", "tex"],
                        help="export format for every table but 'results' (default: md); csv is plain data, its "
                             "provenance goes to stderr, or with --output X.csv to X.provenance.txt")
    report.add_argument("--output", "-o", metavar="PATH",
                        help="write the export to PATH instead of stdout (csv: and its provenance to "
                             "PATH's name with .provenance.txt in place of .csv)")
    report.add_argument("--benchmark", help="the benchmark whose history to show (--table history)")
    report.add_argument("--against", metavar="DIR",
                        help="--table noise: results of a second run of the same commit (speedlib run --results-dir DIR)")
    report.add_argument("--writeup", action="store_true",
                        help="print the results page (docs/results.md) for every machine, with a run-to-run "
                             "section from --against DIR (--table is ignored)")
    report.add_argument("--verbose", "-v", action="store_true",
                        help="list every result file whose older results were set aside or kept (by default "
                             "one line counts them; damaged files are always listed)")
    report.add_argument("--all-commits", action="store_true",
                        help="every commit, not only each machine's latest")
    report.add_argument("--fail-on-regression", nargs=2, metavar=("A", "B"),
                        help="CI gate: print the significant changes from commit A to commit B (hash prefixes) on "
                             "each machine that measured both, by asv compare's rule; exit 1 if any is a regression, "
                             "0 if none, 2 for bad input (--table is ignored)")
    report.set_defaults(func=_cmd_report)

    dash = sub.add_parser("dashboard", help="open the Streamlit dashboard on the results")
    dash.add_argument("--results", default=str(CHECKOUT / "results"),
                      help="results directory (default: this checkout's results/)")
    dash.add_argument("--address", default="127.0.0.1",
                      help="address to listen on (default: 127.0.0.1, this machine only)")
    dash.add_argument("--port", default="8501", help="port (default: 8501)")
    dash.add_argument("--no-browser", action="store_true",
                      help="do not open a browser window (none is opened without a display anyway)")
    dash.set_defaults(func=_cmd_dashboard)

    from speedbench.results import merge  # noqa: PLC0415 - stdlib only at import: the parser stays fast

    merge.add_parser(sub)  # `speedlib merge`: archives and results trees into one tree (speedbench/results/merge.py)
    from speedbench.run import slurm  # noqa: PLC0415 - stdlib only at import: the parser stays fast

    slurm.add_parser(sub)  # `speedlib slurm`: the suite as a Slurm job array (speedbench/run/slurm.py)
    from speedbench.run import slot  # noqa: PLC0415 - stdlib only at import: the parser stays fast

    slot.add_parser(sub)  # `speedlib slot`: a short GPU slot in one command (speedbench/run/slot.py)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args, argv)
    except KeyboardInterrupt:
        # Ctrl+C while results load or a table is drawn: one line, not a traceback (`run`
        # catches it itself, after stopping asv). A further Ctrl+C while this is said would
        # escape as a KeyboardInterrupt and end the process by SIGINT (status -2, not 130).
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            print(f"speedlib {args.command}: stopped by Ctrl+C", file=sys.stderr)
        finally:  # main() runs inside other programs (tests) too: their handler comes back
            signal.signal(signal.SIGINT, previous)
        return 130


if __name__ == "__main__":
    sys.exit(main())
