"""The SDK's NVML probe reads GPM too: a Hopper's samples carry SM occupancy, tensor-pipe activity
and DRAM bandwidth; an older GPU's leave them out (the server stores them empty)."""

from __future__ import annotations

import time

from costlab.gpm import MIN_INTERVAL_S
from costlab.probes import NvmlProbe
from costlab.sampler import Progress, Sampler
from tests.gpu_runtime.test_gpm import DRAM, OCC, TENSOR
from tests.gpu_runtime.test_gpm import fake_nvml as fake_gpm
from tests.sdk.test_probes import fake_nvml


def nvml_with_gpm(**gpm):
    nvml = fake_nvml()
    for name in dir(gpm_module := fake_gpm(**gpm)):
        if (
            name.startswith(("nvmlGpm", "NVML_GPM_", "c_nvmlGpm", "NVML_SUCCESS"))
            or name == "state"
        ):
            setattr(nvml, name, getattr(gpm_module, name))
    return nvml


def samples_of(probe, n: int) -> list[dict]:
    out: list[dict] = []
    progress = Progress(0, 0, None, 0.0, 0, None, 0.0)
    sampler = Sampler(probe=probe, progress=lambda: progress, interval_s=3600, emit=out.append)
    for _ in range(n):
        time.sleep(MIN_INTERVAL_S * 1.2)
        sampler.sample()
    return out


def test_a_hopper_sample_carries_the_gpm_figures():
    nvml = nvml_with_gpm(values={OCC: [35.0, 36.0], TENSOR: [61.0, 62.0], DRAM: [18.0, 19.0]})
    probe = NvmlProbe(nvml, ("idx", 0), label="cuda:0 H100")
    out = samples_of(probe, 2)
    assert [(s["sm_occupancy_pct"], s["tensor_active_pct"], s["dram_bw_pct"]) for s in out] == [
        (35.0, 61.0, 18.0),
        (36.0, 62.0, 19.0),
    ]
    probe.close()
    assert len(set(nvml.state["freed"])) == 2


def test_a_gpu_without_gpm_sends_none_of_them():
    probe = NvmlProbe(nvml_with_gpm(supported=False), ("idx", 0), label="cuda:0 A100")
    (sample,) = samples_of(probe, 1)
    assert sample["power_w"] == 350.0
    assert not {"sm_occupancy_pct", "tensor_active_pct", "dram_bw_pct"} & set(sample)
