"""Synthetic asv result trees, for load benchmarks and the golden-file tests of the exports.

Everything written here is labelled synthetic (machine names start with `synthetic-`, the
GPU model says so, the recorded command names this module), so it can never pass for a
measurement. The files follow asv 0.6's format version 2 exactly as `speedlib run` leaves
them, environment records included, and are deterministic for a given seed.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import random
from pathlib import Path

from speedbench.results.tree import ResultsTree

__all__ = ["write_results", "BENCHMARKS"]

_COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
            "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples"]
_WORKLOADS = ["mlp", "resnet50"]
_VARIANTS = ["forloop", "fused", "speedlib"]
# benchmark -> (asv type, unit, base value per workload, factor per variant)
BENCHMARKS = {
    "bench_contiguous.OptimizerStep.time_adam_step": ("time", "seconds", (0.015, 0.056), (1.0, 0.15, 0.06)),
    "bench_contiguous.IterationMemory.track_peak_memory": ("track", "bytes", (2.0e7, 4.1e8), (1.0, 1.0, 1.05)),
    "bench_contiguous.AdamBandwidth.track_fraction_of_floor": ("track", "% of memory bandwidth", (8.0, 9.0),
                                                               (1.0, 4.8, 9.5)),
}
_MACHINES = {
    "synthetic-h100": ("NVIDIA H100 80GB HBM3 (synthetic)", "550.54.15", 1.0),
    "synthetic-h200": ("NVIDIA H200 (synthetic)", "550.54.15", 0.8),
    "synthetic-cpu": (None, None, 6.0),
}


def _version(kind: str, bases) -> str:
    """Stands in for asv's hash of the benchmark's code: same inputs, same version."""
    return hashlib.sha256(repr((kind, bases)).encode()).hexdigest()


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def _entry(rng: random.Random, kind: str, bases, factors, scale: float, started: int, skipped: bool) -> list:
    values, lows, highs, q25s, q75s, samples = [], [], [], [], [], []
    for base in bases:
        for factor in factors:
            centre = base * factor * (scale if kind == "time" else 1.0)
            if skipped:  # asv writes NaN for a benchmark whose setup raised NotImplementedError
                values.append(float("nan"))
                continue
            if kind != "time":  # track_*: one value, no statistics
                values.append(round(centre * rng.uniform(0.98, 1.02), 6))
                continue
            draws = sorted(round(centre * rng.gauss(1.0, 0.02), 9) for _ in range(10))
            values.append((draws[4] + draws[5]) / 2)
            lows.append(draws[0])
            highs.append(draws[-1])
            q25s.append(draws[2])
            q75s.append(draws[7])
            samples.append(draws)
    params = [[repr(w) for w in _WORKLOADS], [repr(v) for v in _VARIANTS]]
    version = _version(kind, bases)
    if kind != "time":
        return [values, params, version, started, 1.0]
    n = len(values)
    return [values, params, version, started, 1.0, lows, highs, q25s, q75s, [1] * n, [10] * n, samples]


def write_results(root: str | Path, *, commits: int = 3, machines: int = 3, seed: int = 0) -> list[Path]:
    """Write `machines` x `commits` result files (plus the listing, the machine files and
    environment records) under `root`; return the result files."""
    root = Path(root)
    tree = ResultsTree(root)
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    benchmarks = {"version": 2}
    for name, (kind, unit, bases, _) in BENCHMARKS.items():
        benchmarks[name] = {"name": name, "type": kind, "unit": unit, "param_names": ["workload", "variant"],
                            "params": [[repr(w) for w in _WORKLOADS], [repr(v) for v in _VARIANTS]],
                            "version": _version(kind, bases)}
    tree.benchmarks.write_text(json.dumps(benchmarks, indent=2, sort_keys=True))
    names = list(_MACHINES)
    files = []
    start = 1_790_000_000_000  # ms since the epoch: 2026-09-21T14:13Z
    for m in range(machines):
        base_name = names[m % len(names)]
        machine = base_name if m < len(names) else f"{base_name}-{m // len(names)}"
        gpu, driver, scale = _MACHINES[base_name]
        mdir = tree.machine(machine)
        mdir.environment_dir.mkdir(parents=True, exist_ok=True)
        mdir.machine_file.write_text(json.dumps({"machine": machine, "version": 1}))
        for c in range(commits):
            sha = _sha(f"commit {c}")
            date = start + c * 86_400_000
            started = date + 3_600_000
            # as on real CPU machines, peak GPU memory is skipped where there is no GPU
            results = {name: _entry(rng, kind, bases, factors, scale, started, skipped=gpu is None and unit == "bytes")
                       for name, (kind, unit, bases, factors) in BENCHMARKS.items()}
            env_name = "existing-py_usr_bin_python3"
            data = {"commit_hash": sha, "env_name": env_name, "date": date,
                    "params": {"machine": machine, "python": "/usr/bin/python3"}, "python": "/usr/bin/python3",
                    "requirements": {}, "env_vars": {}, "result_columns": _COLUMNS, "results": results,
                    "durations": {}, "version": 2}
            file = mdir.path / f"{sha[:8]}-{env_name}.json"
            file.write_text(json.dumps(data, sort_keys=True))
            files.append(file)
            recorded = _dt.datetime.fromtimestamp((started + 7_200_000) / 1000, _dt.timezone.utc)
            record = {"commit": sha, "recorded_at": recorded.isoformat(timespec="seconds"),
                      "command": "synthetic (speedbench.results.synthetic)", "machine": machine, "gpu_model": gpu,
                      "gpu_count": 1 if gpu else 0, "driver": driver, "cuda": "12.8", "cudnn": 91000,
                      "torch": "2.11.0+cu128", "torchvision": "0.26.0", "python": "3.12.3",
                      "cpu_model": "synthetic CPU", "nccl": None, "cupy": None}
            with mdir.environment_record(sha).open("a") as f:
                f.write(json.dumps(record, sort_keys=True) + "\n")
    return files
