"""to_trainer_args: an assigned strategy's keys as TrainingArguments keywords (that construct a real
TrainingArguments), and every non-default key the Trainer cannot act on named, dotted."""

from __future__ import annotations

import pytest

from costlab.strategy import DEFAULTS, _checkpointing_args, to_trainer_args
from gpu_runtime.schema import StrategyConfig


def test_the_sdk_knows_the_schema_defaults():
    """The SDK imports nothing of gpu_runtime: its copy of the defaults must not drift."""
    assert StrategyConfig().model_dump(mode="json") == DEFAULTS


def test_a_strategy_maps_onto_training_arguments(tmp_path):
    from transformers import TrainingArguments

    strategy = StrategyConfig.model_validate(
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
    ).model_dump(mode="json")  # as the assign endpoint gives it: defaults filled
    kwargs, unmapped = to_trainer_args(strategy)
    # transformers 5.24 (the pinned one) calls it activation_checkpointing, every_n_layers its own
    assert _checkpointing_args() == ("activation_checkpointing", True)
    assert kwargs == {
        "bf16": True,
        "activation_checkpointing": True,
        "activation_checkpointing_kwargs": {"every_n_layers": 2},
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 4,  # 32 over 2 ranks, 4 per micro-batch
        "learning_rate": 1e-3,
        "warmup_steps": 20,
        "max_steps": 300,
        "max_grad_norm": 0.5,
        "seed": 7,
        "lr_scheduler_type": "cosine_with_min_lr",
        "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
        "full_determinism": False,
        "weight_decay": 0.01,
        "adam_beta1": 0.8,
        "adam_beta2": 0.99,
        "optim": "adamw_torch_fused",
        "torch_compile": True,
        "dataloader_pin_memory": False,
        "dataloader_num_workers": 1,
        "dataloader_prefetch_factor": 4,
    }
    assert unmapped == ["distributed.nproc_per_node"]  # torchrun's --nproc-per-node, not an arg
    bf16 = kwargs.pop("bf16")  # needs a device that runs it; the rest on any CPU
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 4)
    assert args.optim == "adamw_torch_fused" and args.torch_compile and bf16
    assert args.activation_checkpointing and args.activation_checkpointing_kwargs == {
        "every_n_layers": 2
    }


def test_what_the_trainer_cannot_do_is_named():
    _kwargs, unmapped = to_trainer_args(
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
        }
    )
    assert unmapped == [
        "optimizer.dynamic_batching.enabled",
        "optimizer.dynamic_batching.max_micro_batch",
        "precision.compute_dtype",
        "precision.storage_dtype",
        "precision.quantization.enabled",
        "offload.embedding",
        "kernels.fused_rmsnorm_qkv",
        "kernels.compile",
        "finetune.method",
    ]


@pytest.mark.parametrize(
    ("train", "expected"),
    [
        ({"global_batch": 8}, (8, 1)),
        ({"global_batch": 64, "micro_batch": 16}, (16, 4)),
    ],
)
def test_the_global_batch_is_reached_by_accumulation(train, expected):
    kwargs, unmapped = to_trainer_args({"train": train})
    assert (
        kwargs["per_device_train_batch_size"],
        kwargs["gradient_accumulation_steps"],
    ) == expected
    assert unmapped == []


def test_a_batch_that_does_not_divide_is_named_not_guessed():
    kwargs, unmapped = to_trainer_args({"train": {"global_batch": 10, "micro_batch": 4}})
    assert "per_device_train_batch_size" not in kwargs
    assert unmapped == ["train.global_batch", "train.micro_batch"]
