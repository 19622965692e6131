"""A LLaMA-style decoder: RMSNorm, rotary embeddings, SwiGLU, SDPA attention.

Only the model lives here (nanoGPT's rule): a dataclass of shapes, the modules, and
the parameter and FLOP counts that follow from the shapes. No I/O, no loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

BYTE_VOCAB = 256
BOS, EOS, PAD = 256, 257, 258
VOCAB_SIZE = 320  # 256 bytes + 3 specials, padded to a multiple of 64 for tensor-core shapes


@dataclass(frozen=True)
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    hidden_dim: int
    n_kv_heads: int | None = None  # None: multi-head; fewer than n_heads: grouped-query attention
    vocab_size: int = VOCAB_SIZE
    max_seq_len: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # Loaded Hugging Face checkpoints (gpu_runtime.hf) need these; the defaults are costlab's own.
    head_dim_override: int | None = None  # config.json head_dim when it is not dim // n_heads
    qkv_bias: bool = False  # q/k/v projections with a bias (qwen2); o_proj never has one
    tie_embeddings: bool = False  # the output head is the embedding table
    # interleaved: rotate pairs (x[2i], x[2i+1]), costlab's own; half: rotate (x[i], x[i+hd/2]),
    # Hugging Face's rotate_half, so a checkpoint's q/k weights map by name without a permutation
    rope_style: Literal["interleaved", "half"] = "interleaved"

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    def num_params(self, *, embedding: bool = True) -> int:
        """Parameter count from the shapes alone (a 7B model need not be built to be counted).

        ``embedding=False`` leaves out the lookup table, which does no matmul. A tied table is
        also the output head, which does: it is counted once, as the head, either way
        (nanoGPT's rule), so tied ``num_params(embedding=False) == num_params()``.
        """
        d, q, kv = self.dim, self.n_heads * self.head_dim, self.kv_heads * self.head_dim
        attn = d * q + 2 * d * kv + q * d + ((q + 2 * kv) if self.qkv_bias else 0)
        mlp = 3 * d * self.hidden_dim
        per_block = attn + mlp + 2 * d
        total = (
            self.n_layers * per_block + d + self.vocab_size * d
        )  # blocks, final norm, output head
        return total + (self.vocab_size * d if embedding and not self.tie_embeddings else 0)

    def flops_per_token(self, seq_len: int, trainable: int | None = None) -> int:
        """Training FLOPs per token: 6N + 12*L*d*T (PaLM, appendix B),
        N without the embedding table (``num_params(embedding=False)``).

        With ``trainable`` (how many of those N parameters take gradients: LoRA adapters,
        a frozen base) the backward computes weight gradients for those only.
        """
        return training_flops_per_token(
            self.num_params(embedding=False),
            n_layers=self.n_layers,
            dim=self.dim,
            seq_len=seq_len,
            trainable=trainable,
        )


def training_flops_per_token(
    n: int, *, n_layers: int, dim: int, seq_len: int, trainable: int | None = None
) -> int:
    """2N forward + 2N activation gradients + 2*trainable weight gradients + 12*L*d*T attention.

    N: the parameters that do a matmul per token (no lookup tables); trainable None: all N,
    which is 6N + 12*L*d*T.
    """
    weight_grads = n if trainable is None else trainable
    return 4 * n + 2 * weight_grads + 12 * n_layers * dim * seq_len


PRESETS: dict[str, ModelArgs] = {
    "tiny": ModelArgs(dim=256, n_layers=4, n_heads=4, hidden_dim=1024),
    "small": ModelArgs(dim=512, n_layers=8, n_heads=8, hidden_dim=1408),
    "125m": ModelArgs(dim=768, n_layers=12, n_heads=12, hidden_dim=3584),
    "350m": ModelArgs(dim=1024, n_layers=24, n_heads=16, hidden_dim=3328),
    "1b": ModelArgs(
        dim=2048, n_layers=22, n_heads=32, n_kv_heads=4, hidden_dim=5632
    ),  # TinyLlama-1.1B shapes
    "7b": ModelArgs(dim=4096, n_layers=32, n_heads=32, hidden_dim=11008),  # LLaMA-7B shapes
}


def preset_args(preset: str, seq_len: int) -> ModelArgs:
    base = PRESETS[preset]
    return ModelArgs(**{**base.__dict__, "max_seq_len": seq_len})


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 whatever the storage dtype; half-precision sums of squares overflow.
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    style: Literal["interleaved", "half"] = "interleaved",
) -> torch.Tensor:
    """Rotate x (B, H, T, hd) by the position's angles, in fp32.

    interleaved: pairs (x[2i], x[2i+1]); half: pairs (x[i], x[i + hd/2]), Hugging Face's
    rotate_half layout. The same rotation, with the features in a different order.
    ``cos``/``sin`` are the tables (max_seq_len, hd/2), the first T rows used, or per-row
    angles (B, 1, T, hd/2) when positions restart inside a row (packed documents).
    """
    if cos.dim() == 2:
        cos, sin = cos[: x.shape[-2]], sin[: x.shape[-2]]
    if style == "half":
        x0, x1 = x.float().chunk(2, dim=-1)
        return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).type_as(x)
    xf = x.float().unflatten(-1, (-1, 2))
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).type_as(x)


AttentionImpl = Literal["sdpa", "math"]


def math_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """Softmax(q k^T / sqrt(hd)) v as two matmuls and an fp32 softmax (`kernels.attention: math`).

    q (B, H, T, hd), k/v (B, H_kv, T, hd); mask (B, 1, T, T) True where a query may attend,
    None: causal. What SDPA computes; on a CPU with short rows it is the faster of the two
    (ATen's flash kernel pays its blocking overhead on every call)."""
    if k.shape[1] != q.shape[1]:  # grouped-query attention: each kv head serves H / H_kv queries
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5)
    if mask is None:
        T = q.shape[-2]
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1).to(v.dtype)
    return torch.matmul(probs, v)


QkvFn = Callable[
    [torch.Tensor, RMSNorm, "Attention"], tuple[torch.Tensor, torch.Tensor, torch.Tensor]
]


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.kv_heads, args.head_dim
        self.rope_style = args.rope_style
        bias = args.qkv_bias
        self.q_proj = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=bias)
        self.k_proj = nn.Linear(args.dim, self.n_kv_heads * args.head_dim, bias=bias)
        self.v_proj = nn.Linear(args.dim, self.n_kv_heads * args.head_dim, bias=bias)
        self.o_proj = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        # A fused RMSNorm+QKV implementation (x, norm, attn) -> (q, k, v) may be installed here.
        self.qkv_fn: QkvFn | None = None
        self.attention: AttentionImpl = "sdpa"  # kernels.attention

    def norm_qkv(
        self, x: torch.Tensor, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of norm(x), each (B, T, features): the one place a fused kernel replaces."""
        if self.qkv_fn is not None:
            return self.qkv_fn(x, norm, self)
        h = norm(x)
        return self.q_proj(h), self.k_proj(h), self.v_proj(h)

    def forward(
        self,
        x: torch.Tensor,
        norm: RMSNorm,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.norm_qkv(x, norm)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin, self.rope_style), apply_rope(k, cos, sin, self.rope_style)
        # mask: (B, 1, T, T) True where a query may attend (causal, within its own document)
        if self.attention == "math":
            y = math_attention(q, k, v, mask)
            return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None,
            enable_gqa=self.n_kv_heads != self.n_heads,
        )
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.dim, args.hidden_dim, bias=False)
        self.up_proj = nn.Linear(args.dim, args.hidden_dim, bias=False)
        self.down_proj = nn.Linear(args.hidden_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attn_norm = RMSNorm(args.dim, args.norm_eps)
        self.attn = Attention(args)
        self.mlp_norm = RMSNorm(args.dim, args.norm_eps)
        self.mlp = FeedForward(args)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(x, self.attn_norm, cos, sin, mask)
        return x + self.mlp(self.mlp_norm(x))


def document_layout(
    idx: torch.Tensor, end_id: int, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed rows hold several documents, each ending with ``end_id``: the rotary angles of
    positions that restart at every document, and the causal mask that keeps each token to
    its own document. (B, 1, T, hd/2) angles and a (B, 1, T, T) boolean mask.

    A window that starts inside a document sees that document's tail as one document."""
    B, T = idx.shape
    ends = idx == end_id
    starts = torch.zeros_like(ends)
    starts[:, 1:] = ends[:, :-1]
    doc = torch.cumsum(starts, dim=1)  # the document each position belongs to
    steps = torch.arange(T, device=idx.device).expand(B, T)
    first = torch.cummax(torch.where(starts, steps, torch.zeros_like(steps)), dim=1).values
    positions = steps - first
    same = doc[:, :, None] == doc[:, None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
    mask = (same & causal)[:, None]
    return cos[positions][:, None], sin[positions][:, None], mask


IGNORE_INDEX = -100  # F.cross_entropy's default, and Hugging Face's label for "no loss here"


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean fp32 cross-entropy over the targets that are not IGNORE_INDEX (0 when none are)."""
    flat = targets.reshape(-1)
    total = F.cross_entropy(
        logits.float().view(-1, logits.size(-1)),
        flat,
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return total / (flat != IGNORE_INDEX).sum().clamp(min=1)


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.blocks = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # The id that ends a document in packed rows (data.packing of jsonl records): set, each
        # token attends to its own document only and its position restarts there. None: one
        # causal sequence per row.
        self.document_end: int | None = None
        self.apply(self._init_weights)
        # GPT-2: scale the projections that write into the residual stream by depth.
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * args.n_layers))
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def flops_per_token(self, seq_len: int, trainable: int | None = None) -> int:
        """``ModelArgs.flops_per_token`` of this model's shapes (the sampler's MFU)."""
        return self.args.flops_per_token(seq_len, trainable)

    def num_trainable(self, *, embedding: bool = False) -> int:
        """Parameters that take gradients, counted like ``ModelArgs.num_params``: a tied table
        counts once, as the output head; ``embedding=False`` leaves out an untied lookup table.

        What ``flops_per_token(seq_len, trainable=...)`` wants, after LoRA or freezing.
        """
        skip = set()
        if not embedding and not self.args.tie_embeddings:
            skip = {id(p) for p in self.tok_embeddings.parameters()}
        return sum(p.numel() for p in self.parameters() if p.requires_grad and id(p) not in skip)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, vocab) and, with targets, the mean next-token cross-entropy in fp32.

        Targets equal to IGNORE_INDEX (-100: prompt tokens, padding) are left out of the mean;
        when every target is ignored the loss is 0, not NaN.
        """
        x = self.tok_embeddings(idx)
        cos, sin, mask = self.rope_cos, self.rope_sin, None
        if self.document_end is not None:
            cos, sin, mask = document_layout(idx, self.document_end, cos, sin)
        for block in self.blocks:
            x = block(x, cos, sin, mask)
        logits = self.output(self.norm(x))
        if targets is None:
            return logits, None
        return logits, token_loss(logits, targets)
