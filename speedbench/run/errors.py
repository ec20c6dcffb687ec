"""How a run refuses and ends: `SuiteError` for a precondition it refuses, the exit statuses
`speedlib run` and `speedlib slot` share, and the one-line refusals when torch is missing or the
host settings ($SPEEDLIB_THREADS, $SPEEDLIB_DEVICE) cannot be measured with."""

from __future__ import annotations

import importlib.util
import sys

from speedbench.measure import host_settings


class SuiteError(RuntimeError):
    """A `speedlib run` precondition failed; the message says how to fix it."""


# Not 2 (the run stopped early), so that a script can tell that the run finished and its
# results and archive are there to collect.
BENCHMARKS_FAILED = 3
CHUNKS_LEFT = 4


def missing_torch(command: str) -> bool:
    """Measuring needs torch; viewing results does not, so a viewer-only install (the
    README's first command) has none. Say so in one line instead of a traceback."""
    if importlib.util.find_spec("torch") is not None:
        return False
    print(f"speedlib {command}: PyTorch is not installed, and measuring needs it: "
          'python3 -m pip install -e ".[bench]" (report and dashboard work without it)', file=sys.stderr)
    return True


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
