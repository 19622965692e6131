"""An arm's strategy as ``transformers.TrainingArguments``: only the keys the arm declares,
never over a value the script set, and every declared key accounted for.

    callback = CostlabCallback(experiment=12, assign=True)
    args = callback.apply(TrainingArguments(output_dir="out", max_steps=300))  # assigns, applies
    Trainer(model, args, train_dataset=data, callbacks=[callback]).train()

or by hand, with a run of ``costlab.track(..., assign=True).start()``:

    mapping = costlab.to_trainer_args(run, args=training_args)
    training_args = mapping.apply(training_args)  # mapping.unmapped, mapping.conflicts: say them

- **Declared keys only.** The assign answer's ``declared`` holds the keys the arm's YAML sets;
  a key the arm leaves at the schema's default changes nothing in the script (an arm of
  ``precision: {compute_dtype: bf16}`` sets ``bf16=True`` and nothing else). A plain dict is
  read as declared keys.
- **No silent override.** Where ``args`` (the script's TrainingArguments, or the keywords it
  passes) already holds a different value, the argument is left out of ``kwargs`` and listed in
  ``conflicts`` (key, argument, the script's value, the arm's); a TrainingArguments field still at
  its default is the script's silence, not a choice.
- **Every declared key accounted for**: mapped (``kwargs``; a value the Trainer keeps anyway, such
  as ``precision.storage_dtype: fp32``, maps to nothing) or in ``unmapped`` with the reason
  (``kernels.fused_rmsnorm_qkv: costlab's fused kernel; the Trainer has none``).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
from collections.abc import Mapping
from typing import Any, NamedTuple

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


class Conflict(NamedTuple):
    """A declared key whose argument the script set otherwise: the script's value is kept."""

    key: str  # the strategy's dotted key
    argument: str  # the TrainingArguments field
    script: Any
    arm: Any

    def __str__(self) -> str:
        return (
            f"{self.key}: the arm asks {self.argument}={self.arm!r}, the script set "
            f"{self.script!r}; the script's value is kept"
        )


class TrainerArgs(NamedTuple):
    """What `to_trainer_args` found: the keywords to apply, the declared keys the Trainer does
    not act on (dotted key: why), and the conflicts with the script's own settings."""

    kwargs: dict[str, Any]
    unmapped: dict[str, str]
    conflicts: list[Conflict]

    def apply(self, args: Any) -> Any:
        """`args` with `kwargs` applied: a new TrainingArguments (its checks run again), or a new
        dict of keywords."""
        if isinstance(args, Mapping):
            return {**args, **self.kwargs}
        return dataclasses.replace(args, **self.kwargs) if self.kwargs else args


# Why a declared key has no TrainingArguments equivalent, by dotted prefix (longest first wins).
# A key at a value the Trainer keeps anyway is in SATISFIED instead.
NOT_THE_TRAINERS = {
    "model": "the model is the script's own (loaded before the Trainer)",
    "data": "the dataset and its collator are the script's own",
    "train.init": "the script loads its own weights",
    "optimizer.dynamic_batching": "the Trainer's micro-batch is fixed: no dynamic batching",
    "precision.compute_dtype": "'auto' is resolved from the device by costlab's runtime; declare "
    "bf16, fp16 or fp32 for the Trainer",
    "precision.storage_dtype": "the Trainer keeps fp32 weights (bf16/fp16 are autocast)",
    "precision.quantization": "int8 weights with adapters: peft and bitsandbytes in the script",
    "offload": "costlab's embedding offload and mmap: not in the Trainer",
    "memory.gradient_checkpointing.every_n_blocks": "this transformers checkpoints every layer "
    "(activation_checkpointing_kwargs.every_n_layers came in 5.24)",
    "kernels.fused_rmsnorm_qkv": "costlab's fused RMSNorm+QKV kernel: the Trainer has none",
    "kernels.compile": "'auto' decides from the device in costlab's runtime; declare true or false",
    "kernels.attention": "the attention kernel is chosen at model load "
    "(from_pretrained(attn_implementation=...)) in the script",
    "finetune": "LoRA is peft's, applied to the model in the script",
    "placement": "device placement is the launcher's (torchrun, CUDA_VISIBLE_DEVICES)",
    "distributed.nproc_per_node": "the launch shape: torchrun --nproc-per-node",
    "distributed.nnodes": "the launch shape: torchrun --nnodes",
    "telemetry.enabled": "the callback samples while it tracks: leave it out to track nothing",
    "telemetry.peak_flops": "used by costlab's runtime for MFU only",
}
SATISFIED = {  # declared at what the Trainer does anyway: nothing to apply
    ("precision.storage_dtype", "fp32"),
    ("precision.quantization.enabled", False),
    ("offload.embedding", "none"),
    ("offload.mmap", False),
    ("kernels.fused_rmsnorm_qkv", False),
    ("finetune.method", "full"),
    ("distributed.backend", "auto"),
    ("optimizer.name", "adamw"),
}


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


def _leaves(tree: Mapping, prefix: str = ""):
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, name + ".")
        else:
            yield name, value


def _get(tree: Any, dotted: str, default: Any = None) -> Any:
    for key in dotted.split("."):
        if not isinstance(tree, Mapping) or key not in tree:
            return default
        tree = tree[key]
    return tree


def _declared_of(strategy: Any) -> dict:
    """The declared keys: a Run's (the assign answer's `declared`; an older server's filled-in
    strategy otherwise), or a dict as given."""
    if isinstance(strategy, Mapping) or strategy is None:
        return copy.deepcopy(dict(strategy or {}))
    declared = getattr(strategy, "declared", None)
    if declared is None:
        declared = getattr(strategy, "strategy", None)
    if declared is None:
        raise ValueError("strategy: the run has no strategy yet (start it with assign=True)")
    return copy.deepcopy(dict(declared))


def _script_value(args: Any, name: str) -> tuple[bool, Any]:
    """(whether the script set `name`, its value): a dict's key present; a TrainingArguments
    field away from its default."""
    if args is None:
        return False, None
    if isinstance(args, Mapping):
        return (name in args), args.get(name)
    if not hasattr(args, name):
        return False, None
    value = getattr(args, name)
    value = getattr(value, "value", value)  # an enum (optim, lr_scheduler_type)
    for f in dataclasses.fields(args) if dataclasses.is_dataclass(args) else ():
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                return True, value
            return value != getattr(default, "value", default), value
    return True, value


def to_trainer_args(
    strategy: Any, *, args: Any = None, world_size: int | None = None
) -> TrainerArgs:
    """The TrainingArguments keywords of the keys `strategy` declares (a started costlab.Run,
    or a dict of declared keys), none over a different value in `args` (the script's
    TrainingArguments or keywords). world_size: the job's processes, which share
    `train.global_batch` (default: the strategy's ``distributed.nproc_per_node x nnodes``)."""
    declared = _declared_of(strategy)
    s = copy.deepcopy(DEFAULTS)

    def merge(into: dict, given: Mapping) -> None:
        for key, value in given.items():
            if isinstance(value, Mapping) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    merge(s, declared)
    keys = dict(_leaves(declared))
    kwargs: dict[str, Any] = {}
    unmapped: dict[str, str] = {}
    conflicts: list[Conflict] = []
    accounted: set[str] = set()

    def put(key: str, *also: str, **values: Any) -> None:
        """Map the declared `key` (and `also`) to `values`, all or none of them."""
        accounted.update((key, *also))
        clashes = []
        for name, value in values.items():
            set_, script = _script_value(args, name)
            if set_ and script != value:
                clashes.append(Conflict(key, name, script, value))
        if clashes:
            conflicts.extend(clashes)
        else:
            kwargs.update(values)

    def declared_any(*names: str) -> bool:
        return any(n in keys for n in names)

    train, kernels = s["train"], s["kernels"]
    compute = s["precision"]["compute_dtype"]
    if "precision.compute_dtype" in keys and compute in ("bf16", "fp16", "fp32"):
        put("precision.compute_dtype", bf16=compute == "bf16", fp16=compute == "fp16")
    checkpointing = s["memory"]["gradient_checkpointing"]
    arg_name, every_n = _checkpointing_args()
    if "memory.gradient_checkpointing.enabled" in keys:
        put("memory.gradient_checkpointing.enabled", **{arg_name: bool(checkpointing["enabled"])})
    if "memory.gradient_checkpointing.every_n_blocks" in keys and every_n:
        if checkpointing["every_n_blocks"] == 1:
            accounted.add("memory.gradient_checkpointing.every_n_blocks")  # the Trainer's way
        else:
            put(
                "memory.gradient_checkpointing.every_n_blocks",
                **{f"{arg_name}_kwargs": {"every_n_layers": checkpointing["every_n_blocks"]}},
            )

    if declared_any("train.global_batch", "train.micro_batch"):
        shape = s["distributed"]
        world = world_size or shape["nproc_per_node"] * shape["nnodes"]
        per_rank, spare = divmod(train["global_batch"], world)
        micro = train["micro_batch"] or per_rank
        batch_keys = [k for k in ("train.global_batch", "train.micro_batch") if k in keys]
        if per_rank and not spare and per_rank % micro == 0:
            put(
                *batch_keys,
                per_device_train_batch_size=micro,
                gradient_accumulation_steps=per_rank // micro,
            )
        else:
            for key in batch_keys:
                unmapped[key] = (
                    f"a global batch of {train['global_batch']} over {world} process(es) does "
                    f"not divide into micro-batches of {micro}"
                )
                accounted.add(key)
    for key, argument, cast in (
        ("train.lr", "learning_rate", float),
        ("train.warmup_steps", "warmup_steps", int),
        ("train.steps", "max_steps", int),
        ("train.grad_clip", "max_grad_norm", float),
        ("train.seed", "seed", int),
        ("train.deterministic", "full_determinism", bool),
        ("optimizer.weight_decay", "weight_decay", float),
        ("optimizer.beta1", "adam_beta1", float),
        ("optimizer.beta2", "adam_beta2", float),
        ("data.pin_memory", "dataloader_pin_memory", bool),
    ):
        if key in keys:
            put(key, **{argument: cast(keys[key])})
    if "train.min_lr_ratio" in keys:  # costlab's schedule: linear warmup, cosine to a floor
        put(
            "train.min_lr_ratio",
            lr_scheduler_type="cosine_with_min_lr",
            lr_scheduler_kwargs={"min_lr_rate": float(train["min_lr_ratio"])},
        )
    if "train.checkpoint_every" in keys:
        every = int(train["checkpoint_every"])
        if every:
            put("train.checkpoint_every", save_strategy="steps", save_steps=every)
        else:
            put("train.checkpoint_every", save_strategy="no")
    if "kernels.fused_optimizer" in keys:  # explicit either way: the Trainer's default is fused
        fused = bool(kernels["fused_optimizer"])
        put("kernels.fused_optimizer", optim="adamw_torch_fused" if fused else "adamw_torch")
    if "kernels.compile" in keys and kernels["compile"] in (True, False):
        put("kernels.compile", torch_compile=bool(kernels["compile"]))
    if "data.prefetch" in keys:  # batches loaded ahead: the Trainer does it in worker processes
        ahead = int(s["data"]["prefetch"])
        if ahead:
            put("data.prefetch", dataloader_num_workers=1, dataloader_prefetch_factor=ahead)
        else:
            put("data.prefetch", dataloader_num_workers=0)
    if "distributed.backend" in keys and s["distributed"]["backend"] != "auto":
        put("distributed.backend", ddp_backend=s["distributed"]["backend"])

    for key, value in keys.items():
        if key in accounted or key in SDK_KEYS or key in unmapped:
            continue
        if (key, value) in SATISFIED:
            continue
        if _get(DEFAULTS, key, _MISSING) is _MISSING:
            unmapped[key] = "not a strategy key (gpu_runtime's schema has no such key)"
            continue
        unmapped[key] = next(
            (
                why
                for prefix, why in sorted(NOT_THE_TRAINERS.items(), key=lambda kv: -len(kv[0]))
                if key == prefix or key.startswith(prefix + ".")
            ),
            "the Trainer has no equivalent",
        )
    return TrainerArgs(kwargs, unmapped, conflicts)


_MISSING = object()
