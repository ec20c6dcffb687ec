"""speedbench.measure.instruments (the timer, memory counters, bandwidth floors) and speedbench.measure.hardware
(the environment record and machine names)."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
import types
from importlib import metadata

import pytest
import torch

from speedbench.measure import hardware, host_settings, instruments
from speedbench.results.tree import machine_name_refused

requires_cuda = pytest.mark.gpu(reason="needs a CUDA GPU; CPU tests cover the logic")


def test_timer_is_monotonic_seconds():
    a = instruments.timer()
    b = instruments.timer()
    assert isinstance(a, float) and b >= a


def test_timer_waits_for_the_gpu(monkeypatch):
    """On CPU, check the wiring: timer() synchronises before reading the clock."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: calls.append(dev))
    instruments.timer()
    assert calls == [None]


def test_device_selection(monkeypatch):
    monkeypatch.delenv("SPEEDLIB_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert instruments.device().type == expected
    assert instruments.device("cpu") == torch.device("cpu")
    monkeypatch.setenv("SPEEDLIB_DEVICE", "cpu")
    assert instruments.device() == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA device"):
            instruments.device("cuda")


def test_saved_tensor_bytes_counts_each_storage_once():
    x = torch.randn(1000, requires_grad=True)
    w = torch.randn(1000, requires_grad=True)

    def fn():
        y = x.exp()  # exp saves its output y (4000 bytes), not x
        (y * w).sum()  # mul saves y again (same storage: not counted twice) and w; sum saves nothing
        return y

    assert instruments.saved_tensor_bytes(fn) == 4000 + 4000
    assert instruments.saved_tensor_bytes(fn, exclude=[w]) == 4000


def test_saved_tensor_bytes_of_a_linear_layer_is_its_input():
    layer = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64)
    got = instruments.saved_tensor_bytes(lambda: layer(x).sum(), exclude=layer.parameters())
    assert got == 8 * 64 * 4  # the input is saved for the weight gradient; weights excluded


def test_peak_memory_is_a_skip_off_gpu():
    with pytest.raises(NotImplementedError, match="only tracked on CUDA"):
        instruments.peak_memory(lambda: None, "cpu")


@requires_cuda
def test_peak_memory_resets_the_counter():
    big = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    del big
    # above_start: tensors that earlier tests of the process left alive are not this call's.
    peak = instruments.peak_memory(lambda: torch.empty(1 << 20, dtype=torch.uint8, device="cuda"), "cuda",
                                   above_start=True)
    assert (1 << 20) <= peak < (1 << 28)


def test_memory_bandwidth_is_plausible():
    bw = instruments.memory_bandwidth("cpu", nbytes=1 << 22, repeats=2)
    assert 1e8 < bw < 1e13  # between 100 MB/s and 10 TB/s


def test_environment_record_is_json_ready():
    env = hardware.environment()
    json.dumps(env)
    for key in ("gpu_model", "gpu_count", "driver", "cuda", "cudnn", "nccl", "torch", "torchvision",
                "cupy", "cpu_model", "cpu_cores", "machine"):
        assert key in env
    assert env["torch"] == torch.__version__
    assert env["cpu_cores"] >= 1


def test_machine_name_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU machine is named after its GPU")
    name = hardware.machine_name()
    assert name == f"cpu-{os.cpu_count()}core-{hardware.cpu_slug(hardware.cpu_model())}"
    assert machine_name_refused(name) is None  # the name --machine would accept


@pytest.mark.parametrize("model, slug", [
    ("Intel(R) Xeon(R) Processor", "intel-xeon"),
    ("AMD EPYC", "amd-epyc"),
    ("AMD EPYC 7B13 64-Core Processor", "amd-epyc-7b13"),
    ("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", "intel-xeon-platinum-8481c"),
    ("Intel(R) Core(TM) i7-8700K CPU @ 3.70GHz", "intel-core-i7-8700k"),
    ("AMD Ryzen 7 5800H with Radeon Graphics", "amd-ryzen-7-5800h"),
    ("AMD FX(tm)-8350 Eight-Core Processor", "amd-fx-8350"),
    ("Apple M2 Pro", "apple-m2-pro"),
    ("", "unknown-cpu"),
    ("(R) CPU @ 3GHz", "unknown-cpu"),
])
def test_a_cpu_model_gives_a_short_stable_name(model, slug):
    """Vendor, family and model number; trademarks, 'CPU', the clock and the core count go."""
    assert hardware.cpu_slug(model) == slug


def test_a_long_cpu_model_is_cut_at_a_word():
    slug = hardware.cpu_slug("Intel(R) Xeon(R) Some Very Long Marketing Name With Many Words 12345")
    assert slug == "intel-xeon-some-very-long-marketing-name"
    assert len(hardware.cpu_slug("x" * 80)) == 40
    assert machine_name_refused(f"cpu-2core-{hardware.cpu_slug('x' * 200)}") is None


def test_the_quick_identity_agrees_with_the_environment_record():
    """`speedlib run` checks the machine directory with identity() before the slow record is
    taken; the two must name the same machine, hardware and build."""
    ident, env = hardware.identity(), hardware.environment()
    assert ident == {k: env[k] for k in ident}
    assert set(ident) == {"machine", "gpu_model", "gpu_count", "cpu_model", "torch", "cuda"}


@pytest.mark.parametrize("name, mem, slug", [
    ("NVIDIA H100 80GB HBM3", 85 * 10**9, "h100-sxm-80gb"),
    ("NVIDIA H200", 150 * 10**9, "h200-141gb"),
    ("NVIDIA A100-SXM4-40GB", 42 * 10**9, "a100-sxm4-40gb"),
    ("NVIDIA L4", 24 * 2**30, "l4-24gb"),
])
def test_gpu_machine_names(name, mem, slug):
    assert hardware._gpu_slug(name, mem) == slug


def test_host_memory_grows_with_touched_memory():
    before = instruments.host_memory()
    block = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MiB, every page written
    assert instruments.host_memory() - before >= 48 << 20
    del block


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")
def test_host_copy_floors_are_skips_without_a_gpu():
    with pytest.raises(NotImplementedError):
        instruments.host_copy_bandwidth("cpu")
    with pytest.raises(NotImplementedError):
        instruments.device_memory_in_use("cpu")


@pytest.mark.gpu(reason="needs a CUDA GPU")
def test_host_copy_bandwidth_is_positive_on_gpu():
    for direction in ("h2d", "d2h"):
        assert instruments.host_copy_bandwidth("cuda", direction, pinned=True, nbytes=1 << 24) > 0
    with pytest.raises(ValueError, match="direction"):
        instruments.host_copy_bandwidth("cuda", "sideways")


# --- environment: asv versions, GPU operating state, CPU frequency policy -------------------

# What nvidia-smi 570 prints on an H100 SXM host (idle GPU 0; GPU 1 without a power reading,
# in MIG-incapable mode), per --query-gpu field name. The fake answers in the order asked for
# and, like the real one, rejects a field it does not know: so a misspelt field fails here.
_SMI_ROWS = [
    {"index": "0", "pci.bus_id": "00000000:18:00.0", "clocks.sm": "345", "clocks.max.sm": "1980",
     "clocks.mem": "2619", "clocks.max.mem": "2619", "power.limit": "700.00",
     "power.default_limit": "700.00", "enforced.power.limit": "650.00", "ecc.mode.current": "Enabled",
     "mig.mode.current": "Disabled", "persistence_mode": "Enabled", "temperature.gpu": "34",
     "driver_version": "570.124.06"},
    {"index": "1", "pci.bus_id": "00000000:2A:00.0", "clocks.sm": "1980", "clocks.max.sm": "1980",
     "clocks.mem": "2619", "clocks.max.mem": "2619", "power.limit": "[N/A]",
     "power.default_limit": "[Not Supported]", "enforced.power.limit": "[N/A]", "ecc.mode.current": "Disabled",
     "mig.mode.current": "[N/A]", "persistence_mode": "Disabled", "temperature.gpu": "61",
     "driver_version": "570.124.06"},
]
_EXPECTED_STATE = [
    {"index": 0, "pci_bus_id": "00000000:18:00.0", "sm_clock_mhz": 345, "sm_clock_max_mhz": 1980,
     "memory_clock_mhz": 2619, "memory_clock_max_mhz": 2619, "power_limit_w": 700.0,
     "power_default_limit_w": 700.0, "power_enforced_limit_w": 650.0, "ecc_enabled": True,
     "mig_enabled": False, "persistence_enabled": True, "temperature_c": 34},
    {"index": 1, "pci_bus_id": "00000000:2A:00.0", "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980,
     "memory_clock_mhz": 2619, "memory_clock_max_mhz": 2619, "power_limit_w": None,
     "power_default_limit_w": None, "power_enforced_limit_w": None, "ecc_enabled": False,
     "mig_enabled": None, "persistence_enabled": False, "temperature_c": 61},
]


def _fake_smi(tmp_path, monkeypatch, body: str):
    """Put an executable `nvidia-smi` running `body` (Python) first on PATH; hide pynvml."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails, as where it is not installed


def test_gpu_state_from_nvidia_smi(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, f"""
rows = {_SMI_ROWS!r}
args = dict(a.split("=", 1) for a in sys.argv[1:])
assert args["--format"] == "csv,noheader,nounits", args
fields = args["--query-gpu"].split(",")
unknown = [f for f in fields if f not in rows[0]]
if unknown:
    print(f'Field "{{unknown[0]}}" is not a valid field to query.')
    sys.exit(2)
for row in rows:
    print(", ".join(row[f] for f in fields))
""")
    env = hardware.environment()
    assert env["gpu_state"] == _EXPECTED_STATE
    json.dumps(env)
    # Any bracketed placeholder, text fields included: a value nvidia-smi could not read.
    assert hardware._smi_value("[Insufficient Permissions]", str) is None


def _fake_pynvml():
    class NVMLError(Exception):
        pass

    def not_supported(*_):
        raise NVMLError("Not Supported")

    gpus = [
        {"bus": b"00000000:18:00.0", "clocks": {1: 345, 2: 2619}, "max": {1: 1980, 2: 2619},
         "power": (700000, 700000, 650000), "ecc": (1, 1), "mig": (0, 0), "persist": 1, "temp": 34},
        {"bus": "00000000:2A:00.0", "clocks": {1: 1980, 2: 2619}, "max": {1: 1980, 2: 2619},
         "power": None, "ecc": (0, 0), "mig": None, "persist": 0, "temp": 61},
    ]
    nv = types.ModuleType("pynvml")
    nv.calls = []
    nv.NVMLError = NVMLError
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_TEMPERATURE_GPU = 1, 2, 0
    nv.nvmlInit = lambda: nv.calls.append("init")
    nv.nvmlShutdown = lambda: nv.calls.append("shutdown")
    nv.nvmlDeviceGetCount = lambda: len(gpus)
    nv.nvmlDeviceGetHandleByIndex = lambda i: gpus[i]
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=h["bus"])
    nv.nvmlDeviceGetClockInfo = lambda h, kind: h["clocks"][kind]
    nv.nvmlDeviceGetMaxClockInfo = lambda h, kind: h["max"][kind]
    nv.nvmlDeviceGetPowerManagementLimit = lambda h: h["power"][0] if h["power"] else not_supported()
    nv.nvmlDeviceGetPowerManagementDefaultLimit = lambda h: h["power"][1] if h["power"] else not_supported()
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: h["power"][2] if h["power"] else not_supported()
    nv.nvmlDeviceGetEccMode = lambda h: h["ecc"]
    nv.nvmlDeviceGetMigMode = lambda h: h["mig"] if h["mig"] else not_supported()
    nv.nvmlDeviceGetPersistenceMode = lambda h: h["persist"]
    nv.nvmlDeviceGetTemperature = lambda h, sensor: h["temp"] if sensor == 0 else not_supported()
    return nv


def test_gpu_state_from_pynvml(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: the values can only come from NVML
    nv = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    env = hardware.environment()
    assert env["gpu_state"] == _EXPECTED_STATE  # the same record, whichever source
    assert nv.calls == ["init", "shutdown"]
    json.dumps(env)


def test_gpu_state_without_nvml_or_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    env = hardware.environment()
    assert env["gpu_state"] is None


def test_gpu_state_when_nvml_has_no_driver(tmp_path, monkeypatch):
    """pynvml installed on a host without a driver: nvmlInit raises; nvidia-smi is asked next."""
    nv = _fake_pynvml()

    def no_driver():
        raise nv.NVMLError("Driver Not Loaded")

    nv.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert hardware.gpu_state() is None


@pytest.mark.parametrize("body", [
    "time.sleep(30)",  # a wedged driver: killed at the timeout
    'print("NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."); sys.exit(9)',
])
def test_gpu_state_when_nvidia_smi_hangs_or_fails(tmp_path, monkeypatch, body):
    _fake_smi(tmp_path, monkeypatch, body)
    monkeypatch.setattr(hardware, "NVIDIA_SMI_TIMEOUT_S", 1.0)
    start = time.monotonic()
    assert hardware.gpu_state() is None
    # Only the query is timed: environment() also starts CUDA on GPU machines, which alone
    # took 21 s on a busy H100 host.
    assert time.monotonic() - start < 20
    assert hardware.environment()["gpu_state"] is None


def test_cpu_frequency_policy_from_sysfs(tmp_path):
    for cpu, governor in (("cpu0", "performance"), ("cpu1", "powersave"), ("cpu2", "performance")):
        (tmp_path / cpu / "cpufreq").mkdir(parents=True)
        (tmp_path / cpu / "cpufreq" / "scaling_governor").write_text(f"{governor}\n")
    (tmp_path / "cpu3").mkdir()  # a CPU without cpufreq (offline, or not exposed)
    (tmp_path / "intel_pstate").mkdir()
    (tmp_path / "intel_pstate" / "no_turbo").write_text("1\n")
    env = hardware.environment(cpu_sysfs=tmp_path)
    assert env["cpu_governors"] == ["performance", "powersave"]
    assert env["cpu_boost"] is False
    (tmp_path / "intel_pstate" / "no_turbo").write_text("0\n")
    assert host_settings.cpu_frequency_policy(tmp_path)["cpu_boost"] is True


def test_cpu_frequency_policy_without_cpufreq(tmp_path):
    """As in most VMs: CPUs listed, no cpufreq directory, no boost file."""
    (tmp_path / "cpu0").mkdir()
    assert host_settings.cpu_frequency_policy(tmp_path) == {"cpu_governors": None, "cpu_boost": None}
    (tmp_path / "cpufreq").mkdir()
    (tmp_path / "cpufreq" / "boost").write_text("1\n")  # acpi-cpufreq / amd-pstate
    assert host_settings.cpu_frequency_policy(tmp_path)["cpu_boost"] is True


def test_environment_records_asv_versions(monkeypatch):
    env = hardware.environment()
    assert env["asv"] == metadata.version("asv")
    assert env["asv_runner"] == metadata.version("asv-runner")

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(hardware.metadata, "version", not_installed)
    env = hardware.environment()
    assert env["asv"] is None and env["asv_runner"] is None
