"""The strategy schema: what loads, what is refused, and that refusals name the key."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_runtime import (
    StrategyConfig,
    StrategyError,
    config_sha256,
    load_strategy,
    strategy_json_schema,
)
from gpu_runtime.errors import DOCUMENT_KEY

# Verbatim from the design document (seed/, chapter 1 and section 2.3), comments included.
DESIGN_DOC_DYNAMIC_BATCHING = """optimizer:
  dynamic_batching:
    enabled: true
    min_micro_batch: 4
    max_micro_batch: 64
    stability_window: 128  # 连续评估步数
"""

DESIGN_DOC_PRECISION = """precision:
  compute_dtype: bf16        # 主计算精度（BFloat16，兼顾动态范围与速度）
  storage_dtype: fp16        # 参数存储精度（FP16，节省显存）
  quantization:
    enabled: true
    target_modules: ["q_proj", "v_proj", "o_proj"]
    weight_bits: 8           # INT8 权重量化
"""

# Verbatim from ARCHITECTURE.md, "Strategy YAML".
ARCHITECTURE_EXAMPLE = """model:     {family: llama, preset: tiny, seq_len: 256}
data:      {source: text, path: "...", pin_memory: true, prefetch: 2}
train:     {steps: 200, global_batch: 64, lr: 3.0e-4, seed: 0}
optimizer:
  dynamic_batching: {enabled: true, min_micro_batch: 4, max_micro_batch: 64, stability_window: 128}
precision:
  compute_dtype: bf16
  storage_dtype: fp16            # below fp32: keep fp32 master weights
  quantization: {enabled: true, target_modules: [q_proj, v_proj, o_proj], weight_bits: 8}
offload:   {embedding: cpu, mmap: true}
memory:    {gradient_checkpointing: {enabled: true, every_n_blocks: 1}}
kernels:   {fused_rmsnorm_qkv: true, compile: false}
placement: {strategy: topology_aware}
telemetry: {interval_s: 1.0}
"""


def test_design_document_fragments_load_verbatim():
    batching = load_strategy(DESIGN_DOC_DYNAMIC_BATCHING).optimizer.dynamic_batching
    assert (
        batching.enabled,
        batching.min_micro_batch,
        batching.max_micro_batch,
        batching.stability_window,
    ) == (True, 4, 64, 128)
    precision = load_strategy(DESIGN_DOC_PRECISION.encode("utf-8")).precision
    assert (precision.compute_dtype, precision.storage_dtype) == ("bf16", "fp16")
    assert precision.quantization.target_modules == ["q_proj", "v_proj", "o_proj"]
    assert precision.quantization.weight_bits == 8


def test_architecture_example_loads_with_every_section():
    config = load_strategy(ARCHITECTURE_EXAMPLE)
    assert (
        config.model.seq_len == 256
        and config.train.global_batch == 64
        and config.train.lr == pytest.approx(3e-4)
    )
    assert config.offload.embedding == "cpu" and config.offload.mmap is True
    assert config.memory.gradient_checkpointing.every_n_blocks == 1
    assert (
        config.kernels.fused_rmsnorm_qkv is True and config.placement.strategy == "topology_aware"
    )


def test_empty_document_is_all_defaults():
    config = load_strategy("")
    assert config == StrategyConfig()
    assert config.telemetry.interval_s == 1.0 and config.precision.compute_dtype == "fp32"


def test_exponent_without_dot_is_a_number():
    # YAML 1.1 reads 3e-4 as a string; a strategy author means the number.
    assert load_strategy("train: {lr: 3e-4}").train.lr == pytest.approx(3e-4)


BAD_INPUTS = [
    ("unknown top-level key", "modle: {preset: tiny}", "modle", "unknown key"),
    ("unknown nested key", "model: {seq_lenn: 128}", "model.seq_lenn", "did you mean seq_len"),
    ("string for an int", "train: {steps: '50'}", "train.steps", "integer"),
    ("bool for an int", "train: {global_batch: true}", "train.global_batch", "integer"),
    ("int for a bool", "data: {pin_memory: 1}", "data.pin_memory", "boolean"),
    ("negative steps", "train: {steps: -1}", "train.steps", "greater than or equal to 1"),
    (
        "min above max",
        "optimizer: {dynamic_batching: {min_micro_batch: 65, max_micro_batch: 64}}",
        "optimizer.dynamic_batching.min_micro_batch",
        "larger than max_micro_batch",
    ),
    (
        "min above global batch",
        "train: {global_batch: 2}\noptimizer: {dynamic_batching: {enabled: true}}",
        "optimizer.dynamic_batching.min_micro_batch",
        "global_batch",
    ),
    (
        "micro above global",
        "train: {global_batch: 4, micro_batch: 8}",
        "train.micro_batch",
        "larger than",
    ),
    (
        "tiny CPU memory budget",
        "optimizer: {dynamic_batching: {cpu_memory_budget_mb: 10}}",
        "optimizer.dynamic_batching.cpu_memory_budget_mb",
        "greater than or equal to 64",
    ),
    (
        "speedup above one",
        "optimizer: {dynamic_batching: {min_speedup: 2}}",
        "optimizer.dynamic_batching.min_speedup",
        "less than or equal to 1",
    ),
    (
        "unknown LR scaling",
        "optimizer: {dynamic_batching: {lr_scaling: cubic}}",
        "optimizer.dynamic_batching.lr_scaling",
        "'sqrt' or 'linear'",
    ),
    (
        "min global below min micro",
        "optimizer: {dynamic_batching: {min_global_batch: 2, min_micro_batch: 4}}",
        "optimizer.dynamic_batching.min_global_batch",
        "smaller than min_micro_batch",
    ),
    (
        "min global above global",
        "train: {global_batch: 8}\noptimizer: {dynamic_batching: {min_global_batch: 16}}",
        "optimizer.dynamic_batching.min_global_batch",
        "larger than train.global_batch",
    ),
    (
        "unsupported dtype",
        "precision: {compute_dtype: fp8}",
        "precision.compute_dtype",
        "'fp32', 'bf16' or 'fp16'",
    ),
    (
        "storage narrower than fp32 compute",
        "precision: {storage_dtype: bf16}",
        "precision.storage_dtype",
        "fp32",
    ),
    (
        "unknown quantization target",
        "precision: {quantization: {target_modules: [q_proj, qkv]}}",
        "precision.quantization.target_modules.1",
        "q_proj",
    ),
    (
        "4-bit weights",
        "precision: {quantization: {weight_bits: 4}}",
        "precision.quantization.weight_bits",
        "8",
    ),
    (
        "full fine-tune of int8 weights",
        "precision: {quantization: {enabled: true, trainable: full}}",
        "precision.quantization.trainable",
        "frozen",
    ),
    ("unknown preset", "model: {preset: 13b}", "model.preset", "7b"),
    ("text without a path", "data: {source: text}", "data.path", "required"),
    ("section not a mapping", "train: 5", "train", "dictionary"),
    (
        "zero telemetry interval",
        "telemetry: {interval_s: 0}",
        "telemetry.interval_s",
        "greater than or equal",
    ),
    ("duplicate key", "model: {preset: tiny}\nmodel: {preset: small}", "model", "duplicate"),
    ("list document", "- model\n- train", DOCUMENT_KEY, "mapping"),
    ("broken YAML", "model: {preset: tiny", DOCUMENT_KEY, "not valid YAML"),
    ("python tag", "model: !!python/object:os.system {}", DOCUMENT_KEY, "not valid YAML"),
    ("alias", "x: &a 1\nmodel: *a", DOCUMENT_KEY, "anchors"),
    ("deep nesting", "a: " + "[" * 100 + "]" * 100, DOCUMENT_KEY, "nesting"),
]


@pytest.mark.parametrize(
    ("kind", "document", "key", "reason"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_is_refused_naming_the_key(kind, document, key, reason):
    with pytest.raises(StrategyError) as info:
        load_strategy(document)
    keys = [e["key"] for e in info.value.errors]
    assert key in keys, f"{kind}: {info.value.errors}"
    message = next(e["message"] for e in info.value.errors if e["key"] == key)
    assert reason.lower() in message.lower(), message
    assert key in str(info.value)
    assert isinstance(info.value, ValueError)


def test_every_error_is_reported_at_once():
    with pytest.raises(StrategyError) as info:
        load_strategy("train: {steps: 0, global_batch: x}\nkernels: {fuse: true}")
    assert {e["key"] for e in info.value.errors} == {
        "train.steps",
        "train.global_batch",
        "kernels.fuse",
    }


def _billion_laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels + 1):
        refs = ",".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_in_under_a_second():
    bomb = _billion_laughs()  # 10**10 strings if expanded; a few hundred bytes as text
    assert len(bomb) < 64 * 1024
    start = time.perf_counter()
    with pytest.raises(StrategyError) as info:
        load_strategy(bomb)
    assert time.perf_counter() - start < 1.0
    assert info.value.errors[0]["key"] == DOCUMENT_KEY


def test_oversized_document_is_refused_before_parsing():
    huge = "train: {steps: 1}\n" + "#" * (64 * 1024)
    start = time.perf_counter()
    for document in (huge, huge.encode(), "x" * 50_000_000):
        with pytest.raises(StrategyError, match="65536|over"):
            load_strategy(document)
    assert time.perf_counter() - start < 1.0


def test_non_utf8_bytes_are_refused():
    with pytest.raises(StrategyError, match="UTF-8"):
        load_strategy(b"model: {preset: \xff}")


def test_json_schema_covers_every_key_and_forbids_extras():
    schema = strategy_json_schema()
    assert set(schema["properties"]) == set(StrategyConfig.model_fields)
    assert schema["additionalProperties"] is False
    for name, definition in schema["$defs"].items():
        assert definition["additionalProperties"] is False, name
        for key, prop in definition["properties"].items():
            assert prop.get("description") or "$ref" in prop or "allOf" in prop, (
                f"{name}.{key} has no description"
            )
    seq_len = schema["$defs"]["ModelSection"]["properties"]["seq_len"]
    assert seq_len["default"] == 256 and "tokens" in seq_len["description"]
    assert (
        "seconds"
        in schema["$defs"]["TelemetrySection"]["properties"]["interval_s"]["description"].lower()
    )


def test_config_hash_is_canonical():
    a = load_strategy("train: {steps: 10, lr: 0.001}")
    b = load_strategy("train:\n  lr: 1.0e-3\n  steps: 10\n")
    assert config_sha256(a) == config_sha256(b)
    assert config_sha256(a) != config_sha256(load_strategy("train: {steps: 11, lr: 0.001}"))


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_either_loads_or_is_refused_cleanly(text):
    try:
        load_strategy(text)
    except StrategyError as exc:
        assert exc.errors and all(e["key"] and e["message"] for e in exc.errors)


def test_every_example_strategy_loads():
    from pathlib import Path

    examples = sorted(
        (Path(__file__).resolve().parents[2] / "gpu_runtime" / "examples").glob("*.yaml")
    )
    assert len(examples) >= 2
    for path in examples:
        load_strategy(path.read_bytes())
    batching = load_strategy(
        (examples[0].parent / "dynamic_batching.yaml").read_bytes()
    ).optimizer.dynamic_batching
    assert batching.enabled and not batching.adaptive_global_batch


# -- eval: held-out evaluation ---------------------------------------------------------------

HOLDOUT_REFUSALS = [
    ("zero", "eval: {holdout: 0}", "nothing to evaluate"),
    ("negative", "eval: {holdout: -0.1}", "nothing to evaluate"),
    ("one", "eval: {holdout: 1}", "nothing left to train"),
    ("above one", "eval: {holdout: 1.5}", "nothing left to train"),
    # synthetic data is known at validation: 128 documents for seed 0
    ("no synthetic document held out", "eval: {holdout: 1.0e-9}", "nothing to evaluate"),
    ("every synthetic document held out", "eval: {holdout: 0.9999999}", "nothing left to train"),
    ("a boolean", "eval: {holdout: true}", "fraction of the corpus"),
    ("a list", "eval: {holdout: [0.1]}", "fraction of the corpus"),
    ("an empty path", "eval: {holdout: ''}", "empty path"),
    ("a remote path", "eval: {holdout: 'https://example.com/held.jsonl'}", "never downloads"),
    ("a file for synthetic data", "eval: {holdout: held.txt}", "synthetic data has no files"),
    ("no holdout", "eval: {every_steps: 5}", "needs a holdout"),
]


@pytest.mark.parametrize(
    ("kind", "document", "reason"), HOLDOUT_REFUSALS, ids=[r[0] for r in HOLDOUT_REFUSALS]
)
def test_a_holdout_that_leaves_nothing_is_refused_naming_eval_holdout(kind, document, reason):
    with pytest.raises(StrategyError) as info:
        load_strategy(document)
    assert [e["key"] for e in info.value.errors] == ["eval.holdout"], info.value.errors
    assert reason in info.value.errors[0]["message"], info.value.errors[0]["message"]


@pytest.mark.parametrize(
    ("document", "key", "reason"),
    [
        ("eval: {holdout: 0.1, evry_steps: 5}", "eval.evry_steps", "did you mean every_steps"),
        ("eval: {holdout: 0.1, every_steps: 0}", "eval.every_steps", "greater than or equal to 1"),
        ("eval: {holdout: 0.1, every_steps: '5'}", "eval.every_steps", "integer"),
        ("eval: {holdout: 0.1, max_tokens: 0}", "eval.max_tokens", "greater than or equal to 1"),
        ("eval: {holdout: 0.1, max_tokens: 1.5}", "eval.max_tokens", "integer"),
        ("eval: 0.1", "eval", "dictionary"),
    ],
)
def test_bad_eval_keys_are_refused_naming_the_key(document, key, reason):
    with pytest.raises(StrategyError) as info:
        load_strategy(document)
    errors = {e["key"]: e["message"] for e in info.value.errors}
    assert key in errors and reason in errors[key], info.value.errors


def test_an_eval_section_loads_with_its_defaults_and_a_strategy_without_one_is_unchanged():
    config = load_strategy("eval: {holdout: 5e-2}")  # YAML 1.1's string, read as the number
    assert (config.eval.holdout, config.eval.every_steps, config.eval.max_tokens) == (
        0.05,
        None,
        16384,
    )
    on_files = load_strategy(
        "data: {source: jsonl, path: train.jsonl}\neval: {holdout: held.jsonl, every_steps: 5}"
    )
    assert on_files.eval.holdout == "held.jsonl" and on_files.eval.every_steps == 5
    # absent, the section is left out of the dump: an existing strategy keeps its config hash
    plain = load_strategy("train: {steps: 10}")
    assert plain.eval is None and "eval" not in plain.model_dump(mode="json")
    assert config_sha256(plain) != config_sha256(
        load_strategy("train: {steps: 10}\neval: {holdout: 0.1}")
    )
    assert load_strategy("eval: null") == StrategyConfig()
