"""Fused kernels; Triton is imported only on CUDA hosts that have it."""

from __future__ import annotations

import torch

from gpu_runtime.kernels.rmsnorm_qkv import (
    fused_rmsnorm_qkv,
    rmsnorm_qkv_reference,
    triton_available,
)

__all__ = ["fused_rmsnorm_qkv", "maybe_compile", "rmsnorm_qkv_reference", "triton_available"]


def maybe_compile(model: torch.nn.Module, *, enabled: bool) -> torch.nn.Module:
    """`kernels.compile`: wrap the model in torch.compile, or return it untouched."""
    return torch.compile(model) if enabled else model
