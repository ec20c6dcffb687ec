"""What the benchmark modules share: the machine profile, the technique-import guard, a
per-process cache, the GPU-only skip, and paired comparisons measured in one process.

Process cost decides the suite's length. asv starts a process for every benchmark and
parameter set, and importing torch costs one to three seconds of each. So this module and
every bench module import no torch at their top: a process that only reports what an
earlier one measured, or skips, starts in a fraction of a second. Work happens in
`setup_cache`, which asv runs once per class in a process of its own: one process
measures all of a class's parameter sets, and its `track_*` methods report them.

Paired comparisons (`Paired`): the variants of one configuration take turns in that one
process (speedbench.stats.paired.take_turns: A B C, B C A, ... after warm-up rounds, the device
synchronised around every sample), so drift between processes and over time hits every
variant alike. Each class reports
  track_seconds  every variant's seconds per step, one sample per round (asv keeps the
                 samples, so `asv compare` and `asv publish` read them as times);
  track_speedup  baseline / variant, one ratio per round (> 1: the variant is faster);
                 speedlib's report gives their Hodges-Lehmann estimate and 99 % interval.

Fresh builds (`Paired.builds`): where a class asks for several, its rounds are spread over
that many fresh builds of the variants (models, optimizers, tables built anew, the last
build's freed first) and pooled. Pairing cancels drift over time, not what stays fixed for
the life of the objects: where their memory landed (which physical pages, so which cache
sets, their tensors got). On the 2-core VM the per-tensor Adam loop took 52-60 ms in
different builds while the flat-buffer step held at 15-16 ms, so one build's 15 rounds gave
3.3x to 3.9x, with 99 % intervals of a few per cent that did not overlap; four runs of
three builds of five rounds each agreed within 2.1 %. Spreading the rounds over builds
samples that variation, and the interval widens to cover it.

Rounds sized to a time budget (`Paired.round_budget`): a GPU command has a hard limit, and
a class that runs `pairs` rounds whatever a round costs can run past it (the checkpoint
class was killed after 200 s at 30 rounds on an H100). A class that sets a budget, in
seconds of measured rounds per configuration (every build together), has its first
measured round timed, as it runs after the warm-up rounds: every variant once, the time of
its samples. That round counts as the first of floor(budget / its seconds) rounds, clamped
to at least `min_pairs` (8, the fewest with a 99 % interval) and at most `pairs`. Where even
`min_pairs` rounds overshoot, they run anyway (fewer would be no result) and a warning says
by how much. What was decided is one line per configuration, printed as it is decided and
kept in the cache, where the baseline's track_seconds prints it to stderr
(`speedlib run --show-stderr` shows it; asv keeps a setup_cache's output only when it
fails). N in the results is the rounds run. A quick run stays at one round, unsized.

Memory and saved-activation comparisons are exact counts: the same number every time, so
they need no pairing, only their own process per class (`Measured`).

Interference (speedbench.measure.interference): contention does not slow the variants alike, so
every paired round, and every parameter set of a class that times without pairing
(`Timed`), is bracketed by counters of what else the machine did meanwhile. They are stored
beside the timings, one sample per round, as asv tracks of their own:
  track_interference   % of the machine's CPU time other processes (and a hypervisor) took
  track_preemptions    involuntary context switches of the measuring process per second
  track_gpu_clock      the SM clock, % of its maximum (GPUs with NVML)
  track_gpu_neighbours other processes on the GPU (GPUs with NVML)
speedbench.stats.contention reads them: it marks disturbed rounds and contended results, and the
paired estimate leaves disturbed rounds out where enough others remain.
"""

from __future__ import annotations

import abc
import importlib
import itertools
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from speedbench.measure import interference  # no torch: /proc, getrusage and NVML reads

# --- the machine profile, decided without torch ------------------------------------------


def _sees_a_gpu() -> bool:
    """Whether this run measures a CUDA GPU, by speedbench.measure.instruments.device()'s rule
    ($SPEEDLIB_DEVICE, else CUDA when present), read without importing torch: the NVIDIA
    driver lists its GPUs under /proc. `check_profile` confirms it where torch is loaded."""
    name = os.environ.get("SPEEDLIB_DEVICE")
    if name:
        return name.startswith("cuda")
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    return any(Path("/proc/driver/nvidia/gpus").glob("*"))


ON_GPU = _sees_a_gpu()
# `speedlib run --quick`: every measurement once, to see that the suite works.
QUICK = os.environ.get("SPEEDLIB_QUICK") == "1"


def pick(cpu, gpu):
    """The CPU or the GPU profile's value (sizes, batch lists, rounds)."""
    return gpu if ON_GPU else cpu


def check_profile(dev) -> None:
    """In a process that has torch, before it measures: the profile chosen without it must
    match the device, and torch's threads are set (`set_threads`). Every timing path calls
    it; exact counts (memory) do not depend on threads, and classes that skip never load torch."""
    if (dev.type == "cuda") != ON_GPU:
        raise RuntimeError(f"the benchmarks chose the {'GPU' if ON_GPU else 'CPU'} profile but measure on "
                           f"{dev}: set SPEEDLIB_DEVICE to say which")
    set_threads()


def set_threads() -> int:
    """Set torch's intra-op threads to speedbench.measure.host_settings.benchmark_threads() (one per usable
    CPU unless $SPEEDLIB_THREADS says otherwise) and return it. torch's own default follows
    its build and OMP_NUM_THREADS, so without this a ratio would depend on the shell the run
    was started from. Called by `check_profile`, before anything is timed."""
    import torch  # noqa: PLC0415 - torch: the measuring process only

    from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

    threads = measure.benchmark_threads()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def gpu_only(what: str) -> None:
    """Skip (asv records NaN, not a failure) where there is no GPU."""
    if not ON_GPU:
        raise NotImplementedError(f"{what} is measured on GPUs only")


def technique(name: str):
    """speedlib.<name> as the commit under test has it; a commit from before the technique
    existed skips instead of failing."""
    try:
        return importlib.import_module(f"speedlib.{name}")
    except ImportError as e:
        raise NotImplementedError(f"speedlib has no {name} module here: {e}") from e


def ddp_launch():
    """speedbench.measure.ddp_launch, the harness's DDP / DataParallel launcher, which trains with the
    commit's `speedlib.parallel.wrap`; a commit whose speedlib.parallel has no `wrap` (before
    the launcher moved to the harness) skips instead of failing."""
    technique("parallel")
    try:
        from speedbench.measure import ddp_launch  # noqa: PLC0415 - torch: the measuring process only
    except ImportError as e:
        raise NotImplementedError(f"this commit's speedlib.parallel has no wrap() for the harness's launcher: "
                                  f"{e}") from e
    return ddp_launch


_cache: dict = {}


def cached(key, build: Callable[[], object]):
    """One object per process for `key`, built on first use. Only the last key is kept:
    a model for another configuration frees the previous one's (GPU) memory first."""
    if key not in _cache:
        _cache.clear()
        _cache[key] = build()
    return _cache[key]


# --- one process per class -----------------------------------------------------------------


class Measured(abc.ABC):
    """A class whose parameter sets are all measured in one process.

    A subclass sets `params`, `param_names` and implements `measure_one(*params)`; it also
    defines `def setup_cache(self): return self.measure_all()` itself (asv keys its cache by
    where setup_cache is written, so a shared one would share results between classes).
    Its `track_*` methods read `self.result(cache, *params)`. A parameter set that raises
    NotImplementedError is a skip, any other error that set's failure; neither stops the rest.
    Each concrete class sets its own `version`, bumped only when what it measures changes
    (benchmarks/versions.json, checked by `speedlib versions`).
    """

    rounds = 1  # asv's repeat-in-a-second-process: the work is done once, in setup_cache
    timeout = 60  # a track_* process only reads the cache
    params: list = []
    param_names: list = []

    @abc.abstractmethod  # abstract: asv does not take these bases for benchmarks
    def measure_one(self, *params):
        """The measurement of one parameter set."""

    def measure_all(self) -> dict:
        combos = itertools.product(*self.params) if self.params else [()]
        return {combo: _attempt(f"{type(self).__name__}{combo}",
                                lambda: self.measure_one(*combo))  # noqa: B023 - called at once, this iteration
                for combo in combos}

    @staticmethod
    def result(cache: dict, *params):
        """The measured value of `params`; SKIP where that set does not apply or cannot run
        here (a track_* method returns it as is); raises for a set that failed."""
        status, value = cache[tuple(params)]
        if status == "skip":
            print(f"skipped: {value}", file=sys.stderr)
            return SKIP
        if status == "fail":
            raise RuntimeError(f"measuring {params} failed: {value}")
        return value


# asv records NaN as "skipped". (NotImplementedError means a skip only when setup raises
# it, and setup, shared by all of a class's methods, cannot tell which one runs.)
SKIP = math.nan


def _attempt(label: str, measure: Callable[[], object]) -> tuple[str, object]:
    """("ok", value), ("skip", why) for NotImplementedError, or ("fail", the error): one
    set or configuration never stops the rest. Memory is released after each."""
    began = time.monotonic()
    try:
        entry = ("ok", measure())
    except NotImplementedError as e:
        entry = ("skip", str(e))
    except Exception as e:  # noqa: BLE001 - recorded as this set's failure, shown by track_*
        entry = ("fail", "".join(traceback.format_exception_only(e)).strip())
    finally:
        _release()
    # asv shows setup_cache's output only on failure; the line is for --show-stderr.
    print(f"{label}: {entry[0]} in {time.monotonic() - began:.1f} s", flush=True)
    return entry


def _release() -> None:
    """Free the last configuration's models and cached device memory before the next."""
    _cache.clear()
    if "torch" in sys.modules:
        from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

        measure.release_cached_memory(measure.device())


# --- interference counters ----------------------------------------------------------------

# The cache key (with the configuration after it) under which a class keeps its rounds'
# interference counters; no parameter value can be this object.
ROUNDS = "__rounds__"
# ... and where a Paired class with a round_budget keeps the line saying how it sized them.
SIZED = "__sized__"


class _Interference:
    """asv tracks of the interference counters kept under ROUNDS (see the module docstring),
    one sample per round: a paired class's rounds, or a timed class's one window per
    parameter set. A counter that could not be read (no /proc, no NVML) is a skip."""

    def _round_key(self, params: tuple) -> tuple:
        return (ROUNDS, *params)

    def _counter(self, cache, params: tuple, name: str):
        entry = cache.get(self._round_key(params))
        measured = cache.get(tuple(params))
        # only beside a measurement: a set that was skipped or failed has no rounds to describe
        if entry is None or entry[0] != "ok" or measured is None or measured[0] != "ok":
            return SKIP
        values = [r.get(name) for r in entry[1]]
        if not values or any(v is None for v in values):
            return SKIP
        return {"samples": values, "number": 1}

    def track_interference(self, cache, *params):
        return self._counter(cache, params, "others_cpu")

    track_interference.unit = "% of CPU time to other processes"

    def track_preemptions(self, cache, *params):
        return self._counter(cache, params, "preemptions")

    track_preemptions.unit = "preemptions/s"

    def track_gpu_clock(self, cache, *params):
        return self._counter(cache, params, "gpu_clock")

    track_gpu_clock.unit = "% of maximum SM clock"

    def track_gpu_neighbours(self, cache, *params):
        return self._counter(cache, params, "gpu_neighbours")

    track_gpu_neighbours.unit = "other processes on the GPU"


_probes: dict = {}


def _gpu_probe(dev):
    """NVML's view of the CUDA device `dev` (matched by PCI bus ID: CUDA_VISIBLE_DEVICES
    renumbers devices, NVML does not), one per process; None off CUDA or without NVML."""
    if getattr(dev, "type", None) != "cuda":
        return None
    if dev not in _probes:
        import torch  # noqa: PLC0415 - torch: the measuring process only

        props = torch.cuda.get_device_properties(dev)
        bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        _probes[dev] = interference.gpu_probe(pci_bus_id=bus_id)
    return _probes[dev]


class Timed(_Interference, Measured):
    """A Measured class that times without pairing (separate launches, a bandwidth against a
    floor): each parameter set's measurement is one window of interference counters, stored
    as one sample per parameter set."""

    def measure_all(self) -> dict:
        out = {}
        for combo in itertools.product(*self.params) if self.params else [()]:
            start = interference.snapshot(_probe_here())
            out[combo] = _attempt(f"{type(self).__name__}{combo}",
                                  lambda: self.measure_one(*combo))  # noqa: B023 - called at once, this iteration
            if out[combo][0] == "ok":  # a skip or a failure measured nothing to describe
                out[(ROUNDS, *combo)] = ("ok", [interference.window(start, interference.snapshot(_probe_here()))])
        return out


def _probe_here():
    """The GPU probe of the device the benchmarks measure on, where torch has CUDA up already."""
    if not ON_GPU:
        return None
    from speedbench import measure  # noqa: PLC0415 - torch: the measuring process only

    return _gpu_probe(measure.device())


# --- paired comparisons --------------------------------------------------------------------


class Paired(_Interference, Measured):
    """Variants of one configuration taking turns in one process.

    The last parameter is the variant; the others name a configuration. A subclass sets
    `baseline` and implements `steps(*config) -> (device, {variant: step})`, each step one
    unit of work (a training step, ...); variants it leaves out of the dict do not apply
    to that configuration and are skipped. `number` steps make one sample where a step is
    too short to time alone.
    """

    baseline: str = ""
    pairs = pick(cpu=15, gpu=30)  # rounds: >= 8 for a 99 % interval, 15 keeps it near 1.10x on CPUs
    # Seconds the measured rounds of one configuration may take (all builds together), or None:
    # `pairs` rounds whatever they cost. With a budget, the rounds are sized from the first
    # measured round (see the module's docstring), from `min_pairs` up to `pairs`.
    round_budget: float | None = None
    min_pairs = 8  # the fewest rounds with a 99 % interval (speedbench.stats.paired); a budget never goes below
    warmup = pick(cpu=1, gpu=3)  # rounds run first and dropped, in every build: autotuners, allocator pools, caches
    number = 1
    # Fresh builds the rounds are spread over (see the module's docstring). One by default:
    # a class sets more where its results move from build to build, at the price of building
    # every variant again (seconds on a GPU slot, so GPUs keep one until they show the need).
    builds = 1

    def measure_one(self, *params):
        raise TypeError("a Paired class measures configurations, see measure_all")

    @abc.abstractmethod
    def steps(self, *config):
        """(device, {variant: step}) for one configuration."""

    def measure_all(self) -> dict:
        out = {}
        *configs, variants = self.params
        for config in (itertools.product(*configs) if configs else [()]):
            status, times = _attempt(f"{type(self).__name__}{config}",
                                     lambda: self._take_turns(config))  # noqa: B023 - called at once, this iteration
            if status == "ok":
                out[(ROUNDS, *config)] = ("ok", times.pop(ROUNDS))
                sized = times.pop(SIZED, None)
                if sized is not None:
                    out[(SIZED, *config)] = ("ok", sized)
            for variant in variants:
                applies = status != "ok" or variant in times
                out[(*config, variant)] = (status, times) if applies else (
                    "skip", f"{variant} does not apply to {config}")
        return out

    def _take_turns(self, config: tuple) -> dict[str, list]:
        """Each variant's samples, pooled over the builds, under ROUNDS the interference
        counters of every round, and under SIZED the line saying how the rounds were sized
        (classes with a round_budget)."""
        builds = 1 if QUICK else max(1, self.builds)
        rounds = 1 if QUICK else math.ceil(self.pairs / builds)  # per build; at least `pairs` in all
        pooled: dict[str, list] = {}
        counters: list[dict] = []
        decided: list[str] = []
        size = None
        if not QUICK and self.round_budget is not None:
            def size(per_round: float) -> int:  # the first build's first measured round, in seconds
                per_build, line = sized_rounds(f"{type(self).__name__}{config}", self.round_budget, per_round,
                                               self.min_pairs, self.pairs, builds)
                print(line, flush=True)
                decided.append(line)
                return per_build
        for build in range(builds):
            if build:
                _release()  # the last build's objects go first, so this one gets memory of its own
            dev, steps = self.steps(*config)
            if self.baseline not in steps:
                raise NotImplementedError(f"no {self.baseline} baseline for {config}")
            if build and set(steps) != set(pooled):
                raise RuntimeError(f"build {build + 1} of {config} has variants {sorted(steps)}, "
                                   f"the first had {sorted(pooled)}: rounds cannot be pooled")
            sizing = {"size_rounds": size} if size is not None and build == 0 else {}  # a class without: as before
            times = paired_times(steps, dev, rounds=rounds, warmup=0 if QUICK else self.warmup, number=self.number,
                                 counters=counters, **sizing)
            del steps  # the only references to this build's models: freed by the next _release
            rounds = len(times[self.baseline])  # as sized by the first build, for the others
            for variant, samples in times.items():
                pooled.setdefault(variant, []).extend(samples)
        pooled[ROUNDS] = counters
        if decided:
            pooled[SIZED] = decided[0]
        return pooled

    def _round_key(self, params: tuple) -> tuple:
        return (ROUNDS, *params[:-1])  # a round is every variant of one configuration

    def track_seconds(self, cache, *params):
        times = self.result(cache, *params)
        sized = cache.get((SIZED, *params[:-1]))
        if times is not SKIP and sized is not None and params[-1] == self.baseline:
            print(sized[1], file=sys.stderr)  # how the rounds were sized, once per configuration
        return SKIP if times is SKIP else {"samples": times[params[-1]], "number": 1}

    track_seconds.unit = "seconds"

    def track_speedup(self, cache, *params):
        times = self.result(cache, *params)
        if times is SKIP or params[-1] == self.baseline:  # the baseline's own ratio is 1 by definition
            return SKIP
        return {"samples": [b / v for b, v in zip(times[self.baseline], times[params[-1]], strict=True)], "number": 1}

    track_speedup.unit = "x"


def sized_rounds(label: str, budget: float, per_round: float, fewest: int, most: int,
                 builds: int = 1) -> tuple[int, str]:
    """(rounds per build, the line that says so) for measured rounds that may take `budget`
    seconds in all, one round taking `per_round`: floor(budget / per_round) rounds, at
    least `fewest` (a 99 % interval needs 8) and at most `most`, spread over `builds` builds
    (whole rounds in each, so the budget is not overshot by rounding up). Where a class asks
    for fewer rounds than `fewest`, the ceiling wins. Where even `fewest` overshoot the
    budget, they are what runs, and the line is a warning saying by how much."""
    if budget <= 0 or fewest < 1 or most < 1 or builds < 1:
        raise ValueError(f"need a budget > 0 and rounds >= 1, got budget {budget}, rounds {fewest} to {most}, "
                         f"{builds} builds")
    low, high = math.ceil(min(fewest, most) / builds), math.ceil(most / builds)
    room = budget / per_round / builds if per_round > 0 else math.inf  # rounds a build has room for
    fit = high if room >= high else math.floor(room)  # (a round too short to time: the ceiling)
    per_build = min(high, max(low, fit))
    rounds, estimate = per_build * builds, per_build * builds * per_round
    said = f"{label}: one round {_seconds(per_round)} -> {rounds} rounds"
    said += f" over {builds} builds" if builds > 1 else ""
    if fit < low:
        line = (f"warning: {said}, the fewest allowed (min_pairs {min(fewest, most)}): about {_seconds(estimate)}, "
                f"over the budget of {_seconds(budget)} by {_seconds(estimate - budget)}")
    else:
        line = f"{said}, about {_seconds(estimate)} (budget {_seconds(budget)}, {min(fewest, most)} to {most} rounds)"
    return per_build, line


def _seconds(x: float) -> str:
    """A duration for a line of text: three significant digits, whole seconds from 100 s."""
    return f"{x:.3g} s" if abs(x) < 100 else f"{x:.0f} s"


def paired_times(steps: dict[str, Callable[[], object]], dev, rounds: int, warmup: int,
                 number: int = 1, counters: list | None = None,
                 size_rounds: Callable[[float], int] | None = None) -> dict[str, list[float]]:
    """Each variant's seconds per step, one sample per round, variants taking turns.
    counters: a list that gets each measured round's interference counters.
    size_rounds: called with the seconds the first measured round took (every variant's
    `number` steps, synchronised: its samples times `number`); it returns how many rounds
    to run in all, that one included, in place of `rounds` (speedbench.stats.paired.take_turns)."""
    from speedbench import measure  # noqa: PLC0415 - torch, in the measuring process only
    from speedbench.stats import paired  # noqa: PLC0415 - torch, in the measuring process only

    check_profile(dev)
    observe, bracketed = None, None
    if counters is not None:
        probe, bracketed = _gpu_probe(dev), []

        def observe():
            start = interference.snapshot(probe)
            return lambda: (start, interference.snapshot(probe))

    def timed(step):
        def sample() -> float:
            measure.synchronize(dev)
            start = time.perf_counter()
            for _ in range(number):
                step()
            measure.synchronize(dev)
            return (time.perf_counter() - start) / number
        return sample

    size = None
    if size_rounds is not None:
        def size(first: dict[str, float]) -> int:
            return size_rounds(number * sum(first.values()))

    times = paired.take_turns({v: timed(s) for v, s in steps.items()}, rounds=rounds, warmup=warmup,
                              observe=observe, observed=bracketed, size=size)
    if counters is not None:
        counters.extend(interference.round_windows(bracketed))
    return times
