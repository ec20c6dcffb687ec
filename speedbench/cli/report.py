"""`speedlib report`: a results table, its export with provenance, the write-up and the regression gate."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from speedbench import CHECKOUT, report
from speedbench.results import safekeep
from speedbench.results.common import printable
from speedbench.results.tree import ResultsTree

RESULTS = str(ResultsTree.in_checkout(CHECKOUT).root)  # the default of every command that reads results

REPORT_EXIT_STATUS = """exit status:
  0  the table, the page or the export was printed or written; --fail-on-regression: no regression
  1  no measured results (or none for --machine); --fail-on-regression: a regression
  2  refused, one line on stderr says why: no results directory, a bad --benchmark or
     --against, an export that cannot be written, a gate across environments or contended
  130  stopped by Ctrl+C"""


def _cmd_report(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from speedbench.results import cache  # noqa: PLC0415 - pandas; `speedlib --help` loads none
    from speedbench.results.load import format_table  # noqa: PLC0415 - pandas; `speedlib --help` loads none

    path = Path(args.results)
    if not path.is_dir():
        print(f"speedlib report: no results directory at {path}", file=sys.stderr)
        return 2
    refused = _check_output(args)  # before the results load: a wrong path is said at once
    if refused:
        print(f"speedlib report: {refused}", file=sys.stderr)
        return 2
    root = path.resolve()  # as the dashboard names it: both read back what the other kept
    signature = cache.fingerprint(root)
    loaded = cache.load(root, key=signature)
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
        from speedbench.report import writeup  # noqa: PLC0415 - pandas; `speedlib --help` loads none

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
            from speedbench.report import headline, kept  # noqa: PLC0415 - pandas; `speedlib --help` loads none

            table = kept.table(root, signature, "headline", df, lambda: headline.grid(df))  # the dashboard's too
        else:
            table = {"paired": report.paired_table, "speedup": report.speedup_table, "memory": report.memory_table,
                     "floor": report.floor_table, "claims": report.claims_table,
                     "roofline": report.roofline_table}[args.table](rows)
    return _export(report, table, args)


def _outputs(args: argparse.Namespace) -> list[Path]:
    """The files --output writes: the export, and beside a CSV in a file its provenance (a CSV sent
    to a device or a pipe has its provenance on stderr, as on stdout)."""
    if not args.output:
        return []
    out = Path(args.output)
    streamed = os.path.exists(out) and not os.path.isfile(out)
    return [out] if args.format != "csv" or streamed else [out, report.provenance_path(out)]


def _check_output(args: argparse.Namespace) -> str | None:
    """Why --output cannot be written (the one output rule, speedbench.results.outputs), or None."""
    from speedbench.results import outputs  # noqa: PLC0415 - with the rest of the results package, when it runs

    trees = [Path(args.results), *([Path(args.against)] if args.against else [])]
    try:
        for path in _outputs(args):
            outputs.file_output(path, "--output" if path == Path(args.output) else "--output's provenance", trees)
    except outputs.OutputRefused as e:
        return str(e)
    return None


def _export(report, table, args: argparse.Namespace) -> int:
    """Print `table` in --format, or write it to --output. CSV is plain data: its provenance
    (commits, machines, run dates, the Reproduce command) goes to X.provenance.txt beside
    --output X.csv, and to stderr where the CSV goes to stdout, a device or a pipe."""
    from speedbench.results import outputs  # noqa: PLC0415 - with the rest of the results package, when it runs

    text = {"md": report.to_markdown, "csv": report.to_csv, "tex": report.to_latex}[args.format](table)
    footer = report.csv_provenance(table) if args.format == "csv" else None
    files = _outputs(args)
    if not files:
        print(text, end="")
        if footer:
            print(footer, end="", file=sys.stderr)
        return 0
    try:  # each file whole or as it was: a full disk or a kill leaves no torn export
        for path, content in zip(files, (text, footer), strict=False):
            with outputs.written(path) as f:
                f.write(content.encode("utf-8"))
    except OSError as e:
        print(f"speedlib report: cannot write {printable(args.output)}: {e.strerror or e}{safekeep.disk_full(e)}",
              file=sys.stderr)
        return 2
    if footer and len(files) == 1:
        print(footer, end="", file=sys.stderr)
    beside = f" and its provenance to {printable(str(files[1]))}" if len(files) > 1 else ""
    print(f"speedlib report: wrote {printable(args.output)}{beside}", file=sys.stderr)
    return 0


def _second_run(directory: str, verbose: bool = False):
    """The measured rows of --against DIR, a second run; as for --results, a damaged file is
    never silent."""
    from speedbench.results.load import load_results  # noqa: PLC0415 - pandas; `speedlib --help` loads none

    again = load_results(Path(directory))
    _print_problems(again.problems, verbose, f"speedlib report: --against {printable(directory)}: ")
    return again.measured


def _print_problems(problems, verbose: bool, prefix: str) -> None:
    """On stderr: every damaged or incomplete result (always), the older results the loader
    set aside or kept in one summary line, or one by one with --verbose (speedbench.results.problems)."""
    from speedbench.results import problems as told  # noqa: PLC0415 - pandas; `speedlib --help` loads none

    shown = told.lines(problems, verbose)
    for line in shown[:-1]:
        print(line, file=sys.stderr)
    if shown:
        print(prefix + shown[-1], file=sys.stderr)  # the summary names the command (or --against DIR)


def _regression_gate(report, df, args: argparse.Namespace) -> int:
    """--fail-on-regression A B: the significant changes from A to B; exit 1 on a regression."""
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


def add_parser(sub) -> None:
    report = sub.add_parser("report", help="print a results table (with its provenance footer)",
                            description="Print a results table with its provenance footer, export it, write the "
                                        "results page, or gate CI on regressions.",
                            epilog=REPORT_EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    report.add_argument("--results", default=RESULTS,
                        help="results directory (default: this checkout's results/, as `speedlib dashboard`)")
    report.add_argument("--machine", help="only this machine")
    report.add_argument("--table", default="results",
                        choices=["results", "headline", "paired", "speedup", "memory", "floor", "roofline", "claims",
                                 "history", "noise"],
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
                        help="--table noise: results of a second run of the same commit "
                             "(speedlib run --results-dir DIR)")
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
