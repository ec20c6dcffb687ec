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

__all__ = ["write_results", "write_roofline", "BENCHMARKS"]

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


# The host-gather roofline's classes (bench_transfer.Roofline, RooflineHypotheses): their
# variants and points as the benchmark names them, for pages and exports to be tested on.
ROOFLINE_DEFAULT = "default (row 512 B, batch 131072, table 5.12 GB, order random)"
ROOFLINE = {
    "Roofline": (["torch_pinned", "uva", "auto"],
                 [ROOFLINE_DEFAULT, "batch 1024", "batch 1048576", "order sorted", "order zipf", "row 64 B",
                  "row 256 B", "row 4096 B", "table 1 GB", "table 40 GB"]),
    "RooflineHypotheses": (["uva", "uva_sorted", "uva_2m", "uva_lines", "uva_4k_in_flight", "uva_64k_in_flight"],
                           [ROOFLINE_DEFAULT, "row 64 B", "table 40 GB"]),
}
_ROOFLINE_UNITS = {"gather": "% of pinned host->device bandwidth", "scatter": "% of pinned device->host bandwidth",
                   "gather_bandwidth": "GB/s", "scatter_bandwidth": "GB/s", "h2d_floor": "GB/s", "d2h_floor": "GB/s",
                   "gather_bus_bytes": "bytes on the bus per row", "scatter_bus_bytes": "bytes on the bus per row"}


def _roofline_values(rng: random.Random, variant: str, point: str) -> dict[str, float]:
    """Made-up figures of one roofline result, shaped like a bus: a path's % rises with the row's
    width and falls with tiny batches; the floors near 55 GB/s host->device, 50 device->host."""
    row = int(point.split()[1]) if point.startswith("row") else 512
    batch = int(point.split()[1]) if point.startswith("batch") else 131072
    level = {"torch_pinned": 50.0, "auto": 58.0, "uva_2m": 45.0, "uva_sorted": 40.0}.get(variant, 33.0)
    gather = level * min(1.0, (row / 512) ** 0.3) * min(1.0, (batch / 16384) ** 0.25) * rng.uniform(0.97, 1.03)
    scatter = (30.0 if variant == "torch_pinned" else 52.0) * rng.uniform(0.97, 1.03)
    h2d, d2h = 55.0 * rng.uniform(0.99, 1.01), 50.0 * rng.uniform(0.99, 1.01)
    bus = float(row) if variant == "torch_pinned" else (max(row, 128) if variant == "uva_lines" else row) + 8.0
    return {"gather": gather, "scatter": scatter, "gather_bandwidth": gather * h2d / 100,
            "scatter_bandwidth": scatter * d2h / 100, "h2d_floor": h2d, "d2h_floor": d2h, "gather_bus_bytes": bus,
            "scatter_bus_bytes": float(row)}


def write_roofline(root: str | Path, machine: str = "synthetic-h200", *, commit: int = 0, seed: int = 0) -> Path:
    """Add the roofline's results for `machine` at the `commit`-th synthetic commit to the tree at
    `root` (its listing, machine file, environment record and result file; a tree of
    write_results gets them beside its own), GPU figures made up as `_roofline_values` says;
    return the result file."""
    root, rng = Path(root), random.Random(seed)
    tree = ResultsTree(root)
    root.mkdir(parents=True, exist_ok=True)
    listing = json.loads(tree.benchmarks.read_text()) if tree.benchmarks.is_file() else {"version": 2}
    sha, date = _sha(f"commit {commit}"), 1_790_000_000_000 + commit * 86_400_000
    started = date + 3_600_000
    mdir = tree.machine(machine)
    mdir.environment_dir.mkdir(parents=True, exist_ok=True)
    mdir.machine_file.write_text(json.dumps({"machine": machine, "version": 1}))
    file = mdir.path / f"{sha[:8]}-existing-py_usr_bin_python3.json"
    data = json.loads(file.read_text()) if file.is_file() else {
        "commit_hash": sha, "env_name": "existing-py_usr_bin_python3", "date": date,
        "params": {"machine": machine, "python": "/usr/bin/python3"}, "python": "/usr/bin/python3",
        "requirements": {}, "env_vars": {}, "result_columns": _COLUMNS, "results": {}, "durations": {}, "version": 2}
    for cls, (variants, points) in ROOFLINE.items():
        params = [[repr(v) for v in variants], [repr(p) for p in points]]
        figures = {(v, p): _roofline_values(rng, v, p) for v in variants for p in points}
        for metric, unit in _ROOFLINE_UNITS.items():
            name = f"bench_transfer.{cls}.track_roofline_{metric}"
            listing[name] = {"name": name, "type": "track", "unit": unit, "param_names": ["variant", "point"],
                             "params": params, "version": "1"}
            values = [round(figures[(v, p)][metric], 6) for v in variants for p in points]
            data["results"][name] = [values, params, "1", started, 1.0]
    tree.benchmarks.write_text(json.dumps(listing, indent=2, sort_keys=True))
    file.write_text(json.dumps(data, sort_keys=True))
    recorded = _dt.datetime.fromtimestamp((started + 7_200_000) / 1000, _dt.timezone.utc)
    record = {"commit": sha, "recorded_at": recorded.isoformat(timespec="seconds"),
              "command": "synthetic (speedbench.results.synthetic)", "machine": machine,
              "gpu_model": "NVIDIA H200 (synthetic)", "gpu_count": 1, "driver": "550.54.15", "cuda": "12.8",
              "cudnn": 91000, "torch": "2.11.0+cu128", "torchvision": "0.26.0", "python": "3.12.3",
              "cpu_model": "synthetic CPU", "nccl": None, "cupy": None}
    with mdir.environment_record(sha).open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    return file
