"""Mixed precision: autocast for compute, a storage dtype for parameters, fp32 master weights.

When parameters are stored below fp32 the optimizer never steps on them directly:
it updates fp32 master copies, and the stored parameters are refreshed from them
after every step, so small updates are not rounded away.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from gpu_runtime.capability import TORCH_DTYPES
from gpu_runtime.schema import PrecisionSection


def autocast(device: torch.device, compute_dtype: str) -> contextlib.AbstractContextManager:
    """torch.autocast for bf16/fp16 compute; nothing for fp32."""
    if compute_dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=TORCH_DTYPES[compute_dtype])


def cast_storage(model: nn.Module, storage_dtype: str) -> None:
    """Store floating-point parameters in the storage dtype; buffers (RoPE tables) stay fp32."""
    dtype = TORCH_DTYPES[storage_dtype]
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)


class MasterWeights:
    """fp32 copies of the trainable parameters,
    which the optimizer owns when storage is below fp32."""

    def __init__(self, named_params: list[tuple[str, nn.Parameter]]):
        self.pairs = [
            (name, p, p.detach().float().clone().requires_grad_(True)) for name, p in named_params
        ]

    def named_masters(self) -> Iterator[tuple[str, torch.Tensor]]:
        return ((name, master) for name, _, master in self.pairs)

    def grads_to_masters(self) -> None:
        for _, p, master in self.pairs:
            master.grad = None if p.grad is None else p.grad.float()
            p.grad = None

    @torch.no_grad()
    def masters_to_model(self) -> None:
        for _, p, master in self.pairs:
            p.copy_(master)

    def state(self) -> list[torch.Tensor]:
        return [master.detach() for _, _, master in self.pairs]

    @torch.no_grad()
    def load_state(self, tensors: list[torch.Tensor]) -> None:
        if len(tensors) != len(self.pairs):
            raise ValueError(
                f"checkpoint has {len(tensors)} master weights, the model {len(self.pairs)}"
            )
        for (_, _, master), saved in zip(self.pairs, tensors, strict=True):
            master.copy_(saved)
        self.masters_to_model()


class Precision:
    """The precision policy of one run: autocast, storage, masters and loss scaling."""

    def __init__(self, section: PrecisionSection, device: torch.device):
        self.section, self.device = section, device
        self.needs_masters = section.storage_dtype != "fp32"
        # fp16 has too little range for small gradients: scale the loss, skip steps that overflow.
        self.scaler = torch.amp.GradScaler(
            device.type, enabled=section.compute_dtype == "fp16" or section.storage_dtype == "fp16"
        )
        self.masters: MasterWeights | None = None

    def prepare(self, model: nn.Module) -> list[tuple[str, torch.Tensor]]:
        """Cast the model to its storage dtype;
        return the (name, tensor) pairs the optimizer steps on."""
        cast_storage(model, self.section.storage_dtype)
        trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not self.needs_masters:
            return trainable
        self.masters = MasterWeights(trainable)
        return list(self.masters.named_masters())

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.section.compute_dtype)
