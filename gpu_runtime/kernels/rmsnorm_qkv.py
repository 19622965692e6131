"""RMSNorm followed by the Q, K and V projections, fused where a kernel exists.

`fused_rmsnorm_qkv` picks the Triton kernel on CUDA (forward fused, backward in
PyTorch through one autograd.Function) and the unfused reference elsewhere.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

BACKENDS = ("auto", "triton", "function", "reference")


@functools.cache
def triton_available() -> bool:
    """True when Triton imports and a CUDA device exists
    (never imports Triton on CPU-only hosts)."""
    if not torch.cuda.is_available():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def rmsnorm_qkv_reference(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    wv: torch.Tensor,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unfused: RMSNorm in fp32, back to x's dtype, times the norm weight,
    then three projections."""
    xf = x.float()
    normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * norm_weight
    return F.linear(normed, wq), F.linear(normed, wk), F.linear(normed, wv)


def _forward_torch(x2d, g, weights, eps):
    """The kernel's math in PyTorch: runs the autograd.Function where Triton does not."""
    xf = x2d.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps)
    xhat = (xf * rstd[:, None] * g.float()).to(x2d.dtype)
    return (*(xhat @ w.t() for w in weights), rstd)


class _FusedRmsNormQkv(torch.autograd.Function):
    """Saves x, the weights and rstd (one fp32 per row), not the normalised activations."""

    @staticmethod
    def forward(ctx, x2d, g, wq, wk, wv, eps, use_triton):
        with torch.autocast(x2d.device.type, enabled=False):
            if use_triton:
                from gpu_runtime.kernels.triton_rmsnorm_qkv import rmsnorm_qkv_forward

                q, k, v, rstd = rmsnorm_qkv_forward(x2d, g, (wq, wk, wv), eps)
            else:
                q, k, v, rstd = _forward_torch(x2d, g, (wq, wk, wv), eps)
        ctx.save_for_backward(x2d, g, wq, wk, wv, rstd)
        return q, k, v

    @staticmethod
    def backward(ctx, dq, dk, dv):
        x2d, g, wq, wk, wv, rstd = ctx.saved_tensors
        dtype = x2d.dtype
        grads = [None] * 7
        with torch.autocast(x2d.device.type, enabled=False):
            xn = x2d.float() * rstd[:, None]
            xhat = (xn * g.float()).to(dtype)
            douts = [d.to(dtype) for d in (dq, dk, dv)]
            for slot, d in zip((2, 3, 4), douts, strict=True):
                if ctx.needs_input_grad[slot]:
                    grads[slot] = d.t() @ xhat
            if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
                dxhat = sum((d @ w).float() for d, w in zip(douts, (wq, wk, wv), strict=True))
                if ctx.needs_input_grad[1]:
                    grads[1] = (dxhat * xn).sum(0).to(g.dtype)
                if ctx.needs_input_grad[0]:
                    dxn = dxhat * g.float()
                    dx = rstd[:, None] * (dxn - xn * (dxn * xn).mean(-1, keepdim=True))
                    grads[0] = dx.to(dtype)
        return tuple(grads)


def fused_rmsnorm_qkv(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    wq: torch.Tensor,
    wk: torch.Tensor,
    wv: torch.Tensor,
    eps: float = 1e-6,
    *,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v = projections of RMSNorm(x); x is [..., hidden], each W is [out, hidden].

    Runs in the autocast dtype when autocast is on (weights cast like autocast would),
    otherwise in x's dtype. backend: auto (Triton on CUDA, else reference), triton,
    function (the autograd.Function with its PyTorch forward), reference.
    """
    if backend not in BACKENDS:
        raise ValueError(
            f"kernels.fused_rmsnorm_qkv: unknown backend {backend!r}; one of {BACKENDS}"
        )
    device_type = x.device.type
    dtype = (
        torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
    )
    if backend == "auto":
        backend = "triton" if x.is_cuda and triton_available() else "reference"
    if backend == "reference":
        with torch.autocast(device_type, enabled=False):
            return rmsnorm_qkv_reference(*(t.to(dtype) for t in (x, norm_weight, wq, wk, wv)), eps)
    lead = x.shape[:-1]
    x2d, g, q_w, k_w, v_w = (
        t.to(dtype).contiguous() for t in (x.reshape(-1, x.shape[-1]), norm_weight, wq, wk, wv)
    )
    q, k, v = _FusedRmsNormQkv.apply(x2d, g, q_w, k_w, v_w, eps, backend == "triton")
    return q.view(*lead, -1), k.view(*lead, -1), v.view(*lead, -1)
