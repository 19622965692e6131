"""AdamW with decay on matrices only, and a linear-warmup cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch

from gpu_runtime.schema import OptimizerSection, TrainSection

FUSED_DEVICE_TYPES = ("cuda", "cpu")


def build_adamw(named_params: list[tuple[str, torch.Tensor]], opt: OptimizerSection, lr: float,
                *, fused: bool = False) -> torch.optim.AdamW:
    """AdamW; norms and other 1-D parameters are not decayed (as in LLaMA and nanoGPT).

    ``fused`` (`kernels.fused_optimizer`): PyTorch's fused kernel, one pass over each
    parameter, its gradient and both moments. Off, PyTorch picks its default (a loop over
    tensors on CPU, foreach on CUDA): what a plain PyTorch script gets.
    """
    decay = [p for _, p in named_params if p.dim() >= 2]
    no_decay = [p for _, p in named_params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": opt.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if fused:
        for name, p in named_params:
            if p.device.type not in FUSED_DEVICE_TYPES or not p.is_floating_point():
                raise ValueError(f"kernels.fused_optimizer: parameter {name} is {p.dtype} on {p.device.type}; "
                                 f"the fused AdamW runs on floating-point tensors on {'/'.join(FUSED_DEVICE_TYPES)}")
    return torch.optim.AdamW(groups, lr=lr, betas=(opt.beta1, opt.beta2), fused=fused or None)


def lr_at(step: int, train: TrainSection, total_steps: int) -> float:
    """LR for a step (0-based): linear warmup to ``lr``, then cosine down to ``lr * min_lr_ratio``."""
    peak, floor = train.lr, train.lr * train.min_lr_ratio
    warmup = min(train.warmup_steps, max(total_steps - 1, 0))
    if step < warmup:
        return peak * (step + 1) / warmup
    span = max(total_steps - warmup, 1)
    progress = min(max((step - warmup) / span, 0.0), 1.0)
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
