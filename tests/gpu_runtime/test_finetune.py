"""A team's own checkpoint through train(): LoRA and full fine-tuning, what is saved, and every
strategy key acting on a Hugging Face model (or refused, by name, where it cannot act).

The checkpoints are tiny (2 layers, hidden 64, a 512-id BPE trained on the shipped data),
built once per module by gpu_runtime.tinyhf; nothing is downloaded. A spy Trainer (the class
train() builds, swapped in) lets a test look at the real model and optimizer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gpu_runtime import StrategyError, runtime, train
from gpu_runtime.schema import strategy_from_dict
from gpu_runtime.strategies.offload import CpuOffloadedEmbedding
from gpu_runtime.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DATASET = str(
    Path(__file__).resolve().parents[2] / "gpu_runtime" / "datasets" / "instructions.jsonl"
)
ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from gpu_runtime.tinyhf import build_checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    return {
        "llama": str(build_checkpoint(root / "llama", "llama", seq_len=64)),
        "gpt2": str(build_checkpoint(root / "gpt2", "gpt2", seq_len=64, tie=False)),
    }


def hf_config(path, **sections):
    base = {
        "model": {"family": "hf", "path": path, "seq_len": 32},
        "data": {"source": "jsonl", "path": DATASET, "loss_on": "response"},
        "train": {"steps": 4, "global_batch": 4, "lr": 1.0e-2, "warmup_steps": 0},
        "telemetry": {"interval_s": 0.05},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return strategy_from_dict(base)


@pytest.fixture
def spy(monkeypatch):
    built: list[Trainer] = []

    class SpyTrainer(Trainer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.losses: list[float] = []
            built.append(self)

        def train_step(self, step, total_steps, tokens):
            out = super().train_step(step, total_steps, tokens)
            self.losses.append(float(out.loss))
            return out

    monkeypatch.setattr(runtime, "Trainer", SpyTrainer)
    return built


def checkpoint_tensors(path):
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


def test_lora_trains_the_adapters_only_the_loss_falls_and_the_base_weights_stay(
    checkpoints, spy, tmp_path
):
    from gpu_runtime.hf import hf_state_dict

    config = hf_config(
        checkpoints["llama"],
        train={"steps": 30},
        finetune={"method": "lora", "r": 8, "target_modules": ALL_PROJECTIONS, "save": True},
    )
    result = train(config, device="cpu", artifacts_dir=str(tmp_path / "out"))
    [trainer] = spy
    assert result.status == "completed"
    first, last = sum(trainer.losses[:5]) / 5, sum(trainer.losses[-5:]) / 5
    assert last < first - 0.05, trainer.losses
    # only the adapters train, and only they have optimizer state
    stepped = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    named = dict(trainer.model.named_parameters())
    adapters = {n for n, p in named.items() if p.requires_grad}
    assert adapters and all(".lora_" in n for n in adapters)
    assert stepped == {id(named[n]) for n in adapters}
    assert result.params_trainable == sum(named[n].numel() for n in adapters)
    assert result.params_trainable < result.params_total / 5
    # the base weights are what the checkpoint holds, to the bit
    base = {k: v for k, v in hf_state_dict(_merged_out(trainer.model)).items()}
    original = checkpoint_tensors(checkpoints["llama"])
    assert base.keys() == original.keys()
    assert all(torch.equal(base[k], original[k]) for k in original)
    [artifact] = result.artifacts
    assert artifact["kind"] == "lora_adapter"
    assert artifact["dataset_sha256"] == result.dataset_sha256


def _merged_out(model):
    """The base model beside peft's adapters: each LoRA layer's base_layer in its place."""
    import copy

    clone = copy.deepcopy(model)
    for name, module in list(clone.named_modules()):
        if hasattr(module, "base_layer"):
            parent, _, leaf = name.rpartition(".")
            setattr(clone.get_submodule(parent), leaf, module.base_layer)
    return clone


def test_the_saved_adapter_loads_onto_the_checkpoint_with_peft_and_gives_the_trained_logits(
    checkpoints, spy, tmp_path
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = hf_config(checkpoints["llama"], finetune={"method": "lora", "r": 4, "save": True})
    out = tmp_path / "adapter"
    train(config, device="cpu", artifacts_dir=str(out))
    [trainer] = spy
    ids = torch.randint(3, 500, (2, 16))  # no special ids: one document per row
    with torch.no_grad():
        ours = trainer.model.eval()(ids)[0]
        base = AutoModelForCausalLM.from_pretrained(checkpoints["llama"], dtype=torch.float32)
        theirs = PeftModel.from_pretrained(base, str(out)).eval()(input_ids=ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4


def test_a_full_fine_tune_changes_every_weight_and_saves_a_checkpoint_transformers_loads(
    checkpoints, spy, tmp_path
):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "full"
    result = train(
        hf_config(checkpoints["llama"], finetune={"save": True}),
        device="cpu",
        artifacts_dir=str(out),
    )
    [trainer] = spy
    assert result.params_trainable == result.params_total
    [artifact] = result.artifacts
    assert artifact["kind"] == "weights" and (out / "config.json").is_file()
    saved = checkpoint_tensors(out)
    original = checkpoint_tensors(checkpoints["llama"])
    assert saved.keys() == original.keys()
    assert not any(torch.equal(saved[k], original[k]) for k in original if saved[k].dim() == 2)
    ids = torch.randint(3, 500, (2, 16))  # no special ids: one document per row
    with torch.no_grad():
        ours = trainer.model.eval()(ids)[0]
        theirs = AutoModelForCausalLM.from_pretrained(str(out)).eval()(input_ids=ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4


def test_the_mfu_counts_the_flops_of_what_is_trained(checkpoints):
    from gpu_runtime.sources import open_model_source

    full = hf_config(checkpoints["llama"])
    lora = hf_config(checkpoints["llama"], finetune={"method": "lora"})
    flops = {}
    for name, config in (("full", full), ("lora", lora)):
        source = open_model_source(config)
        module = source.build()
        if name == "lora":
            from gpu_runtime.finetune import apply_lora

            apply_lora(module, config.finetune, model_type="llama", native=True)
        flops[name] = source.flops_per_token(module, 32)
    args = open_model_source(full).build().args
    assert flops["full"] == args.flops_per_token(32)  # PaLM's 6N + 12LdT
    n = args.num_params(embedding=False)
    # LoRA: the frozen weights' gradients are not computed: about 4N, not 6N
    assert 4 * n < flops["lora"] < 4.2 * n + 12 * args.n_layers * args.dim * 32


# ---- every strategy key on an HF model: each visibly acting -------------------------------


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_mixed_precision_casts_storage_and_keeps_fp32_masters(checkpoints, spy, arch):
    config = hf_config(
        checkpoints[arch], precision={"compute_dtype": "bf16", "storage_dtype": "bf16"}
    )
    result = train(config, device="cpu", steps=2)
    [trainer] = spy
    assert result.status == "completed"
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    assert trainer.precision.masters is not None
    assert {m.dtype for _, m in trainer.precision.masters.named_masters()} == {torch.float32}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_gradient_checkpointing_lowers_what_an_hf_model_keeps_for_backward(checkpoints, arch):
    config = hf_config(checkpoints[arch], memory={"gradient_checkpointing": {"enabled": True}})
    result = train(config, device="cpu", steps=2)
    report = result.strategies["memory.gradient_checkpointing"]
    assert report["peak_bytes_with"] < report["peak_bytes_without"]
    expected = "torch.utils.checkpoint" if arch == "llama" else "gradient_checkpointing_enable"
    assert expected in report["implementation"]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_dynamic_batching_resizes_the_micro_batch_of_an_hf_model(checkpoints, arch):
    config = hf_config(
        checkpoints[arch],
        train={"steps": 12, "global_batch": 8},
        optimizer={
            "dynamic_batching": {
                "enabled": True,
                "min_micro_batch": 1,
                "max_micro_batch": 8,
                "probe_steps": 1,
                "min_speedup": 0.0,
            }
        },
    )
    result = train(config, device="cpu")
    assert result.micro_batch_events, "the scaler made no decision"


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_embedding_of_an_hf_model_is_offloaded_to_the_cpu(checkpoints, spy, arch):
    train(hf_config(checkpoints[arch], offload={"embedding": "cpu"}), device="cpu", steps=2)
    [trainer] = spy
    assert any(isinstance(m, CpuOffloadedEmbedding) for m in trainer.model.modules())


def test_lora_on_gpt2_adapts_its_fused_attention_projection(checkpoints, spy):
    result = train(hf_config(checkpoints["gpt2"], finetune={"method": "lora"}), device="cpu")
    [trainer] = spy
    assert result.strategies["finetune"]["target_modules"] == ["c_attn"]
    trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trained and all("c_attn.lora_" in n for n in trained)


def test_quantization_and_the_fused_kernel_act_on_a_native_hf_checkpoint(checkpoints):
    quantized = train(
        hf_config(checkpoints["llama"], precision={"quantization": {"enabled": True}}),
        device="cpu",
        steps=2,
    )
    assert quantized.strategies["precision.quantization"]["weight_bytes_saved"] > 0
    fused = train(
        hf_config(checkpoints["llama"], kernels={"fused_rmsnorm_qkv": True}), device="cpu", steps=2
    )
    assert fused.strategies["kernels.fused_rmsnorm_qkv"]["blocks"] == 2


def test_the_fused_optimizer_steps_an_hf_model(checkpoints, spy):
    train(hf_config(checkpoints["gpt2"], kernels={"fused_optimizer": True}), device="cpu", steps=2)
    [trainer] = spy
    assert all(group["fused"] for group in trainer.optimizer.param_groups)


# ---- refusals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sections", "key"),
    [
        ({"kernels": {"fused_rmsnorm_qkv": True}}, "kernels.fused_rmsnorm_qkv"),
        ({"precision": {"quantization": {"enabled": True}}}, "precision.quantization.enabled"),
        (
            {"memory": {"gradient_checkpointing": {"enabled": True, "every_n_blocks": 2}}},
            "memory.gradient_checkpointing.every_n_blocks",
        ),
    ],
)
def test_a_key_that_cannot_act_on_gpt2_is_refused_naming_the_key_and_the_architecture(
    checkpoints, sections, key
):
    with pytest.raises(StrategyError) as info:
        train(hf_config(checkpoints["gpt2"], **sections), device="cpu", steps=1)
    [error] = info.value.errors
    assert error["key"] == key and "gpt2" in error["message"]


def test_lora_on_q_and_v_with_the_fused_qkv_kernel_is_refused(checkpoints):
    config = hf_config(
        checkpoints["llama"], finetune={"method": "lora"}, kernels={"fused_rmsnorm_qkv": True}
    )
    with pytest.raises(StrategyError) as info:
        train(config, device="cpu", steps=1)
    assert info.value.errors[0]["key"] == "kernels.fused_rmsnorm_qkv"
    assert "q_proj" in info.value.errors[0]["message"]


@pytest.mark.parametrize("path", ["meta-llama/Llama-2-7b-hf", "no/such/dir"])
def test_a_path_that_is_not_a_local_checkpoint_is_refused_before_anything_loads(path):
    config = strategy_from_dict({"model": {"family": "hf", "path": path}})
    with pytest.raises(StrategyError) as info:
        train(config, device="cpu", steps=1)
    assert info.value.errors[0]["key"] == "model.path"


def test_a_url_is_refused_by_the_schema():
    with pytest.raises(StrategyError) as info:
        strategy_from_dict({"model": {"family": "hf", "path": "https://example.org/model"}})
    assert info.value.errors[0]["key"] == "model.path"
    assert "never downloads" in info.value.errors[0]["message"]


def test_unknown_lora_targets_are_refused_naming_the_projections_there_are(checkpoints):
    config = hf_config(
        checkpoints["gpt2"], finetune={"method": "lora", "target_modules": ["q_proj"]}
    )
    with pytest.raises(StrategyError) as info:
        train(config, device="cpu", steps=1)
    assert info.value.errors[0]["key"] == "finetune.target_modules"
    assert "c_attn" in info.value.errors[0]["message"]


def test_offloading_a_table_tied_to_the_output_head_is_refused_by_key(tmp_path):
    from gpu_runtime.tinyhf import build_checkpoint

    tied = build_checkpoint(tmp_path / "qwen2", "qwen2", seq_len=64, tie=True)
    with pytest.raises(StrategyError) as info:
        train(hf_config(str(tied), offload={"embedding": "cpu"}), device="cpu", steps=1)
    assert info.value.errors[0]["key"] == "offload.embedding"
    assert "tied" in info.value.errors[0]["message"]


def test_an_hf_strategy_survives_a_dump_and_a_reload(checkpoints):
    """DDP ranks and live edits rebuild the strategy from its dump: nothing may refuse it."""
    config = hf_config(checkpoints["llama"], finetune={"method": "lora"}, data={"format": "chat"})
    assert strategy_from_dict(config.model_dump(mode="json")) == config


@pytest.mark.slow  # two rank processes
def test_two_ddp_ranks_fine_tune_an_hf_checkpoint_with_lora_and_rank_0_saves(checkpoints, tmp_path):
    config = hf_config(
        checkpoints["llama"],
        finetune={"method": "lora", "save": True},
        distributed={"nproc_per_node": 2},
        telemetry={"enabled": False},
    )
    out = tmp_path / "ddp"
    result = train(config, device="cpu", artifacts_dir=str(out))
    assert result.status == "completed"
    ranks = result.strategies["distributed"]["ranks"]
    assert [r["status"] for r in ranks] == ["completed", "completed"]
    assert 0 < result.params_trainable < result.params_total / 10
    # the masked prompts are counted out across both ranks' shares of every step
    assert 0 < result.tokens < 4 * 4 * 32
    [artifact] = result.artifacts
    assert artifact["kind"] == "lora_adapter" and (out / artifact["path"]).is_file()


def test_packed_records_attend_only_to_themselves_and_restart_their_positions():
    """Two records in one packed row give each record's logits as if it were alone."""
    from gpu_runtime.model import EOS, Transformer, preset_args

    torch.manual_seed(0)
    model = Transformer(preset_args("tiny", 64)).eval()
    first, second = torch.randint(0, 250, (1, 20)), torch.randint(0, 250, (1, 30))
    first[0, -1] = second[0, -1] = EOS
    with torch.no_grad():
        alone = model(first)[0], model(second)[0]
        model.document_end = EOS
        packed = model(torch.cat([first, second], dim=1))[0]
        model.document_end = None
        leaky = model(torch.cat([first, second], dim=1))[0]
    assert (packed[:, :20] - alone[0]).abs().max() < 1e-5
    assert (packed[:, 20:] - alone[1]).abs().max() < 1e-5
    assert (leaky[:, 20:] - alone[1]).abs().max() > 1e-2  # without the mask it would leak


@pytest.mark.parametrize(("arch", "masked"), [("llama", True), ("gpt2", False)])
def test_a_run_on_packed_records_says_whether_they_were_kept_apart(checkpoints, arch, masked):
    result = train(hf_config(checkpoints[arch]), device="cpu", steps=1)
    assert result.strategies["data.packing"]["document_mask"] is masked
