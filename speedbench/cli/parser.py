"""The `speedlib` command: `run` the asv suite, print the `env` record, `report` results,
open the `dashboard`, `publish` them as a static site, check benchmark `versions`, `merge`
results from several hosts, run the suite on `slurm`, or in a short GPU `slot`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from speedbench.cli import dashboard, env, merge, publish, report, run, slot, slurm, versions
from speedlib import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speedlib", description=__doc__)
    parser.add_argument("--version", action="version", version=f"speedlib {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    # one module per command; each imports only the standard library until it runs
    for command in (run, env, report, dashboard, publish, versions, merge, slurm, slot):
        command.add_parser(sub)
    return parser


# Exit statuses as a shell reports a command ended by the signal: 128 + its number.
INTERRUPTED = 128 + signal.SIGINT
READER_GONE = 128 + signal.SIGPIPE  # what `cat` ends with when its reader has gone


def main(argv: Sequence[str] | None = None) -> int:
    # Without argv this is the `speedlib` command itself (console script, python -m), not a
    # call from another program (a test) whose own Ctrl+C handling must come back.
    program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        try:
            status = args.func(args, argv)
            sys.stdout.flush()  # a reader that has gone shows here, not as an error at exit
        except KeyboardInterrupt:
            # Ctrl+C while results load or a table is drawn: one line, not a traceback (`run`
            # catches it itself, after stopping asv).
            status = _stopped(args.command)
    except BrokenPipeError:
        return _reader_gone()
    if program and status == INTERRUPTED:
        # A further Ctrl+C while the interpreter ends would kill it by SIGINT (status -2, a
        # traceback) after it said it stopped; the command is over, so it changes nothing.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return status


def _stopped(command: str) -> int:
    # A further Ctrl+C while this is said would escape as a KeyboardInterrupt.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        print(f"speedlib {command}: stopped by Ctrl+C", file=sys.stderr)
    finally:  # main() runs inside other programs (tests) too: their handler comes back
        signal.signal(signal.SIGINT, previous)
    return INTERRUPTED


def _reader_gone() -> int:
    """stdout's reader has gone (`speedlib report | head`): end quietly, as `cat` does. What is
    still buffered for stdout goes to /dev/null, so exiting does not fail on it again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a descriptor (a test's capture) keeps nothing to flush
        pass
    return READER_GONE
