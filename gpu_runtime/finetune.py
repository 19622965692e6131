"""Fine-tuning (`finetune`): what trains, and what a run saves of it.

`method: full` trains every weight. `method: lora` freezes the loaded weights and trains
low-rank adapters beside `target_modules` through peft (`inject_adapter_in_model`, which
works on costlab's own modules and on a transformers model alike); only the adapters
reach the optimizer, so only they get AdamW state. peft is imported here only, when LoRA
is asked for.

`save: true` writes the result as safetensors under the run's artifacts directory, the
config and dataset hashes in the file's metadata: the adapter in peft's layout
(`adapter_model.safetensors` + `adapter_config.json`, names as transformers spells them, so
`PeftModel.from_pretrained` loads it onto the checkpoint), or the full weights (a loadable
checkpoint directory for family hf: the weights, config.json and the tokenizer's files).
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpu_runtime.errors import StrategyError
from gpu_runtime.schema import FinetuneSection

# peft's own defaults for the architectures costlab trains through transformers
DEFAULT_TARGETS: dict[str, list[str]] = {
    "native": ["q_proj", "v_proj"],
    "gpt2": ["c_attn"],
    "gpt_neox": ["query_key_value"],
    "falcon": ["query_key_value"],
    "bloom": ["query_key_value"],
    "opt": ["q_proj", "v_proj"],
    "phi": ["q_proj", "v_proj"],
}
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
    "chat_template.jinja",
)


def lora_targets(section: FinetuneSection, model_type: str, native: bool) -> list[str]:
    if section.target_modules:
        return list(section.target_modules)
    targets = DEFAULT_TARGETS.get("native" if native else model_type)
    if targets is None:
        raise StrategyError.single(
            "finetune.target_modules",
            f"no default LoRA targets for a {model_type} model; name its attention "
            "projections (module name suffixes)",
        )
    return targets


def apply_lora(
    model: nn.Module, section: FinetuneSection, *, model_type: str, native: bool
) -> dict[str, Any]:
    """Freeze every weight, add trainable adapters beside the target modules; what it did."""
    targets = lora_targets(section, model_type, native)
    names = [n for n, _ in model.named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        leaves = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if _is_linear(m)})
        raise StrategyError.single(
            "finetune.target_modules",
            f"no module named {', '.join(missing)} in this {model_type} model; its "
            f"projections are: {', '.join(leaves)}",
        )
    from peft import LoraConfig, inject_adapter_in_model

    lora = LoraConfig(
        r=section.r,
        lora_alpha=section.alpha,
        lora_dropout=section.dropout,
        target_modules=targets,
        bias="none",
    )
    for p in model.parameters():
        p.requires_grad_(False)
    inject_adapter_in_model(lora, model)
    adapted = sorted(
        {n for n, m in model.named_modules() if hasattr(m, "lora_A") and len(m.lora_A)}
    )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "method": "lora",
        "library": "peft",
        "target_modules": targets,
        "modules": len(adapted),
        "r": section.r,
        "alpha": section.alpha,
        "adapter_params": trainable,
    }


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def parameter_counts(model: nn.Module) -> tuple[int, int]:
    """(total, trainable) parameters of the assembled model; tied tables counted once."""
    seen: set[int] = set()
    total = trainable = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if p.requires_grad:
            trainable += p.numel()
    return total, trainable


# costlab's names for a native model's blocks -> transformers' (LlamaForCausalLM and kin)
_NATIVE_TO_HF = (
    (re.compile(r"^blocks\.(\d+)\.attn\."), r"model.layers.\1.self_attn."),
    (re.compile(r"^blocks\.(\d+)\.mlp\."), r"model.layers.\1.mlp."),
)


def _hf_name(name: str) -> str:
    for pattern, repl in _NATIVE_TO_HF:
        name = pattern.sub(repl, name)
    return name


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _artifact(
    kind: str, root: Path, path: Path, config_sha256: str, dataset_sha256: str
) -> dict[str, Any]:
    return {
        "kind": kind,
        "path": str(path.relative_to(root)),
        "bytes": path.stat().st_size,
        "sha256": _sha256(path),
        "config_sha256": config_sha256,
        "dataset_sha256": dataset_sha256,
    }


def save_result(
    model: nn.Module,
    section: FinetuneSection,
    *,
    out_dir: str,
    native: bool,
    model_type: str,
    checkpoint_path: str | None,
    config_sha256: str,
    dataset_sha256: str,
    lora_targets_used: list[str] | None,
) -> list[dict[str, Any]]:
    """Write the adapter or the full weights as safetensors; the artifacts written."""
    from safetensors.torch import save_file

    root = Path(out_dir)
    root.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "pt", "config_sha256": config_sha256, "dataset_sha256": dataset_sha256}
    if section.method == "lora":
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(model)
        prefix = "base_model.model."
        tensors = {
            prefix + (_hf_name(k) if native else k): v.detach().contiguous().cpu()
            for k, v in state.items()
        }
        path = root / "adapter_model.safetensors"
        save_file(tensors, str(path), metadata=metadata)
        from peft import LoraConfig

        LoraConfig(
            r=section.r,
            lora_alpha=section.alpha,
            lora_dropout=section.dropout,
            target_modules=lora_targets_used,
            bias="none",
            task_type="CAUSAL_LM",
            fan_in_fan_out=model_type == "gpt2",
            base_model_name_or_path=Path(checkpoint_path).name if checkpoint_path else None,
        ).save_pretrained(str(root))
        return [_artifact("lora_adapter", root, path, config_sha256, dataset_sha256)]
    if checkpoint_path is not None and native:
        from gpu_runtime.hf import hf_state_dict

        state = hf_state_dict(model)
    elif checkpoint_path is not None:
        state = model.hf.state_dict()
    else:
        state = model.state_dict()
    tensors = _untied({k: v.detach().contiguous().cpu() for k, v in state.items()})
    path = root / "model.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    if checkpoint_path is not None:
        for name in ("config.json", *_TOKENIZER_FILES):
            source = Path(checkpoint_path) / name
            if source.is_file():
                shutil.copyfile(source, root / name)
    return [_artifact("weights", root, path, config_sha256, dataset_sha256)]


def _untied(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses two names for one storage (a tied head): keep the first name."""
    seen: dict[tuple[int, int], str] = {}
    out = {}
    for name, t in tensors.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen:
            continue
        seen[key] = name
        out[name] = t
    return out
