import subprocess
import sys

import pytest
import torch

from gpu_runtime.kernels import fused_rmsnorm_qkv, maybe_compile

EPS = 1e-6
TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=0.0), torch.bfloat16: dict(atol=2e-1, rtol=2e-2)}
# (batch, seq, hidden, q_out, kv_out): odd hidden, a single token, GQA-like narrower K/V
SHAPES = [(2, 7, 123, 123, 41), (1, 1, 123, 123, 123), (3, 16, 64, 64, 32)]


def unfused_fp32(x, g, wq, wk, wv):
    normed = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * g
    return normed @ wq.t(), normed @ wk.t(), normed @ wv.t()


def make_inputs(shape, dtype, device="cpu", seed=0):
    b, s, h, nq, nkv = shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, s, h, generator=gen)
    g = 1 + 0.1 * torch.randn(h, generator=gen)
    ws = [torch.randn(n, h, generator=gen) / h**0.5 for n in (nq, nkv, nkv)]
    return [t.to(device=device, dtype=dtype).requires_grad_() for t in (x, g, *ws)]


def check_against_reference(shape, dtype, backend, device="cpu"):
    inputs = make_inputs(shape, dtype, device)
    refs = [t.detach().float().requires_grad_() for t in inputs]
    out = fused_rmsnorm_qkv(*inputs, EPS, backend=backend)
    ref = unfused_fp32(*refs)
    upstream = [
        torch.randn(r.shape, generator=torch.Generator().manual_seed(1)).to(device) for r in ref
    ]
    sum((o.float() * u).sum() for o, u in zip(out, upstream, strict=True)).backward()
    sum((r * u).sum() for r, u in zip(ref, upstream, strict=True)).backward()
    for name, got, want in zip("qkv", out, ref, strict=True):
        assert got.dtype == dtype
        torch.testing.assert_close(got.float(), want, **TOLERANCE[dtype], msg=f"output {name}")
    for name, tensor, ref_tensor in zip(
        ("x", "norm_weight", "wq", "wk", "wv"), inputs, refs, strict=True
    ):
        assert tensor.grad is not None, f"no gradient for {name}"
        torch.testing.assert_close(
            tensor.grad.float(), ref_tensor.grad, **TOLERANCE[dtype], msg=f"gradient of {name}"
        )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_path_matches_fp32_unfused(shape, dtype):
    check_against_reference(shape, dtype, "reference")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_autograd_function_backward_matches_fp32_unfused(shape, dtype):
    # the same Function and backward the Triton path uses, with its PyTorch forward
    check_against_reference(shape, dtype, "function")


def test_a_wrong_weight_is_caught_by_the_tolerance():
    inputs = make_inputs(SHAPES[0], torch.float32)
    q, _, _ = fused_rmsnorm_qkv(*inputs, EPS, backend="function")
    with torch.no_grad():
        inputs[2][0, 0] += 1e-3
    q_ref, _, _ = unfused_fp32(*inputs)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(q, q_ref, **TOLERANCE[torch.float32])


def test_autocast_runs_the_fused_path_in_bf16():
    inputs = make_inputs(SHAPES[0], torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = fused_rmsnorm_qkv(*inputs, EPS, backend="function")
    assert q.dtype == k.dtype == v.dtype == torch.bfloat16
    q.float().sum().backward()
    assert inputs[0].grad.dtype == torch.float32 and inputs[2].grad.dtype == torch.float32


@pytest.mark.slow
def test_cpu_auto_backend_never_imports_triton():
    code = (
        "import sys, torch; from gpu_runtime.kernels import fused_rmsnorm_qkv;"
        "x = torch.randn(2, 8); w = torch.randn(8, 8);"
        "fused_rmsnorm_qkv(x, torch.ones(8), w, w, w);"
        "assert 'triton' not in sys.modules, 'triton imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_unknown_backend_names_the_key():
    with pytest.raises(ValueError, match="kernels.fused_rmsnorm_qkv"):
        fused_rmsnorm_qkv(*make_inputs(SHAPES[0], torch.float32), backend="cutlass")


def test_compile_flag_off_returns_the_model_itself():
    model = torch.nn.Linear(2, 2)
    assert maybe_compile(model, enabled=False) is model


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", SHAPES + [(4, 256, 512, 512, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernel_matches_fp32_unfused(shape, dtype):
    pytest.importorskip("triton")
    check_against_reference(shape, dtype, "triton", device="cuda")
