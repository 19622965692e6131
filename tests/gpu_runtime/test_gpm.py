"""NVML GPM, against a fake NVML that answers through nvidia-ml-py's own ctypes structures (this
machine has no GPU): what a probe reads between two GPM samples, what it reports where GPM is
missing, and the kernel diagnosis made of it."""

from __future__ import annotations

import ctypes
import math
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from gpu_runtime import gpm
from gpu_runtime.diagnosis import (
    COMPUTE_BOUND,
    DRAM_BW_HIGH_PCT,
    LAUNCH_OR_INPUT_BOUND,
    MEMORY_BOUND,
    TENSOR_ACTIVE_LOW_PCT,
    UNAVAILABLE,
    kernel_diagnosis,
    kernel_verdict,
)
from gpu_runtime.telemetry import Progress, RunCounters, Sampler

pynvml = pytest.importorskip("pynvml")
ROOT = Path(__file__).resolve().parents[2]


class NVMLError(Exception):
    pass


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def fake_nvml(
    *,
    supported: bool = True,
    values: dict[int, list[float]] | None = None,
    failing: frozenset[int] = frozenset(),
) -> types.ModuleType:
    """NVML with GPM: each nvmlGpmSampleGet stamps its buffer with a counter; nvmlGpmMetricsGet
    answers metric m of the interval (sample1, sample2) with values[m][k] for the k-th call and
    records what it was asked. Metric ids in `failing` answer NVML_ERROR_NOT_SUPPORTED."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError
    nvml.NVML_SUCCESS = pynvml.NVML_SUCCESS
    for name in dir(pynvml):
        if name.startswith(("NVML_GPM_", "c_nvmlGpm")):
            setattr(nvml, name, getattr(pynvml, name))
    state = {"stamps": {}, "next": 0, "asked": [], "freed": [], "calls": 0, "buffers": []}
    nvml.state = state
    values = values or {}

    def query(handle):
        support = pynvml.c_nvmlGpmSupport_t()
        support.isSupportedDevice = 1 if supported else 0
        return support

    def address(sample) -> int:
        return ctypes.cast(sample, ctypes.c_void_p).value

    def alloc():
        buffer = pynvml.struct_c_nvmlGpmSample_t()
        state["buffers"].append(buffer)  # alive as long as the fake: its address is its name
        return ctypes.pointer(buffer)

    def sample_get(handle, sample):
        state["next"] += 1
        state["stamps"][address(sample)] = state["next"]
        return sample

    def metrics_get(request):
        k = state["calls"]
        state["calls"] += 1
        state["asked"].append(
            (
                request.version,
                request.numMetrics,
                state["stamps"][address(request.sample1)],
                state["stamps"][address(request.sample2)],
                [request.metrics[i].metricId for i in range(request.numMetrics)],
            )
        )
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in failing:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = values.get(metric.metricId, [50.0] * 10)[k]
        return request

    nvml.nvmlGpmQueryDeviceSupport = query
    nvml.nvmlGpmSampleAlloc = alloc
    nvml.nvmlGpmSampleGet = sample_get
    nvml.nvmlGpmMetricsGet = metrics_get
    nvml.nvmlGpmSampleFree = lambda sample: state["freed"].append(address(sample))
    return nvml


OCC, TENSOR, DRAM = (
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
)


def test_each_read_reports_the_interval_since_the_previous_one():
    nvml = fake_nvml(values={OCC: [41.5, 43.0], TENSOR: [12.0, 71.25], DRAM: [88.0, 20.0]})
    clock = FakeClock()
    sampler = gpm.GpmSampler(nvml, handle="gpu0", clock=clock)
    assert sampler.supported and sampler.reason == ""
    clock.t += 0.5
    first = sampler.read()
    clock.t += 0.5
    second = sampler.read()
    assert first == gpm.GpmReading(sm_occupancy_pct=41.5, tensor_active_pct=12.0, dram_bw_pct=88.0)
    assert second == gpm.GpmReading(
        sm_occupancy_pct=43.0, tensor_active_pct=71.25, dram_bw_pct=20.0
    )
    version = pynvml.NVML_GPM_METRICS_GET_VERSION
    # the opening sample (1) to the first read's (2), then that one to the next (3): no gap
    assert nvml.state["asked"] == [
        (version, 3, 1, 2, [OCC, TENSOR, DRAM]),
        (version, 3, 2, 3, [OCC, TENSOR, DRAM]),
    ]
    sampler.close()
    assert len(nvml.state["freed"]) == 2 and not sampler.supported
    assert sampler.read() == gpm.UNAVAILABLE


def test_a_read_too_soon_is_unavailable_and_the_next_spans_the_whole_interval():
    nvml = fake_nvml(values={OCC: [30.0], TENSOR: [40.0], DRAM: [50.0]})
    clock = FakeClock()
    sampler = gpm.GpmSampler(nvml, handle="gpu0", clock=clock)
    clock.t += gpm.MIN_INTERVAL_S / 2
    assert sampler.read() == gpm.UNAVAILABLE and nvml.state["asked"] == []
    clock.t += gpm.MIN_INTERVAL_S
    assert sampler.read().tensor_active_pct == 40.0
    assert nvml.state["asked"][0][2:4] == (1, 2)  # from the opening sample


def test_a_metric_nvml_refuses_is_none_the_others_stand():
    nvml = fake_nvml(values={OCC: [101.3], DRAM: [float("nan")]}, failing=frozenset({TENSOR}))
    clock = FakeClock()
    sampler = gpm.GpmSampler(nvml, handle="gpu0", clock=clock)
    clock.t += 1
    reading = sampler.read()
    # refused: None; a rounding past 100 %: 100; NaN is no percentage: None
    assert reading == gpm.GpmReading(sm_occupancy_pct=100.0, tensor_active_pct=None)


@pytest.mark.parametrize(
    ("nvml", "reason"),
    [
        (fake_nvml(supported=False), "before Hopper"),
        (types.SimpleNamespace(NVMLError=NVMLError), "no GPM API"),  # an old nvidia-ml-py
    ],
    ids=["ampere", "old-bindings"],
)
def test_without_gpm_every_reading_is_none_and_says_why(nvml, reason):
    sampler = gpm.GpmSampler(nvml, handle="gpu0")
    assert not sampler.supported and reason in sampler.reason
    assert sampler.read() == gpm.UNAVAILABLE
    sampler.close()


def test_the_runtime_and_the_sdk_share_one_gpm_reader():
    runtime = (ROOT / "gpu_runtime" / "gpm.py").read_text()
    assert (ROOT / "costlab" / "gpm.py").read_text() == runtime, (
        "gpu_runtime/gpm.py and costlab/gpm.py must stay the same file"
    )


def test_the_runtime_probe_puts_gpm_in_every_sample(monkeypatch):
    """gpu_runtime's NVML probe on a fake NVML (and torch's CUDA device queries answered as an
    H200's): the sampler's samples carry the three GPM figures."""
    from gpu_runtime.probes import NvmlProbe

    nvml = fake_nvml(values={OCC: [40.0] * 10, TENSOR: [20.0] * 10, DRAM: [75.0] * 10})
    nvml.NVML_CLOCK_SM, nvml.NVML_TEMPERATURE_GPU = 1, 0
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda i: ("idx", i)
    nvml.nvmlDeviceGetHandleByUUID = lambda u: ("uuid", u)
    nvml.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=93)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=2**30, total=2**37)
    nvml.nvmlDeviceGetPowerUsage = lambda h: 612_000
    nvml.nvmlDeviceGetTotalEnergyConsumption = lambda h: 5_000_000
    nvml.nvmlDeviceGetClockInfo = lambda h, which: 1980
    nvml.nvmlDeviceGetTemperature = lambda h, which: 55
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H200")
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(uuid="")
    )
    probe = NvmlProbe(torch.device("cuda", 0))
    out: list[dict] = []
    counters = RunCounters(Progress(0, 0, 0.0, 0, None, 1))
    sampler = Sampler(
        probe=probe,
        counters=counters,
        interval_s=3600,
        sink=out.append,
        flops_per_token=1.0,
        peak=None,
        overlap=None,
    )
    counters.progress = Progress(5, 5000, 0.5, 5, 2.0, 1)
    time.sleep(gpm.MIN_INTERVAL_S * 1.5)  # GPM needs this much between its two samples
    sampler.stop()
    sample = out[-1]
    assert (sample["sm_occupancy_pct"], sample["tensor_active_pct"], sample["dram_bw_pct"]) == (
        40.0,
        20.0,
        75.0,
    )
    assert sample["power_w"] == 612.0 and not sample["estimated"]
    assert len(set(nvml.state["freed"])) == 2  # stop() closed the probe: both buffers freed


# ---------------------------------------------------------------------------------------------
# The diagnosis
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tensor", "dram", "verdict"),
    [
        (TENSOR_ACTIVE_LOW_PCT - 0.1, DRAM_BW_HIGH_PCT, MEMORY_BOUND),
        (5.0, 92.0, MEMORY_BOUND),
        (TENSOR_ACTIVE_LOW_PCT - 0.1, DRAM_BW_HIGH_PCT - 0.1, LAUNCH_OR_INPUT_BOUND),
        (3.0, 4.0, LAUNCH_OR_INPUT_BOUND),
        (TENSOR_ACTIVE_LOW_PCT, 95.0, COMPUTE_BOUND),  # busy tensor pipes win, whatever DRAM does
        (70.0, 10.0, COMPUTE_BOUND),
    ],
)
def test_the_decision_table(tensor, dram, verdict):
    got = kernel_verdict(tensor_active_pct=tensor, dram_bw_pct=dram, samples=10)
    assert got.verdict == verdict and got.available
    assert (got.tensor_active_pct, got.dram_bw_pct) == (round(tensor, 1), round(dram, 1))


def test_the_advice_names_what_to_change():
    memory = kernel_verdict(tensor_active_pct=10, dram_bw_pct=80, samples=5)
    launch = kernel_verdict(tensor_active_pct=10, dram_bw_pct=10, samples=5)
    assert "fuse" in memory.action and "arithmetic intensity" in memory.action
    assert all(w in launch.action for w in ("micro-batch", "prefetch", "compile"))


def test_no_gpm_or_too_little_is_unavailable_never_a_guess():
    assert kernel_verdict(tensor_active_pct=None, dram_bw_pct=None, samples=0).verdict == (
        UNAVAILABLE
    )
    few = kernel_verdict(tensor_active_pct=5, dram_bw_pct=5, samples=2)
    assert few.verdict == UNAVAILABLE and few.tensor_active_pct is None and not few.available


def test_the_diagnosis_of_samples_leaves_out_start_up_and_samples_without_gpm():
    warm_up = {"step": 0, "tensor_active_pct": 0.0, "dram_bw_pct": 1.0}  # building the model
    cpu_like = {"step": 4, "tensor_active_pct": None, "dram_bw_pct": None}
    steady = [
        {"step": s, "tensor_active_pct": t, "dram_bw_pct": d, "sm_occupancy_pct": 60.0}
        for s, t, d in ((1, 20.0, 70.0), (2, 24.0, 74.0), (3, 22.0, 72.0))
    ]
    got = kernel_diagnosis([warm_up, *steady, cpu_like])
    assert got.verdict == MEMORY_BOUND and got.samples == 3
    assert math.isclose(got.tensor_active_pct, 22.0) and math.isclose(got.dram_bw_pct, 72.0)
    assert got.sm_occupancy_pct == 60.0
    assert kernel_diagnosis([warm_up, cpu_like]).verdict == UNAVAILABLE
