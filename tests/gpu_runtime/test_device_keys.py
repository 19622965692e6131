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
    ("profile", "dtype"),
    [
        (cpu(EPYC_AVX2), "fp32"),  # bf16 emulated at 0.02x: never chosen
        (cpu(XEON_AMX), "bf16"),  # bf16 4x fp32 on AMX
        (gpu((9, 0), {"fp32": 50_000.0, "bf16": 700_000.0, "fp16": 690_000.0}), "bf16"),
        (gpu((6, 1), {"fp32": 10_000.0, "bf16": 300.0, "fp16": 160.0}), "fp32"),
    ],
    ids=["avx2", "amx", "hopper", "pascal"],
)
def test_auto_keys_resolve_from_the_profile(profile, dtype):
    config, reports = resolve_device_keys(load_strategy(AUTO), torch.device("cpu"), profile=profile)
    assert config.precision.compute_dtype == dtype
    assert reports["precision.compute_dtype"]["resolved"] == dtype
    # compile: auto is the run's payback rule's, on every device: eager until it decides
    assert config.kernels.compile is False and reports["kernels.compile"]["resolved"] is False
    assert "payback rule" in reports["kernels.compile"]["why"]


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
    compiled = result.strategies["kernels.compile"]
    assert compiled["resolved"] is False and compiled["mode"] == "eager"
    assert "no longer than the 3-step probe" in compiled["why"]  # AUTO trains 2 steps
    assert result.status == "completed"


@pytest.mark.parametrize("value", ["1", "0", "maybe"])
def test_kernels_compile_takes_true_false_or_auto_only(value):
    from gpu_runtime import StrategyError

    with pytest.raises(StrategyError) as refused:
        load_strategy(f"kernels: {{compile: {value}}}\n")
    assert refused.value.errors[0]["key"] == "kernels.compile"


CEILING = """\
model: {preset: tiny, seq_len: 32}
data: {source: synthetic}
train: {steps: 2, global_batch: 64}
precision: {compute_dtype: auto}
optimizer:
  dynamic_batching: {enabled: true, min_micro_batch: 1, max_micro_batch: auto}
telemetry: {enabled: false}
"""
KEY = "optimizer.dynamic_batching.max_micro_batch"


def with_curves(profile: DeviceProfile, **curves) -> DeviceProfile:
    return DeviceProfile.from_dict(
        {**profile.as_dict(), "rows_gflops": curves, "rows_kn": [256, 768]}
    )


# The AVX2 EPYC: fp32 flat from 256 rows on (60-80 GFLOP/s); AMX bf16 keeps rising.
FLAT_FP32 = [[64, 30.0], [128, 52.0], [256, 71.0], [512, 74.0], [1024, 78.0], [2048, 76.0]]
RISING_BF16 = [[64, 40.0], [128, 80.0], [256, 150.0], [512, 210.0], [1024, 230.0], [2048, 236.0]]


@pytest.mark.parametrize(
    ("profile", "dtype", "ceiling", "curve"),
    [
        (with_curves(cpu(EPYC_AVX2), fp32=FLAT_FP32), "fp32", 8, "fp32"),  # 256 rows / 32
        (with_curves(cpu(XEON_AMX), fp32=FLAT_FP32, bf16=RISING_BF16), "bf16", 32, "bf16"),
        (with_curves(cpu(XEON_AMX), fp32=FLAT_FP32), "bf16", 8, "fp32"),  # no bf16 curve
    ],
    ids=["avx2-flat", "amx-bf16-rising", "fp32-stands-in"],
)
def test_the_micro_batch_ceiling_is_where_throughput_stops_rising(profile, dtype, ceiling, curve):
    config, reports = resolve_device_keys(load_strategy(CEILING), torch.device("cpu"), profile)
    assert config.precision.compute_dtype == dtype
    assert config.optimizer.dynamic_batching.max_micro_batch == ceiling
    report = reports[KEY]
    assert report["requested"] == "auto" and report["resolved"] == ceiling
    assert report["why"].startswith(f"{curve} GEMMs reach 90%")
    assert report["rows_gflops"]["fp32"] == FLAT_FP32


def test_the_ceiling_stays_within_min_micro_batch_and_the_global_batch():
    profile = with_curves(cpu(EPYC_AVX2), fp32=FLAT_FP32)
    small = load_strategy(CEILING.replace("global_batch: 64", "global_batch: 4"))
    config, reports = resolve_device_keys(small, torch.device("cpu"), profile)
    assert config.optimizer.dynamic_batching.max_micro_batch == 4
    assert reports[KEY]["why"].endswith(
        "(8 sequences of 32 tokens); a larger micro-batch buys "
        "under 10% here; the global batch of 4 bounds it"
    )
    floor = load_strategy(CEILING.replace("min_micro_batch: 1", "min_micro_batch: 16"))
    config, reports = resolve_device_keys(floor, torch.device("cpu"), profile)
    assert config.optimizer.dynamic_batching.max_micro_batch == 16
    assert reports[KEY]["why"].endswith("here; min_micro_batch 16 is the floor")
    # one sequence already fills the GEMMs: said in the singular
    long_rows = load_strategy(CEILING.replace("seq_len: 32", "seq_len: 256"))
    config, reports = resolve_device_keys(long_rows, torch.device("cpu"), profile)
    assert config.optimizer.dynamic_batching.max_micro_batch == 1
    assert "at 256 rows (1 sequence of 256 tokens)" in reports[KEY]["why"]
    # A profile recorded before curves were: the global batch bounds it, and the report says so.
    config, reports = resolve_device_keys(
        load_strategy(CEILING), torch.device("cpu"), cpu(EPYC_AVX2)
    )
    assert config.optimizer.dynamic_batching.max_micro_batch == 64
    assert "no throughput-by-rows curve" in reports[KEY]["why"]


def test_a_ceiling_of_auto_without_dynamic_batching_measures_nothing():
    off = load_strategy(
        CEILING.replace("enabled: true", "enabled: false").replace(
            "compute_dtype: auto", "compute_dtype: fp32"
        )
    )
    config, reports = resolve_device_keys(off, torch.device("cpu"), profile=None)
    assert reports == {} and config.optimizer.dynamic_batching.max_micro_batch == 64


@pytest.mark.parametrize("value", ["0", "-2", "true", "'8'", "2.5", "big"])
def test_max_micro_batch_takes_a_count_or_auto_only(value):
    from gpu_runtime import StrategyError

    with pytest.raises(StrategyError) as refused:
        load_strategy(f"optimizer: {{dynamic_batching: {{max_micro_batch: {value}}}}}\n")
    assert refused.value.errors[0]["key"] == KEY
    assert "whole number of sequences (at least 1) or auto" in str(refused.value)


def test_train_never_grows_past_the_resolved_ceiling():
    profile = with_curves(cpu(EPYC_AVX2), fp32=[[16, 10.0], [32, 60.0], [64, 61.0], [128, 62.0]])
    strategy = CEILING.replace("steps: 2", "steps: 6").replace("seq_len: 32", "seq_len: 16")
    strategy = strategy.replace("global_batch: 64", "global_batch: 8")
    strategy = strategy.replace("min_micro_batch: 1,", "min_micro_batch: 1, probe_steps: 1,")
    result = train(load_strategy(strategy), profile=profile, device="cpu")
    assert result.status == "completed"
    assert result.strategies[KEY]["resolved"] == 2  # 32 rows / 16 tokens
    grown = [e["new_micro_batch"] for e in result.micro_batch_events if e["kind"] == "grow"]
    assert all(new <= 2 for new in grown), result.micro_batch_events


def test_a_live_edit_to_auto_resolves_at_the_step_boundary():
    """max_micro_batch is a live key: an arm edited to `auto` mid-run gets the device's ceiling
    (2 here) at the next step, and the micro-batch is clamped into it."""
    profile = with_curves(cpu(EPYC_AVX2), fp32=[[16, 10.0], [32, 60.0], [64, 61.0], [128, 62.0]])
    strategy = (
        CEILING.replace("steps: 2, global_batch: 64", "steps: 4, global_batch: 8, micro_batch: 8")
        .replace("seq_len: 32", "seq_len: 16")
        .replace("max_micro_batch: auto", "max_micro_batch: 8")
    )
    edits = [{"optimizer": {"dynamic_batching": {"max_micro_batch": "auto"}}}]
    result = train(
        load_strategy(strategy),
        profile=profile,
        device="cpu",
        live=lambda: edits.pop() if edits else None,
    )
    assert result.status == "completed" and not edits
    bounds = [e for e in result.micro_batch_events if e["kind"] == "bounds"]
    assert [(e["old_micro_batch"], e["new_micro_batch"]) for e in bounds] == [(8, 2)], (
        result.micro_batch_events
    )
    assert bounds[0]["detail"]["max_micro_batch"] == 2


@pytest.mark.parametrize(("device", "chosen"), [("cpu", "math"), ("cuda", "sdpa")])
def test_attention_auto_is_math_on_a_cpu_and_sdpa_elsewhere(device, chosen):
    config = load_strategy(
        "model: {preset: tiny, seq_len: 16}\ndata: {source: synthetic}\n"
        "kernels: {attention: auto}\n"
    )
    resolved, reports = resolve_device_keys(config, torch.device(device), profile=None)
    assert resolved.kernels.attention == chosen
    assert (
        reports["kernels.attention"]["resolved"] == chosen and reports["kernels.attention"]["why"]
    )


@pytest.mark.parametrize("value", ["flash", "true", "1"])
def test_kernels_attention_takes_sdpa_math_or_auto_only(value):
    from gpu_runtime import StrategyError

    with pytest.raises(StrategyError) as refused:
        load_strategy(f"kernels: {{attention: {value}}}\n")
    assert refused.value.errors[0]["key"] == "kernels.attention"
