"""AdamW with decay on matrices only, and a linear-warmup cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch

from gpu_runtime.errors import StrategyError
from gpu_runtime.schema import OptimizerSection, TrainSection

FUSED_DEVICE_TYPES = ("cuda", "cpu")
# Settings of how AdamW runs, not of what it computes: the strategy decides them, not a checkpoint.
IMPLEMENTATION_KEYS = ("fused", "foreach", "capturable", "differentiable")


def build_adamw(
    named_params: list[tuple[str, torch.Tensor]],
    opt: OptimizerSection,
    lr: float,
    *,
    fused: bool = False,
) -> torch.optim.AdamW:
    """AdamW; norms and other 1-D parameters are not decayed (as in LLaMA and nanoGPT).

    ``fused`` (`kernels.fused_optimizer`): PyTorch's fused kernel, one pass over each
    parameter, its gradient and both moments. Off, PyTorch picks its default (a loop over
    tensors on CPU, foreach on CUDA): what a plain PyTorch script gets.
    """
    decay = [p for _, p in named_params if p.dim() >= 2]
    no_decay = [p for _, p in named_params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": opt.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if fused:
        _check_fusable(named_params)
    return torch.optim.AdamW(groups, lr=lr, betas=(opt.beta1, opt.beta2), fused=fused or None)


def _check_fusable(named_params: list[tuple[str, torch.Tensor]]) -> None:
    device_types = {p.device.type for _, p in named_params}
    if len(device_types) > 1:
        # With loss scaling, the fused kernel hands the overflow flag between devices without
        # a sync: the CPU half could step on a stale flag. Refused rather than risked.
        raise StrategyError.single(
            "kernels.fused_optimizer",
            (
                f"parameters live on {' and '.join(sorted(device_types))} "
                "(offload.embedding: cpu); the fused AdamW "
                "steps one device's tensors: turn one of the two off"
            ),
        )
    for name, p in named_params:
        if p.device.type not in FUSED_DEVICE_TYPES or not p.is_floating_point():
            raise StrategyError.single(
                "kernels.fused_optimizer",
                (
                    f"parameter {name} is {p.dtype} on {p.device.type}; "
                    "the fused AdamW steps floating-point "
                    f"tensors on {'/'.join(FUSED_DEVICE_TYPES)}"
                ),
            )


def lr_at(step: int, train: TrainSection, total_steps: int) -> float:
    """LR for a step (0-based): linear warmup to ``lr``, then cosine down to
    ``lr * min_lr_ratio``."""
    peak, floor = train.lr, train.lr * train.min_lr_ratio
    warmup = min(train.warmup_steps, max(total_steps - 1, 0))
    if step < warmup:
        return peak * (step + 1) / warmup
    span = max(total_steps - warmup, 1)
    progress = min(max((step - warmup) / span, 0.0), 1.0)
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Load a checkpoint's optimizer state, keeping this run's implementation (fused or not).

    ``load_state_dict`` would take ``fused`` from the checkpoint's groups, so a run resumed
    with `kernels.fused_optimizer` switched would silently step as the checkpoint did; and
    the state is placed (the ``step`` counters) according to the settings in force.
    """
    # a different group count is load_state_dict's error to raise
    for group, mine in zip(saved["param_groups"], optimizer.param_groups, strict=False):
        group.update({k: mine[k] for k in IMPLEMENTATION_KEYS if k in mine})
    optimizer.load_state_dict(saved)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
