"""Triton forward of RMSNorm fused into the Q/K/V projections (CUDA only; imported lazily).

RMSNorm scales each row by one number, so norm(x) @ W.T == rstd * ((x * g) @ W.T):
the kernel folds the norm weight into the A tile as it loads it, accumulates the
row's sum of squares from the same tiles, and applies rstd in the epilogue. The
normalised activations are never written to memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_matmul_kernel(
    x_ptr,
    g_ptr,
    w_ptr,
    out_ptr,
    rstd_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    WRITE_RSTD: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sumsq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + rows[:, None] * stride_xm + ks[None, :],
            mask=(rows[:, None] < M) & (ks[None, :] < K),
            other=0.0,
        )
        g = tl.load(g_ptr + ks, mask=ks < K, other=0.0)
        xf = x.to(tl.float32)
        sumsq += tl.sum(xf * xf, axis=1)
        xg = (xf * g.to(tl.float32)[None, :]).to(x.dtype)
        w = tl.load(
            w_ptr + cols[None, :] * stride_wn + ks[:, None],
            mask=(cols[None, :] < N) & (ks[:, None] < K),
            other=0.0,
        )
        if IEEE_FP32:
            # TF32 would cost ~1e-3 relative error; the fp32 contract is 1e-4.
            acc += tl.dot(xg, w, input_precision="ieee")
        else:
            acc += tl.dot(xg, w)
    rstd = 1.0 / tl.sqrt(sumsq / K + eps)
    out = acc * rstd[:, None]
    tl.store(
        out_ptr + rows[:, None] * stride_om + cols[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=(rows[:, None] < M) & (cols[None, :] < N),
    )
    if WRITE_RSTD:
        if pid_n == 0:
            tl.store(rstd_ptr + rows, rstd, mask=rows < M)


def rmsnorm_qkv_forward(
    x2d: torch.Tensor, norm_weight: torch.Tensor, weights: tuple[torch.Tensor, ...], eps: float
) -> tuple[torch.Tensor, ...]:
    """(x2d [M, K], g [K], (W [N_i, K], ...)) -> (*outputs [M, N_i], rstd [M] fp32)."""
    m, k = x2d.shape
    fp32 = x2d.dtype == torch.float32
    block_m = 16 if m <= 16 else (32 if fp32 else 64)
    block_n, block_k = (64, 32) if fp32 else (128, 64)
    rstd = torch.empty(m, device=x2d.device, dtype=torch.float32)
    outputs = []
    for index, w in enumerate(weights):
        n = w.shape[0]
        out = torch.empty((m, n), device=x2d.device, dtype=x2d.dtype)
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
        _rmsnorm_matmul_kernel[grid](
            x2d,
            norm_weight,
            w,
            out,
            rstd,
            m,
            n,
            k,
            x2d.stride(0),
            w.stride(0),
            out.stride(0),
            eps,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            IEEE_FP32=fp32,
            WRITE_RSTD=index == 0,
            num_warps=4 if fp32 else 8,
            num_stages=3,
        )
        outputs.append(out)
    return (*outputs, rstd)
