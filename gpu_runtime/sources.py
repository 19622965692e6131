"""Where a run's model comes from: costlab's own preset, or a team's local checkpoint.

`open_model_source` reads only what is cheap (the preset's shapes; a checkpoint's
config.json, safetensors headers and tokenizer) so the run can be refused before any
weight is allocated: an architecture a strategy key cannot act on, a model that does not
fit. `build()` then makes the CPU model the assembly applies the strategy to.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from gpu_runtime.errors import StrategyError
from gpu_runtime.model import EOS, Transformer, preset_args
from gpu_runtime.schema import StrategyConfig


@dataclass
class ModelSource:
    model_type: str  # llama (costlab's own) or the checkpoint's config model_type
    native: bool  # trains as costlab's own Transformer (every kernel strategy applies)
    params: int  # parameters, counted before building (for the memory check)
    what: str  # how errors name the model
    key: str  # the strategy key errors about the model's size name
    build: Callable[[], nn.Module]
    flops_per_token: Callable[[nn.Module, int], float]
    tokenizer: Any = None  # gpu_runtime.tokenizer.Tokenizer; None: bytes (family llama)
    report: dict[str, Any] = field(default_factory=dict)


def _safetensors_numel(files: list[Path]) -> int:
    """Parameters in a checkpoint from its safetensors headers alone (no tensor is read)."""
    total = 0
    for path in files:
        with path.open("rb") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                n = 1
                for dim in entry["shape"]:
                    n *= dim
                total += n
    return total


def _flops(module: nn.Module, seq_len: int) -> float:
    """PaLM's 6N + 12LdT with the backward's weight gradients counted for the trained weights
    only: 2N forward, 2N activation gradients, 2 per trainable weight (LoRA: the adapters)."""
    return module.flops_per_token(seq_len, trainable=module.num_trainable())


def mask_documents(config: StrategyConfig, source: ModelSource, module: nn.Module) -> dict:
    """Packed instruction records (`data.packing` of jsonl) attend within their own record.

    Records are independent examples: a packed window must not let one record's tokens look
    at its neighbours' (the model would learn to lean on them, and score worse on a record
    alone), and each record's positions start at 0 as they do when it is used. Text and
    synthetic streams stay one causal sequence per row, as pretraining on a stream does.
    What was decided goes into the run's report under `data.packing`."""
    if config.data.source != "jsonl" or not config.data.packing:
        return {}
    end = EOS if source.tokenizer is None else source.tokenizer.eos_id
    if not source.native:
        return {
            "document_mask": False,
            "why": f"a {source.model_type} model trains through transformers, whose attention "
            "takes no per-document mask here: packed records attend across their neighbours",
        }
    if end is None:
        return {"document_mask": False, "why": "the tokenizer has no end-of-sequence token"}
    module.document_end = end
    return {"document_mask": True, "end_id": end, "positions": "restart per record"}


def open_model_source(config: StrategyConfig) -> ModelSource:
    model = config.model
    if model.family == "llama":
        args = preset_args(model.preset, model.seq_len)
        return ModelSource(
            model_type="llama",
            native=True,
            params=args.num_params(),
            what=model.preset,
            key="model.preset",
            build=lambda: Transformer(args),
            flops_per_token=_flops,
            report={"family": "llama", "preset": model.preset, "tokenizer": "bytes"},
        )
    from gpu_runtime import hf
    from gpu_runtime.tokenizer import load_tokenizer

    ckpt = hf.read_checkpoint(model.path)
    native = ckpt.model_type in hf.NATIVE_TYPES
    init = config.train.starts_from(model.family)
    tokenizer = load_tokenizer(model.path)
    vocab = ckpt.config.get("vocab_size")
    if isinstance(vocab, int) and tokenizer.vocab_size > vocab:
        raise StrategyError.single(
            "model.path",
            f"the tokenizer has {tokenizer.vocab_size} ids but the model's embedding has "
            f"{vocab} rows (config.json vocab_size): they are not one checkpoint",
        )
    name = Path(model.path).name or model.path
    report = {
        "family": "hf",
        "checkpoint": name,
        "model_type": ckpt.model_type,
        "trains_as": "costlab Transformer" if native else "transformers",
        "init": init,
        "sharded": ckpt.sharded,
        "tokenizer": tokenizer.name,
        "vocab_size": vocab,
        "finetune": config.finetune.method,
    }
    if native:
        params = hf.native_args(ckpt, model.seq_len).num_params()
    else:
        params = _safetensors_numel(ckpt.weight_files)

    def build() -> nn.Module:
        return hf.load_model(model.path, model.seq_len, init=init, seed=config.train.seed).module

    return ModelSource(
        model_type=ckpt.model_type,
        native=native,
        params=params,
        what=f"{name} ({ckpt.model_type})",
        key="model.path",
        build=build,
        flops_per_token=_flops,
        tokenizer=tokenizer,
        report=report,
    )
