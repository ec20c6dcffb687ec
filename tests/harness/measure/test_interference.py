"""speedbench.measure.interference: the counters read around every round, and what the benchmarks store."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from benchmarks import common
from speedbench.measure import interference
from speedbench.measure.interference import Snapshot
from speedbench.stats import contention, paired


def snap(wall, own=0.0, invol=0, busy=0.0, steal=0.0, cores=2, load=0.1, gpu=None) -> Snapshot:
    return Snapshot(wall, own, invol, (busy, steal, cores), load, gpu)


def test_proc_stat_busy_time_counts_steal_and_leaves_out_idle_iowait_and_guest(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice, in 1/100 s ticks
    stat.write_text("cpu  100 20 30 5000 40 5 6 7 50 0\ncpu0 50 10 15 2500 20 2 3 3 25 0\n"
                    "cpu1 50 10 15 2500 20 3 3 4 25 0\nintr 1 2 3\n")
    busy, steal, cores = interference.machine_cpu_times(str(stat))
    assert cores == 2
    assert busy == pytest.approx((100 + 20 + 30 + 5 + 6 + 7) / 100)  # guest is inside user already
    assert steal == pytest.approx(0.07)
    stat.write_text("not a stat file\n")
    assert interference.machine_cpu_times(str(stat)) is None
    assert interference.machine_cpu_times(str(tmp_path / "missing")) is None


def test_a_window_says_what_share_of_the_machine_others_took():
    # 1 s on 2 CPUs: the machine was busy 1.6 s, 0.5 s of it ours, 0.1 s stolen by the hypervisor
    w = interference.window(snap(10.0, own=3.0, invol=100, busy=50.0, steal=1.0),
                            snap(11.0, own=3.5, invol=400, busy=51.6, steal=1.1, load=1.7))
    assert w["others_cpu"] == pytest.approx(55.0)  # (1.6 - 0.5) / 2
    assert w["steal"] == pytest.approx(5.0)
    assert w["preemptions"] == pytest.approx(300.0)
    assert w["cpu_per_wall"] == pytest.approx(0.5)
    assert w["load"] == 1.7
    assert w["gpu_clock"] is None and w["gpu_neighbours"] is None
    # whole ticks make a short window coarse: the share is never reported beyond what can be
    assert interference.window(snap(0.0, busy=0.0), snap(0.001, busy=0.01))["others_cpu"] == 100.0
    assert interference.window(snap(0.0, own=0.0), snap(0.5, own=0.6, busy=0.5))["others_cpu"] == 0.0
    assert interference.window(snap(1.0), snap(1.0))["others_cpu"] is None  # no time passed


def test_a_window_without_proc_stat_judges_by_what_it_has():
    start, end = Snapshot(0.0, 0.0, 0, None, None, None), Snapshot(1.0, 0.9, 3, None, None, None)
    w = interference.window(start, end)
    assert w["others_cpu"] is None and w["steal"] is None and w["preemptions"] == 3.0


def test_gpu_counters_take_the_lowest_clock_every_reason_and_the_most_neighbours():
    w = interference.window(snap(0.0, gpu=(98.0, 0x1, 0)), snap(1.0, gpu=(91.0, 0x20, 2)))
    assert (w["gpu_clock"], w["gpu_reasons"], w["gpu_neighbours"]) == (91.0, 0x21, 2.0)


def test_short_rounds_take_their_cpu_counters_from_the_rounds_around_them():
    # ten 0.1 s rounds: the first five quiet, the last five with another process on one CPU
    rounds, busy = [], 0.0
    for i in range(10):
        start = snap(i * 0.1, own=i * 0.1, busy=busy)
        busy += 0.1 + (0.1 if i >= 5 else 0.0)
        rounds.append((start, snap((i + 1) * 0.1, own=(i + 1) * 0.1, busy=busy, gpu=None)))
    out = interference.round_windows(rounds, min_seconds=0.25)
    assert len(out) == 10
    assert out[0]["others_cpu"] == pytest.approx(0.0) and out[9]["others_cpu"] == pytest.approx(50.0)
    # every window spans at least 0.25 s: three rounds here, so a round at the edge of the busy
    # stretch sees part of it
    assert 0.0 < out[5]["others_cpu"] < 50.0
    long = interference.round_windows(rounds, min_seconds=0.05)  # each round long enough alone
    assert [round(w["others_cpu"]) for w in long] == [0] * 5 + [50] * 5
    everything = interference.round_windows(rounds[:2], min_seconds=5.0)  # shorter than the minimum in all
    assert everything[0]["others_cpu"] == everything[1]["others_cpu"] == pytest.approx(0.0)


def test_own_cpu_counts_the_processes_it_started():
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
    before = interference.own_cpu_seconds()
    child = subprocess.Popen([sys.executable, "-c", spin + "time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while interference.own_cpu_seconds() - before < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert interference.own_cpu_seconds() - before >= 0.3  # still running: read from /proc
    finally:
        child.kill()
        child.wait()
    waited = interference.own_cpu_seconds() - before
    assert waited >= 0.3  # waited for: getrusage's children


class FakeNvml:
    """Stands in for pynvml: one GPU at 1500 of 1980 MHz, thermal slowdown, two processes."""

    NVML_CLOCK_SM = 1

    def __init__(self, pid):
        self.pid, self.looked_up = pid, []

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"gpu{i}"

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus):
        self.looked_up.append(bus)
        if bus != "00000000:19:00.0":  # this fake knows lower case only
            raise RuntimeError("not found")
        return "gpu-by-bus"

    def nvmlDeviceGetMaxClockInfo(self, handle, kind):
        return 1980

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return 1500

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return 0x20

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=self.pid), SimpleNamespace(pid=1)]


def test_the_gpu_probe_reads_clock_reasons_and_other_processes():
    nvml = FakeNvml(os.getpid())
    probe = interference.gpu_probe(pci_bus_id="00000000:19:00.0", nvml=nvml)
    assert probe.handle == "gpu-by-bus" and nvml.looked_up == ["00000000:19:00.0"]
    clock, reasons, others = probe.read()
    assert clock == pytest.approx(100 * 1500 / 1980) and reasons == 0x20 and others == 1  # not this process
    assert interference.gpu_probe(nvml=nvml).handle == "gpu0"

    class Broken(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("no driver")

    assert interference.gpu_probe(nvml=Broken(0)) is None


def test_take_turns_observes_every_measured_round_and_no_warmup():
    opened = []

    def observe():
        opened.append(len(opened))
        return lambda: f"round {len(opened) - 1}"

    observed: list = []
    samples = paired.take_turns({"a": lambda: 1.0, "b": lambda: 2.0}, rounds=4, warmup=2, observe=observe,
                                observed=observed)
    assert observed == ["round 0", "round 1", "round 2", "round 3"] and len(samples["a"]) == 4
    with pytest.raises(ValueError, match="together"):
        paired.take_turns({"a": lambda: 1.0}, rounds=1, observe=observe)


def test_a_paired_class_stores_one_counter_per_round_beside_its_samples():
    """benchmarks.common.Paired end to end, in this process: the counters' tracks have one
    sample per round, the same for every variant of the configuration."""
    pytest.importorskip("torch")
    import torch  # noqa: PLC0415 - torch, only for this test: the rest of the file needs none

    class Tiny(common.Paired):
        params = (["w"], ["slow", "fast"])
        param_names = ["workload", "variant"]
        baseline = "slow"
        pairs, warmup = 9, 1

        def setup_cache(self):
            return self.measure_all()

        def steps(self, workload):
            x = torch.ones(1000)
            return torch.device("cpu"), {"slow": lambda: [x.add_(1) for _ in range(50)], "fast": lambda: x.add_(1)}

    bench = Tiny()
    cache = bench.setup_cache()
    for variant in ("slow", "fast"):
        others = bench.track_interference(cache, "w", variant)
        assert len(others["samples"]) == 9 and all(0.0 <= v <= 100.0 for v in others["samples"])
        assert len(bench.track_preemptions(cache, "w", variant)["samples"]) == 9
        assert bench.track_gpu_clock(cache, "w", variant) is common.SKIP  # no GPU here
    assert len(bench.track_speedup(cache, "w", "fast")["samples"]) == 9
    assert torch.get_num_threads() == common.set_threads()  # the count the environment record names


def test_the_loader_knows_every_counter_track_by_its_unit():
    """benchmarks/common.py names the tracks' units; speedbench.results.load reads a row of one of
    them as a counter (kind "interference") and keeps it out of the results: the two must agree."""
    from speedbench.results import load as results  # noqa: PLC0415 - pandas, only for this test

    tracks = {m: getattr(common._Interference, f"track_{m}").unit for m in contention.COUNTER_METRICS}
    assert set(tracks.values()) == set(results.INTERFERENCE_UNITS)
    assert all(results.metric_kind("track", u) == "interference" for u in tracks.values())


def test_a_machine_of_many_cpus_takes_its_cpu_counters_over_longer_windows():
    """Two 0.3 s rounds, others busy in the first only: each round alone on 2 CPUs (0.25 s is
    enough); pooled on 16, where whole ticks need 0.8 s to resolve half a core."""
    def two_rounds(cpus):
        return [(snap(0.0, cores=cpus), snap(0.3, cores=cpus, busy=0.3)),
                (snap(0.3, cores=cpus, busy=0.3), snap(0.6, cores=cpus, busy=0.3))]

    assert [round(w["others_cpu"]) for w in interference.round_windows(two_rounds(2))] == [50, 0]
    sixteen = interference.round_windows(two_rounds(16))
    assert sixteen[0]["others_cpu"] == sixteen[1]["others_cpu"] == pytest.approx(100 * 0.3 / (0.6 * 16))


# --- /proc readings that no kernel writes (damaged or planted) ------------------------------

@pytest.mark.parametrize("value", ["9" * 400, str(2**64), "-5", "9" * 5000, "１２"],
                         ids=["400-digits", "2**64", "negative", "5000-digits", "fullwidth-digits"])
def test_a_counter_no_kernel_writes_is_no_reading(tmp_path, value):
    """/proc counters are unsigned 64-bit: a 400-digit one made an OverflowError (its seconds
    do not fit a float) where it should be what an unreadable file is, no reading."""
    with pytest.raises(ValueError):
        interference.counter(value)
    stat = tmp_path / "stat"
    stat.write_text(f"cpu  {value} 20 30 5000 40 5 6 7 50 0\ncpu0 50 10 15 2500 20 2 3 3 25 0\n")
    assert interference.machine_cpu_times(str(stat)) is None
    assert interference.counter(str(2**64 - 1)) == 2**64 - 1 and interference.counter("0") == 0
