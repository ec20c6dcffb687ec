"""The `speedlib` command: `run` the asv suite, print the `env` record, `report` results,
open the `dashboard`; `merge`, `slurm` and `slot` (a short GPU slot) add their own."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from speedbench.cli import dashboard, env, publish, report, run
from speedbench.results import merge
from speedbench.run import slot, slurm
from speedlib import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speedlib", description=__doc__)
    parser.add_argument("--version", action="version", version=f"speedlib {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    # one module per command; each imports only the standard library until it runs
    for command in (run, env, report, dashboard, publish, merge, slurm, slot):
        command.add_parser(sub)
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
