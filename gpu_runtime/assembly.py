"""Build the model a strategy asks for: every model-shaping key applied,
in the one order that works.

The model is costlab's own `Transformer` (family llama, and the LLaMA-family checkpoints
of family hf: llama, mistral, qwen2), or a transformers model wrapped in
`gpu_runtime.hf.HFCausalLM` (any other architecture). Every key applies to the first; on
the second the keys that need costlab's own modules are refused (`architecture_conflicts`).

1. `offload.embedding: cpu` swaps the embedding for a CPU-resident one *before* the model
   moves, so `.to(device)` leaves the table (and later its optimizer state) in host memory.
1b. `finetune.method: lora` freezes every weight and adds peft's adapters (before the cast:
   the adapters are cast, and given fp32 masters, like any trainable weight).
2. The model moves to the device and is cast to `precision.storage_dtype`.
3. `precision.quantization` swaps the targeted projections for frozen int8 + LoRA *after*
   the cast (an int8 weight must not be cast) and before the optimizer sees parameters.
4. `memory.gradient_checkpointing` wraps block forwards (names and checkpoints unchanged);
   on a transformers model, its own `gradient_checkpointing_enable`.
5. `kernels.fused_rmsnorm_qkv` installs the fused RMSNorm+QKV in every attention block;
   `kernels.attention` picks every block's attention (transformers' own switch on its models).
6. `kernels.compile` is not applied here: the run's CompileControl
   (gpu_runtime.kernels.compiling) wraps the whole in torch.compile from the first step, or at the
   step boundary where the payback rule says it pays; the trainer calls the wrapper and keeps the
   plain module for parameters and checkpoints.

Each step records what it did in `AssembledModel.report`, which ends up in the RunResult.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gpu_runtime.data import split_batch
from gpu_runtime.errors import StrategyError
from gpu_runtime.finetune import apply_lora
from gpu_runtime.kernels import fused_rmsnorm_qkv, triton_available
from gpu_runtime.model import Attention, RMSNorm, Transformer
from gpu_runtime.precision import Precision, cast_storage
from gpu_runtime.schema import StrategyConfig
from gpu_runtime.strategies.checkpointing import (
    apply_gradient_checkpointing,
    measure_peak_memory,
    peak_memory_with_and_without,
)
from gpu_runtime.strategies.offload import OffloadError, offload_embeddings
from gpu_runtime.strategies.quantization import quantize_for_lora

QKV = ("q_proj", "k_proj", "v_proj")


@dataclass
class AssembledModel:
    module: nn.Module  # owns the parameters (Transformer or HFCausalLM); state_dict goes here
    forward: nn.Module  # what the trainer calls at the start: the module (compiling wraps it later)
    named_params: list[
        tuple[str, torch.Tensor]
    ]  # what the optimizer steps (fp32 masters when storage is narrower)
    report: dict[str, Any] = field(default_factory=dict)


def strategy_conflicts(config: StrategyConfig) -> list[dict[str, str]]:
    """Strategy combinations this runtime cannot honour together,
    refused rather than half applied."""
    quant = config.precision.quantization
    fused_targets = sorted(set(quant.target_modules) & set(QKV)) if quant.enabled else []
    ft = config.finetune
    if ft.method == "lora" and config.kernels.fused_rmsnorm_qkv:
        lora_qkv = sorted(
            {t.rsplit(".", 1)[-1] for t in (ft.target_modules or ["q_proj", "v_proj"])} & set(QKV)
        )
        if lora_qkv:
            return [
                {
                    "key": "kernels.fused_rmsnorm_qkv",
                    "message": (
                        "the fused RMSNorm+QKV path multiplies by the plain q/k/v weights and "
                        f"would skip the LoRA adapters on {', '.join(lora_qkv)} "
                        "(finetune.target_modules): target other modules or turn the fused "
                        "path off"
                    ),
                }
            ]
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


# keys that act on costlab's own modules (RMSNorm + q/k/v, named projections in blocks)
NATIVE_ONLY = {
    "kernels.fused_rmsnorm_qkv": lambda c: c.kernels.fused_rmsnorm_qkv,
    "precision.quantization.enabled": lambda c: c.precision.quantization.enabled,
}


def architecture_conflicts(
    config: StrategyConfig, model_type: str, *, native: bool
) -> list[dict[str, str]]:
    """Strategy keys that cannot act on the loaded architecture, each refused by name.

    A LLaMA-family checkpoint loads into costlab's own model: every key acts. Another
    architecture trains through transformers: the keys built on costlab's own modules
    cannot touch it, and `every_n_blocks` has no counterpart in transformers'
    checkpointing (it checkpoints every layer)."""
    if native:
        return []
    problems = [
        {
            "key": key,
            "message": (
                f"acts on costlab's own LLaMA-family modules (RMSNorm, q/k/v projections); a "
                f"{model_type} checkpoint trains through transformers, which has neither: "
                "turn it off for this model"
            ),
        }
        for key, wanted in NATIVE_ONLY.items()
        if wanted(config)
    ]
    ckpt = config.memory.gradient_checkpointing
    if ckpt.enabled and ckpt.every_n_blocks != 1:
        problems.append(
            {
                "key": "memory.gradient_checkpointing.every_n_blocks",
                "message": (
                    f"a {model_type} model is checkpointed by transformers' own "
                    "gradient_checkpointing_enable, which checkpoints every layer: use 1"
                ),
            }
        )
    return problems


def fused_backend(device: torch.device) -> str:
    """Triton on CUDA when it is installed; elsewhere the autograd.Function with a PyTorch forward.

    The Function saves x and one rstd per row instead of the normalised activations, so
    even without a kernel the fused path keeps less for the backward than the unfused one.
    """
    return "triton" if device.type == "cuda" and triton_available() else "function"


def _fused_qkv(x: torch.Tensor, norm: RMSNorm, attn: Attention, *, backend: str):
    q, k, v = fused_rmsnorm_qkv(
        x,
        norm.weight,
        attn.q_proj.weight,
        attn.k_proj.weight,
        attn.v_proj.weight,
        norm.eps,
        backend=backend,
    )
    # q/k/v biases (qwen2) are added after the fused projection, in its output dtype
    biases = (attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias)
    if all(b is None for b in biases):
        return q, k, v
    return tuple(
        out if b is None else out + b.to(out.dtype)
        for out, b in zip((q, k, v), biases, strict=True)
    )


def install_fused_rmsnorm_qkv(model: Transformer, *, backend: str) -> int:
    """Route every attention block's norm+q/k/v through the fused function;
    returns how many blocks."""
    qkv = functools.partial(_fused_qkv, backend=backend)
    for block in model.blocks:
        projections = [getattr(block.attn, name) for name in QKV]
        if not all(type(p) is nn.Linear for p in projections):
            raise ValueError("kernels.fused_rmsnorm_qkv: q/k/v must be plain nn.Linear layers")
        block.attn.qkv_fn = qkv
    return len(model.blocks)


def install_attention(model: nn.Module, implementation: str) -> dict[str, Any]:
    """`kernels.attention`: every block of costlab's model attends with ``implementation``; a
    model trained through transformers gets its counterpart (math is transformers' eager)."""
    if isinstance(model, Transformer):
        for block in model.blocks:
            block.attn.attention = implementation
        return {"implementation": implementation, "blocks": len(model.blocks)}
    hf_impl = {"math": "eager", "sdpa": "sdpa"}[implementation]
    model.hf.set_attn_implementation(hf_impl)
    return {"implementation": implementation, "attn_implementation": hf_impl}


def _measure_checkpointing(
    module: nn.Module,
    precision: Precision,
    sample: torch.Tensor,
    every_n_blocks: int,
    device: torch.device,
) -> dict[str, Any]:
    """One sequence forward and backward without and with checkpointing: the bytes it saves."""
    x, y = (t.to(device) for t in split_batch(sample[:1]))

    def forward() -> torch.Tensor:
        with precision.autocast():
            return module(x, y)[1]

    exclude = list(module.parameters())
    if isinstance(module, Transformer):
        report = peak_memory_with_and_without(
            module.blocks, forward, every_n_blocks=every_n_blocks, device=device, exclude=exclude
        )
        blocks, without, with_ = (
            report.checkpointed_blocks,
            report.without,
            report.with_checkpointing,
        )
        implementation = "torch.utils.checkpoint per block"
    else:  # a transformers model: its own switch, every layer
        hf = module.hf
        hf.gradient_checkpointing_disable()
        without = measure_peak_memory(forward, device=device, exclude=exclude)
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        with_ = measure_peak_memory(forward, device=device, exclude=exclude)
        blocks = list(range(module.n_layers))
        implementation = "transformers gradient_checkpointing_enable"
    for p in module.parameters():
        p.grad = None
    return {
        "blocks": blocks,
        "implementation": implementation,
        "peak_bytes_without": without.bytes,
        "peak_bytes_with": with_.bytes,
        "saved_fraction": round(1 - with_.bytes / max(without.bytes, 1), 4),
        "measured_on": "one sequence",
        "method": with_.method,
        "estimated": with_.estimated,
    }


def assemble_model(
    model: nn.Module,
    config: StrategyConfig,
    device: torch.device,
    precision: Precision,
    sample: torch.Tensor,
    *,
    model_type: str = "llama",
) -> AssembledModel:
    """Apply the strategy's model keys to a freshly built CPU model;
    see the module docstring for the order."""
    report: dict[str, Any] = {}
    native = isinstance(model, Transformer)
    if config.offload.embedding == "cpu":
        try:
            names = offload_embeddings(
                model, target="cpu", names=["tok_embeddings"] if native else None
            )
        except OffloadError as exc:  # a tied table (qwen2's small models, gpt2): refused by name
            raise StrategyError.single(
                "offload.embedding", str(exc).removeprefix("offload.embedding: ")
            ) from None
    if config.finetune.method == "lora":
        report["finetune"] = apply_lora(
            model, config.finetune, model_type=model_type, native=native
        )
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
        if native:
            apply_gradient_checkpointing(model.blocks, every_n_blocks=checkpointing.every_n_blocks)
        else:
            model.hf.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
    if config.kernels.fused_rmsnorm_qkv:
        backend = fused_backend(device)
        report["kernels.fused_rmsnorm_qkv"] = {
            "blocks": install_fused_rmsnorm_qkv(model, backend=backend),
            "backend": backend,
        }
    if config.kernels.attention != "sdpa":
        report["kernels.attention"] = install_attention(model, config.kernels.attention)
    named_params = precision.prepare(model)
    # kernels.compile is the run's CompileControl's (gpu_runtime.kernels.compiling): it compiles
    # from the first step, or at the step boundary where the payback rule says it pays
    return AssembledModel(module=model, forward=model, named_params=named_params, report=report)
