"""The machine a measurement ran on: its environment record and its names.

- `environment()` is the JSON-ready record that travels with every result file, with
  `gpu_state()` (clocks, power limits, modes, temperature) and the CPU frequency policy
  (speedbench.measure.host_settings).
- `identity()` is what makes two machines one kind of hardware; `machine_name()` names this
  one after its GPU (`h200-141gb`) or, on a CPU-only machine, its CPU model (`cpu_slug()`).

The measuring instruments (the device rule, the synchronising timer, memory counters and
bandwidth floors) are speedbench.measure.instruments; the package (`speedbench.measure`) names both.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from collections.abc import Callable
from importlib import metadata

import torch

# The CPU frequency reader and the thread rule live in host_settings, which must work without
# torch (the pre-flight check reads them too); the environment record keeps what they say.
from speedbench.measure.host_settings import CPU_SYSFS, benchmark_threads, cpu_frequency_policy, usable_cores

__all__ = ["environment", "gpu_state", "machine_name", "cpu_model", "cpu_slug", "identity"]


def cpu_model() -> str:
    """The CPU's marketing name (from /proc/cpuinfo on Linux), else platform's guess."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:  # a bad byte must not end the run
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cupy_version() -> str | None:
    # CuPy ships under several distribution names (cupy, cupy-cuda12x, ...): ask the module.
    try:
        import cupy  # noqa: PLC0415 - optional and heavy, only imported when asked for
    except Exception:  # noqa: BLE001 - a broken CUDA install makes its import fail with anything
        return None
    return cupy.__version__


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out.strip() else None


def _gpus() -> list[dict]:
    if not torch.cuda.is_available():
        return []
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append({
            "name": props.name,
            "memory_bytes": int(props.total_memory),
            "compute_capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
        })
    return gpus


# The GPU's operating state, which changes a timing without any change of code: clocks
# (locked, capped or throttled SM and memory clocks scale kernel time directly), the power
# cap (a lowered limit throttles under load), temperature (thermal throttling), ECC (costs
# memory bandwidth), MIG (a slice has a fraction of the SMs) and persistence mode (off:
# the driver tears the GPU down between processes, so start-up costs more). Volatile, so
# it goes in the environment record only, never in asv's machine file.
# Record key -> (nvidia-smi --query-gpu field, parser of its text).
_ENABLED = {"Enabled": True, "Disabled": False}
_GPU_STATE_FIELDS = {
    "index": ("index", int),
    "pci_bus_id": ("pci.bus_id", str),  # matches a GPU to torch's when CUDA_VISIBLE_DEVICES reorders
    "sm_clock_mhz": ("clocks.sm", int),
    "sm_clock_max_mhz": ("clocks.max.sm", int),
    "memory_clock_mhz": ("clocks.mem", int),
    "memory_clock_max_mhz": ("clocks.max.mem", int),
    "power_limit_w": ("power.limit", float),
    "power_default_limit_w": ("power.default_limit", float),
    "power_enforced_limit_w": ("enforced.power.limit", float),
    "ecc_enabled": ("ecc.mode.current", _ENABLED.__getitem__),
    "mig_enabled": ("mig.mode.current", _ENABLED.__getitem__),
    "persistence_enabled": ("persistence_mode", _ENABLED.__getitem__),
    "temperature_c": ("temperature.gpu", int),
}
NVIDIA_SMI_TIMEOUT_S = 10.0  # a wedged driver must not hold up a benchmark run


def _smi_value(text: str, parse: Callable[[str], object]) -> object:
    # nvidia-smi writes "[N/A]", "[Not Supported]", "[Unknown Error]", ... where it has no value.
    try:
        return None if text.startswith("[") or text in ("", "N/A") else parse(text)
    except (ValueError, KeyError):
        return None


def _gpu_state_smi() -> list[dict] | None:
    fields = [field for field, _ in _GPU_STATE_FIELDS.values()]
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):  # absent, timed out, or failed: unknown, not an error
        return None
    rows = [[v.strip() for v in line.split(",")] for line in out.splitlines() if line.strip()]
    return [{key: _smi_value(text, parse)
             for (key, (_, parse)), text in zip(_GPU_STATE_FIELDS.items(), row, strict=True)}
            for row in rows if len(row) == len(fields)]


def _gpu_state_nvml() -> list[dict] | None:
    try:
        import pynvml as nv  # noqa: PLC0415 - optional (nvidia-ml-py); nvidia-smi is the fallback
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - not installed, a broken install, or no driver to talk to (NVMLError)
        return None
    readers = {  # NVML reports power in milliwatts; modes as (current, pending) where pending exists
        "pci_bus_id": lambda h: _text(nv.nvmlDeviceGetPciInfo(h).busId),
        "sm_clock_mhz": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "sm_clock_max_mhz": lambda h: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
        "memory_clock_mhz": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "memory_clock_max_mhz": lambda h: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
        "power_limit_w": lambda h: nv.nvmlDeviceGetPowerManagementLimit(h) / 1000,
        "power_default_limit_w": lambda h: nv.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000,
        "power_enforced_limit_w": lambda h: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
        "ecc_enabled": lambda h: bool(nv.nvmlDeviceGetEccMode(h)[0]),
        "mig_enabled": lambda h: bool(nv.nvmlDeviceGetMigMode(h)[0]),
        "persistence_enabled": lambda h: bool(nv.nvmlDeviceGetPersistenceMode(h)),
        "temperature_c": lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
    }

    def read(fn: Callable, handle: object) -> object:
        try:
            return fn(handle)
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and the like: no value, as nvidia-smi's [N/A]
            return None

    try:
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        return [{"index": i, **{key: read(fn, h) for key, fn in readers.items()}} for i, h in enumerate(handles)]
    except Exception:  # noqa: BLE001 - any NVMLError (the device list may change under us): no state
        return None
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - the state is read; a failed shutdown changes nothing
            pass


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value  # older nvidia-ml-py returns bytes


def gpu_state() -> list[dict] | None:
    """Per GPU (NVML's numbering), its clocks, power limits, ECC/MIG/persistence modes and
    temperature now: from pynvml where it works, else nvidia-smi, else None."""
    state = _gpu_state_nvml()
    return state if state is not None else _gpu_state_smi()


def identity() -> dict:
    """This machine's name and the fields that say its hardware and build, without the slow
    parts of `environment()` (nvidia-smi): what `speedlib run` checks against the machine
    directory before anything else (speedbench.results.machines.check_directory)."""
    gpus = _gpus()
    return {"machine": machine_name(), "gpu_model": gpus[0]["name"] if gpus else None, "gpu_count": len(gpus),
            "cpu_model": cpu_model(), "torch": torch.__version__, "cuda": torch.version.cuda}


def environment(cpu_sysfs: str | os.PathLike = CPU_SYSFS) -> dict:
    """What a reader needs to reproduce a number: hardware, every relevant version, and the
    GPU and CPU operating state at the time of the call."""
    gpus = _gpus()
    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001 - NCCL missing from this build: torch raises what its binding does
            nccl = None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        **identity(),  # name, GPU model and count, CPU model, torch and CUDA
        "gpus": gpus,
        "driver": _nvidia_driver() if gpus else None,
        "cudnn": cudnn,
        "nccl": nccl,
        "torchvision": _version("torchvision"),
        "cupy": _cupy_version(),
        # asv and its runner decide how samples are taken and summarised.
        "asv": _version("asv"),
        "asv_runner": _version("asv_runner"),
        "gpu_state": gpu_state(),
        **cpu_frequency_policy(cpu_sysfs),
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        # What the benchmarks set (benchmark_threads), not this process's own default.
        "torch_threads": benchmark_threads(),
        "usable_cores": usable_cores(),
        "os": f"{platform.system()} {platform.release()}",
        "hostname": platform.node(),
    }


# Marketing names that the CUDA device name does not spell out. Memory sizes are the
# datasheets' (NVIDIA H100 Tensor Core GPU datasheet: SXM5 80 GB HBM3, PCIe 80 GB HBM2e;
# NVIDIA H200 datasheet: 141 GB HBM3e), which differ from what total_memory reports.
_KNOWN_GPUS = {
    "NVIDIA H100 80GB HBM3": "h100-sxm-80gb",
    "NVIDIA H100 PCIe": "h100-pcie-80gb",
    "NVIDIA H100 NVL": "h100-nvl-94gb",
    "NVIDIA H200": "h200-141gb",
    "NVIDIA H200 NVL": "h200-nvl-141gb",
}


def _gpu_slug(name: str, memory_bytes: int) -> str:
    if name in _KNOWN_GPUS:
        return _KNOWN_GPUS[name]
    words = re.sub(r"^NVIDIA\s+", "", name).lower()
    slug = re.sub(r"[^a-z0-9]+", "-", words).strip("-")
    if not re.search(r"\d+gb", slug):
        slug += f"-{round(memory_bytes / 2**30)}gb"
    return slug


# Parts of a CPU's marketing name that do not tell one CPU model from another: trademark
# signs, "CPU"/"Processor", the clock ("@ 2.40GHz"), the core count ("64-Core", "Eight-Core")
# and an APU's graphics ("with Radeon Graphics").
_NOT_THE_MODEL = re.compile(
    r"\((?:r|tm|c)\)|\b(?:cpu|processor)\b|@\s*[\d.]+\s*[gm]hz|\b[a-z0-9]+-core\b|\bwith\s.*\bgraphics\b",
    re.IGNORECASE)
_CPU_SLUG_MAX = 40


def cpu_slug(model: str | None) -> str:
    """A short, stable name for a CPU model: vendor, family and model number, lower case
    ('Intel(R) Xeon(R) Processor' -> 'intel-xeon', 'AMD EPYC 7B13 64-Core Processor' ->
    'amd-epyc-7b13'); 'unknown-cpu' where the name says nothing."""
    words = _NOT_THE_MODEL.sub(" ", model or "").lower()
    slug = re.sub(r"[^a-z0-9]+", "-", words).strip("-")
    if len(slug) > _CPU_SLUG_MAX:  # cut at a word where there is one, so that a long name stays readable
        cut = slug[:_CPU_SLUG_MAX + 1]
        slug = cut.rsplit("-", 1)[0] if "-" in cut else slug[:_CPU_SLUG_MAX]
    return slug or "unknown-cpu"


def machine_name() -> str:
    """asv machine name that says the hardware: 'h100-sxm-80gb', '8xh100-sxm-80gb', and for a
    host without a GPU its cores and CPU model, 'cpu-2core-intel-xeon': the same code gave a
    headline ratio 3.26x on one 2-core VM's CPU and 4.18x on another's (speedbench.results.machines)."""
    gpus = _gpus()
    if not gpus:
        return f"cpu-{os.cpu_count()}core-{cpu_slug(cpu_model())}"
    slug = _gpu_slug(gpus[0]["name"], gpus[0]["memory_bytes"])
    return slug if len(gpus) == 1 else f"{len(gpus)}x{slug}"
