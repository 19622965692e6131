"""A team's own Hugging Face causal-LM checkpoint (``model.family: hf``), loaded from disk.

``read_checkpoint`` checks a local directory is a checkpoint costlab can load (config.json,
safetensors weights, every shard present) without reading a weight. ``load_model`` then
builds the module the trainer trains:

* ``llama``, ``mistral`` and ``qwen2`` (``NATIVE_TYPES``) load into costlab's own
  ``Transformer`` (``rope_style="half"``, so every tensor maps 1:1 by name, and
  ``hf_state_dict`` maps it back). Every strategy key acts on them, the fused kernels too.
* Any other causal LM (gpt2, ...) trains through transformers itself, wrapped in
  ``HFCausalLM`` with the same ``forward(idx, targets) -> (logits, loss)`` contract.
  On those, these strategy keys apply: ``precision`` (autocast, storage dtype),
  ``memory.gradient_checkpointing`` (through transformers' ``gradient_checkpointing_enable``,
  every layer), dynamic batching, ``offload.embedding`` (the input embedding table), LoRA
  (peft, on the model's own module names), DDP. These do not: ``kernels.fused_rmsnorm_qkv``
  (needs costlab's RMSNorm followed by separate q/k/v ``nn.Linear`` projections) and
  ``precision.quantization`` (swaps costlab's named q/k/v/o and MLP projections).

Nothing is ever downloaded: a path must be an existing local directory, transformers is
imported with ``HF_HUB_OFFLINE=1`` and every call passes ``local_files_only=True``. Weights
load from safetensors only; pickle checkpoints (``pytorch_model.bin``) are refused, since
unpickling can run arbitrary code. transformers and safetensors are imported inside the
functions that need them, so importing this module costs nothing.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from gpu_runtime.errors import StrategyError
from gpu_runtime.model import (
    ModelArgs,
    Transformer,
    rope_tables,
    token_loss,
    training_flops_per_token,
)
from gpu_runtime.strategies.offload import CpuOffloadedEmbedding

NATIVE_TYPES = ("llama", "mistral", "qwen2")
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
_REMOTE = ("http://", "https://", "hf://", "s3://", "gs://")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")

Init = Literal["checkpoint", "scratch"]


def _refuse(message: str, key: str = "model.path") -> StrategyError:
    return StrategyError.single(key, message)


def _transformers():
    """transformers, imported offline: nothing it does may reach the network."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers

    return transformers


# --- the checkpoint directory -------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    config: dict[str, Any]  # config.json
    model_type: str
    weight_files: list[Path]  # model.safetensors, or every shard the index names
    sharded: bool


def read_checkpoint(path: str) -> Checkpoint:
    """Check ``path`` is a local causal-LM checkpoint with safetensors weights; reads no weight."""
    text = str(path)
    if text.lower().startswith(_REMOTE):
        raise _refuse(
            f"{text!r} is a remote address; costlab loads local checkpoints only and never "
            "downloads: copy the checkpoint into a directory and name that directory"
        )
    root = Path(text)
    if not root.exists():
        if _HUB_ID.match(text) and not text.startswith("."):
            raise _refuse(
                f"no local directory {text!r}; if that is a Hugging Face Hub id: a hub id is "
                "not a local checkpoint and costlab never downloads, so fetch the model "
                "yourself (the Hugging Face CLI's download command) and name its directory"
            )
        raise _refuse(
            f"no directory {text!r}: name a local checkpoint directory (config.json and "
            "safetensors weights), relative to the working directory; costlab never downloads"
        )
    if not root.is_dir():
        raise _refuse(
            f"{text!r} is a file; name the checkpoint directory that holds config.json and "
            "the safetensors weights"
        )
    config_path = root / CONFIG
    if not config_path.is_file():
        raise _refuse(
            f"{text!r} has no config.json, so it is not a Hugging Face checkpoint directory "
            "(save_pretrained writes config.json next to the weights)"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _refuse(f"config.json in {text!r} is not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise _refuse(f"config.json in {text!r} is not a JSON object")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise _refuse(
            f"config.json in {text!r} has no model_type, so it is not a transformers "
            "causal language model"
        )
    _check_causal_lm(config, text)
    if (root / "adapter_config.json").is_file() and not (root / WEIGHTS).is_file():
        raise _refuse(
            f"{text!r} holds a PEFT adapter, not a full model: name its base checkpoint "
            "(finetune.method lora trains a new adapter on it)"
        )
    files, sharded = _weight_files(root, text)
    return Checkpoint(
        path=root.resolve(),
        config=config,
        model_type=model_type,
        weight_files=files,
        sharded=sharded,
    )


def _check_causal_lm(config: dict[str, Any], text: str) -> None:
    if config.get("is_encoder_decoder"):
        raise _refuse(
            f"{text!r} is an encoder-decoder model ({config['model_type']}); costlab trains "
            "decoder-only causal language models"
        )
    archs = config.get("architectures")
    if isinstance(archs, list) and archs:
        if not any(str(a).endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
            raise _refuse(
                f"config.json architectures {archs} in {text!r} name no causal language "
                "model (a ...ForCausalLM or ...LMHeadModel class)"
            )
    if config.get("quantization_config"):
        raise _refuse(
            f"{text!r} is a quantized checkpoint (config.json quantization_config); load its "
            "full-precision weights (precision.quantization quantizes them for training)"
        )


def _weight_files(root: Path, text: str) -> tuple[list[Path], bool]:
    index = root / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise _refuse(f"{INDEX} in {text!r} is not a readable shard index ({exc})") from None
        if not names:
            raise _refuse(f"{INDEX} in {text!r} names no shard")
        missing = [n for n in names if not (root / n).is_file()]
        if missing:
            raise _refuse(
                f"{text!r} is missing {len(missing)} of the {len(names)} shards its {INDEX} "
                f"names: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}; copy "
                "the whole checkpoint directory"
            )
        return [root / n for n in names], True
    if (root / WEIGHTS).is_file():
        return [root / WEIGHTS], False
    pickles = sorted(p.name for p in root.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
    if pickles:
        raise _refuse(
            f"{text!r} has only pickle weights ({', '.join(pickles[:3])}); costlab loads "
            "safetensors only, because unpickling a file can run arbitrary code: convert it "
            "to safetensors (load it once where you trust it and save_pretrained, which "
            "writes model.safetensors)"
        )
    others = sorted(p.name for p in root.glob("*.safetensors"))
    if others:
        raise _refuse(
            f"{text!r} has safetensors files ({', '.join(others[:3])}) but neither "
            f"{WEIGHTS} nor {INDEX}: not a transformers checkpoint layout (save_pretrained "
            "writes one)"
        )
    raise _refuse(f"{text!r} has no weights: expected {WEIGHTS}, or {INDEX} and its shards")


# --- LLaMA-family checkpoints into costlab's own Transformer ------------------------------


def _int(config: dict[str, Any], key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise _refuse(
            f"config.json {key} is {value!r}; a {config['model_type']} needs a positive int"
        )
    return value


def _rope(config: dict[str, Any]) -> float:
    """rope_theta, wherever the config keeps it; refuses any scaled RoPE."""
    key, rope = "rope_parameters", config.get("rope_parameters")
    if not rope:
        key, rope = "rope_scaling", config.get("rope_scaling")
    rope = rope or {}
    if not isinstance(rope, dict) or any(isinstance(v, dict) for v in rope.values()):
        raise _refuse(f"config.json {key} is {rope!r}; costlab reads one default RoPE")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in (None, "default"):
        raise _refuse(
            f"config.json {key} rope_type is {rope_type!r}; costlab's rotary embedding is "
            "the default, unscaled RoPE, so this checkpoint would compute other attention"
        )
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    if not isinstance(theta, int | float) or isinstance(theta, bool) or theta <= 0:
        raise _refuse(f"config.json rope_theta is {theta!r}; expected a positive number")
    return float(theta)


def _sliding_window(config: dict[str, Any], model_type: str, n_layers: int) -> int | None:
    """The attention window some layer is limited to, or None when every layer sees it all."""
    window = config.get("sliding_window")
    if not isinstance(window, int) or isinstance(window, bool):
        return None
    if model_type == "mistral":
        return window
    if model_type == "qwen2":
        if not config.get("use_sliding_window"):
            return None
        types = config.get("layer_types")
        if isinstance(types, list):
            return window if "sliding_attention" in types else None
        first = config.get("max_window_layers", n_layers)
        return window if isinstance(first, int) and first < n_layers else None
    return None


def native_args(ckpt: Checkpoint, seq_len: int) -> ModelArgs:
    """costlab's ModelArgs for a llama/mistral/qwen2 config; refuses what it cannot compute."""
    cfg, mt = ckpt.config, ckpt.model_type
    if mt not in NATIVE_TYPES:
        raise _refuse(
            f"a {mt} checkpoint does not load into costlab's own model (only "
            f"{', '.join(NATIVE_TYPES)}); it trains through transformers (load_model)"
        )
    dim, n_layers = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers")
    n_heads, hidden = _int(cfg, "num_attention_heads"), _int(cfg, "intermediate_size")
    vocab = _int(cfg, "vocab_size")
    kv = cfg.get("num_key_value_heads") or n_heads
    if not isinstance(kv, int) or n_heads % kv:
        raise _refuse(
            f"config.json num_key_value_heads {kv!r} does not divide num_attention_heads {n_heads}"
        )
    head_dim = cfg.get("head_dim")
    if head_dim is None:
        if dim % n_heads:
            raise _refuse(
                f"config.json hidden_size {dim} is not a multiple of num_attention_heads "
                f"{n_heads} and head_dim is not set"
            )
        head_dim = dim // n_heads
    if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise _refuse(f"config.json head_dim is {head_dim!r}; rotary embeddings need an even int")
    act = cfg.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise _refuse(f"config.json hidden_act is {act!r}; costlab's SwiGLU feed-forward uses silu")
    if cfg.get("mlp_bias"):
        raise _refuse(
            "config.json mlp_bias is true; costlab's feed-forward projections have no bias"
        )
    if mt == "llama" and cfg.get("attention_bias"):
        raise _refuse(
            "config.json attention_bias is true, which in a llama gives o_proj a bias too; "
            "costlab's attention has q/k/v biases only (qwen2's layout), not an o_proj bias"
        )
    dropout = cfg.get("attention_dropout", 0.0)
    if dropout:
        raise _refuse(
            f"config.json attention_dropout is {dropout}; costlab's attention has no dropout, "
            "so it would train a different model: save the config with 0.0"
        )
    theta = _rope(cfg)
    window = _sliding_window(cfg, mt, n_layers)
    if window is not None and window < seq_len:
        raise _refuse(
            f"the checkpoint's attention sees only the last {window} tokens (config.json "
            f"sliding_window) and costlab's is full causal attention: use seq_len <= {window}",
            key="model.seq_len",
        )
    max_pos = cfg.get("max_position_embeddings")
    if isinstance(max_pos, int) and max_pos < seq_len:
        raise _refuse(
            f"seq_len {seq_len} is longer than the {max_pos} positions the checkpoint was "
            f"trained for (config.json max_position_embeddings): use seq_len <= {max_pos}",
            key="model.seq_len",
        )
    eps = cfg.get("rms_norm_eps", 1e-6)
    return ModelArgs(
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        hidden_dim=hidden,
        n_kv_heads=kv,
        vocab_size=vocab,
        max_seq_len=seq_len,
        norm_eps=float(eps),
        rope_theta=theta,
        head_dim_override=head_dim if head_dim != dim // n_heads else None,
        qkv_bias=mt == "qwen2",
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_style="half",
    )


# transformers' names (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM) <-> costlab's
_NAMES = (
    ("model.embed_tokens.weight", "tok_embeddings.weight"),
    ("model.norm.weight", "norm.weight"),
    ("lm_head.weight", "output.weight"),
    ("model.layers.{i}.self_attn.{qkvo}_proj.{wb}", "blocks.{i}.attn.{qkvo}_proj.{wb}"),
    ("model.layers.{i}.mlp.{mlp}_proj.weight", "blocks.{i}.mlp.{mlp}_proj.weight"),
    ("model.layers.{i}.input_layernorm.weight", "blocks.{i}.attn_norm.weight"),
    ("model.layers.{i}.post_attention_layernorm.weight", "blocks.{i}.mlp_norm.weight"),
)
_SLOTS = {"i": r"\d+", "qkvo": "[qkvo]", "wb": "weight|bias", "mlp": "gate|up|down"}


def _pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", template)  # literal, slot, literal, slot, ...
    return re.compile(
        "".join(
            f"(?P<{part}>{_SLOTS[part]})" if k % 2 else re.escape(part)
            for k, part in enumerate(parts)
        )
    )


_TO_COSTLAB = [(_pattern(hf), ours) for hf, ours in _NAMES]
_TO_HF = [(_pattern(ours), hf) for hf, ours in _NAMES]
# tensors some older checkpoints store that are recomputed, not learned
_DERIVED = re.compile(r".*rotary_emb\.inv_freq$")


def costlab_name(hf_name: str) -> str | None:
    """costlab's state-dict name for a transformers LLaMA-family tensor name (None: unknown)."""
    return _rename(hf_name, _TO_COSTLAB)


def hf_name(costlab: str) -> str | None:
    """transformers' name for a costlab state-dict name (None: no counterpart)."""
    return _rename(costlab, _TO_HF)


def _rename(name: str, table: list[tuple[re.Pattern[str], str]]) -> str | None:
    for pattern, template in table:
        m = pattern.fullmatch(name)
        if m:
            return template.format(**m.groupdict())
    return None


def _empty_transformer(args: ModelArgs) -> Transformer:
    """A Transformer with uninitialised storage (no seconds of random init a load overwrites)."""
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device="cpu")
    if args.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight
    cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta)
    model.rope_cos.copy_(cos)
    model.rope_sin.copy_(sin)
    return model


def _load_weights(model: Transformer, ckpt: Checkpoint) -> None:
    """Copy every checkpoint tensor into its costlab parameter (fp32); strict both ways."""
    from safetensors import SafetensorError, safe_open

    targets = model.state_dict()
    tied = model.args.tie_embeddings
    if tied:
        targets.pop("output.weight")
    loaded: set[str] = set()
    where = ckpt.path.name
    tied_head = None
    for file in ckpt.weight_files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as fh:
                for name in fh.keys():
                    if _DERIVED.match(name):
                        continue  # recomputed from the config, not learned
                    if tied and name == "lm_head.weight":
                        tied_head = fh.get_tensor(name)  # must be the embedding: checked below
                        continue
                    ours = costlab_name(name)
                    if ours is None or ours not in targets:
                        raise _refuse(
                            f"{where}: unexpected tensor {name!r} in {file.name}: not part of "
                            f"a {ckpt.model_type} with this config.json"
                        )
                    if ours in loaded:
                        raise _refuse(f"{where}: tensor {name!r} is stored twice")
                    tensor = fh.get_tensor(name)
                    target = targets[ours]
                    if tuple(tensor.shape) != tuple(target.shape):
                        raise _refuse(
                            f"{where}: tensor {name!r} has shape {tuple(tensor.shape)} but "
                            f"config.json implies {tuple(target.shape)}"
                        )
                    if not tensor.is_floating_point():
                        raise _refuse(
                            f"{where}: tensor {name!r} is {tensor.dtype}, not a float weight"
                        )
                    with torch.no_grad():
                        target.copy_(tensor.to(torch.float32))
                    loaded.add(ours)
        except (SafetensorError, OSError) as exc:
            raise _refuse(
                f"{where}: {file.name} is not a readable safetensors file ({exc})"
            ) from None
    if tied_head is not None and not torch.equal(
        tied_head.to(torch.float32), model.tok_embeddings.weight.detach()
    ):
        raise _refuse(
            f"{where}: config.json ties the output head to the embedding "
            "(tie_word_embeddings), but the weights hold a different lm_head.weight"
        )
    missing = sorted(set(targets) - loaded)
    if missing:
        names = [hf_name(n) or n for n in missing]
        raise _refuse(
            f"{where}: the weights lack {len(missing)} tensors config.json implies: "
            f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
        )


def load_native(ckpt: Checkpoint, seq_len: int, *, init: Init, seed: int) -> Transformer:
    """costlab's Transformer (CPU, fp32) with the checkpoint's shapes; its weights for
    ``init="checkpoint"``, costlab's seeded initialisation for ``init="scratch"``."""
    args = native_args(ckpt, seq_len)
    if init == "scratch":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return Transformer(args)
    model = _empty_transformer(args)
    _load_weights(model, ckpt)
    return model


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under transformers' names (LlamaForCausalLM layout); the tied head
    is left out, as save_pretrained does. Raises ValueError for a tensor with no counterpart
    (merge LoRA adapters or undo quantization first)."""
    out: dict[str, torch.Tensor] = {}
    unknown = []
    for name, tensor in model.state_dict().items():
        if model.args.tie_embeddings and name == "output.weight":
            continue
        theirs = hf_name(name)
        if theirs is None:
            unknown.append(name)
        else:
            out[theirs] = tensor
    if unknown:
        raise ValueError(f"no transformers name for {', '.join(unknown[:5])}")
    return out


# --- every other causal LM, trained through transformers ------------------------------------


def _config_value(config: Any, *names: str) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise AttributeError(f"config has none of {names}")


class HFCausalLM(nn.Module):
    """A transformers causal LM behind costlab's contract:
    ``forward(idx, targets=None) -> (logits, loss)``, the loss a mean fp32 cross-entropy
    over targets other than -100 (0 when every target is -100)."""

    def __init__(self, hf: nn.Module, model_type: str):
        super().__init__()
        self.hf = hf
        self.model_type = model_type
        self.n_layers = _config_value(hf.config, "num_hidden_layers", "n_layer")
        self.dim = _config_value(hf.config, "hidden_size", "n_embd")

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.hf(input_ids=idx, use_cache=False).logits
        if targets is None:
            return logits, None
        return logits, token_loss(logits, targets)

    def _tables(self) -> set[int]:
        """Lookup tables (token and position embeddings), except one that is also the head."""
        head = self.hf.get_output_embeddings()
        head_weight = id(head.weight) if head is not None else None
        return {
            id(p)
            for m in self.hf.modules()
            if isinstance(m, nn.Embedding | CpuOffloadedEmbedding)
            for p in m.parameters(recurse=False)
            if id(p) != head_weight
        }

    def num_params(self, *, embedding: bool = True) -> int:
        """The module's parameters (a tied table once); ``embedding=False`` leaves out the
        token and position lookup tables, but a tied table counts, as the output head."""
        skip = set() if embedding else self._tables()
        return sum(p.numel() for p in self.parameters() if id(p) not in skip)

    def num_trainable(self, *, embedding: bool = False) -> int:
        """Parameters that take gradients, counted like ``num_params``."""
        skip = set() if embedding else self._tables()
        return sum(p.numel() for p in self.parameters() if p.requires_grad and id(p) not in skip)

    def flops_per_token(self, seq_len: int, trainable: int | None = None) -> int:
        """Same formula as ``ModelArgs.flops_per_token``."""
        return training_flops_per_token(
            self.num_params(embedding=False),
            n_layers=self.n_layers,
            dim=self.dim,
            seq_len=seq_len,
            trainable=trainable,
        )


def _max_positions(config: dict[str, Any]) -> tuple[str, int] | None:
    for key in ("max_position_embeddings", "n_positions"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return key, value
    return None


def _build_foreign(build):
    """build(attn_implementation) with SDPA where the architecture has it, else eager."""
    try:
        return build("sdpa")
    except (ValueError, ImportError) as exc:
        if "sdpa" not in str(exc).lower() and "attn_implementation" not in str(exc):
            raise
    return build("eager")


def load_foreign(ckpt: Checkpoint, seq_len: int, *, init: Init, seed: int) -> HFCausalLM:
    """A non-LLaMA-family causal LM through transformers (CPU, fp32), in ``HFCausalLM``."""
    cfg, text = ckpt.config, ckpt.path.name
    limit = _max_positions(cfg)
    if limit is not None and limit[1] < seq_len:
        raise _refuse(
            f"seq_len {seq_len} is longer than the {limit[1]} positions a {ckpt.model_type} "
            f"with this config has (config.json {limit[0]}): use seq_len <= {limit[1]}",
            key="model.seq_len",
        )
    transformers = _transformers()
    auto = transformers.AutoModelForCausalLM
    path = str(ckpt.path)
    try:
        if init == "scratch":
            config = transformers.AutoConfig.from_pretrained(
                path, local_files_only=True, trust_remote_code=False
            )

            def build(attn: str):
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(seed)
                    return auto.from_config(
                        config,
                        dtype=torch.float32,
                        attn_implementation=attn,
                        trust_remote_code=False,
                    )

            hf = _build_foreign(build)
        else:

            def build(attn: str):
                return auto.from_pretrained(
                    path,
                    local_files_only=True,
                    trust_remote_code=False,
                    use_safetensors=True,
                    dtype=torch.float32,
                    attn_implementation=attn,
                    output_loading_info=True,
                )

            hf, info = _build_foreign(build)
            problems = []
            for what in ("missing", "unexpected", "mismatched"):
                names = sorted(map(str, info.get(f"{what}_keys") or ()))  # sets in transformers 5
                if names:
                    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
                    problems.append(f"{what}: {', '.join(names[:5])}{more}")
            if problems:
                raise _refuse(
                    f"{text}: the weights do not match config.json ({'; '.join(problems)})"
                )
        hf.float()
        hf.train()
        return HFCausalLM(hf, ckpt.model_type)
    except StrategyError:
        raise
    except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError) as exc:
        raise _refuse(
            f"transformers cannot load {text} ({ckpt.model_type}) as a causal language model: {exc}"
        ) from None


# --- one entry point -----------------------------------------------------------------------


@dataclass
class Loaded:
    module: nn.Module  # Transformer (native) or HFCausalLM
    native: bool
    model_type: str
    args: ModelArgs | None  # the native model's shapes; None for a foreign one
    checkpoint: Checkpoint = field(repr=False)


def load_model(path: str, seq_len: int, *, init: Init, seed: int) -> Loaded:
    """Read the checkpoint at ``path`` and build the module that trains it (CPU, fp32)."""
    ckpt = read_checkpoint(path)
    if ckpt.model_type in NATIVE_TYPES:
        module = load_native(ckpt, seq_len, init=init, seed=seed)
        return Loaded(module, True, ckpt.model_type, module.args, ckpt)
    module = load_foreign(ckpt, seq_len, init=init, seed=seed)
    return Loaded(module, False, ckpt.model_type, None, ckpt)
