"""Training: loss falls, resume is exact, cancel and SIGTERM stop cleanly,
precision does what it says."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
import torch

from gpu_runtime import StrategyError, train
from gpu_runtime.capability import check_capability
from gpu_runtime.checkpoint import read_checkpoint_config
from gpu_runtime.data import StepBatches, load_corpus
from gpu_runtime.model import PRESETS, Transformer, preset_args
from gpu_runtime.precision import Precision

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _initial_loss(config) -> float:
    torch.manual_seed(config.train.seed)
    model = Transformer(preset_args(config.model.preset, config.model.seq_len))
    corpus = load_corpus(config.data, seed=config.train.seed)
    tokens = StepBatches(
        corpus,
        seq_len=config.model.seq_len,
        global_batch=config.train.global_batch,
        seed=config.train.seed,
    ).batch(0)
    with torch.no_grad():
        return model(tokens[:, :-1], tokens[:, 1:])[1].item()


@pytest.mark.slow
def test_loss_falls_over_50_steps_on_tiny(tiny_config):
    # Two micro-batches per step, so gradient accumulation is on the path that has to work.
    config = tiny_config(
        train={"steps": 50, "global_batch": 4, "micro_batch": 2}, telemetry={"enabled": False}
    )
    result = train(config)
    assert result.status == "completed" and result.steps == 50
    assert result.tokens == 50 * 4 * 32
    start = _initial_loss(config)
    assert start > 5.0  # ~ln(320) before training
    assert result.final_loss < start - 2.0, (start, result.final_loss)


@pytest.mark.slow
def test_resume_from_a_checkpoint_reproduces_the_next_step(tiny_config, tmp_path):
    config = tiny_config(train={"steps": 6}, telemetry={"enabled": False})
    straight = train(config)

    calls = []

    def cancel_after_four() -> bool:
        calls.append(1)
        return len(calls) > 4

    # Stop after 4 of 6 steps: step 6's loss then depends on step 5's update, which needs the
    # restored optimizer moments and LR position, not only the weights.
    first = train(config, cancel=cancel_after_four, checkpoint_dir=str(tmp_path / "ckpt"))
    assert (first.status, first.steps) == ("cancelled", 4)
    assert read_checkpoint_config(tmp_path / "ckpt") == config.model_dump(mode="json")
    resumed = train(config, resume_from=str(tmp_path / "ckpt"))
    assert (resumed.status, resumed.steps, resumed.tokens) == ("completed", 6, straight.tokens)
    assert resumed.final_loss == pytest.approx(straight.final_loss, abs=1e-6)
    assert resumed.final_loss != pytest.approx(first.final_loss, abs=1e-6)


def test_resume_refuses_a_checkpoint_of_another_model(tiny_config, tmp_path):
    train(
        tiny_config(train={"steps": 1}, telemetry={"enabled": False}), checkpoint_dir=str(tmp_path)
    )
    with pytest.raises(StrategyError) as info:
        train(tiny_config(model={"seq_len": 64}), resume_from=str(tmp_path))
    assert info.value.errors[0]["key"] == "model"


def test_cancel_is_checked_every_step_and_keeps_the_measurements(tiny_config):
    samples = []
    calls = []

    def cancel() -> bool:
        calls.append(1)
        return len(calls) == 3

    result = train(tiny_config(train={"steps": 100}), sink=samples.append, cancel=cancel)
    assert (result.status, result.steps, len(calls)) == ("cancelled", 2, 3)
    assert samples and samples[-1]["step"] == 2 and samples[-1]["tokens"] == result.tokens
    assert result.samples == len(samples)


def test_sigterm_mid_run_stops_cleanly_with_a_valid_result(tiny_config):
    samples = []
    calls = []
    before = signal.getsignal(signal.SIGTERM)

    def terminate_at_step_three() -> bool:
        calls.append(1)
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return False

    result = train(
        tiny_config(train={"steps": 100}), sink=samples.append, cancel=terminate_at_step_three
    )
    assert result.status == "interrupted"
    assert 3 <= result.steps < 100 and result.tokens == result.steps * 4 * 32
    assert result.final_loss is not None and result.energy_j is not None
    assert samples[-1]["step"] == result.steps
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back


def test_same_seed_same_run(tiny_config):
    config = tiny_config(train={"steps": 3}, telemetry={"enabled": False})
    a, b = train(config), train(config)
    assert a.final_loss == b.final_loss and a.dataset_sha256 == b.dataset_sha256
    assert a.config_sha256 == b.config_sha256
    c = train(tiny_config(train={"steps": 3, "seed": 1}, telemetry={"enabled": False}))
    assert c.final_loss != a.final_loss and c.dataset_sha256 != a.dataset_sha256


def test_bf16_autocast_runs_on_cpu(tiny_config):
    config = tiny_config(
        train={"steps": 3}, precision={"compute_dtype": "bf16"}, telemetry={"enabled": False}
    )
    result = train(config)
    assert result.status == "completed" and torch.isfinite(torch.tensor(result.final_loss))
    precision = Precision(config.precision, torch.device("cpu"))
    model = Transformer(preset_args("tiny", 32))
    seen = []
    model.blocks[0].attn.q_proj.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    with precision.autocast():
        model(torch.randint(0, 256, (1, 32)))
    assert seen == [torch.bfloat16]


def test_fp16_storage_keeps_fp32_master_weights(tiny_config):
    # The design document's precision section: bf16 compute, fp16 storage.
    config = tiny_config(precision={"compute_dtype": "bf16", "storage_dtype": "fp16"})
    precision = Precision(config.precision, torch.device("cpu"))
    model = Transformer(preset_args("tiny", 32))
    stepped = precision.prepare(model)
    assert all(p.dtype == torch.float16 for p in model.parameters())
    assert all(t.dtype == torch.float32 for _, t in stepped) and precision.scaler.is_enabled()
    assert model.rope_cos.dtype == torch.float32  # buffers are not storage
    result = train(
        config.model_copy(
            update={"telemetry": config.telemetry.model_copy(update={"enabled": False})}
        ),
        steps=8,
    )
    assert (
        result.status == "completed" and result.final_loss < 4.5
    )  # from ~5.8: the fp16 weights do move


def test_master_weights_keep_updates_too_small_for_fp16():
    from gpu_runtime.precision import MasterWeights

    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    masters = MasterWeights([("w", weight)])
    ((_, master),) = masters.named_masters()
    optimizer = torch.optim.SGD(
        [master], lr=1e-4
    )  # 1e-4 per step: below fp16's spacing at 1.0 (~1e-3)
    for _ in range(20):
        weight.grad = torch.ones_like(weight)
        masters.grads_to_masters()
        optimizer.step()
        masters.masters_to_model()
    assert master.dtype == torch.float32 and master[0].item() == pytest.approx(
        1 - 20 * 1e-4, abs=1e-6
    )
    assert weight.dtype == torch.float16 and weight[0].item() == pytest.approx(0.998, abs=5e-4)
    naive = torch.ones(4, dtype=torch.float16)
    for _ in range(20):
        naive -= 1e-4  # stepping the fp16 weights directly rounds every update away
    assert naive[0].item() == 1.0


def test_fp16_compute_uses_a_grad_scaler(tiny_config):
    config = tiny_config(precision={"compute_dtype": "fp16"}, telemetry={"enabled": False})
    assert Precision(config.precision, torch.device("cpu")).scaler.is_enabled()
    assert not Precision(tiny_config().precision, torch.device("cpu")).scaler.is_enabled()
    result = train(config, steps=3)
    assert result.status == "completed" and result.final_loss < 6.0


def test_bf16_on_a_pre_ampere_gpu_is_refused_naming_the_device(tiny_config, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    config = tiny_config(precision={"compute_dtype": "bf16", "storage_dtype": "bf16"})
    with pytest.raises(StrategyError) as info:
        check_capability(config, torch.device("cuda", 0))
    keys = {e["key"] for e in info.value.errors}
    assert keys == {"precision.compute_dtype", "precision.storage_dtype"}
    assert (
        "cuda:0 Tesla T4" in str(info.value)
        and "7.5" in str(info.value)
        and ">= 8.0" in str(info.value)
    )
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    check_capability(config, torch.device("cuda", 0))  # an A100 runs it


def test_what_the_host_cannot_run_is_refused_before_training(tiny_config):
    with pytest.raises(StrategyError) as info:
        train(
            tiny_config(
                offload={"embedding": "npu"},
                placement={"gpus": 4},
                distributed={"nproc_per_node": 4},
            )
        )
    assert {e["key"] for e in info.value.errors} == {"offload.embedding", "placement.gpus"}
    if not torch.cuda.is_available():
        with pytest.raises(StrategyError) as info:
            train(tiny_config(), device="cuda")
        assert info.value.errors[0]["key"] == "device"


def test_strategies_the_runtime_cannot_honour_are_refused_not_ignored(tiny_config):
    # int8 q/v weights cannot go through the fused RMSNorm+QKV multiply: refused, naming the key
    config = tiny_config(
        precision={"quantization": {"enabled": True, "target_modules": ["q_proj", "v_proj"]}},
        kernels={"fused_rmsnorm_qkv": True},
    )
    with pytest.raises(StrategyError) as info:
        train(config)
    assert [e["key"] for e in info.value.errors] == ["kernels.fused_rmsnorm_qkv"]
    assert "q_proj, v_proj" in str(info.value)


def test_a_model_that_cannot_fit_is_refused_before_it_is_built(tiny_config):
    need = PRESETS["7b"].num_params() * 16
    if psutil.virtual_memory().available > need:
        pytest.skip("this host could hold a 7B model's training state")
    with pytest.raises(StrategyError) as info:
        train(tiny_config(model={"preset": "7b"}))
    assert (
        info.value.errors[0]["key"] == "model.preset" and "GiB" in info.value.errors[0]["message"]
    )


def test_accumulation_reaches_the_same_step_whatever_the_micro_batch(tiny_config):
    losses = [
        train(
            tiny_config(train={"steps": 3, "micro_batch": mb}, telemetry={"enabled": False})
        ).final_loss
        for mb in (4, 2, 3)
    ]  # 3 leaves a short last micro-batch of one row
    assert losses[1] == pytest.approx(losses[0], abs=1e-4)
    assert losses[2] == pytest.approx(losses[0], abs=1e-4)


def test_learning_rate_warms_up_linearly_then_follows_a_cosine_to_the_floor(tiny_config):
    from gpu_runtime.optim import lr_at

    train_cfg = tiny_config(
        train={"lr": 1.0e-3, "warmup_steps": 4, "min_lr_ratio": 0.1, "steps": 104}
    ).train
    assert [lr_at(s, train_cfg, 104) for s in range(4)] == pytest.approx(
        [2.5e-4, 5e-4, 7.5e-4, 1e-3]
    )
    assert lr_at(4, train_cfg, 104) == pytest.approx(1e-3)
    assert lr_at(54, train_cfg, 104) == pytest.approx(1e-4 + 0.5 * 9e-4)  # half way down the cosine
    assert lr_at(104, train_cfg, 104) == pytest.approx(1e-4)
