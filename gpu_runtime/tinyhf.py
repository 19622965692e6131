"""Tiny Hugging Face checkpoints built on this machine: nothing is downloaded.

Tests, the benchmark and the docs need a real ``save_pretrained`` directory (config.json,
safetensors weights, tokenizer files) to load as ``model.family: hf``. These are built from
transformers' own config classes with seeded random weights and a small byte-level BPE
tokenizer trained on the shipped instruction dataset, in well under a few seconds::

    python -m gpu_runtime.tinyhf --arch llama OUT_DIR
    python -m gpu_runtime.tinyhf --arch qwen2 --shards 100KB OUT_DIR

transformers and tokenizers are imported inside the functions.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

ARCHS = ("llama", "mistral", "qwen2", "gpt2")
SPECIALS = ("<s>", "</s>", "<pad>")
DATASET = Path(__file__).resolve().parent / "datasets" / "instructions.jsonl"
# A plain, prefix-stable chat template: each turn is a role header and its content; an
# assistant turn ends with </s>.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}</s>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _default_texts() -> list[str]:
    """The shipped Alpaca records in their prompt template, else synthetic documents."""
    from gpu_runtime.data import alpaca_prompt, synthetic_documents

    if DATASET.is_file():
        texts = []
        for line in DATASET.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                if isinstance(record, dict) and "instruction" in record and "output" in record:
                    texts.append(alpaca_prompt(record))
        if texts:
            return texts
    return [doc.decode("utf-8") for doc in synthetic_documents(0, 200_000)]


def build_tokenizer(
    out_dir: str | os.PathLike,
    *,
    vocab_size: int = 512,
    texts: Iterable[str] | None = None,
    chat_template: bool = True,
) -> Path:
    """Train a byte-level BPE (specials <s>, </s>, <pad>) on ``texts`` and save it as a
    transformers tokenizer in ``out_dir``. Deterministic for the same texts."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts) if texts is not None else _default_texts(), trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    if chat_template:
        wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(str(out))
    return out


def _config(
    arch: str,
    *,
    vocab: int,
    ids: dict[str, int],
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    seq_len: int,
    tie: bool | None,
    head_dim: int | None,
):
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    specials = {
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "pad_token_id": ids["<pad>"],
    }
    if arch == "gpt2":
        return GPT2Config(
            vocab_size=vocab,
            n_positions=seq_len,
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_inner=intermediate,
            # no dropout: a tiny run's losses are then a function of the seed and the data
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            tie_word_embeddings=True if tie is None else tie,
            **specials,
        )
    shapes = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": seq_len,
        "tie_word_embeddings": bool(tie),
        **specials,
    }
    if head_dim is not None:
        shapes["head_dim"] = head_dim
    if arch == "llama":
        return LlamaConfig(**shapes)
    if arch == "mistral":
        return MistralConfig(sliding_window=None, **shapes)
    if arch == "qwen2":
        return Qwen2Config(**shapes)
    raise ValueError(f"unknown arch {arch!r}; one of {ARCHS}")


def build_checkpoint(
    out_dir: str | os.PathLike,
    arch: str,
    *,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    seq_len: int = 256,
    seed: int = 0,
    shard_size: str | int | None = None,
    dtype: torch.dtype = torch.float32,
    tie: bool | None = None,
    head_dim: int | None = None,
    vocab_size: int = 512,
) -> Path:
    """A tiny ``arch`` checkpoint in ``out_dir``: tokenizer, config.json and seeded random
    safetensors weights (sharded into files of at most ``shard_size``, e.g. "100KB").

    ``tie`` None: the architecture's usual (gpt2 tied, the others not). Biases and norm
    weights are randomised too, so a load that mixes them up shows in the logits.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; one of {ARCHS}")
    out = Path(out_dir)
    build_tokenizer(out, vocab_size=vocab_size)
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shapes = {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "intermediate": intermediate,
        "seq_len": seq_len,
        "tie": tie,
        "head_dim": head_dim,
    }
    # The tokenizer as a run will load it: beside the checkpoint's config.json, whose model_type
    # may choose a tokenizer class that adds tokens of its own (qwen2's <|endoftext|>).
    _config(arch, vocab=vocab_size, ids=dict.fromkeys(SPECIALS, 0), **shapes).save_pretrained(
        str(out)
    )
    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS}
    config = _config(arch, vocab=len(tokenizer), ids=ids, **shapes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() == 1:  # biases and norm weights: off their 0 / 1 init
                    param.add_(torch.randn_like(param) * 0.1)
    model.to(dtype)
    kwargs = {} if shard_size is None else {"max_shard_size": shard_size}
    model.save_pretrained(str(out), **kwargs)
    return out


def main(argv: Sequence[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_runtime.tinyhf",
        description="Build a tiny Hugging Face checkpoint locally (nothing is downloaded).",
    )
    parser.add_argument("out_dir", help="directory to write (created if missing)")
    parser.add_argument("--arch", choices=ARCHS, default="llama")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=256, help="max positions")
    parser.add_argument(
        "--shards", default=None, metavar="SIZE", help="max shard size, e.g. 100KB (sharded)"
    )
    parser.add_argument("--seed", type=int, default=0)
    ns = parser.parse_args(argv)
    out = build_checkpoint(
        ns.out_dir,
        ns.arch,
        layers=ns.layers,
        hidden=ns.hidden,
        intermediate=2 * ns.hidden,
        seq_len=ns.seq_len,
        seed=ns.seed,
        shard_size=ns.shards,
    )
    print(out)
    return out


if __name__ == "__main__":
    main()
