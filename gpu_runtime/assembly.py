"""Build the model a strategy asks for: every model-shaping key applied,
in the one order that works.

1. `offload.embedding: cpu` swaps the embedding for a CPU-resident one *before* the model
   moves, so `.to(device)` leaves the table (and later its optimizer state) in host memory.
2. The model moves to the device and is cast to `precision.storage_dtype`.
3. `precision.quantization` swaps the targeted projections for frozen int8 + LoRA *after*
   the cast (an int8 weight must not be cast) and before the optimizer sees parameters.
4. `memory.gradient_checkpointing` wraps block forwards (names and checkpoints unchanged).
5. `kernels.fused_rmsnorm_qkv` installs the fused RMSNorm+QKV in every attention block.
6. `kernels.compile` wraps the whole in torch.compile; the trainer calls the wrapper and
   keeps the plain module for parameters and checkpoints.

Each step records what it did in `AssembledModel.report`, which ends up in the RunResult.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gpu_runtime.kernels import fused_rmsnorm_qkv, maybe_compile, triton_available
from gpu_runtime.model import Attention, RMSNorm, Transformer
from gpu_runtime.precision import Precision, cast_storage
from gpu_runtime.schema import StrategyConfig
from gpu_runtime.strategies.checkpointing import (
    apply_gradient_checkpointing,
    peak_memory_with_and_without,
)
from gpu_runtime.strategies.offload import offload_embeddings
from gpu_runtime.strategies.quantization import quantize_for_lora

QKV = ("q_proj", "k_proj", "v_proj")


@dataclass
class AssembledModel:
    module: Transformer  # owns the parameters; state_dict and load_state_dict go here
    forward: nn.Module  # what the trainer calls: the module, or its torch.compile wrapper
    named_params: list[
        tuple[str, torch.Tensor]
    ]  # what the optimizer steps (fp32 masters when storage is narrower)
    report: dict[str, Any] = field(default_factory=dict)


def strategy_conflicts(config: StrategyConfig) -> list[dict[str, str]]:
    """Strategy combinations this runtime cannot honour together,
    refused rather than half applied."""
    quant = config.precision.quantization
    fused_targets = sorted(set(quant.target_modules) & set(QKV)) if quant.enabled else []
    if config.kernels.fused_rmsnorm_qkv and fused_targets:
        return [
            {
                "key": "kernels.fused_rmsnorm_qkv",
                "message": (
                    "the fused RMSNorm+QKV path multiplies by plain q/k/v weights, "
                    f"but {', '.join(fused_targets)} "
                    "are int8-quantized (precision.quantization.target_modules); "
                    "drop them from target_modules "
                    "or turn the fused path off"
                ),
            }
        ]
    return []


def fused_backend(device: torch.device) -> str:
    """Triton on CUDA when it is installed; elsewhere the autograd.Function with a PyTorch forward.

    The Function saves x and one rstd per row instead of the normalised activations, so
    even without a kernel the fused path keeps less for the backward than the unfused one.
    """
    return "triton" if device.type == "cuda" and triton_available() else "function"


def _fused_qkv(x: torch.Tensor, norm: RMSNorm, attn: Attention, *, backend: str):
    return fused_rmsnorm_qkv(
        x,
        norm.weight,
        attn.q_proj.weight,
        attn.k_proj.weight,
        attn.v_proj.weight,
        norm.eps,
        backend=backend,
    )


def install_fused_rmsnorm_qkv(model: Transformer, *, backend: str) -> int:
    """Route every attention block's norm+q/k/v through the fused function;
    returns how many blocks."""
    qkv = functools.partial(_fused_qkv, backend=backend)
    for block in model.blocks:
        projections = [getattr(block.attn, name) for name in QKV]
        if not all(type(p) is nn.Linear and p.bias is None for p in projections):
            raise ValueError(
                "kernels.fused_rmsnorm_qkv: q/k/v must be plain bias-free nn.Linear layers"
            )
        block.attn.qkv_fn = qkv
    return len(model.blocks)


def _measure_checkpointing(
    module: Transformer,
    precision: Precision,
    sample: torch.Tensor,
    every_n_blocks: int,
    device: torch.device,
) -> dict[str, Any]:
    """One sequence forward and backward without and with checkpointing: the bytes it saves."""
    x, y = sample[:1, :-1].to(device), sample[:1, 1:].to(device)

    def forward() -> torch.Tensor:
        with precision.autocast():
            return module(x, y)[1]

    report = peak_memory_with_and_without(
        module.blocks,
        forward,
        every_n_blocks=every_n_blocks,
        device=device,
        exclude=list(module.parameters()),
    )
    for p in module.parameters():
        p.grad = None
    return {
        "blocks": report.checkpointed_blocks,
        "peak_bytes_without": report.without.bytes,
        "peak_bytes_with": report.with_checkpointing.bytes,
        "saved_fraction": round(report.saved_fraction, 4),
        "measured_on": "one sequence",
        "method": report.with_checkpointing.method,
        "estimated": report.with_checkpointing.estimated,
    }


def assemble_model(
    model: Transformer,
    config: StrategyConfig,
    device: torch.device,
    precision: Precision,
    sample: torch.Tensor,
) -> AssembledModel:
    """Apply the strategy's model keys to a freshly built CPU model;
    see the module docstring for the order."""
    report: dict[str, Any] = {}
    if config.offload.embedding == "cpu":
        names = offload_embeddings(model, target="cpu", names=["tok_embeddings"])
    model.to(device)
    cast_storage(model, config.precision.storage_dtype)
    if config.offload.embedding == "cpu":
        table = model.get_submodule(names[0]).weight
        report["offload.embedding"] = {
            "modules": names,
            "table_device": str(table.device),
            "table_bytes": table.nbytes,
        }
    quant = config.precision.quantization
    if quant.enabled:
        q = quantize_for_lora(
            model,
            target_modules=list(quant.target_modules),
            weight_bits=quant.weight_bits,
            lora_rank=quant.adapter_rank,
            lora_alpha=quant.adapter_alpha,
            full_finetune=quant.trainable == "full",
        )
        report["precision.quantization"] = {
            "modules": q.modules,
            "backend": q.backend,
            "weight_bytes_before": q.weight_bytes_before,
            "weight_bytes_after": q.weight_bytes_after,
            "weight_bytes_saved": q.weight_bytes_saved,
            "adapter_bytes": q.adapter_bytes,
        }
    checkpointing = config.memory.gradient_checkpointing
    if checkpointing.enabled:
        report["memory.gradient_checkpointing"] = _measure_checkpointing(
            model, precision, sample, checkpointing.every_n_blocks, device
        )
        # the measurement leaves it applied; said again here so the strategy never rests on a side
        # effect
        apply_gradient_checkpointing(model.blocks, every_n_blocks=checkpointing.every_n_blocks)
    if config.kernels.fused_rmsnorm_qkv:
        backend = fused_backend(device)
        report["kernels.fused_rmsnorm_qkv"] = {
            "blocks": install_fused_rmsnorm_qkv(model, backend=backend),
            "backend": backend,
        }
    named_params = precision.prepare(model)
    forward = maybe_compile(model, enabled=config.kernels.compile)
    if config.kernels.compile:
        report["kernels.compile"] = {"wrapper": type(forward).__name__}
    return AssembledModel(module=model, forward=forward, named_params=named_params, report=report)
