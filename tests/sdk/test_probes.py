"""Which device a rank samples, and what NVML's readings become, against a fake NVML (this machine
has no GPU; the CPU probe is the real one)."""

from __future__ import annotations

import sys
import time
import types

import pytest

from costlab.probes import CpuProbe, NvmlProbe, open_probe
from costlab.sampler import Progress, Sampler


class NVMLError(Exception):
    pass


def fake_nvml(count: int = 4, *, energy: bool = True) -> types.ModuleType:
    """NVML with `count` GPUs: handles are ("idx", i) or ("uuid", s); each reading moves on."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError
    nvml.NVML_CLOCK_SM, nvml.NVML_TEMPERATURE_GPU = 1, 0
    state = {"energy_mj": 1_000_000, "inits": 0}
    nvml.state = state
    nvml.nvmlInit = lambda: state.__setitem__("inits", state["inits"] + 1)
    nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: count
    nvml.nvmlDeviceGetHandleByIndex = lambda i: ("idx", i)
    nvml.nvmlDeviceGetHandleByUUID = lambda u: ("uuid", u)
    nvml.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=87)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        used=40 * 1024**3, total=80 * 1024**3
    )
    nvml.nvmlDeviceGetPowerUsage = lambda h: 350_000  # mW

    def energy_mj(h):
        if not energy:
            raise NVMLError("not supported")
        state["energy_mj"] += 700_000  # 700 J per reading
        return state["energy_mj"]

    nvml.nvmlDeviceGetTotalEnergyConsumption = energy_mj
    nvml.nvmlDeviceGetClockInfo = lambda h, which: 1980
    nvml.nvmlDeviceGetTemperature = lambda h, which: 61
    return nvml


@pytest.mark.parametrize(
    ("visible", "local_rank", "handle"),
    [
        (None, 2, ("idx", 2)),  # no CUDA_VISIBLE_DEVICES: the local rank's GPU
        ("3,1", 1, ("idx", 1)),  # the local rank's entry of the visible list
        ("5", 3, ("idx", 5)),  # one GPU per rank (srun --gpus-per-task=1): that one
        ("GPU-aaa,GPU-bbb", 1, ("uuid", "GPU-bbb")),  # UUIDs: matched as such
    ],
)
def test_each_rank_samples_its_own_visible_gpu(monkeypatch, visible, local_rank, handle):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    probe = open_probe(None, local_rank=local_rank, cpu_tdp_w=65.0)
    assert isinstance(probe, NvmlProbe) and probe.handle == handle
    assert probe.label.endswith("NVIDIA H100 80GB HBM3") and not probe.estimated


@pytest.mark.parametrize("visible", ["", "-1", "0,1"])
def test_no_visible_gpu_for_the_rank_samples_the_cpu(monkeypatch, visible):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert isinstance(open_probe(None, local_rank=2, cpu_tdp_w=65.0), CpuProbe)


def test_cpu_is_sampled_when_asked_or_without_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert isinstance(open_probe("cuda:0", local_rank=0, cpu_tdp_w=65.0), CpuProbe)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml())
    assert isinstance(open_probe("cpu", local_rank=0, cpu_tdp_w=65.0), CpuProbe)


def run_sampler(probe) -> list[dict]:
    out: list[dict] = []
    progress = Progress(0, 0, None, 0.0, 0, None, time.perf_counter())
    sampler = Sampler(probe=probe, progress=lambda: progress, interval_s=3600, emit=out.append)
    for _ in range(3):
        time.sleep(0.01)
        sampler.sample()
    return out


def test_gpu_energy_comes_from_the_counter_from_the_start(monkeypatch):
    nvml = fake_nvml()
    probe = NvmlProbe(nvml, ("idx", 0), label="cuda:0 H100")
    out = run_sampler(probe)
    assert [s["energy_j"] for s in out] == [700.0, 1400.0, 2100.0]  # since the first reading
    first = out[0]
    assert (first["util_pct"], first["power_w"], first["mem_used_mb"]) == (87.0, 350.0, 40960.0)
    assert (first["sm_clock_mhz"], first["temperature_c"], first["estimated"]) == (
        1980.0,
        61.0,
        False,
    )


def test_without_the_counter_gpu_energy_is_power_times_time(monkeypatch):
    from costlab import sampler as sampler_module

    clock = {"t": 100.0}

    def tick() -> float:
        clock["t"] += 0.5  # every reading of the clock: half a second later
        return clock["t"]

    monkeypatch.setattr(
        sampler_module, "time", types.SimpleNamespace(perf_counter=tick, time=time.time)
    )
    probe = NvmlProbe(fake_nvml(energy=False), ("idx", 0), label="cuda:0 T4")
    out: list[dict] = []
    progress = Progress(0, 0, None, 0.0, 0, None, 0.0)
    sampler = sampler_module.Sampler(
        probe=probe, progress=lambda: progress, interval_s=3600, emit=out.append
    )
    for _ in range(3):
        sampler.sample()
    assert [s["energy_j"] for s in out] == [175.0, 350.0, 525.0]  # 350 W x 0.5 s each
    assert not out[0]["estimated"]  # measured power, integrated


def test_the_cpu_probe_models_power_and_says_so(tmp_path):
    probe = CpuProbe(tdp_w=100.0, rapl_root=tmp_path)  # no RAPL here
    busy = time.process_time() + 0.05
    while time.process_time() < busy:
        pass
    reading = probe.read()
    assert probe.estimated and 0 < reading.util_pct <= 100
    assert reading.power_w == pytest.approx(100.0 * reading.util_pct / 100)
    assert reading.mem_used_mb > 0 and reading.mem_total_mb > reading.mem_used_mb
