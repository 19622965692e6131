"""`auto` keys resolve from the device's profile: the dtype the device runs natively and fastest,
torch.compile only where it pays; train() reports what each became."""

from __future__ import annotations

import pytest
import torch

from gpu_runtime import load_strategy, train
from gpu_runtime.device_keys import resolve_device_keys
from gpu_runtime.profile import DeviceProfile, classify_cuda
from tests.factories import EPYC_AVX2, XEON_AMX, device_profile

AUTO = """\
model: {preset: tiny, seq_len: 16}
data: {source: synthetic}
train: {steps: 2, global_batch: 2}
precision: {compute_dtype: auto}
kernels: {compile: auto}
telemetry: {enabled: false}
"""


def cpu(spec) -> DeviceProfile:
    return DeviceProfile.from_dict(device_profile(spec))


def gpu(capability: tuple[int, int], gflops: dict) -> DeviceProfile:
    dtypes, notes = classify_cuda(capability, gflops)
    return DeviceProfile(
        device="cuda",
        device_label="cuda:0 NVIDIA Test",
        device_class="cuda:NVIDIA Test",
        compute_capability=capability,
        dtypes=dtypes,
        notes=tuple(notes),
    )


@pytest.mark.parametrize(
    ("profile", "dtype", "compiled"),
    [
        (cpu(EPYC_AVX2), "fp32", False),  # bf16 emulated at 0.02x: never chosen
        (cpu(XEON_AMX), "bf16", False),  # bf16 4x fp32 on AMX; compiling on a CPU does not pay
        (gpu((9, 0), {"fp32": 50_000.0, "bf16": 700_000.0, "fp16": 690_000.0}), "bf16", True),
        (gpu((6, 1), {"fp32": 10_000.0, "bf16": 300.0, "fp16": 160.0}), "fp32", False),
    ],
    ids=["avx2", "amx", "hopper", "pascal"],
)
def test_auto_keys_resolve_from_the_profile(profile, dtype, compiled):
    config, reports = resolve_device_keys(load_strategy(AUTO), torch.device("cpu"), profile=profile)
    assert config.precision.compute_dtype == dtype and config.kernels.compile is compiled
    assert reports["precision.compute_dtype"]["resolved"] == dtype
    assert reports["kernels.compile"]["resolved"] is compiled and reports["kernels.compile"]["why"]


def test_named_values_are_left_alone_and_nothing_is_measured():
    named = load_strategy(
        AUTO.replace("compute_dtype: auto", "compute_dtype: bf16").replace(
            "compile: auto", "compile: false"
        )
    )
    config, reports = resolve_device_keys(named, torch.device("cpu"), profile=None)
    assert reports == {} and config.precision.compute_dtype == "bf16"


def test_train_reports_what_auto_became_on_the_profile_it_was_given():
    result = train(load_strategy(AUTO), profile=cpu(EPYC_AVX2), device="cpu")
    assert result.strategies["precision.compute_dtype"]["resolved"] == "fp32"
    assert "no dtype runs natively faster" in result.strategies["precision.compute_dtype"]["why"]
    assert result.strategies["kernels.compile"]["resolved"] is False
    assert result.status == "completed"


@pytest.mark.parametrize("value", ["1", "0", "maybe"])
def test_kernels_compile_takes_true_false_or_auto_only(value):
    from gpu_runtime import StrategyError

    with pytest.raises(StrategyError) as refused:
        load_strategy(f"kernels: {{compile: {value}}}\n")
    assert refused.value.errors[0]["key"] == "kernels.compile"
