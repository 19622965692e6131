"""The strategy schema: every key of a strategy YAML, its default and its unit.

Imports no torch, so the web side can validate a strategy without loading the runtime.
Hardware-dependent checks (a dtype the device cannot run) live in ``capability``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gpu_runtime.errors import DOCUMENT_KEY, StrategyError
from gpu_runtime.holdout import synthetic_split_problem
from gpu_runtime.yaml_loader import read_strategy_yaml

PRESETS = ("tiny", "small", "125m", "350m", "1b", "7b")
DTYPES = ("fp32", "bf16", "fp16")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _yaml_float(value: Any) -> Any:
    # YAML 1.1 reads `3e-4` (no dot) as a string; accept it as the number it plainly is.
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


Float = Annotated[float, BeforeValidator(_yaml_float)]


def _not_a_number(value: Any) -> Any:
    # Literal[True] would take 1 (1 == True); a switch is true, false or auto, never a number.
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError(f"must be true, false or auto, not the number {value!r}")
    return value


def _count_or_auto(value: Any) -> Any:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError("must be a whole number of sequences (at least 1) or auto")


Dtype = Literal["fp32", "bf16", "fp16"]
# `auto`: the fastest dtype this device runs natively, from its measured profile
# (gpu_runtime.profile.best_dtype), resolved when the run starts and recorded on it.
ComputeDtype = Literal["auto", "fp32", "bf16", "fp16"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, validate_default=True)


_REMOTE_SCHEMES = ("http://", "https://", "hf://", "s3://", "gs://", "ssh://", "git@")


class ModelSection(_Section):
    family: Literal["llama", "hf"] = Field(
        "llama",
        description=(
            "llama: costlab's own LLaMA-style decoder, built from a preset with byte tokens; "
            "hf: a local Hugging Face causal-LM checkpoint (model.path)."
        ),
    )
    preset: Literal["tiny", "small", "125m", "350m", "1b", "7b"] = Field(
        "tiny",
        description="Model size (family llama): tiny ~4M, small ~25M parameters; "
        "125m/350m/1b/7b follow the public shapes. Family hf takes its shapes from the "
        "checkpoint (another preset than the default is refused there).",
    )
    path: str | None = Field(
        None,
        description=(
            "family hf: a local checkpoint directory (config.json, safetensors weights, "
            "tokenizer files), relative to the working directory. Nothing is ever downloaded."
        ),
    )
    seq_len: int = Field(256, ge=8, le=32768, description="Context length in tokens.")

    @model_validator(mode="after")
    def _family_keys(self) -> ModelSection:
        if self.family == "hf":
            if not self.path:
                raise PydanticCustomError(
                    "hf_needs_path",
                    "family hf needs path: the local checkpoint directory to load",
                    {"field": "path"},
                )
            if self.path.lower().startswith(_REMOTE_SCHEMES):
                raise PydanticCustomError(
                    "remote_path",
                    "{path} is a remote address; costlab loads local checkpoints only and "
                    "never downloads: copy the checkpoint to a directory and name it here",
                    {"field": "path", "path": self.path},
                )
            if self.preset != "tiny":  # tiny, the default, survives a dump and reload
                raise PydanticCustomError(
                    "preset_with_hf",
                    "preset sizes costlab's own model (family llama); a family hf model takes "
                    "its shapes from the checkpoint's config.json: drop preset",
                    {"field": "preset"},
                )
        elif self.path is not None:
            raise PydanticCustomError(
                "path_without_hf",
                "path names a checkpoint to load, which only family hf does; family llama "
                "builds a preset from scratch: set family: hf or drop path",
                {"field": "path"},
            )
        return self


class DataSection(_Section):
    source: Literal["text", "jsonl", "synthetic"] = Field(
        "synthetic",
        description="text: a glob of local text files; jsonl: instruction records "
        "(data.format); synthetic: generated from the seed.",
    )
    path: str | None = Field(
        None, description="Glob of local files (text, jsonl); relative to the working directory."
    )
    format: Literal["alpaca", "chat"] = Field(
        "alpaca",
        description=(
            "jsonl records: alpaca ({instruction, input, output}) or chat ({messages: "
            "[{role, content}]}, roles system/user/assistant)."
        ),
    )
    loss_on: Literal["all", "response"] = Field(
        "all",
        description=(
            "Which tokens the loss trains on: all, or only the responses of jsonl records "
            "(Alpaca output, chat assistant turns); prompts are read but not trained on."
        ),
    )
    packing: bool = Field(
        True,
        description=(
            "true: text packed into one stream cut in windows of seq_len tokens, jsonl "
            "records packed whole into rows of seq_len (best fit, never split, the rest padded); "
            "false: one record per row, truncated or padded to seq_len (padding is never "
            "trained on)."
        ),
    )
    pin_memory: bool = Field(True, description="Stage batches in pinned host memory (CUDA only).")
    prefetch: int = Field(
        2, ge=0, le=64, description="Batches loaded ahead by a background thread; 0 loads inline."
    )

    @model_validator(mode="after")
    def _path_for_files(self) -> DataSection:
        if self.source != "synthetic" and not self.path:
            raise PydanticCustomError(
                "missing_path",
                "a path (glob) is required when source is {source}",
                {"field": "path", "source": self.source},
            )
        if self.loss_on == "response" and self.source != "jsonl":
            raise PydanticCustomError(
                "response_needs_records",
                "loss_on response trains on the responses of instruction records; source "
                "{source} has no responses: use source jsonl or loss_on all",
                {"field": "loss_on", "source": self.source},
            )
        if self.format != "alpaca" and self.source != "jsonl":
            raise PydanticCustomError(
                "format_needs_jsonl",
                "format describes jsonl records; source is {source}",
                {"field": "format", "source": self.source},
            )
        return self


class TrainSection(_Section):
    steps: int = Field(
        200, ge=1, le=10_000_000, description="Optimizer steps; also the LR schedule's length."
    )
    global_batch: int = Field(
        8, ge=1, le=65536, description="Sequences per optimizer step (reached by accumulation)."
    )
    micro_batch: int | None = Field(
        None,
        ge=1,
        description="Sequences per forward/backward when dynamic batching is off; "
        "unset = global_batch.",
    )
    lr: Float = Field(3.0e-4, gt=0, le=1.0, description="Peak learning rate (per step).")
    min_lr_ratio: Float = Field(
        0.1, ge=0, le=1.0, description="Final LR as a fraction of the peak (cosine floor)."
    )
    warmup_steps: int = Field(10, ge=0, description="Linear warmup length in steps.")
    grad_clip: Float = Field(
        1.0, ge=0, description="Max global gradient L2 norm; 0 disables clipping."
    )
    seed: int = Field(0, ge=0, le=2**63 - 1, description="Seed for initialisation and data order.")
    deterministic: bool = Field(
        False, description="Ask torch for deterministic algorithms (slower on CUDA)."
    )
    checkpoint_every: int = Field(
        0, ge=0, description="Save a checkpoint every N steps (0: only at the end)."
    )
    init: Literal["checkpoint", "scratch"] | None = Field(
        None,
        description=(
            "Where the weights start: checkpoint (model.path's weights) or scratch (random, "
            "the checkpoint's shapes). Unset: checkpoint for family hf, scratch for llama."
        ),
    )

    def starts_from(self, family: str) -> str:
        return self.init or ("checkpoint" if family == "hf" else "scratch")


class DynamicBatchingSection(_Section):
    enabled: bool = Field(
        False,
        description=(
            "Grow the micro-batch (the global batch fixed) while it fits in memory and "
            "raises throughput; halve it on out-of-memory (BatchScaler)."
        ),
    )
    min_micro_batch: int = Field(4, ge=1, description="Smallest micro-batch in sequences.")
    max_micro_batch: Annotated[int | Literal["auto"], BeforeValidator(_count_or_auto)] = Field(
        64,
        description=(
            "Largest micro-batch in sequences. auto: where the device's measured GEMM "
            "throughput stops rising (its profile's rows curve), at least min_micro_batch."
        ),
    )
    stability_window: int = Field(
        128,
        ge=1,
        description="Steps between two global-batch changes, at least (adaptive_global_batch).",
    )
    probe_steps: int = Field(
        4,
        ge=1,
        le=10_000,
        description=(
            "Steps timed at each micro-batch size (after one warm-up step) before the scaler "
            "compares throughput."
        ),
    )
    min_speedup: Float = Field(
        0.03,
        ge=0,
        le=1.0,
        description=(
            "A larger micro-batch is kept only if its measured tokens/s beats the smaller "
            "one's by this fraction; otherwise the scaler steps back and stops probing."
        ),
    )
    cpu_memory_budget_mb: int | None = Field(
        None,
        ge=64,
        description=(
            "On CPU, the process's peak RSS in MiB that a micro-batch may be predicted to reach; "
            "unset: half the host's physical memory. (CUDA uses the allocator's capacity.)"
        ),
    )
    adaptive_global_batch: bool = Field(
        False,
        description=(
            "Opt-in: let gradient statistics (policy) choose the global batch in "
            "[min_global_batch, train.global_batch], the learning rate scaled by lr_scaling. "
            "Off: the global batch never changes."
        ),
    )
    min_global_batch: int | None = Field(
        None,
        ge=1,
        description=(
            "adaptive_global_batch's smallest (starting) global batch; unset: "
            "train.global_batch // 8 (at least min_micro_batch)."
        ),
    )
    lr_scaling: Literal["sqrt", "linear"] = Field(
        "sqrt",
        description=(
            "adaptive_global_batch: the LR is train.lr x (batch / train.global_batch) ** 0.5 "
            "(sqrt, Adam-like, as Pollux) or ** 1 (linear, as AdaptDL's SGD scaling)."
        ),
    )
    policy: Literal["noise_scale", "grad_variance"] = Field(
        "noise_scale",
        description=(
            "adaptive_global_batch's rule: noise_scale: gradient noise scale B_simple; "
            "grad_variance: tanh of gradient-norm variance."
        ),
    )

    @model_validator(mode="after")
    def _bounds(self) -> DynamicBatchingSection:
        if self.max_micro_batch != "auto" and self.min_micro_batch > self.max_micro_batch:
            raise PydanticCustomError(
                "min_gt_max",
                "min_micro_batch ({min}) is larger than max_micro_batch ({max})",
                {
                    "field": "min_micro_batch",
                    "min": self.min_micro_batch,
                    "max": self.max_micro_batch,
                },
            )
        if self.min_global_batch is not None and self.min_global_batch < self.min_micro_batch:
            raise PydanticCustomError(
                "min_global_lt_micro",
                "min_global_batch ({gb}) is smaller than min_micro_batch ({min})",
                {
                    "field": "min_global_batch",
                    "gb": self.min_global_batch,
                    "min": self.min_micro_batch,
                },
            )
        return self


class OptimizerSection(_Section):
    name: Literal["adamw"] = Field("adamw", description="Optimizer: AdamW.")
    weight_decay: Float = Field(
        0.1, ge=0, description="Decoupled weight decay on matrices (not norms)."
    )
    beta1: Float = Field(0.9, ge=0, lt=1, description="AdamW first-moment decay.")
    beta2: Float = Field(0.95, ge=0, lt=1, description="AdamW second-moment decay.")
    dynamic_batching: DynamicBatchingSection = Field(default_factory=DynamicBatchingSection)


class QuantizationSection(_Section):
    enabled: bool = Field(
        False, description="Freeze target_modules' weights in int8 and train adapters."
    )
    target_modules: list[
        Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    ] = Field(
        default_factory=lambda: ["q_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Projection names to quantize.",
    )
    weight_bits: Literal[8] = Field(8, description="Weight bits; int8 only.")
    adapter_rank: int = Field(
        8, ge=1, le=1024, description="LoRA adapter rank trained beside each frozen weight."
    )
    adapter_alpha: Float = Field(
        16.0,
        gt=0,
        le=65536,
        description="LoRA scale numerator: the adapters add (adapter_alpha "
        "/ adapter_rank) x B A x.",
    )
    trainable: Literal["adapters", "full"] = Field(
        "adapters", description="What trains: adapters (full is refused)."
    )

    @model_validator(mode="after")
    def _no_full_finetune(self) -> QuantizationSection:
        if self.enabled and self.trainable == "full":
            raise PydanticCustomError(
                "quantized_full_finetune",
                "full fine-tuning of int8-quantized modules ({modules}) is not possible: "
                "their weights are frozen; "
                "use trainable: adapters or disable quantization",
                {"field": "trainable", "modules": ", ".join(self.target_modules)},
            )
        return self


class PrecisionSection(_Section):
    compute_dtype: ComputeDtype = Field(
        "fp32",
        description=(
            "Matmul dtype through torch.autocast: fp32, bf16 or fp16; auto picks the fastest one "
            "the device runs natively, from its measured profile."
        ),
    )
    storage_dtype: Dtype = Field(
        "fp32", description="Parameter dtype; below fp32 the optimizer keeps fp32 master weights."
    )
    quantization: QuantizationSection = Field(default_factory=QuantizationSection)

    @model_validator(mode="after")
    def _storage_not_narrower_than_fp32_compute(self) -> PrecisionSection:
        if self.compute_dtype in ("fp32", "auto") and self.storage_dtype != "fp32":
            raise PydanticCustomError(
                "storage_below_compute",
                "storage_dtype {storage} with compute_dtype {compute} would compute in "
                "{storage}{why}; set compute_dtype to bf16/fp16 or storage_dtype to fp32",
                {
                    "field": "storage_dtype",
                    "storage": self.storage_dtype,
                    "compute": self.compute_dtype,
                    "why": " (auto resolves to fp32 where nothing is faster)"
                    if self.compute_dtype == "auto"
                    else "",
                },
            )
        return self


class OffloadSection(_Section):
    embedding: Literal["none", "cpu", "npu"] = Field(
        "none", description="Where the embedding table lives: none (with the model), cpu, npu."
    )
    mmap: bool = Field(
        False, description="Load persisted tensors (checkpoints) memory-mapped instead of copying."
    )


class GradientCheckpointingSection(_Section):
    enabled: bool = Field(
        False, description="Recompute block activations in backward instead of storing them."
    )
    every_n_blocks: int = Field(1, ge=1, description="Checkpoint one block in every N.")


class MemorySection(_Section):
    gradient_checkpointing: GradientCheckpointingSection = Field(
        default_factory=GradientCheckpointingSection
    )


class KernelsSection(_Section):
    fused_rmsnorm_qkv: bool = Field(
        False, description="Fuse RMSNorm and the q/k/v projections (Triton on CUDA)."
    )
    compile: Annotated[Literal[False, True, "auto"], BeforeValidator(_not_a_number)] = Field(
        False,
        description=(
            "Wrap the model in torch.compile; auto compiles where the device's profile says it "
            "pays (a CUDA device of compute capability 7.0 or newer), not on a CPU."
        ),
    )
    attention: Literal["sdpa", "math", "auto"] = Field(
        "sdpa",
        description=(
            "sdpa: PyTorch's scaled_dot_product_attention (flash kernels); math: the explicit "
            "matmul, masked fp32 softmax, matmul (transformers' eager attention), faster on a "
            "CPU for short rows; auto: math on a CPU, sdpa elsewhere."
        ),
    )
    fused_optimizer: bool = Field(
        False,
        description=(
            "AdamW as PyTorch's fused kernel (one pass over each parameter's state, on CUDA "
            "and CPU) instead of the default per-tensor implementation."
        ),
    )


class FinetuneSection(_Section):
    method: Literal["full", "lora"] = Field(
        "full",
        description=(
            "full: every weight trains; lora: the base weights stay frozen and low-rank "
            "adapters train beside target_modules (peft)."
        ),
    )
    r: int = Field(8, ge=1, le=1024, description="LoRA rank.")
    alpha: Float = Field(
        16.0, gt=0, le=65536, description="LoRA scale numerator: adapters add (alpha / r) B A x."
    )
    dropout: Float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input.")
    target_modules: list[str] | None = Field(
        None,
        min_length=1,
        description=(
            "Module names (suffixes) that get adapters; unset: the attention projections "
            "(q_proj, v_proj on LLaMA-family models; the architecture's own on others)."
        ),
    )
    save: bool = Field(
        False,
        description=(
            "Save the result as safetensors under the run's artifacts: the LoRA adapter, or "
            "the full weights, with the config and dataset hashes in the file's metadata."
        ),
    )


class PlacementSection(_Section):
    strategy: Literal["round_robin", "topology_aware"] = Field(
        "topology_aware", description="How a multi-GPU job picks its GPUs."
    )
    gpus: int = Field(1, ge=1, le=1024, description="GPUs per job.")


class DistributedSection(_Section):
    nproc_per_node: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "Processes per node, one device each (DDP ranks); above 1 the run is launched "
            "with torch.distributed's elastic launcher."
        ),
    )
    nnodes: int = Field(
        1,
        ge=1,
        le=1024,
        description="Nodes (workers) the run spans; they meet at a c10d rendezvous.",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="Collective backend: auto is nccl on CUDA and gloo on CPU."
    )

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


class TelemetrySection(_Section):
    enabled: bool = Field(
        True, description="Run the sampler thread (off only for overhead measurements)."
    )
    interval_s: Float = Field(
        1.0, ge=0.01, le=3600, description="Seconds between telemetry samples."
    )
    cpu_tdp_w: Float = Field(
        65.0,
        gt=0,
        le=2000,
        description="CPU power in watts at 100 % utilisation, for modelled energy.",
    )
    peak_flops: Float | None = Field(
        None,
        gt=0,
        description="Device dense peak in FLOP/s for MFU; needed on CPU, overrides the GPU table.",
    )


def _holdout(value: Any) -> Any:
    """A fraction in (0, 1), or a held-out file's path; refused naming what it would leave."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)  # YAML 1.1 reads `5e-2` (no dot) as a string
        except ValueError:
            path = value.strip()
            if not path:
                raise PydanticCustomError(
                    "holdout_type",
                    "an empty path; a fraction of the corpus (e.g. 0.05) or a held-out file",
                ) from None
            if path.lower().startswith(_REMOTE_SCHEMES):
                raise PydanticCustomError(
                    "remote_path",
                    "{path} is a remote address; costlab reads local files only and never "
                    "downloads: copy the held-out file to a directory and name it here",
                    {"path": path},
                ) from None
            return path
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError(
            "holdout_type",
            "must be a fraction of the corpus between 0 and 1 (e.g. 0.05), or the path (glob) "
            "of a held-out file, not {got}",
            {"got": repr(value)},
        )
    fraction = float(value)
    if not math.isfinite(fraction) or fraction <= 0:
        raise PydanticCustomError(
            "holdout_empty",
            "{got} holds out no record: nothing to evaluate; a fraction between 0 and 1 "
            "(e.g. 0.05), or the path of a held-out file",
            {"got": repr(value)},
        )
    if fraction >= 1:
        raise PydanticCustomError(
            "holdout_everything",
            "{got} holds out every record: nothing left to train; a fraction between 0 and 1 "
            "(e.g. 0.05), or the path of a held-out file",
            {"got": repr(value)},
        )
    return fraction


class EvalSection(_Section):
    every_steps: int | None = Field(
        None,
        ge=1,
        description=(
            "Evaluate on the held-out records every N optimizer steps, and once at the end; "
            "unset: only at the end."
        ),
    )
    holdout: Annotated[float | str | None, BeforeValidator(_holdout)] = Field(
        None,
        description=(
            "A fraction of the corpus, in (0, 1): a record is held out (never trained on) when "
            "the hash of its content falls below it, the same records on every run and host; "
            "or the path (glob) of a held-out file in data.path's format (records identical to "
            "a held-out one are then left out of training)."
        ),
    )
    max_tokens: int = Field(
        16384,
        ge=1,
        le=100_000_000,
        description=(
            "Tokens evaluated per evaluation, at most: the first held-out targets in a fixed "
            "order, so every run evaluates the same ones."
        ),
    )

    @model_validator(mode="after")
    def _needs_holdout(self) -> EvalSection:
        if self.holdout is None:
            raise PydanticCustomError(
                "holdout_missing",
                "eval needs a holdout: a fraction of the corpus (e.g. 0.05), never trained on, "
                "or the path of a held-out file",
                {"field": "holdout"},
            )
        return self


class StrategyConfig(_Section):
    """A whole strategy. Build it with ``load_strategy`` from YAML, or directly from dicts."""

    model: ModelSection = Field(default_factory=ModelSection)
    data: DataSection = Field(default_factory=DataSection)
    train: TrainSection = Field(default_factory=TrainSection)
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    precision: PrecisionSection = Field(default_factory=PrecisionSection)
    offload: OffloadSection = Field(default_factory=OffloadSection)
    memory: MemorySection = Field(default_factory=MemorySection)
    kernels: KernelsSection = Field(default_factory=KernelsSection)
    finetune: FinetuneSection = Field(default_factory=FinetuneSection)
    placement: PlacementSection = Field(default_factory=PlacementSection)
    distributed: DistributedSection = Field(default_factory=DistributedSection)
    telemetry: TelemetrySection = Field(default_factory=TelemetrySection)
    # Left out of the dump when absent, so a strategy without it keeps its config_sha256.
    eval: EvalSection | None = Field(
        None,
        exclude_if=lambda section: section is None,
        description="Held-out evaluation: the loss on records never trained on (optional).",
    )

    @model_validator(mode="after")
    def _holdout_leaves_both(self) -> StrategyConfig:
        if self.eval is None:
            return self
        holdout = self.eval.holdout
        if isinstance(holdout, str) and self.data.source == "synthetic":
            raise PydanticCustomError(
                "holdout_file_synthetic",
                "a held-out file is read as data.path is; synthetic data has no files: hold out "
                "a fraction of it (e.g. 0.05)",
                {"field": "eval.holdout"},
            )
        if isinstance(holdout, float) and self.data.source == "synthetic":
            problem = synthetic_split_problem(self.train.seed, holdout)
            if problem is not None:
                raise PydanticCustomError("holdout_split", problem, {"field": "eval.holdout"})
        return self

    @model_validator(mode="after")
    def _weights_to_start_from(self) -> StrategyConfig:
        family, init = self.model.family, self.train.starts_from(self.model.family)
        if init == "checkpoint" and family != "hf":
            raise PydanticCustomError(
                "init_without_checkpoint",
                "init checkpoint loads model.path's weights; family {family} has none (it "
                "builds a preset): set model.family hf with model.path, or init scratch",
                {"field": "train.init", "family": family},
            )
        if self.finetune.method == "lora" and init != "checkpoint":
            raise PydanticCustomError(
                "lora_from_scratch",
                "LoRA trains adapters beside frozen pretrained weights; this run starts from "
                "{why}: load a checkpoint (model.family hf, train.init checkpoint) or use "
                "method full",
                {
                    "field": "finetune.method",
                    "why": "scratch (train.init)" if family == "hf" else "a fresh llama preset",
                },
            )
        if self.finetune.method == "lora" and self.precision.quantization.enabled:
            raise PydanticCustomError(
                "lora_and_quantization",
                "precision.quantization already trains LoRA adapters beside its int8 weights "
                "(adapter_rank, adapter_alpha); finetune.method lora would add a second set: "
                "use one of the two",
                {"field": "finetune.method"},
            )
        return self

    @model_validator(mode="after")
    def _batches_fit(self) -> StrategyConfig:
        gb = self.train.global_batch
        if self.train.micro_batch is not None and self.train.micro_batch > gb:
            raise PydanticCustomError(
                "micro_gt_global",
                "micro_batch ({mb}) is larger than global_batch ({gb})",
                {"field": "train.micro_batch", "mb": self.train.micro_batch, "gb": gb},
            )
        world = self.distributed.world_size
        if gb % world:
            raise PydanticCustomError(
                "batch_not_divisible",
                "train.global_batch ({gb}) must divide evenly over the world's {world} "
                "processes (distributed.nproc_per_node x distributed.nnodes): each rank "
                "takes global_batch / world",
                {"field": "train.global_batch", "gb": gb, "world": world},
            )
        dyn = self.optimizer.dynamic_batching
        if dyn.enabled and dyn.min_micro_batch > gb // world:
            raise PydanticCustomError(
                "min_gt_global",
                "min_micro_batch ({min}) is larger than train.global_batch ({gb})",
                {
                    "field": "optimizer.dynamic_batching.min_micro_batch",
                    "min": dyn.min_micro_batch,
                    "gb": gb
                    if world == 1
                    else f"{gb} / {world} processes = {gb // world} per rank",
                },
            )
        if dyn.min_global_batch is not None and dyn.min_global_batch > gb:
            raise PydanticCustomError(
                "min_global_gt_global",
                "min_global_batch ({min}) is larger than train.global_batch ({gb})",
                {
                    "field": "optimizer.dynamic_batching.min_global_batch",
                    "min": dyn.min_global_batch,
                    "gb": gb,
                },
            )
        if dyn.enabled and dyn.adaptive_global_batch and world > 1:
            raise PydanticCustomError(
                "adaptive_global_ddp",
                "adaptive_global_batch is not available with DDP yet ({world} processes): "
                "every rank would have to agree on each new global batch; leave it off, or "
                "train in one process",
                {"field": "optimizer.dynamic_batching.adaptive_global_batch", "world": world},
            )
        nproc = self.distributed.nproc_per_node
        if self.placement.gpus > 1 and self.placement.gpus != nproc:
            raise PydanticCustomError(
                "gpus_not_nproc",
                "placement.gpus ({gpus}) differs from distributed.nproc_per_node ({nproc}): a DDP "
                "rank trains on one device, so a job holds one GPU per process; set "
                "distributed.nproc_per_node "
                "to {gpus} (placement.gpus may then be left out)",
                {"field": "placement.gpus", "gpus": self.placement.gpus, "nproc": nproc},
            )
        return self

    @property
    def devices_per_node(self) -> int:
        """How many devices a node of this job holds: one per DDP process (placement.gpus agrees or
        is 1)."""
        return max(self.distributed.nproc_per_node, self.placement.gpus)


def _dotted(loc: tuple[Any, ...], ctx: dict[str, Any] | None) -> str:
    parts = [str(p) for p in loc]
    if ctx and ctx.get("field"):
        parts.append(str(ctx["field"]))
    return ".".join(parts) or DOCUMENT_KEY


def _section_model(annotation: Any) -> Any:
    """The section model of a field's annotation (an optional section: its model)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for member in typing.get_args(annotation):
            if hasattr(member, "model_fields"):
                return member
    return annotation


def _allowed_keys(loc: tuple[Any, ...]) -> list[str]:
    model: Any = StrategyConfig
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = _section_model(field.annotation)
    return sorted(getattr(model, "model_fields", {}))


_OWN_ERROR_TYPES = {
    "missing_path",
    "hf_needs_path",
    "remote_path",
    "preset_with_hf",
    "path_without_hf",
    "response_needs_records",
    "format_needs_jsonl",
    "init_without_checkpoint",
    "lora_from_scratch",
    "lora_and_quantization",
    "min_gt_max",
    "quantized_full_finetune",
    "storage_below_compute",
    "micro_gt_global",
    "min_gt_global",
    "min_global_lt_micro",
    "min_global_gt_global",
    "adaptive_global_ddp",
    "gpus_not_nproc",
    "batch_not_divisible",
    "holdout_type",
    "holdout_empty",
    "holdout_everything",
    "holdout_missing",
    "holdout_file_synthetic",
    "holdout_split",
}


def _message(err: dict[str, Any]) -> str:
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(tuple(err["loc"]))
        close = difflib.get_close_matches(str(err["loc"][-1]), allowed, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        return (
            f"unknown key; {hint}allowed here: {', '.join(allowed)}" if allowed else "unknown key"
        )
    if (
        err["type"] in _OWN_ERROR_TYPES
        or err["type"] == "missing"
        or isinstance(err.get("input"), dict | list)
    ):
        return err["msg"]
    got = repr(err.get("input"))
    return f"{err['msg']} (got {got if len(got) <= 80 else got[:77] + '...'})"


def errors_from_validation(exc: ValidationError) -> list[dict[str, str]]:
    """Pydantic's errors as ``{"key": dotted.path, "message": reason}``."""
    return [
        {"key": _dotted(tuple(e["loc"]), e.get("ctx")), "message": _message(e)}
        for e in exc.errors()
    ]


def strategy_from_dict(data: dict[str, Any]) -> StrategyConfig:
    """Validate already-parsed data (e.g. a JSON body) into a StrategyConfig."""
    try:
        return StrategyConfig.model_validate(data)
    except ValidationError as exc:
        raise StrategyError(errors_from_validation(exc)) from None


def load_strategy(document: str | bytes) -> StrategyConfig:
    """Parse and validate a strategy YAML document; raise StrategyError naming each bad key."""
    return strategy_from_dict(read_strategy_yaml(document))


def strategy_json_schema() -> dict[str, Any]:
    """JSON Schema of a strategy document (for the API and editors)."""
    schema = StrategyConfig.model_json_schema()
    schema["title"] = "costlab strategy"
    return schema


def config_sha256(config: StrategyConfig) -> str:
    """SHA-256 of the config's canonical JSON (sorted keys, defaults filled in)."""
    canonical = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def distributed_problems(
    config: StrategyConfig, *, cuda: bool, devices: int, where: str
) -> list[dict[str, str]]:
    """What the ``distributed`` keys ask of a host that it cannot give: nccl without CUDA, more
    processes than devices. ``where`` names the host or queue in the message. Torch-free, so
    the web side refuses at submit what a worker would refuse at claim."""
    dist = config.distributed
    problems = []
    if dist.backend == "nccl" and not cuda:
        problems.append(
            {
                "key": "distributed.backend",
                "message": (
                    f"nccl needs CUDA devices and {where} has none; use gloo (or auto, which "
                    "picks gloo on CPU)"
                ),
            }
        )
    if cuda and dist.nproc_per_node > devices:
        problems.append(
            {
                "key": "distributed.nproc_per_node",
                "message": (
                    f"{dist.nproc_per_node} processes per node need {dist.nproc_per_node} devices "
                    f"(one each); {where} has {devices}"
                ),
            }
        )
    return problems
