"""Strategy keys whose value depends on the device, made concrete from its measured profile
(gpu_runtime.profile) when the run starts: ``precision.compute_dtype: auto``,
``optimizer.dynamic_batching.max_micro_batch: auto``; ``kernels.attention: auto``, from the
device type alone; and ``kernels.compile: auto``, handed on to the run's payback rule. What each
became, and why, is reported on the run.

The profile is measured once per device per process (``auto`` on a device never measured
measures it first: never a guess), or handed in by the caller (the worker, which measured its
devices at start).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from gpu_runtime.compile_payback import MARGIN
from gpu_runtime.schema import StrategyConfig

_PROFILES: dict[str, object] = {}


def device_profile(device: torch.device, profile=None):
    """The device's profile: the one given, else this process's cached one, else measured now."""
    from gpu_runtime.profile import measure_profile

    key = str(device)
    if profile is not None:
        _PROFILES[key] = profile
    elif key not in _PROFILES:
        _PROFILES[key] = measure_profile(device)
    return _PROFILES[key]


def _resolve_precision(config: StrategyConfig, measured) -> tuple[StrategyConfig, dict[str, Any]]:
    """``precision.compute_dtype: auto``: the fastest dtype the device runs natively
    (gpu_runtime.profile.best_dtype)."""
    from gpu_runtime.profile import best_dtype

    dtype = best_dtype(measured)
    fp32 = measured.dtypes.get("fp32")
    chosen = measured.dtypes.get(dtype)
    report = {
        "requested": "auto",
        "resolved": dtype,
        "device_class": measured.device_class,
        "measured_at": measured.measured_at,
        "gflops": {name: r.gflops for name, r in measured.dtypes.items() if r.gflops is not None},
        "why": (
            f"{dtype} is native here and measured {chosen.ratio_vs_fp32:.2f}x fp32"
            if dtype != "fp32" and chosen is not None and chosen.ratio_vs_fp32
            else "no dtype runs natively faster than fp32 here"
            if fp32 is not None
            else "fp32: the profile has no fp32 figure"
        ),
    }
    precision = config.precision.model_copy(update={"compute_dtype": dtype})
    return config.model_copy(update={"precision": precision}), report


def _resolve_compile(config: StrategyConfig) -> tuple[StrategyConfig, dict[str, Any]]:
    """``kernels.compile: auto``: eager at the start; the run's CompileControl
    (gpu_runtime.kernels.compiling) compiles where the payback rule says the saving over the
    remaining steps repays the compile (gpu_runtime.compile_payback), and reports what it chose."""
    kernels = config.kernels.model_copy(update={"compile": False})
    report = {
        "requested": "auto",
        "resolved": False,
        "why": (
            "the payback rule decides in the run: it compiles where the expected saving over the "
            f"remaining steps beats the compile (or cache load) by {MARGIN:g}x; eager until then"
        ),
    }
    return config.model_copy(update={"kernels": kernels}), report


def device_class_of(device: torch.device, profile=None) -> str:
    """The device's class (gpu_runtime.profile.DeviceProfile.device_class) without measuring
    anything: the profile's where one is given or cached, else read off the hardware."""
    from gpu_runtime.profile import cpu_device_class, read_cpu_info

    known = profile if profile is not None else _PROFILES.get(str(device))
    if known is not None:
        return known.device_class
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return cpu_device_class(*read_cpu_info())


def _resolve_attention(config: StrategyConfig, device: torch.device) -> tuple[StrategyConfig, dict]:
    """``kernels.attention: auto``: math on a CPU, sdpa elsewhere.

    On a CPU, ATen's flash-attention kernel costs more than the explicit matmul-softmax-matmul
    at the row lengths fine-tuning uses (docs/benchmarks.md, the peer bench: 118 against 161 us
    per token for a whole training step of the tiny llama, AMD EPYC AVX-512, bf16); on a GPU the
    flash kernels win and never write the T x T scores."""
    chosen = "math" if device.type == "cpu" else "sdpa"
    why = (
        "a CPU: the explicit matmul-softmax-matmul costs less than ATen's flash-attention kernel"
        if chosen == "math"
        else f"a {device.type} device: SDPA's fused kernels, no T x T scores written"
    )
    kernels = config.kernels.model_copy(update={"attention": chosen})
    report = {"requested": "auto", "resolved": chosen, "why": why}
    return config.model_copy(update={"kernels": kernels}), report


def _resolve_micro_batch_ceiling(
    config: StrategyConfig, measured
) -> tuple[StrategyConfig, dict[str, Any]]:
    """``optimizer.dynamic_batching.max_micro_batch: auto``: the micro-batch whose GEMM rows
    (micro-batch x seq_len) reach 90 % of the device's best throughput in the compute dtype
    (gpu_runtime.profile.saturation_rows); past it a larger micro-batch buys under 10 %. At
    least min_micro_batch, at most the global batch. Memory still bounds it while training
    (the BatchScaler halves on out-of-memory)."""
    from gpu_runtime.profile import saturation_rows

    dyn = config.optimizer.dynamic_batching
    seq_len, dtype = config.model.seq_len, config.precision.compute_dtype
    global_batch = config.train.global_batch
    found = saturation_rows(measured, dtype)
    if found is None:
        ceiling = global_batch
        why = "the profile has no throughput-by-rows curve: the global batch bounds it"
    else:
        rows, curve = found
        saturated = math.ceil(rows / seq_len)
        ceiling = min(max(saturated, dyn.min_micro_batch), global_batch)
        why = (
            f"{curve} GEMMs reach 90% of their best throughput at {rows} rows "
            f"({_sequences(saturated)} of {seq_len} tokens); a larger micro-batch buys under 10% "
            "here"
            + (f" ({dtype} has no curve of its own)" if curve != dtype else "")
            + (
                f"; the global batch of {global_batch} bounds it"
                if saturated > global_batch
                else f"; min_micro_batch {dyn.min_micro_batch} is the floor"
                if saturated < dyn.min_micro_batch
                else ""
            )
        )
    config = _with_ceiling(config, max(ceiling, dyn.min_micro_batch))
    report = {
        "requested": "auto",
        "resolved": config.optimizer.dynamic_batching.max_micro_batch,
        "device_class": measured.device_class,
        "rows_gflops": {k: [list(p) for p in v] for k, v in measured.rows_gflops.items()},
        "why": why,
    }
    return config, report


def _sequences(n: int) -> str:
    return f"{n} sequence" if n == 1 else f"{n} sequences"


def _with_ceiling(config: StrategyConfig, ceiling: int) -> StrategyConfig:
    section = config.optimizer.dynamic_batching.model_copy(update={"max_micro_batch": ceiling})
    optimizer = config.optimizer.model_copy(update={"dynamic_batching": section})
    return config.model_copy(update={"optimizer": optimizer})


def resolve_device_keys(
    config: StrategyConfig, device: torch.device, profile=None
) -> tuple[StrategyConfig, dict[str, dict[str, Any]]]:
    """The config to train, with every `auto` key made concrete for this device, and what each
    became ({key: report}; empty when the strategy named every value)."""
    wants_dtype = config.precision.compute_dtype == "auto"
    wants_compile = config.kernels.compile == "auto"
    dyn = config.optimizer.dynamic_batching
    if dyn.max_micro_batch == "auto" and not dyn.enabled:  # unused: no device to measure
        config = _with_ceiling(config, max(config.train.global_batch, dyn.min_micro_batch))
    wants_ceiling = config.optimizer.dynamic_batching.max_micro_batch == "auto"
    reports = {}
    if config.kernels.attention == "auto":  # by device type: nothing to measure
        config, reports["kernels.attention"] = _resolve_attention(config, device)
    if wants_compile:  # decided in the run, from its step time: nothing to measure here
        config, reports["kernels.compile"] = _resolve_compile(config)
    if not (wants_dtype or wants_ceiling):
        return config, reports
    measured = device_profile(device, profile)
    if wants_dtype:
        config, reports["precision.compute_dtype"] = _resolve_precision(config, measured)
    if wants_ceiling:  # after the dtype: the ceiling is the resolved dtype's
        key = "optimizer.dynamic_batching.max_micro_batch"
        config, reports[key] = _resolve_micro_batch_ceiling(config, measured)
    return config, reports
