"""int8 weight quantization with LoRA adapters (`precision.quantization`), QLoRA-style.

The Linear layers named in `target_modules` (matched on the last part of the module
name, e.g. `q_proj`) get a frozen int8 weight (symmetric, one scale per output
channel) and trainable low-rank adapters: y = x W_int8^T s + (alpha/r) x A^T B^T.
bitsandbytes' Linear8bitLt is used on CUDA when it is installed, a pure-PyTorch
weight-only path everywhere else. The backward saves the int8 weight, never a
dequantised copy, so training keeps the memory the quantization saved.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

_KEY = "precision.quantization"
BACKENDS = ("auto", "torch", "bitsandbytes")


class QuantizationError(ValueError):
    """A quantization request that cannot be honoured; names the key and the reason."""


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: weight ~ q * scale[:, None], q in [-127, 127]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


class _Int8Matmul(torch.autograd.Function):
    """x @ (q * s)^T that saves q and s for the backward, not the dequantised weight."""

    @staticmethod
    def forward(ctx, x, q, scale):
        ctx.save_for_backward(q, scale)
        return x @ (q.to(x.dtype) * scale.to(x.dtype)[:, None]).t()

    @staticmethod
    def backward(ctx, grad_out):
        q, scale = ctx.saved_tensors
        grad_x = grad_out @ (q.to(grad_out.dtype) * scale.to(grad_out.dtype)[:, None])
        return grad_x, None, None


class Int8WeightOnlyLinear(nn.Module):
    """Frozen linear layer whose weight is int8 with fp32 per-channel scales (all buffers)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = quantize_int8(linear.weight)
        self.register_buffer("weight_int8", q)
        self.register_buffer("weight_scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_type = x.device.type
        if torch.is_autocast_enabled(device_type):
            x = x.to(torch.get_autocast_dtype(device_type))
        with torch.autocast(device_type, enabled=False):
            out = _Int8Matmul.apply(x, self.weight_int8, self.weight_scale)
            return out if self.bias is None else out + self.bias.to(out.dtype)

    def dequantized_weight(self) -> torch.Tensor:
        return self.weight_int8.float() * self.weight_scale[:, None]

    @property
    def weight_bytes(self) -> int:
        return self.weight_int8.nbytes + self.weight_scale.nbytes


def _bitsandbytes_linear(linear: nn.Linear) -> nn.Module:
    """bitsandbytes' int8 layer; its weight is quantised when it is moved to the GPU."""
    import bitsandbytes as bnb

    layer = bnb.nn.Linear8bitLt(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        has_fp16_weights=False,
        threshold=6.0,
    )
    layer.weight = bnb.nn.Int8Params(
        linear.weight.detach().to("cpu", torch.float16), requires_grad=False, has_fp16_weights=False
    )
    if linear.bias is not None:
        layer.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
    return layer.to(linear.weight.device)


class LoraInt8Linear(nn.Module):
    """Frozen int8 base layer plus trainable adapters A [r, in] and B [out, r] (B starts at 0)."""

    def __init__(self, linear: nn.Linear, *, rank: int, alpha: float, backend: str):
        super().__init__()
        self.backend = backend
        self.base = (
            _bitsandbytes_linear(linear)
            if backend == "bitsandbytes"
            else Int8WeightOnlyLinear(linear)
        )
        factory = {"device": linear.weight.device, "dtype": linear.weight.dtype}
        self.lora_a = nn.Parameter(torch.empty(rank, linear.in_features, **factory))
        self.lora_b = nn.Parameter(torch.zeros(linear.out_features, rank, **factory))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # as nn.Linear and PEFT's LoRA
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scaling

    @property
    def weight_bytes(self) -> int:
        if isinstance(self.base, Int8WeightOnlyLinear):
            return self.base.weight_bytes
        weight = self.base.weight  # bitsandbytes: int8 data plus its row scales
        scales = getattr(weight, "SCB", None)
        return weight.nbytes + (scales.nbytes if scales is not None else 0)


@dataclass(frozen=True)
class QuantizationReport:
    """What quantization did; bytes are the targeted weights only (biases and scales noted)."""

    modules: list[str]
    backend: str
    weight_bytes_before: int
    weight_bytes_after: int  # int8 values + per-channel scales
    adapter_bytes: int

    @property
    def weight_bytes_saved(self) -> int:
        return self.weight_bytes_before - self.weight_bytes_after


def _pick_backend(backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise QuantizationError(f"{_KEY}: backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "auto":
        usable = device.type == "cuda" and importlib.util.find_spec("bitsandbytes") is not None
        return "bitsandbytes" if usable else "torch"
    return backend


def quantize_for_lora(
    model: nn.Module,
    *,
    target_modules: list[str],
    weight_bits: int = 8,
    lora_rank: int = 8,
    lora_alpha: float = 16.0,
    full_finetune: bool = False,
    backend: str = "auto",
) -> QuantizationReport:
    """Swap the targeted nn.Linear layers for frozen int8 + LoRA; build the optimizer afterwards."""
    if weight_bits != 8:
        raise QuantizationError(
            f"{_KEY}.weight_bits: {weight_bits} is not supported; only 8 (int8)"
        )
    if lora_rank < 1:
        raise QuantizationError(
            f"{_KEY}.lora_rank must be >= 1, got {lora_rank}: the adapters are "
            "the only trainable part of a quantized layer"
        )
    matches = [
        (n, m)
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in target_modules
    ]
    unmatched = sorted(set(target_modules) - {n.rsplit(".", 1)[-1] for n, _ in matches})
    if unmatched:
        raise QuantizationError(
            f"{_KEY}.target_modules: no nn.Linear named {unmatched} in the model"
        )
    names = [n for n, _ in matches]
    if full_finetune:
        raise QuantizationError(
            f"{_KEY}: full fine-tuning of quantized modules {names} is not possible: "
            "their weights are "
            "frozen int8 and only the LoRA adapters train; drop them from target_modules or turn "
            "quantization off to train them fully"
        )
    chosen = _pick_backend(backend, matches[0][1].weight.device)
    before = after = adapters = 0
    for name, linear in matches:
        before += linear.weight.nbytes
        layer = LoraInt8Linear(linear, rank=lora_rank, alpha=lora_alpha, backend=chosen)
        after += layer.weight_bytes
        adapters += layer.lora_a.nbytes + layer.lora_b.nbytes
        parent_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, leaf, layer)
    return QuantizationReport(names, chosen, before, after, adapters)
