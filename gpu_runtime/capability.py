"""Which device a run uses, what it is called, and whether it can run what the strategy asks."""

from __future__ import annotations

import torch

from gpu_runtime.errors import StrategyError
from gpu_runtime.schema import StrategyConfig, distributed_problems

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(device: str | None) -> torch.device:
    """The device to train on: the one asked for, else the first CUDA device, else the CPU."""
    if device is None:
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise StrategyError.single("device", f"{device!r} is not a device ({exc})") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise StrategyError.single(
                "device", f"{device!r} asked for, but this host has no CUDA device"
            )
        index = 0 if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise StrategyError.single(
                "device",
                f"{device!r} asked for; this host has {torch.cuda.device_count()} CUDA devices",
            )
        return torch.device("cuda", index)
    if dev.type != "cpu":
        raise StrategyError.single("device", f"{device!r}: gpu_runtime trains on cuda or cpu")
    return dev


def device_label(device: torch.device) -> str:
    """ "cpu" or e.g. "cuda:0 NVIDIA H200"."""
    if device.type == "cuda":
        return f"cuda:{device.index} {torch.cuda.get_device_name(device.index)}"
    return "cpu"


def _cpu_autocast_problem(dtype: torch.dtype) -> str | None:
    try:
        with torch.autocast("cpu", dtype=dtype):
            out = torch.nn.functional.linear(torch.ones(2, 4), torch.ones(3, 4))
        return None if out.dtype == dtype else f"autocast produced {out.dtype}"
    except (RuntimeError, ValueError) as exc:
        return str(exc).splitlines()[0]


def capability_problems(config: StrategyConfig, device: torch.device) -> list[dict[str, str]]:
    """Everything in the strategy this device cannot do, as ``{"key", "message"}``."""
    problems: list[dict[str, str]] = []
    label = device_label(device)
    prec = config.precision
    for key, dtype in (
        ("precision.compute_dtype", prec.compute_dtype),
        ("precision.storage_dtype", prec.storage_dtype),
    ):
        if dtype == "fp32":
            continue
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device.index)
            if dtype == "bf16" and (major, minor) < (8, 0):
                problems.append(
                    {
                        "key": key,
                        "message": (
                            "bf16 needs CUDA compute capability >= 8.0 (Ampere or newer); "
                            f"{label} has {major}.{minor}"
                        ),
                    }
                )
        elif key == "precision.compute_dtype":
            reason = _cpu_autocast_problem(TORCH_DTYPES[dtype])
            if reason is not None:
                problems.append(
                    {"key": key, "message": f"{dtype} autocast does not run on {label}: {reason}"}
                )
    if config.offload.embedding == "npu":
        problems.append(
            {
                "key": "offload.embedding",
                "message": (
                    "npu offload needs an NPU backend; "
                    f"this torch build has none (training on {label})"
                ),
            }
        )
    available = torch.cuda.device_count() if device.type == "cuda" else 0
    problems += distributed_problems(
        config, cuda=device.type == "cuda", devices=available, where=f"this host ({label})"
    )
    if config.placement.gpus > max(available, 1):
        problems.append(
            {
                "key": "placement.gpus",
                "message": (f"{config.placement.gpus} GPUs asked for; this host has {available}"),
            }
        )
    return problems


def check_capability(
    config: StrategyConfig, device: str | torch.device | None = None
) -> torch.device:
    """Resolve the device and refuse (StrategyError) what it cannot run,
    naming the device and why."""
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    problems = capability_problems(config, dev)
    if problems:
        raise StrategyError(problems)
    return dev
