"""to_trainer_args: the keys an arm declares as TrainingArguments keywords (that construct a real
TrainingArguments), never over a value the script set, and every declared key the Trainer cannot
act on named, dotted, with the reason."""

from __future__ import annotations

import pytest

from costlab.strategy import DEFAULTS, _checkpointing_args, to_trainer_args
from gpu_runtime.schema import StrategyConfig


def test_the_sdk_knows_the_schema_defaults():
    """The SDK imports nothing of gpu_runtime: its copy of the defaults must not drift."""
    assert StrategyConfig().model_dump(mode="json") == DEFAULTS


def test_a_strategy_maps_onto_training_arguments(tmp_path):
    from transformers import TrainingArguments

    declared = StrategyConfig.model_validate(
        {
            "train": {
                "steps": 300,
                "global_batch": 32,
                "micro_batch": 4,
                "lr": 1e-3,
                "warmup_steps": 20,
                "grad_clip": 0.5,
                "seed": 7,
            },
            "optimizer": {"weight_decay": 0.01, "beta1": 0.8, "beta2": 0.99},
            "precision": {"compute_dtype": "bf16"},
            "memory": {"gradient_checkpointing": {"enabled": True, "every_n_blocks": 2}},
            "kernels": {"compile": True, "fused_optimizer": True},
            "data": {"prefetch": 4, "pin_memory": False},
            "distributed": {"nproc_per_node": 2},
        }
    ).model_dump(mode="json", exclude_unset=True)  # as the assign answer's `declared`
    kwargs, unmapped, conflicts = to_trainer_args(declared)
    # transformers 5.24 (the pinned one) calls it activation_checkpointing, every_n_layers its own
    assert _checkpointing_args() == ("activation_checkpointing", True)
    assert kwargs == {
        "bf16": True,
        "fp16": False,
        "activation_checkpointing": True,
        "activation_checkpointing_kwargs": {"every_n_layers": 2},
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 4,  # 32 over 2 ranks, 4 per micro-batch
        "learning_rate": 1e-3,
        "warmup_steps": 20,
        "max_steps": 300,
        "max_grad_norm": 0.5,
        "seed": 7,
        "weight_decay": 0.01,
        "adam_beta1": 0.8,
        "adam_beta2": 0.99,
        "optim": "adamw_torch_fused",
        "torch_compile": True,
        "dataloader_pin_memory": False,
        "dataloader_num_workers": 1,
        "dataloader_prefetch_factor": 4,
    }
    assert unmapped == {"distributed.nproc_per_node": "the launch shape: torchrun --nproc-per-node"}
    assert conflicts == []
    bf16 = kwargs.pop("bf16")  # needs a device that runs it; the rest on any CPU
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 4)
    assert args.optim == "adamw_torch_fused" and args.torch_compile and bf16
    assert args.activation_checkpointing and args.activation_checkpointing_kwargs == {
        "every_n_layers": 2
    }


def test_what_the_trainer_cannot_do_is_named_with_the_reason():
    _kwargs, unmapped, _ = to_trainer_args(
        {
            "precision": {
                "compute_dtype": "auto",
                "storage_dtype": "bf16",
                "quantization": {"enabled": True},
            },
            "optimizer": {"dynamic_batching": {"enabled": True, "max_micro_batch": 32}},
            "kernels": {"fused_rmsnorm_qkv": True, "compile": "auto"},
            "offload": {"embedding": "cpu"},
            "finetune": {"method": "lora"},
            "telemetry": {"interval_s": 0.5},  # the SDK's own: not the Trainer's to map
            "trian": {"steps": 3},  # a typo: named, not dropped
        }
    )
    assert list(unmapped) == [
        "precision.compute_dtype",
        "precision.storage_dtype",
        "precision.quantization.enabled",
        "optimizer.dynamic_batching.enabled",
        "optimizer.dynamic_batching.max_micro_batch",
        "kernels.fused_rmsnorm_qkv",
        "kernels.compile",
        "offload.embedding",
        "finetune.method",
        "trian.steps",
    ]
    assert "'auto'" in unmapped["precision.compute_dtype"]
    assert "no dynamic batching" in unmapped["optimizer.dynamic_batching.max_micro_batch"]
    assert "peft" in unmapped["finetune.method"]
    assert "not a strategy key" in unmapped["trian.steps"]


def test_an_arm_of_bf16_only_changes_only_the_precision():
    """The issue's case: the assign answer filled in every default, and max_steps, the learning
    rate, decay, betas, scheduler, warmup, batch, seed and workers were all overridden."""
    assert to_trainer_args({"precision": {"compute_dtype": "bf16"}}) == (
        {"bf16": True, "fp16": False},
        {},
        [],
    )


@pytest.mark.parametrize(("fused", "optim"), [(False, "adamw_torch"), (True, "adamw_torch_fused")])
def test_the_fused_optimizer_key_selects_either_optimizer(fused, optim):
    """`false` used to map to nothing, and transformers 5.24's default is the fused AdamW: both
    arms of a fused-vs-unfused test trained fused."""
    assert to_trainer_args({"kernels": {"fused_optimizer": fused}}).kwargs == {"optim": optim}


def test_a_value_the_script_set_is_kept_and_named(tmp_path):
    from transformers import TrainingArguments

    script = TrainingArguments(
        output_dir=str(tmp_path), max_steps=30, learning_rate=1e-3, use_cpu=True, report_to="none"
    )
    mapping = to_trainer_args(
        {"train": {"steps": 200, "lr": 1e-3, "warmup_steps": 10, "seed": 0}}, args=script
    )
    # lr agrees; warmup_steps and seed are at the Trainer's defaults (the script's silence)
    assert mapping.kwargs == {"learning_rate": 1e-3, "warmup_steps": 10, "seed": 0}
    assert [(c.key, c.argument, c.script, c.arm) for c in mapping.conflicts] == [
        ("train.steps", "max_steps", 30, 200)
    ]
    assert "the script's value is kept" in str(mapping.conflicts[0])
    applied = mapping.apply(script)
    assert (applied.max_steps, applied.warmup_steps, applied.learning_rate) == (30, 10, 1e-3)
    # keywords the script passes, as a dict: present means set
    kwargs = to_trainer_args({"train": {"seed": 7}}, args={"seed": 42})
    assert kwargs.kwargs == {} and kwargs.conflicts[0].script == 42


@pytest.mark.parametrize(
    ("train", "expected"),
    [
        ({"global_batch": 8}, (8, 1)),
        ({"global_batch": 64, "micro_batch": 16}, (16, 4)),
    ],
)
def test_the_global_batch_is_reached_by_accumulation(train, expected):
    kwargs, unmapped, _ = to_trainer_args({"train": train})
    assert (
        kwargs["per_device_train_batch_size"],
        kwargs["gradient_accumulation_steps"],
    ) == expected
    assert unmapped == {}


def test_a_batch_that_does_not_divide_is_named_not_guessed():
    kwargs, unmapped, _ = to_trainer_args({"train": {"global_batch": 10, "micro_batch": 4}})
    assert "per_device_train_batch_size" not in kwargs
    assert list(unmapped) == ["train.global_batch", "train.micro_batch"]
    assert "does not divide" in unmapped["train.global_batch"]
