"""`speedlib env`: this machine's environment record, or with --check whether it is fit to measure on."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from speedbench.measure import host_settings, preflight
from speedbench.results.common import printable
from speedbench.run.errors import missing_torch

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
    from speedbench.measure import devices as measure  # noqa: PLC0415 - torch; `speedlib --help` loads none

    print(json.dumps(measure.environment(), indent=2, sort_keys=True))
    return 0


def settings_refused(command: str, *, device: bool = False) -> bool:
    """A $SPEEDLIB_THREADS that is not a positive integer (and with `device`, a $SPEEDLIB_DEVICE
    the benchmarks cannot measure on) said in one line (True), before the environment record
    or a run would raise on it or file timings of nothing."""
    readers = ((host_settings.benchmark_threads, host_settings.benchmark_device) if device
               else (host_settings.benchmark_threads,))
    for read in readers:
        try:
            read()
        except ValueError as e:  # its message quotes the value with repr: no control character gets through
            print(f"speedlib {command}: {e}", file=sys.stderr)
            return True
    missing = _device_missing() if device else None
    if missing:
        print(f"speedlib {command}: {missing}", file=sys.stderr)
        return True
    return False


def _device_missing() -> str | None:
    """Why the CUDA device $SPEEDLIB_DEVICE names is not here, or None (a CPU, no setting, or no
    torch to ask: the run says that itself). Asked before a run, whose every benchmark would
    otherwise fail on it with no word about the device."""
    name = host_settings.benchmark_device()
    if not name or not name.startswith("cuda"):
        return None
    import importlib.util  # noqa: PLC0415 - only where a CUDA device is asked for

    if importlib.util.find_spec("torch") is None:
        return None
    import torch  # noqa: PLC0415 - the run loads it next anyway

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(name.partition(":")[2] or 0)
    if index < count:
        return None
    seen = ("torch sees no CUDA device" if count == 0
            else f"torch sees {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return (f"${host_settings.DEVICE_ENV}={name} asks for a CUDA device, and {seen} here: unset it to measure on "
            "this machine's CPU, or run where that GPU is")


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
