"""The LLaMA-style model: shapes, presets, causality, and the seam for a fused RMSNorm+QKV."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from gpu_runtime.model import (
    PRESETS,
    Attention,
    Block,
    ModelArgs,
    RMSNorm,
    Transformer,
    apply_rope,
    preset_args,
    rope_tables,
)
from gpu_runtime.schema import PRESETS as SCHEMA_PRESETS

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_presets_match_the_schema_and_their_names():
    assert tuple(PRESETS) == SCHEMA_PRESETS
    assert 3.5e6 < PRESETS["tiny"].num_params() < 5e6
    assert 20e6 < PRESETS["small"].num_params() < 30e6
    assert 100e6 < PRESETS["125m"].num_params() < 150e6
    assert 300e6 < PRESETS["350m"].num_params() < 400e6
    assert 0.9e9 < PRESETS["1b"].num_params() < 1.2e9
    seven = PRESETS["7b"]
    assert (seven.dim, seven.n_layers, seven.n_heads, seven.hidden_dim) == (
        4096,
        32,
        32,
        11008,
    )  # LLaMA-7B
    assert 6.3e9 < seven.num_params() < 6.8e9


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_analytic_parameter_count_matches_the_built_model(preset):
    args = preset_args(preset, 64)
    assert _count(Transformer(args)) == args.num_params()


def test_grouped_query_shapes_count_and_run():
    args = ModelArgs(dim=64, n_layers=2, n_heads=8, n_kv_heads=2, hidden_dim=128, max_seq_len=16)
    model = Transformer(args)
    assert _count(model) == args.num_params()
    assert model.blocks[0].attn.k_proj.out_features == 2 * 8
    logits, loss = model(torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16)))
    assert logits.shape == (2, 16, args.vocab_size) and torch.isfinite(loss)


def test_block_layout_is_the_quantization_and_fusion_contract():
    block = Transformer(preset_args("tiny", 16)).blocks[0]
    assert (
        isinstance(block, Block)
        and isinstance(block.attn_norm, RMSNorm)
        and isinstance(block.attn, Attention)
    )
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        proj = getattr(block.attn, name)
        assert isinstance(proj, nn.Linear) and proj.bias is None
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert isinstance(getattr(block.mlp, name), nn.Linear)


def test_future_tokens_do_not_change_past_logits():
    torch.manual_seed(0)
    model = Transformer(preset_args("tiny", 24)).eval()
    idx = torch.randint(0, 256, (1, 24))
    changed = idx.clone()
    changed[0, 12:] = (changed[0, 12:] + 1) % 256
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    assert torch.allclose(a[0, :12], b[0, :12], atol=1e-5)
    assert not torch.allclose(a[0, 12:], b[0, 12:], atol=1e-3)


def test_initial_loss_is_near_uniform_over_the_vocabulary():
    torch.manual_seed(0)
    model = Transformer(preset_args("tiny", 32))
    _, loss = model(torch.randint(0, 256, (4, 32)), torch.randint(0, 256, (4, 32)))
    assert abs(loss.item() - math.log(model.args.vocab_size)) < 0.1


def test_rmsnorm_matches_its_formula():
    norm = RMSNorm(8, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1.0, 9.0))
    x = torch.randn(3, 8)
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-5) * torch.arange(1.0, 9.0)
    assert torch.allclose(norm(x), expected, atol=1e-6)


def test_rope_scores_depend_only_on_relative_position():
    cos, sin = rope_tables(16, 32, 10000.0)
    q, k = torch.randn(16), torch.randn(16)
    q_all = apply_rope(q.expand(1, 1, 32, 16).contiguous(), cos, sin)[0, 0]
    k_all = apply_rope(k.expand(1, 1, 32, 16).contiguous(), cos, sin)[0, 0]
    assert torch.allclose(
        q_all.norm(dim=-1), q.norm().expand(32), atol=1e-5
    )  # a rotation keeps the norm
    assert torch.isclose(q_all[10] @ k_all[7], q_all[25] @ k_all[22], atol=1e-4)
    assert not torch.isclose(q_all[10] @ k_all[7], q_all[10] @ k_all[3], atol=1e-4)


def test_norm_qkv_is_the_one_place_a_fused_kernel_plugs_in():
    torch.manual_seed(0)
    model = Transformer(preset_args("tiny", 16)).eval()
    idx = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        reference, _ = model(idx)
    calls = []

    def recording_qkv(x, norm, attn):
        calls.append(x.shape)
        h = norm(x)
        return attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)

    for block in model.blocks:
        block.attn.qkv_fn = recording_qkv
    with torch.no_grad():
        same, _ = model(idx)
    assert len(calls) == model.args.n_layers
    assert torch.allclose(same, reference, atol=1e-6)

    def zero_qkv(x, norm, attn):
        h = norm(x)
        return attn.q_proj(h), attn.k_proj(h), torch.zeros_like(attn.v_proj(h))

    for block in model.blocks:
        block.attn.qkv_fn = zero_qkv
    with torch.no_grad():
        different, _ = model(idx)
    assert not torch.allclose(different, reference, atol=1e-3)


def test_flops_per_token_is_6n_plus_12_l_d_t():
    args = preset_args("tiny", 128)
    model = Transformer(args)
    n = _count(model) - model.tok_embeddings.weight.numel()  # the lookup table does no matmul
    assert args.flops_per_token(128) == 6 * n + 12 * 4 * 256 * 128


def _document_mask(lengths: list[int]) -> torch.Tensor:
    """(1, 1, T, T): causal within each of the consecutive documents of ``lengths``."""
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    T = doc.numel()
    return ((doc[:, None] == doc[None, :]) & torch.ones(T, T, dtype=torch.bool).tril())[None, None]


@pytest.mark.parametrize(
    ("heads", "kv_heads", "lengths"),
    [(4, 4, [7, 13, 5]), (6, 2, [1, 11, 9, 2]), (3, 3, None)],
    ids=["documents", "grouped-query", "causal"],
)
def test_math_attention_matches_sdpa_on_output_and_gradients(heads, kv_heads, lengths):
    """kernels.attention: math is SDPA's result (fp32, atol 1e-5) for a document mask, grouped
    kv heads and plain causal rows, on the output and on the q, k and v gradients."""
    from gpu_runtime.model import math_attention

    torch.manual_seed(0)
    T, hd = 25 if lengths is None else sum(lengths), 16
    q = torch.randn(2, heads, T, hd, requires_grad=True)
    k, v = (torch.randn(2, kv_heads, T, hd, requires_grad=True) for _ in range(2))
    mask = None if lengths is None else _document_mask(lengths).expand(2, 1, T, T)
    grad = torch.randn(2, heads, T, hd)
    ours = math_attention(q, k, v, mask)
    ours_grads = torch.autograd.grad(ours, (q, k, v), grad)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=kv_heads != heads
    )
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    assert (ours - ref).abs().max().item() < 1e-5
    for mine, theirs in zip(ours_grads, ref_grads, strict=True):
        assert (mine - theirs).abs().max().item() < 1e-5
    if lengths is not None:  # the mask acts: the first document's tokens see nothing after it
        leaky = math_attention(q, k, v, torch.ones_like(mask).tril())
        assert (leaky[:, :, lengths[0] :] - ours[:, :, lengths[0] :]).abs().max() > 1e-3


def test_a_model_attending_with_math_gives_sdpas_logits_and_loss():
    torch.manual_seed(0)
    model = Transformer(preset_args("tiny", 32)).eval()
    idx = torch.randint(0, 250, (2, 32))
    idx[:, [9, 20]] = 257  # EOS: three documents a row
    model.document_end = 257
    with torch.no_grad():
        sdpa_logits, sdpa_loss = model(idx, idx)
        for block in model.blocks:
            block.attn.attention = "math"
        math_logits, math_loss = model(idx, idx)
    assert (math_logits - sdpa_logits).abs().max().item() < 1e-4
    assert abs(math_loss.item() - sdpa_loss.item()) < 1e-5
