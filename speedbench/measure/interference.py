"""What the machine did to a measurement besides running it: interference counters.

Pairing cancels drift that slows every variant alike; contention does not slow them alike.
On the 2-core VM, one busy-loop process per core turned the flat-buffer Adam step's 4.2x
into 12.5x: the per-tensor loop is thousands of small operations, each waking torch's
intra-op threads and each stalled when one of them has been descheduled, while the flat step
streams memory in a few kernels. So every paired round (and every unpaired timed
measurement) is bracketed by two `snapshot()`s, and `window()` turns them into counters that
say how much of the machine something else took meanwhile:

  others_cpu   % of the machine's CPU time (all cores) spent on anything but this process:
               /proc/stat's busy time (user, nice, system, irq, softirq, steal) less the CPU
               time of this process (all its threads) and of the processes it started. A hypervisor's steal
               counts: another guest on our vCPU takes time from us just the same.
  steal        % of the machine's CPU time the hypervisor gave to other guests.
  preemptions  involuntary context switches of this process (all threads) per second: the
               scheduler took a core from one of our threads while it could still run.
  cpu_per_wall this process's CPU seconds per wall-clock second (2.0: two busy threads).
  load         the 1-minute load average when the window closed. The kernel updates it
               every 5 s, so it describes the run, not one round.
  gpu_clock    the lowest SM clock read at the window's ends, % of the GPU's maximum (NVML).
  gpu_reasons  NVML's clock-event (throttle) reasons seen at either end, as a bit mask.
  gpu_neighbours  the most compute processes other than this one seen on the device.

Reading all of this costs tens of microseconds (one /proc read, one getrusage, a few NVML
calls), outside the timed samples. Where a counter cannot be read (no /proc on macOS, no
NVML without a driver or nvidia-ml-py) it is None, never a guess: speedbench.stats.contention
judges a round only by the counters it has. No torch here, so the report and the pre-flight
check can use it too.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

__all__ = ["Snapshot", "snapshot", "window", "round_windows", "MIN_WINDOW_S", "machine_cpu_times", "own_cpu_seconds",
           "load_average", "gpu_probe", "GpuProbe", "COUNTERS", "TICK_S"]

# The counters `window` returns, in the order the benchmarks store them.
COUNTERS = ("others_cpu", "steal", "preemptions", "cpu_per_wall", "load", "gpu_clock", "gpu_reasons",
            "gpu_neighbours")

PROC_STAT = "/proc/stat"
# /proc/stat and /proc/<pid>/stat count in USER_HZ ticks (100 per second on every Linux ABI in use).
TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


# The kernel keeps its CPU-time counters as unsigned 64-bit numbers: a longer one is no
# reading (a damaged or planted file), and its seconds would overflow a float.
_COUNTER_MAX = 2**64 - 1


def counter(text: str) -> int:
    """One /proc tick counter; ValueError for anything but ASCII digits worth 0 .. 2**64 - 1."""
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(_COUNTER_MAX)) or int(text) > _COUNTER_MAX:
        raise ValueError(f"no /proc counter: {len(text)} characters, not a number of 0 .. 2**64 - 1")
    return int(text)


def machine_cpu_times(path: str = PROC_STAT) -> tuple[float, float, int] | None:
    """(busy seconds, steal seconds, cores) summed over the machine's CPUs since boot, from
    the aggregate `cpu` line of /proc/stat; None where it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            head = f.readline().split()
            cores = sum(1 for line in f if line.startswith("cpu"))
    except (OSError, ValueError):
        return None
    if len(head) < 9 or head[0] != "cpu":
        return None
    try:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (counter(v) for v in head[1:9])
    except ValueError:
        return None
    # guest time is already inside user (the kernel adds it there), so it is not added again
    busy = user + nice + system + irq + softirq + steal
    return busy * TICK_S, steal * TICK_S, max(cores, 1)


def _live_children_cpu(pid: int | str = "self", depth: int = 0) -> float:
    """CPU seconds of the processes below `pid` that are still running (and of what they have
    waited for), from /proc/<child>/stat; 0 where /proc does not list children."""
    total = 0.0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                children = f.read().split()
        except OSError:
            continue
        for child in children:
            try:
                with open(f"/proc/{child}/stat", encoding="ascii", errors="replace") as f:
                    # the command name is in parentheses and may hold spaces: fields follow the last ')'
                    fields = f.read().rsplit(")", 1)[1].split()
                utime, stime, cutime, cstime = (counter(v) for v in fields[11:15])
            except (OSError, IndexError, ValueError):
                continue
            total += (utime + stime + cutime + cstime) * TICK_S
            if depth < 8:  # a tree deeper than this is not one a benchmark starts
                total += _live_children_cpu(child, depth + 1)
    return total


def own_cpu_seconds() -> float:
    """CPU seconds of this process (all threads) and of the processes it started: those it
    has waited for (getrusage) and those still running. Workers a benchmark starts (a
    DataLoader's, torchrun's ranks) are its own work, not a neighbour's."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + waited.ru_utime + waited.ru_stime + _live_children_cpu()


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


# NVML's clock-event reasons (nvml.h, nvmlClocksEventReason*) that say the clock was held down
# by something other than the work asked of it, in words. Left out: idle, application-clock
# settings, and the software power cap, which a heavy kernel reaches on its own (the work's
# own limit, not a neighbour's). The pre-flight check names them.
DISTURBING_REASONS = {0x08: "hardware slowdown", 0x10: "sync boost", 0x20: "software thermal slowdown",
                      0x40: "hardware thermal slowdown", 0x80: "power brake"}


class GpuProbe:
    """NVML reads of one CUDA device: SM clock, its maximum, throttle reasons and the other
    compute processes on it. Built by `gpu_probe`, which returns None where NVML is absent."""

    def __init__(self, nvml, handle, max_clock: int):
        self.nvml, self.handle, self.max_clock = nvml, handle, max_clock
        self.pid = os.getpid()

    def read(self) -> tuple[float | None, int | None, int | None]:
        """(SM clock as % of its maximum, clock-event reasons, other compute processes)."""
        nv = self.nvml
        clock = reasons = others = None
        try:
            clock = 100.0 * nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM) / self.max_clock
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and the like: unknown, not wrong
            pass
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(nv, name, None)  # renamed in NVML 12.2; older bindings have the old name
            if fn is not None:
                try:
                    reasons = int(fn(self.handle))
                except Exception:  # noqa: BLE001 - NVMLError_NotSupported and the like: unknown, not wrong
                    pass
                break
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(self.handle)
            others = sum(1 for p in procs if getattr(p, "pid", None) != self.pid)
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and the like: unknown, not wrong
            pass
        return clock, reasons, others


def gpu_probe(index: int = 0, pci_bus_id: str | None = None, nvml=None) -> GpuProbe | None:
    """A probe of one GPU through nvidia-ml-py's `pynvml`: the one at `pci_bus_id`
    ("00000000:19:00.0", as torch's device properties give it; CUDA_VISIBLE_DEVICES renumbers
    devices, NVML does not) where given, else NVML's device `index`. None where there is no
    such module, driver or device. `nvml`: a stand-in module for tests."""
    if nvml is None:
        try:
            import pynvml as nvml  # noqa: PLC0415 - optional (nvidia-ml-py), only on GPU hosts
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
        if pci_bus_id is not None:
            handle = _handle_by_bus_id(nvml, pci_bus_id)
        else:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        max_clock = nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)
    except Exception:  # noqa: BLE001 - no driver, no device: no GPU counters
        return None
    return GpuProbe(nvml, handle, max_clock) if max_clock else None


def _handle_by_bus_id(nvml, bus_id: str):
    # NVML prints bus IDs in upper case; which case its lookup accepts has varied by version
    error = None
    for text in dict.fromkeys((bus_id.upper(), bus_id.lower())):
        try:
            return nvml.nvmlDeviceGetHandleByPciBusId_v2(text)
        except Exception as e:  # noqa: BLE001 - NVMLError_NotFound or an unaccepted spelling: try the other case
            error = e
    raise error


@dataclass(frozen=True)
class Snapshot:
    wall: float  # time.perf_counter()
    own_cpu: float  # own_cpu_seconds()
    involuntary: int  # this process's involuntary context switches so far
    machine: tuple[float, float, int] | None  # machine_cpu_times()
    load: float | None
    gpu: tuple[float | None, int | None, int | None] | None  # GpuProbe.read()


def snapshot(gpu: GpuProbe | None = None, proc_stat: str = PROC_STAT) -> Snapshot:
    return Snapshot(time.perf_counter(), own_cpu_seconds(), resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw,
                    machine_cpu_times(proc_stat), load_average(), gpu.read() if gpu is not None else None)


def window(start: Snapshot, end: Snapshot) -> dict[str, float | None]:
    """The counters of the time between two snapshots (see the module docstring)."""
    wall = end.wall - start.wall
    own = end.own_cpu - start.own_cpu
    out: dict[str, float | None] = dict.fromkeys(COUNTERS)
    if wall <= 0:
        return out
    out["preemptions"] = (end.involuntary - start.involuntary) / wall
    out["cpu_per_wall"] = own / wall
    out["load"] = end.load
    if start.machine is not None and end.machine is not None:
        busy = end.machine[0] - start.machine[0]
        steal = end.machine[1] - start.machine[1]
        capacity = wall * end.machine[2]
        # Ticks are 10 ms per CPU: a short window's busy time is that coarse, so the share is
        # clamped to what can be: never below 0 % or above 100 %.
        out["others_cpu"] = min(max(100.0 * (busy - own) / capacity, 0.0), 100.0)
        out["steal"] = min(max(100.0 * steal / capacity, 0.0), 100.0)
    if start.gpu is not None and end.gpu is not None:
        clocks = [c for c in (start.gpu[0], end.gpu[0]) if c is not None]
        reasons = [r for r in (start.gpu[1], end.gpu[1]) if r is not None]
        others = [n for n in (start.gpu[2], end.gpu[2]) if n is not None]
        out["gpu_clock"] = min(clocks) if clocks else None
        out["gpu_reasons"] = float(reasons[0] | reasons[-1]) if reasons else None
        out["gpu_neighbours"] = float(max(others)) if others else None
    return out


# The shortest time the CPU counters are taken over. /proc/stat counts whole 10 ms ticks per
# CPU, so over a 1 ms round one tick of anyone's reads as 100 % of the machine, and each CPU's
# count can be a tick off at either end. Over 0.25 s on 2 CPUs that is at most 0.1 of a core,
# well under the half core that makes a round disturbed (speedbench.stats.contention); a machine of
# more CPUs needs longer (CPUs / 20 s keeps it there: 0.8 s on 16). A shorter round takes its
# CPU counters from the rounds around it, as many as make that time.
MIN_WINDOW_S = 0.25
_CPUS_PER_WINDOW_S = 20
_CPU_COUNTERS = ("others_cpu", "steal", "preemptions", "cpu_per_wall", "load")


def round_windows(rounds: list[tuple[Snapshot, Snapshot]], min_seconds: float | None = None) -> list[dict]:
    """The counters of each round from its (start, end) snapshots, consecutive rounds in
    order. The CPU counters of a round shorter than `min_seconds` (by default MIN_WINDOW_S,
    longer on machines of many CPUs) are those of the smallest run of rounds around it that
    lasts that long (or of all of them); the GPU counters are always the round's own (NVML
    reads a clock, not a tick count)."""
    if min_seconds is None:
        cpus = next((s.machine[2] for pair in rounds for s in pair if s.machine is not None), 1)
        min_seconds = max(MIN_WINDOW_S, cpus / _CPUS_PER_WINDOW_S)
    out = []
    for i, (start, end) in enumerate(rounds):
        own = window(start, end)
        lo = hi = i
        while rounds[hi][1].wall - rounds[lo][0].wall < min_seconds and (lo > 0 or hi < len(rounds) - 1):
            if hi < len(rounds) - 1:
                hi += 1
            if lo > 0 and rounds[hi][1].wall - rounds[lo][0].wall < min_seconds:
                lo -= 1
        if (lo, hi) != (i, i):
            wide = window(rounds[lo][0], rounds[hi][1])
            own.update({k: wide[k] for k in _CPU_COUNTERS})
        out.append(own)
    return out
