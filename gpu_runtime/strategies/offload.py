"""Offloading (`offload.embedding`, `offload.mmap`).

`cpu`: the embedding table lives in host memory, and so does its optimizer state
(give each device's parameters their own optimizer, `parameters_by_device`). Rows
are gathered on the CPU and only the gathered rows cross to the device, through
pinned memory without blocking; their gradient comes back the same way.
`mmap`: persisted tensors are mapped from the file instead of read into memory; the
mapping is private, so training may write to them without touching the file.
"""

from __future__ import annotations

import os
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn

TARGETS = ("none", "cpu", "npu")
_CPU = torch.device("cpu")


class OffloadError(ValueError):
    """An offload request this runtime cannot carry out; names the key and the reason."""


class _RowsToDevice(torch.autograd.Function):
    """Gathered CPU rows -> device via pinned memory, non-blocking; gradient back to the CPU."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, device: torch.device) -> torch.Tensor:
        if device.type == "cpu":
            return rows.view_as(rows)
        # the caching host allocator keeps the pinned block alive until the copy has run
        return rows.pin_memory().to(device, non_blocking=True)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(_CPU), None


class CpuOffloadedEmbedding(nn.Module):
    """nn.Embedding whose table stays on the CPU whatever device the model is moved to."""

    def __init__(
        self,
        weight: torch.Tensor,
        *,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
    ):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().to(_CPU))
        self.num_embeddings, self.embedding_dim = self.weight.shape
        self.padding_idx = padding_idx
        self.max_norm, self.norm_type, self.scale_grad_by_freq = (
            max_norm,
            norm_type,
            scale_grad_by_freq,
        )
        # where the rest of the model runs; learnt from model.to(...), else the ids' device
        self.output_device: torch.device | None = None

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding) -> CpuOffloadedEmbedding:
        return cls(
            embedding.weight,
            padding_idx=embedding.padding_idx,
            max_norm=embedding.max_norm,
            norm_type=embedding.norm_type,
            scale_grad_by_freq=embedding.scale_grad_by_freq,
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(
            ids.to(_CPU),
            self.weight,
            self.padding_idx,
            self.max_norm,
            self.norm_type,
            self.scale_grad_by_freq,
        )
        return _RowsToDevice.apply(rows, self.output_device or ids.device)

    def _apply(self, fn, recurse=True):
        # model.to(device) must not drag the table along: remember the device, apply a dtype change
        probe = fn(torch.empty(0, dtype=self.weight.dtype))
        if probe.device != _CPU:
            self.output_device = probe.device
        elif _moves_tensors(fn):
            self.output_device = _CPU
        if probe.dtype != self.weight.dtype:
            self.weight.data = self.weight.data.to(probe.dtype)
            if self.weight.grad is not None:
                self.weight.grad = self.weight.grad.to(probe.dtype)
        return self

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, table on cpu"


def _moves_tensors(fn) -> bool:
    """Tells .cpu() from a cast such as .float(): only a move fails on a meta tensor."""
    try:
        fn(torch.empty(0, device="meta"))
    except NotImplementedError:
        return True
    return False


def offload_embeddings(
    model: nn.Module, *, target: str, names: list[str] | None = None
) -> list[str]:
    """Replace the model's nn.Embedding modules (or those in `names`) per `offload.embedding`.

    Call before the optimizer is built: the table becomes a new Parameter. Returns the
    names of the modules replaced.
    """
    if target not in TARGETS:
        raise OffloadError(f"offload.embedding: {target!r} is not one of {', '.join(TARGETS)}")
    if target == "npu":
        raise OffloadError(
            "offload.embedding: 'npu' is not available: no NPU backend exists in this "
            "runtime; use 'cpu' or 'none'"
        )
    if target == "none":
        return []
    chosen = [
        (n, m)
        for n, m in model.named_modules()
        if isinstance(m, nn.Embedding) and (names is None or n in names)
    ]
    if names is not None and len(chosen) != len(names):
        missing = sorted(set(names) - {n for n, _ in chosen})
        raise OffloadError(f"offload.embedding: no nn.Embedding named {missing}")
    if not chosen:
        raise OffloadError("offload.embedding: cpu was asked for but the model has no nn.Embedding")
    for name, embedding in chosen:
        tied = [
            p
            for p, t in model.named_parameters(remove_duplicate=False)
            if t is embedding.weight and p != f"{name}.weight"
        ]
        if tied:
            raise OffloadError(
                f"offload.embedding: the table of {name!r} is tied to {tied}; moving it to "
                "the CPU would move that computation too: untie it or use 'none'"
            )
        _set_submodule(model, name, CpuOffloadedEmbedding.from_embedding(embedding))
    return [name for name, _ in chosen]


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, leaf, module)


def parameters_by_device(model: nn.Module) -> dict[torch.device, list[nn.Parameter]]:
    """Trainable parameters grouped by device: one optimizer each keeps its state beside them."""
    groups: dict[torch.device, list[nn.Parameter]] = defaultdict(list)
    for param in model.parameters():
        if param.requires_grad:
            groups[param.device].append(param)
    return dict(groups)


def save_tensors(tensors: dict, path: str | os.PathLike) -> None:
    """torch.save in the zip format that mmap loading needs."""
    torch.save(tensors, path)


def load_tensors(path: str | os.PathLike, *, mmap: bool) -> dict:
    """Load persisted tensors to the CPU, memory-mapped from the file when `mmap` (offload.mmap)."""
    return torch.load(path, map_location=_CPU, mmap=mmap, weights_only=True)


def embedding_from_file(
    path: str | os.PathLike, key: str, *, mmap: bool, padding_idx: int | None = None
) -> CpuOffloadedEmbedding:
    """A CPU embedding whose table is read from `path[key]`: pages come in as rows are used."""
    tensors = load_tensors(path, mmap=mmap)
    if key not in tensors:
        raise OffloadError(f"offload: {os.fspath(path)!r} holds no tensor {key!r}")
    return CpuOffloadedEmbedding(tensors[key], padding_idx=padding_idx)
