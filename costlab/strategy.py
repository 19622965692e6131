"""An assigned strategy as ``transformers.TrainingArguments`` keywords: the keys that have an
equivalent there, and the names of those that do not.

    run = costlab.track(experiment=12, assign=True).start()
    kwargs, unmapped = to_trainer_args(run.strategy)
    args = TrainingArguments(output_dir="out", **kwargs)

A key that keeps its default and has no equivalent is not reported: only what the arm asks for
and the Trainer cannot do is (``unmapped``, dotted names such as
``optimizer.dynamic_batching.enabled``). The model, data source and fine-tuning method are the
team's own code; the launch shape (``distributed.nproc_per_node``, ``nnodes``) is torchrun's.
"""

from __future__ import annotations

import copy
import importlib.metadata
from typing import Any

# The strategy schema's defaults (gpu_runtime.schema.StrategyConfig; tests/sdk checks they agree):
# this package imports nothing of gpu_runtime.
DEFAULTS: dict[str, Any] = {
    "model": {"family": "llama", "preset": "tiny", "path": None, "seq_len": 256},
    "data": {
        "source": "synthetic",
        "path": None,
        "format": "alpaca",
        "loss_on": "all",
        "packing": True,
        "pin_memory": True,
        "prefetch": 2,
    },
    "train": {
        "steps": 200,
        "global_batch": 8,
        "micro_batch": None,
        "lr": 3.0e-4,
        "min_lr_ratio": 0.1,
        "warmup_steps": 10,
        "grad_clip": 1.0,
        "seed": 0,
        "deterministic": False,
        "checkpoint_every": 0,
        "init": None,
    },
    "optimizer": {
        "name": "adamw",
        "weight_decay": 0.1,
        "beta1": 0.9,
        "beta2": 0.95,
        "dynamic_batching": {
            "enabled": False,
            "min_micro_batch": 4,
            "max_micro_batch": 64,
            "stability_window": 128,
            "probe_steps": 4,
            "min_speedup": 0.03,
            "cpu_memory_budget_mb": None,
            "adaptive_global_batch": False,
            "min_global_batch": None,
            "lr_scaling": "sqrt",
            "policy": "noise_scale",
        },
    },
    "precision": {
        "compute_dtype": "fp32",
        "storage_dtype": "fp32",
        "quantization": {
            "enabled": False,
            "target_modules": ["q_proj", "v_proj", "o_proj"],
            "weight_bits": 8,
            "adapter_rank": 8,
            "adapter_alpha": 16.0,
            "trainable": "adapters",
        },
    },
    "offload": {"embedding": "none", "mmap": False},
    "memory": {"gradient_checkpointing": {"enabled": False, "every_n_blocks": 1}},
    "kernels": {
        "fused_rmsnorm_qkv": False,
        "compile": False,
        "attention": "sdpa",
        "fused_optimizer": False,
    },
    "finetune": {
        "method": "full",
        "r": 8,
        "alpha": 16.0,
        "dropout": 0.0,
        "target_modules": None,
        "save": False,
    },
    "placement": {"strategy": "topology_aware", "gpus": 1},
    "distributed": {"nproc_per_node": 1, "nnodes": 1, "backend": "auto"},
    "telemetry": {"enabled": True, "interval_s": 1.0, "cpu_tdp_w": 65.0, "peak_flops": None},
}

# Applied by the SDK itself (the callbacks sample at the arm's interval), not the Trainer.
SDK_KEYS = {"telemetry.interval_s", "telemetry.cpu_tdp_w"}


def _checkpointing_args() -> tuple[str, bool]:
    """The TrainingArguments name for activation (gradient) checkpointing, and whether it takes
    `every_n_layers`: transformers 5.24 renamed it activation_checkpointing (the old name a
    deprecated alias, gone in 6) and added every_n_layers; read from the installed version, as
    this module never imports transformers."""
    try:
        major, minor = (int(p) for p in importlib.metadata.version("transformers").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return "gradient_checkpointing", False
    if (major, minor) >= (5, 24):
        return "activation_checkpointing", True
    return "gradient_checkpointing", False


def _merged(strategy: dict) -> dict:
    out = copy.deepcopy(DEFAULTS)

    def merge(into: dict, given: dict) -> None:
        for key, value in given.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    merge(out, strategy or {})
    return out


def _leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _leaves(value, name + ".")
        else:
            yield name, value


def _get(tree: dict, dotted: str) -> Any:
    for key in dotted.split("."):
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def to_trainer_args(strategy: dict, *, world_size: int | None = None) -> tuple[dict, list[str]]:
    """(TrainingArguments keywords, dotted names of the non-default keys with no equivalent).

    world_size: the job's processes, which share `train.global_batch` (default: the strategy's
    ``distributed.nproc_per_node x nnodes``)."""
    s = _merged(strategy)
    train, opt, kernels = s["train"], s["optimizer"], s["kernels"]
    kwargs: dict[str, Any] = {}
    mapped: set[str] = set()

    def put(key: str, *names: str, **values: Any) -> None:
        kwargs.update(values)
        mapped.update((key, *names))

    compute = s["precision"]["compute_dtype"]
    if compute in ("bf16", "fp16", "fp32"):  # "auto" needs the device's profile: unmapped
        put("precision.compute_dtype", **({compute: True} if compute != "fp32" else {}))
    checkpointing = s["memory"]["gradient_checkpointing"]
    name, every_n = _checkpointing_args()
    put("memory.gradient_checkpointing.enabled", **{name: bool(checkpointing["enabled"])})
    if checkpointing["enabled"] and checkpointing["every_n_blocks"] != 1 and every_n:
        put(
            "memory.gradient_checkpointing.every_n_blocks",
            **{f"{name}_kwargs": {"every_n_layers": checkpointing["every_n_blocks"]}},
        )

    world = world_size or s["distributed"]["nproc_per_node"] * s["distributed"]["nnodes"]
    per_rank, spare = divmod(train["global_batch"], world)
    micro = train["micro_batch"] or per_rank
    if per_rank and not spare and per_rank % micro == 0:
        put(
            "train.global_batch",
            "train.micro_batch",
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=per_rank // micro,
        )
    put("train.lr", learning_rate=float(train["lr"]))
    put("train.warmup_steps", warmup_steps=int(train["warmup_steps"]))
    put("train.steps", max_steps=int(train["steps"]))
    put("train.grad_clip", max_grad_norm=float(train["grad_clip"]))
    put("train.seed", seed=int(train["seed"]))
    put(
        "train.min_lr_ratio",  # costlab's schedule: linear warmup, cosine down to a floor
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": float(train["min_lr_ratio"])},
    )
    put("train.deterministic", full_determinism=bool(train["deterministic"]))
    if train["checkpoint_every"]:
        put("train.checkpoint_every", save_strategy="steps", save_steps=train["checkpoint_every"])
    else:
        mapped.add("train.checkpoint_every")
    if opt["name"] == "adamw":
        put("optimizer.name")
    put("optimizer.weight_decay", weight_decay=float(opt["weight_decay"]))
    put("optimizer.beta1", adam_beta1=float(opt["beta1"]))
    put("optimizer.beta2", adam_beta2=float(opt["beta2"]))
    if kernels["fused_optimizer"]:
        put("kernels.fused_optimizer", optim="adamw_torch_fused")
    if kernels["compile"] is True:  # "auto" needs the device: unmapped
        put("kernels.compile", torch_compile=True)
    put("data.pin_memory", dataloader_pin_memory=bool(s["data"]["pin_memory"]))
    if s["data"]["prefetch"]:  # batches loaded ahead: the Trainer does it in a worker process
        put(
            "data.prefetch",
            dataloader_num_workers=1,
            dataloader_prefetch_factor=s["data"]["prefetch"],
        )
    if s["distributed"]["backend"] != "auto":
        put("distributed.backend", ddp_backend=s["distributed"]["backend"])

    unmapped = [
        name
        for name, value in _leaves(s)
        if name not in mapped and name not in SDK_KEYS and value != _get(DEFAULTS, name)
    ]
    return kwargs, unmapped
