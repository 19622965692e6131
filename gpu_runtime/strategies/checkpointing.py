"""Gradient checkpointing (`memory.gradient_checkpointing`) and the peak memory it saves.

Blocks 0, n, 2n, ... keep only their inputs in the forward and run again in the
backward (torch.utils.checkpoint, non-reentrant). The block's forward is replaced on
the instance rather than the block wrapped in another module, so parameter names and
checkpoints stay the same with the strategy on or off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

_KEY = "memory.gradient_checkpointing.every_n_blocks"


class _CheckpointedForward:
    """Instance forward that runs the class's forward under checkpoint while grads are on."""

    def __init__(self, block: nn.Module):
        self.block = block  # a plain attribute: deepcopy and pickle follow it to the copy

    def __call__(self, *args, **kwargs):
        forward = type(self.block).forward
        if torch.is_grad_enabled():
            return checkpoint(forward, self.block, *args, use_reentrant=False, **kwargs)
        return forward(self.block, *args, **kwargs)


def is_checkpointed(block: nn.Module) -> bool:
    return isinstance(block.__dict__.get("forward"), _CheckpointedForward)


def apply_gradient_checkpointing(blocks: Sequence[nn.Module], *, every_n_blocks: int) -> list[int]:
    """Checkpoint every `every_n_blocks`-th block (indices 0, n, 2n, ...); returns their indices."""
    if every_n_blocks < 1:
        raise ValueError(f"{_KEY} must be >= 1, got {every_n_blocks}")
    chosen = list(range(0, len(blocks), every_n_blocks))
    for index in chosen:
        if not is_checkpointed(blocks[index]):
            blocks[index].forward = _CheckpointedForward(blocks[index])
    return chosen


def remove_gradient_checkpointing(blocks: Iterable[nn.Module]) -> None:
    for block in blocks:
        if is_checkpointed(block):
            del block.forward


@dataclass(frozen=True)
class PeakMemory:
    """Bytes a training step adds at its peak; `estimated` when not read from an allocator."""

    bytes: int
    method: str  # cuda_max_memory_allocated | saved_tensor_bytes
    estimated: bool


def measure_peak_memory(
    forward: Callable[[], torch.Tensor],
    *,
    device: torch.device | str,
    exclude: Iterable[torch.Tensor] = (),
) -> PeakMemory:
    """Run forward() and backward on its loss; report the memory the step added at its peak.

    CUDA: max_memory_allocated over the step. Elsewhere an estimate: the bytes of the
    distinct storages autograd saves for the backward (the activations, excluding
    `exclude`, normally the parameters), which is what checkpointing removes; the
    transient of one block's recomputation is not counted.
    """
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        forward().backward()
        torch.cuda.synchronize(device)
        return PeakMemory(
            torch.cuda.max_memory_allocated(device) - base, "cuda_max_memory_allocated", False
        )
    excluded = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in excluded:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = forward()
    saved = sum(storages.values())
    loss.backward()
    return PeakMemory(saved, "saved_tensor_bytes", True)


@dataclass(frozen=True)
class CheckpointingReport:
    without: PeakMemory
    with_checkpointing: PeakMemory
    checkpointed_blocks: list[int]

    @property
    def saved_fraction(self) -> float:
        """Share of the step's peak memory that checkpointing removed."""
        return 1 - self.with_checkpointing.bytes / max(self.without.bytes, 1)


def peak_memory_with_and_without(
    blocks: Sequence[nn.Module],
    forward: Callable[[], torch.Tensor],
    *,
    every_n_blocks: int,
    device: torch.device | str,
    exclude: Iterable[torch.Tensor] = (),
) -> CheckpointingReport:
    """Measure one step without checkpointing, then with it; leaves checkpointing applied."""
    exclude = list(exclude)
    remove_gradient_checkpointing(blocks)
    without = measure_peak_memory(forward, device=device, exclude=exclude)
    chosen = apply_gradient_checkpointing(blocks, every_n_blocks=every_n_blocks)
    with_checkpointing = measure_peak_memory(forward, device=device, exclude=exclude)
    return CheckpointingReport(without, with_checkpointing, chosen)
