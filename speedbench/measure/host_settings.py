"""What every measuring process is set to use, read without torch: the usable CPUs, $SPEEDLIB_THREADS,
$SPEEDLIB_DEVICE, and the CPU frequency policy (speedbench.measure.preflight re-exports them)."""

from __future__ import annotations

import os
import re
from pathlib import Path

CPU_SYSFS = "/sys/devices/system/cpu"


def cpu_frequency_policy(sysfs: str | os.PathLike = CPU_SYSFS) -> dict:
    """The CPU frequency governors in use (sorted, None where cpufreq is not exposed, as in
    most VMs) and whether turbo/boost is on (None where unreadable). A `powersave` governor
    or a changed boost setting moves every host-side timing: data loading, launch overhead."""
    root = Path(sysfs)
    governors = set()
    for path in root.glob("cpu[0-9]*/cpufreq/scaling_governor"):
        try:
            governors.add(_sysfs_word(path))
        except OSError:
            pass
    boost = None
    # intel_pstate says the opposite (no_turbo); acpi-cpufreq and amd-pstate say "boost".
    for name, on in (("intel_pstate/no_turbo", "0"), ("cpufreq/boost", "1")):
        try:
            boost = _sysfs_word(root / name) == on
            break
        except OSError:
            pass
    return {"cpu_governors": sorted(governors) or None, "cpu_boost": boost}


def _sysfs_word(path: Path) -> str:
    """A one-word sysfs file, stripped. The kernel writes ASCII: any other byte (a damaged or
    planted file) is kept as its escape, \\xNN, so the word is recorded and shown, never raises."""
    return path.read_bytes().decode("ascii", "backslashreplace").strip()


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity mask: a container's or taskset's
    limit), else all of the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# $SPEEDLIB_THREADS sets the intra-op threads the benchmarks use; by default one per usable CPU.
THREADS_ENV = "SPEEDLIB_THREADS"
# The most threads it may ask for where the machine has fewer usable CPUs: beyond this it is a
# typo (10**30 overflowed torch.set_num_threads inside every benchmark, after the run started).
MAX_THREADS = 1024


def benchmark_threads() -> int:
    """The intra-op thread count every measuring process sets (`torch.set_num_threads`,
    benchmarks/common.py) before it builds anything: torch's own default depends on its build
    and on OMP_NUM_THREADS, so a ratio would otherwise depend on how the shell that started the
    run was set up. The environment record keeps the number (speedbench.measure.hardware). Raises
    ValueError for a $SPEEDLIB_THREADS that is not a positive integer up to MAX_THREADS (or the
    usable CPUs, where there are more)."""
    text = os.environ.get(THREADS_ENV)
    if text is None or not text.strip():
        return usable_cores()
    most = max(MAX_THREADS, usable_cores())
    try:
        threads = int(text) if len(text) <= 20 else 0  # int() of a huge string is slow, and no count is that long
    except ValueError:
        threads = 0
    if not 1 <= threads <= most:
        shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"
        raise ValueError(f"${THREADS_ENV} must be a positive integer, at most {most}, got {shown}")
    return threads


# $SPEEDLIB_DEVICE names the device the benchmarks measure on; by default CUDA when present.
DEVICE_ENV = "SPEEDLIB_DEVICE"
# The benchmarks have a CPU and a GPU profile and nothing else: on "meta" every kernel is a
# no-op (a run would file timings of nothing), and torch rejects a name it does not know
# only inside each benchmark, which then fails without saying why.
_DEVICE_NAME = re.compile(r"cpu|cuda(:[0-9]+)?")


def benchmark_device() -> str | None:
    """$SPEEDLIB_DEVICE (None where it is unset or blank), read without torch. Raises
    ValueError for anything but cpu, cuda or cuda:N."""
    text = os.environ.get(DEVICE_ENV)
    if text is None or not text.strip():
        return None
    if not _DEVICE_NAME.fullmatch(text):
        raise ValueError(f"${DEVICE_ENV} must be cpu, cuda or cuda:N (the device to measure on), got {text!r}")
    return text
