"""The pre-flight check: is this machine fit to measure on, right now?

`speedlib run` runs it before it measures anything, and `speedlib env --check` on its own.
Each check gives a `Finding`: a level (ok, warn, bad), one line saying what was seen or what
is wrong, one line saying what to do, and the numbers behind it (kept in the environment
record). What it looks at, and why:

- busy: the share of the machine's CPU time that other processes took over a short sample
  (1 s), with the busiest of them by name. The same notion as the per-round counters of
  `speedbench.measure.interference` (`others_cpu`): contention does not slow a pair's variants alike,
  so a ratio measured beside other work is inflated (4.2x became 12.5x on the 2-core VM with
  one busy-loop process per core).
- load: the 1-minute load average per CPU this process may use. It trails by a minute, so it
  only warns ("something ran until recently"); the sample above decides "busy".
- cpufreq: the frequency governor and turbo/boost, where the kernel exposes them.
- threads: torch's intra-op threads the benchmarks will use against the CPUs free.
- gpu: per GPU (NVML, through nvidia-ml-py): other processes computing on it, clock-event
  (throttle) reasons that hold the clock down, persistence mode.

No torch at import: `speedlib env --check` works where only the viewer is installed (then the
thread check is skipped with a note). The sample reads /proc/stat and every /proc/<pid>/stat
twice; every path is a parameter, so the tests run on fake ones.
"""

from __future__ import annotations

import importlib.util
import math
import os
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from speedbench.measure import interference
from speedbench.measure.host_settings import CPU_SYSFS, benchmark_threads, cpu_frequency_policy, usable_cores
from speedbench.stats import contention

__all__ = ["Finding", "Report", "check", "wait_until_quiet", "sample_processes", "cpu_frequency_policy",
           "CPU_SYSFS", "BUSY_WARN_CORES", "LOAD_WARN"]

LEVELS = ("ok", "warn", "bad")

# Other processes' share of the machine's CPU time (all cores, hypervisor steal included, as
# in interference.window). "Busy" is the level at which speedbench.stats.contention calls a
# measured round disturbed (contention.others_limit: half a core beyond the cores the
# benchmark threads leave free): a run started there would have its rounds marked, so it is
# exit 1 from `speedlib env --check`, and `--require-quiet` refuses to measure. An idle VM's
# daemons stay near 1 %; from a tenth of a core beyond the free ones (enough to take a
# benchmark thread's core now and then) it is worth a warning.
BUSY_WARN_CORES = 0.1
# 1-minute load average per usable CPU: at 0.5, half the CPUs had a runnable task on average
# over the last minute. A warning only: it counts tasks waiting on disk too, and trails.
LOAD_WARN = 0.5
SAMPLE_S = 1.0  # long enough for /proc's 10 ms ticks to resolve 1 % of a 2-CPU machine
TOP = 3  # busiest other processes named
NAMED_SHARE = 1.0  # % of the machine below which a process is not named (a tick or two)

PROC = "/proc"
_TICK = interference.TICK_S  # /proc counts in these
_PF_KTHREAD = 0x00200000  # /proc/<pid>/stat flags: a kernel thread, not a process anyone started


@dataclass(frozen=True)
class Finding:
    check: str  # busy, load, cpufreq, threads, gpu0, ...
    level: str  # ok, warn or bad
    what: str  # one line: what was seen, or what is wrong
    todo: str = ""  # one line: what to do ("" when nothing)
    busy: bool = False  # other work is using what the benchmarks need (--wait-quiet waits on it)
    data: dict = field(default_factory=dict)  # the numbers behind it, JSON-ready

    def line(self) -> str:
        return f"{self.check}: {self.what}" + (f": {self.todo}" if self.todo else "")


@dataclass
class Report:
    findings: list[Finding]

    @property
    def level(self) -> str:
        return max((f.level for f in self.findings), key=LEVELS.index, default="ok")

    @property
    def busy_findings(self) -> list[Finding]:
        """Other work takes what the benchmarks need (CPU time, a GPU): what says so."""
        return [f for f in self.findings if f.busy and f.level == "bad"]

    @property
    def busy(self) -> bool:
        return bool(self.busy_findings)

    def busy_line(self) -> str:
        return "; ".join(f.what for f in self.busy_findings)

    def summary(self) -> str:
        bad = sum(f.level == "bad" for f in self.findings)
        warn = sum(f.level == "warn" for f in self.findings)
        if not bad and not warn:
            return "pre-flight check: nothing wrong found"
        counts = ", ".join(part for part in (f"{bad} problem(s)" if bad else "",
                                             f"{warn} warning(s)" if warn else "") if part)
        return f"pre-flight check: {counts}{'; the machine is busy' if self.busy else ''}"

    def record(self) -> dict:
        """What goes into the environment record; `busy_at_start` says what was busy ("" when nothing)."""
        return {"level": self.level, "busy": self.busy, "busy_at_start": self.busy_line() if self.busy else "",
                "findings": [asdict(f) for f in self.findings]}


# --- the CPU sample ----------------------------------------------------------------------

def _processes(proc: str) -> dict[int, tuple[str, int, int]]:
    """pid -> (name, parent pid, CPU ticks of all its threads) of every process but kernel
    threads. A process that ends while being read is left out."""
    out = {}
    try:
        entries = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return out
    for name in entries:
        try:
            with open(f"{proc}/{name}/stat", encoding="utf-8", errors="replace") as f:
                text = f.read()
            # The name is in parentheses and may hold spaces and ')': split after the last one.
            left, right = text.index("("), text.rindex(")")
            fields = text[right + 2:].split()
            ppid, flags = int(fields[1]), int(fields[6])
            ticks = interference.counter(fields[11]) + interference.counter(fields[12])  # utime + stime
        except (OSError, ValueError, IndexError):
            continue
        pid = int(name)
        if flags & _PF_KTHREAD or pid == 2 or ppid == 2:  # kthreadd and its children
            continue
        out[pid] = (text[left + 1:right], ppid, ticks)
    return out


def _tree(procs: dict[int, tuple[str, int, int]], root: int) -> set[int]:
    """`root` and every process descended from it."""
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo += children.get(pid, [])
    return tree


@dataclass(frozen=True)
class Sample:
    seconds: float  # wall time the sample spanned
    cpus: int  # the machine's CPUs (/proc/stat)
    others: float  # % of the machine's CPU time taken by anything but this process and its children
    steal: float  # % of it the hypervisor gave to other guests (inside `others`)
    top: list[tuple[str, float]]  # busiest other processes by name: (name, % of the machine)
    pids: dict[str, list[int]] = field(default_factory=dict)  # the processes behind each name, to stop them


def sample_processes(seconds: float = SAMPLE_S, proc: str = PROC, pid: int | None = None,
                     sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.perf_counter) -> Sample | None:
    """What other processes did with the machine's CPUs over `seconds`; None without /proc/stat."""
    pid = os.getpid() if pid is None else pid
    usage = resource.getrusage(resource.RUSAGE_SELF)
    own_before = usage.ru_utime + usage.ru_stime
    start, machine_before, before = clock(), interference.machine_cpu_times(f"{proc}/stat"), _processes(proc)
    sleep(seconds)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    own_after = usage.ru_utime + usage.ru_stime
    wall, machine_after, after = clock() - start, interference.machine_cpu_times(f"{proc}/stat"), _processes(proc)
    if machine_before is None or machine_after is None or wall <= 0:
        return None
    capacity = wall * machine_after[2]
    ours = _tree(after, pid) | _tree(before, pid)
    per_name: dict[str, float] = {}
    pids: dict[str, list[int]] = {}
    own = 0.0
    for p, (name, _, ticks) in after.items():
        # A process that started during the sample spent all its CPU time inside it.
        used = (ticks - before[p][2] if p in before and before[p][0] == name else ticks) * _TICK
        if p in ours:
            own += used
        elif used > 0:
            per_name[name] = per_name.get(name, 0.0) + 100.0 * used / capacity
            pids.setdefault(name, []).append(p)
    if pid not in after:  # this process is not in `proc` (a fake tree, another pid namespace)
        own = own_after - own_before
    # the same others' share and steal as a measured round's (interference.window)
    shares = interference.window(interference.Snapshot(0.0, 0.0, 0, machine_before, None, None),
                                 interference.Snapshot(wall, own, 0, machine_after, None, None))
    top = sorted(((n, s) for n, s in per_name.items() if s >= NAMED_SHARE), key=lambda t: -t[1])[:TOP]
    return Sample(wall, machine_after[2], shares["others_cpu"], shares["steal"], top,
                  {n: sorted(pids[n]) for n, _ in top})


def _busy_finding(sample: Sample | None, threads: int | None = None) -> Finding:
    """Bad where a measured round would count as disturbed (contention.others_limit for the
    benchmark's `threads`, all CPUs where unknown); a warning from a tenth of a core beyond
    the free ones."""
    if sample is None:
        return Finding("busy", "ok", "not checked: no /proc/stat to read the machine's CPU time from")
    named = [f"{name} {share:.0f} %" + (f" (pid {', '.join(map(str, sample.pids[name][:3]))}"
                                         f"{', ...' if len(sample.pids[name]) > 3 else ''})"
                                         if sample.pids.get(name) else "")
             for name, share in sample.top]
    if sample.steal >= 1.0:
        named.append(f"hypervisor steal {sample.steal:.0f} %")
    what = (f"other processes used {sample.others:.0f} % of the machine's {sample.cpus} CPU(s) over "
            f"{sample.seconds:.1f} s" + (f" ({', '.join(named)})" if named else ""))
    data = {"others_cpu": round(sample.others, 1), "steal": round(sample.steal, 1), "cpus": sample.cpus,
            "seconds": round(sample.seconds, 2), "top": [[n, round(s, 1)] for n, s in sample.top]}
    bad = contention.others_limit(sample.cpus, threads)
    warn = bad - 100.0 * (contention.OTHERS_CORES_MAX - BUSY_WARN_CORES) / sample.cpus
    data.update(busy_above=round(bad, 1), warn_above=round(warn, 1))
    if sample.others > bad:
        return Finding("busy", "bad", what, "stop them, or wait: speedlib run --wait-quiet SECONDS waits for them",
                       True, data)
    if sample.others > warn:
        return Finding("busy", "warn", what, "ratios may come out inflated: stop them if you can", True, data)
    return Finding("busy", "ok", what, data=data)


def _load_finding(load: float | None, usable: int) -> Finding | None:
    if load is None:
        return None
    what = f"1-minute load average {load:.2f} for {usable} usable CPU(s)"
    data = {"load": round(load, 2), "usable_cpus": usable}
    if load >= LOAD_WARN * usable:
        return Finding("load", "warn", what + ": something ran in the last minute (it may still be running: "
                       "see busy)", "wait a minute and check again (speedlib env --check)", data=data)
    return Finding("load", "ok", what, data=data)


def _cpufreq_finding(policy: dict) -> Finding:
    governors, boost = policy["cpu_governors"], policy["cpu_boost"]
    parts = [f"governor {'/'.join(governors)}" if governors else "governor not exposed (usual in a VM)"]
    if boost is not None:
        parts.append(f"turbo/boost {'on' if boost else 'off'}")
    if governors and "powersave" in governors:
        # powersave keeps clocks low (under intel_pstate it still rises with load, but later),
        # so the first samples of each benchmark run slower than the rest.
        return Finding("cpufreq", "warn", ", ".join(parts) + ": clocks are kept low",
                       "sudo cpupower frequency-set -g performance", data=policy)
    return Finding("cpufreq", "ok", ", ".join(parts), data=policy)


def _threads_finding(threads: int | None, usable: int, sample: Sample | None, error: str | None) -> Finding:
    if error is not None:
        return Finding("threads", "bad", error, "set it to a positive integer, or unset it")
    if threads is None:
        return Finding("threads", "ok", "not checked: PyTorch is not installed here (speedlib run needs it)")
    data: dict = {"torch_threads": threads, "usable_cpus": usable}
    if sample is None:
        free = usable
    else:
        # Others' CPU time is counted over the whole machine; where this process may use only
        # some of its CPUs (a container's cpuset), that overstates what is taken from ours.
        taken = sample.others / 100.0 * sample.cpus
        free = max(round(usable - taken), 0)
        data.update(others_cpus=round(taken, 2), free_cpus=free)
    what = f"the benchmarks will run {threads} torch thread(s) on {usable} usable CPU(s), {free} of them free"
    if threads > free:
        return Finding("threads", "warn", what + ": threads will wait for a core",
                       "stop the other work, or set SPEEDLIB_THREADS (recorded with the results)", data=data)
    return Finding("threads", "ok", what, data=data)


def _usable_and_threads() -> tuple[int, int | None, str | None]:
    """(usable CPUs, benchmark threads or None without torch, error of a bad $SPEEDLIB_THREADS).
    Without torch nothing would run those threads; with it, torch is not imported here (the
    rule needs none, and importing it costs seconds)."""
    if importlib.util.find_spec("torch") is None:
        return usable_cores(), None, None
    try:
        return usable_cores(), benchmark_threads(), None
    except ValueError as e:
        return usable_cores(), None, str(e)


# --- the GPU -----------------------------------------------------------------------------

_REASONS = interference.DISTURBING_REASONS  # the clock-event reasons that hold a GPU's clock down, in words
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # one directory per GPU the driver sees


def _gpu_findings(nvml=None, nvidia_gpus: str = NVIDIA_GPUS, proc: str = PROC) -> list[Finding]:
    probe = interference.gpu_probe(0, nvml=nvml)
    if probe is None:
        try:
            present = any(os.scandir(nvidia_gpus))
        except OSError:
            present = False
        if not present:
            return []  # no GPU: nothing to say
        return [Finding("gpu", "warn", "an NVIDIA GPU is here, but NVML could not be read, so the GPU checks "
                                       "were not possible", "python3 -m pip install nvidia-ml-py")]
    nv = probe.nvml
    try:
        count = int(nv.nvmlDeviceGetCount())
    except Exception:  # noqa: BLE001 - NVMLError: the first device is all we know of
        count = 1
    findings = []
    for index in range(count):
        gpu = probe if index == 0 else interference.gpu_probe(index, nvml=nv)
        if gpu is not None:
            findings += _one_gpu(index, gpu, proc)
    return findings


def _one_gpu(index: int, probe, proc: str) -> list[Finding]:
    name = f"gpu{index}"
    clock, reasons, others = probe.read()
    try:
        persistence = bool(probe.nvml.nvmlDeviceGetPersistenceMode(probe.handle))
    except Exception:  # noqa: BLE001 - not supported (Windows, some virtual GPUs): unknown
        persistence = None
    data = {"sm_clock_pct": None if clock is None else round(clock, 1), "reasons": reasons,
            "other_processes": others, "persistence": persistence}
    findings = []
    if others:
        findings.append(Finding(name, "bad", f"{others} other process(es) compute on GPU {index}"
                                             f"{_process_names(probe, proc)}",
                                "stop them, or wait: speedlib run --wait-quiet SECONDS waits for them", True, data))
    held = [words for bit, words in _REASONS.items() if reasons and reasons & bit]
    if held:
        at = f" (SM clock {clock:.0f} % of its maximum)" if clock is not None else ""
        findings.append(Finding(name, "warn", f"GPU {index}'s clock is held down: {', '.join(held)}{at}",
                                "let it cool, or check its cooling and power; nvidia-smi -q -d PERFORMANCE "
                                "says more", data=data))
    if persistence is False:
        # Off, the driver sets the GPU up afresh for every process, and asv starts one per benchmark.
        findings.append(Finding(name, "warn", f"GPU {index}'s persistence mode is off: each benchmark process "
                                              "pays for the GPU's set-up", "sudo nvidia-smi -pm 1", data=data))
    if not findings:
        at = f"SM clock {clock:.0f} % of its maximum (low while idle)" if clock is not None else "SM clock unknown"
        findings.append(Finding(name, "ok", f"GPU {index}: no other process on it, {at}, no throttle reason",
                                data=data))
    return findings


def _process_names(probe, proc: str) -> str:
    """' (python3, ...)' for the other compute processes NVML lists, where /proc names them."""
    try:
        pids = [p.pid for p in probe.nvml.nvmlDeviceGetComputeRunningProcesses(probe.handle)
                if getattr(p, "pid", None) != probe.pid]
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and the like: the line names no process
        return ""
    names = []
    for pid in pids:
        try:
            names.append(Path(f"{proc}/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip())
        except OSError:
            names.append(f"pid {pid}")  # in another container's pid namespace
    return f" ({', '.join(names)})" if names else ""


# --- the whole check ---------------------------------------------------------------------

def check(sample_s: float = SAMPLE_S, proc: str = PROC, sysfs: str | os.PathLike = CPU_SYSFS, nvml=None,
          nvidia_gpus: str = NVIDIA_GPUS,
          threads: Callable[[], tuple[int, int | None, str | None]] = _usable_and_threads,
          load: Callable[[], float | None] = interference.load_average, pid: int | None = None,
          sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.perf_counter) -> Report:
    """Every check, in the order they are shown. The parameters stand in for the machine in
    tests: `threads` gives (usable CPUs, benchmark threads, error of a bad $SPEEDLIB_THREADS),
    `load` the 1-minute load average, `nvml` a pynvml-like module."""
    usable, bench_threads, error = threads()
    sample = sample_processes(sample_s, proc, pid, sleep, clock)
    findings = [_busy_finding(sample, bench_threads)]
    load_finding = _load_finding(load(), usable)
    if load_finding is not None:
        findings.append(load_finding)
    findings.append(_cpufreq_finding(cpu_frequency_policy(sysfs)))
    findings.append(_threads_finding(bench_threads, usable, sample, error))
    findings += _gpu_findings(nvml, nvidia_gpus, proc)
    return Report(findings)


PAUSE_S = 2.0  # between checks while waiting (each check itself samples SAMPLE_S)
PROGRESS_S = 10.0  # one progress line this often while waiting


def wait_until_quiet(seconds: float, report: Report, recheck: Callable[[], Report] | None = None,
                     say: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> Report:
    """Check again (`recheck`, default `check`) until the machine is not busy or `seconds`
    have passed; the last report (still busy when time ran out). Says how it goes every
    PROGRESS_S seconds."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"seconds to wait must be a positive number, got {seconds!r}")
    recheck = recheck or check  # looked up now: a stand-in for `check` counts here too
    start = clock()
    said = start
    while report.busy:
        waited = clock() - start
        if waited >= seconds:
            break
        sleep(min(PAUSE_S, seconds - waited))
        report = recheck()
        now = clock()
        if report.busy and now - said >= PROGRESS_S:
            say(f"still busy after {now - start:.0f} of {seconds:g} s: {report.busy_line()}")
            said = now
    return report
