"""`speedlib env`: this machine's environment record, or with --check whether it is fit to measure on."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from speedbench.measure import preflight
from speedbench.results.common import printable
from speedbench.run.errors import missing_torch, settings_refused

ENV_EXIT_STATUS = """exit status:
  0  the record was printed; with --check, no check found anything bad (warnings may remain)
  1  --check found something bad: the machine is busy, a GPU has other processes on it, or
     $SPEEDLIB_THREADS is not a positive integer (at most 1024, or the usable CPUs where more)
  2  the record needs PyTorch, which is not installed (--check does not), or such an integer
     in $SPEEDLIB_THREADS where it is set"""


def _cmd_env(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if args.check:
        return _check()
    if settings_refused("env"):
        return 2
    if missing_torch("env"):
        return 2
    from speedbench.measure import hardware  # noqa: PLC0415 - torch; `speedlib --help` loads none

    print(json.dumps(hardware.environment(), indent=2, sort_keys=True))
    return 0


def _check() -> int:
    """`speedlib env --check`: every pre-flight check, one line each, then a summary; 1 if
    one of them is bad. Needs no torch (the thread check is then skipped, with a note)."""
    report = preflight.check()
    width = max(len(level) for level in preflight.LEVELS)
    for finding in report.findings:
        print(f"{finding.level:<{width}}  {printable(finding.line())}")
    print(report.summary())
    return 1 if report.level == "bad" else 0


def add_parser(sub) -> None:
    env = sub.add_parser("env", help="print this machine's environment record as JSON", epilog=ENV_EXIT_STATUS,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    env.add_argument("--check", action="store_true",
                     help="instead, check whether this machine is fit to measure on now: other processes' CPU "
                          "use, load, CPU frequency governor, torch threads against free CPUs, GPU state; one "
                          "line each with what to do (needs no PyTorch)")
    env.set_defaults(func=_cmd_env)
