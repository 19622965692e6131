"""Every strategy key through train(), end to end: each test fails if its strategy is silently off.

The runs are the tiny preset at seq_len 16 for a few steps. A spy Trainer (the class
train() builds, swapped in) lets a test look at the real model, optimizer and per-step
plans while the run trains, rather than at what the run says about itself.
"""

from __future__ import annotations

import contextlib
import time

import pytest
import torch

from gpu_runtime import StrategyError, runtime, train
from gpu_runtime.model import Transformer, preset_args
from gpu_runtime.optim import lr_at
from gpu_runtime.placement import LinkLevel, Topology, choose_device
from gpu_runtime.strategies.offload import CpuOffloadedEmbedding
from gpu_runtime.strategies.quantization import LoraInt8Linear
from gpu_runtime.trainer import Trainer
from tests.gpu_runtime.faults import SimulatedOom

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = {"model": {"seq_len": 16}, "train": {"global_batch": 8, "steps": 4}}


def train_on_cpu(config, **kwargs):
    """CPU unless a test says otherwise: the assertions below name CPU backends
    (function, torch int8)."""
    return train(config, **{"device": "cpu", **kwargs})


def dynamic(**settings):
    return {
        "dynamic_batching": {
            "enabled": True,
            "min_micro_batch": 1,
            "max_micro_batch": 8,
            **settings,
        }
    }


@pytest.fixture
def config(tiny_config):
    def make(**sections):
        merged = {
            key: {**SMALL.get(key, {}), **sections.get(key, {})} for key in {*SMALL, *sections}
        }
        return tiny_config(**merged)

    return make


@pytest.fixture
def spy(monkeypatch):
    """The trainers train_on_cpu() builds, recording each step's plan;
    `around_step` may wrap every step."""

    class Built(list):
        cls: type

    built = Built()

    class SpyTrainer(Trainer):
        around_step = staticmethod(contextlib.nullcontext)

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.plans: list[int] = []
            built.append(self)

        def train_step(self, step, total_steps, tokens):
            with self.around_step():
                out = super().train_step(step, total_steps, tokens)
            self.plans.append(out.plan.micro_batch)
            return out

    monkeypatch.setattr(runtime, "Trainer", SpyTrainer)
    built.cls = SpyTrainer
    return built


@pytest.mark.slow
def test_dynamic_batching_grows_the_micro_batch_while_faster_and_keeps_the_global_batch(
    config, spy, monkeypatch
):
    """Each micro-batch costs 50 ms of fixed CPU work (a busy loop in accumulation): larger ones
    are faster.

    On CPU the scaler times steps in process CPU time, so the overhead burns CPU rather than sleeps.
    50 ms, not less: on 2 cores shared with the suite's other xdist workers the model's own step
    time wanders, and the fixed cost must dominate it for "larger is faster" to be the truth.
    """
    accumulate = Trainer._accumulate

    def with_overhead(self, plan, inputs, targets):
        until = time.process_time() + 0.05 * plan.accumulation_steps
        while time.process_time() < until:
            pass
        return accumulate(self, plan, inputs, targets)

    monkeypatch.setattr(spy.cls, "_accumulate", with_overhead)
    samples = []
    result = train_on_cpu(
        config(optimizer=dynamic(probe_steps=2), train={"steps": 12, "micro_batch": 1}),
        sink=samples.append,
    )
    events = result.micro_batch_events
    assert [(e["kind"], e["old_micro_batch"], e["new_micro_batch"]) for e in events] == [
        ("grow", 1, 2),
        ("grow", 2, 4),
        ("grow", 4, 8),
    ]
    assert all(e["detail"]["reason"] for e in events) and events[1]["detail"]["speedup"] > 0.03
    plans = spy[0].plans
    assert (
        plans == [1] * 3 + [2] * 3 + [4] * 3 + [8] * 3
    )  # a warm-up step and two timed ones per size
    assert spy[0].batching.tracker is None, "no gradient statistics without adaptive_global_batch"
    assert result.tokens == 12 * 8 * 16  # the global batch never moved
    assert {s["micro_batch"] for s in samples} <= set(plans)
    # accumulation keeps the global batch: the loss is the static run's, whatever the micro-batches
    static = train_on_cpu(config(train={"steps": 12}, telemetry={"enabled": False}))
    assert result.final_loss == pytest.approx(static.final_loss, abs=2e-4)


def test_adaptive_global_batch_is_opt_in_and_scales_the_learning_rate(config, monkeypatch):
    seen = []

    class Recording(Trainer):
        def train_step(self, step, total_steps, tokens):
            out = super().train_step(step, total_steps, tokens)
            seen.append(
                (
                    out.plan.global_batch,
                    self.optimizer.param_groups[0]["lr"]
                    / lr_at(step, self.config.train, total_steps),
                )
            )
            return out

    monkeypatch.setattr(runtime, "Trainer", Recording)
    settings = dynamic(
        adaptive_global_batch=True,
        min_global_batch=2,
        min_micro_batch=1,
        stability_window=2,
        policy="grad_variance",
        lr_scaling="linear",
    )
    result = train_on_cpu(
        config(optimizer=settings, train={"steps": 14}, telemetry={"enabled": False})
    )
    assert seen[0] == (
        2,
        pytest.approx(2 / 8),
    )  # starts at min_global_batch, the LR scaled linearly
    assert all(scale == pytest.approx(g / 8) for g, scale in seen)
    assert result.tokens == sum(g for g, _ in seen) * 16
    moves = [e for e in result.micro_batch_events if e["kind"].startswith("global_")]
    assert moves and len({g for g, _ in seen}) > 1, "the global batch never moved"
    assert all(
        e["detail"]["reason"]
        and e["detail"]["lr_scale"] == pytest.approx(e["detail"]["global_batch"] / 8)
        for e in moves
    )


def test_a_forced_out_of_memory_is_survived_halved_and_recorded(config, spy, monkeypatch):
    monkeypatch.setattr(Trainer, "fault", SimulatedOom(fits_up_to=2))
    result = train_on_cpu(
        config(optimizer=dynamic(stability_window=100), train={"micro_batch": 8, "steps": 3})
    )
    assert result.status == "completed" and result.steps == 3
    assert [
        (e["kind"], e["old_micro_batch"], e["new_micro_batch"]) for e in result.micro_batch_events
    ] == [("oom", 8, 4), ("oom", 4, 2)]  # halved twice; the retry at 2 fits
    assert "simulated out of memory" in result.micro_batch_events[0]["detail"]["error"]
    assert spy[0].plans == [2, 2, 2] and Trainer.fault.raised == 2
    # without dynamic batching there is nothing to halve: the error is not swallowed
    with pytest.raises(torch.OutOfMemoryError):
        train_on_cpu(config(train={"micro_batch": 4, "steps": 1}, telemetry={"enabled": False}))


def test_a_live_max_micro_batch_is_applied_at_the_next_step_boundary(config, spy):
    polls = []

    def live():
        polls.append(len(spy[0].plans))  # steps finished when this boundary was polled
        return (
            {"optimizer": {"dynamic_batching": {"max_micro_batch": 2}}} if len(polls) == 3 else None
        )

    result = train_on_cpu(
        config(optimizer=dynamic(stability_window=100), train={"micro_batch": 4, "steps": 5}),
        live=live,
    )
    assert polls[2] == 2
    assert spy[0].plans == [4, 4, 2, 2, 2]
    assert [(e["step"], e["kind"], e["new_micro_batch"]) for e in result.micro_batch_events] == [
        (2, "bounds", 2)
    ]
    assert spy[0].config.optimizer.dynamic_batching.max_micro_batch == 2


def test_embedding_table_and_its_optimizer_state_stay_on_the_cpu(config, spy):
    result = train_on_cpu(config(offload={"embedding": "cpu"}, telemetry={"enabled": False}))
    trainer = spy[0]
    table = trainer.model.tok_embeddings
    assert isinstance(table, CpuOffloadedEmbedding) and table.weight.device.type == "cpu"
    state = trainer.optimizer.state[table.weight]
    assert state["exp_avg"].device.type == "cpu" and state["exp_avg"].abs().sum() > 0  # it trained
    assert result.strategies["offload.embedding"] == {
        "modules": ["tok_embeddings"],
        "table_device": "cpu",
        "table_bytes": 320 * 256 * 4,
    }


@pytest.mark.cuda
def test_on_cuda_only_the_embedding_table_stays_on_the_host(config, spy):
    train_on_cpu(config(offload={"embedding": "cpu"}, telemetry={"enabled": False}), device="cuda")
    model = spy[0].model
    assert model.tok_embeddings.weight.device.type == "cpu"
    assert all(p.is_cuda for n, p in model.named_parameters() if not n.startswith("tok_embeddings"))


def _saved_activation_bytes(parameters):
    """Context manager factory summing the storages autograd saves for backward,
    parameters excluded."""
    totals = []

    @contextlib.contextmanager
    def measure():
        excluded = {p.untyped_storage().data_ptr() for p in parameters()}
        storages = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in excluded:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
        totals.append(sum(storages.values()))

    return measure, totals


def test_gradient_checkpointing_lowers_the_activations_kept_for_backward(config, spy):
    kept = {}
    for enabled in (False, True):
        spy.clear()
        spy.cls.around_step = staticmethod(contextlib.nullcontext)
        cfg = config(
            memory={"gradient_checkpointing": {"enabled": enabled}},
            train={"steps": 1},
            telemetry={"enabled": False},
        )
        # measured inside the real training step: checkpointed blocks hand autograd only their
        # inputs
        measure, totals = _saved_activation_bytes(lambda: spy[0].model.parameters())
        spy.cls.around_step = staticmethod(measure)
        result = train_on_cpu(cfg)
        kept[enabled] = totals[0]
    assert kept[True] < 0.5 * kept[False], kept
    report = result.strategies["memory.gradient_checkpointing"]
    assert (
        report["blocks"] == [0, 1, 2, 3]
        and report["peak_bytes_with"] < report["peak_bytes_without"]
    )


def test_quantized_weights_are_int8_and_frozen_while_the_adapters_train(config, spy):
    targets = ["q_proj", "v_proj", "o_proj"]
    cfg = config(
        precision={"quantization": {"enabled": True, "target_modules": targets, "adapter_rank": 4}},
        telemetry={"enabled": False},
    )
    result = train_on_cpu(cfg)
    model = spy[0].model
    layers = {n: m for n, m in model.named_modules() if isinstance(m, LoraInt8Linear)}
    assert sorted({n.rsplit(".", 1)[-1] for n in layers}) == sorted(targets) and len(layers) == 12
    # the same weights, quantized the same way, before any training
    torch.manual_seed(cfg.train.seed)
    initial = Transformer(preset_args("tiny", 16))
    stepped = {id(p) for group in spy[0].optimizer.param_groups for p in group["params"]}
    for name, layer in layers.items():
        assert layer.base.weight_int8.dtype == torch.int8
        want = initial.get_submodule(name).weight.detach()
        want_q = (
            torch.round(want / (want.abs().amax(1, keepdim=True) / 127))
            .clamp(-127, 127)
            .to(torch.int8)
        )
        assert torch.equal(layer.base.weight_int8, want_q), f"{name} moved"
        assert not any(b.requires_grad for b in layer.base.buffers())
        assert layer.lora_b.abs().sum() > 0, f"{name} adapter did not train"  # B starts at zero
        assert id(layer.lora_a) in stepped and id(layer.lora_b) in stepped
    report = result.strategies["precision.quantization"]
    assert report["weight_bytes_saved"] > 0.7 * report["weight_bytes_before"]


def test_the_fused_rmsnorm_qkv_path_runs_and_matches_the_unfused_model(config, monkeypatch):
    import gpu_runtime.assembly as assembly

    calls = []
    original = assembly.fused_rmsnorm_qkv
    monkeypatch.setattr(
        assembly,
        "fused_rmsnorm_qkv",
        lambda *a, **k: calls.append(k["backend"]) or original(*a, **k),
    )
    tolerance = {"fp32": 1e-4, "bf16": 2e-1}
    for dtype, atol in tolerance.items():
        calls.clear()
        cfg = config(
            precision={"compute_dtype": dtype}, train={"steps": 2}, telemetry={"enabled": False}
        )
        fused = train_on_cpu(
            cfg.model_copy(
                update={"kernels": cfg.kernels.model_copy(update={"fused_rmsnorm_qkv": True})}
            )
        )
        assert len(calls) == 2 * 4 and set(calls) == {"function"}  # steps x blocks
        unfused = train_on_cpu(cfg)
        assert fused.final_loss == pytest.approx(unfused.final_loss, abs=atol), dtype
    # and the model's own outputs, one forward apart
    torch.manual_seed(0)
    model = Transformer(preset_args("tiny", 16))
    tokens = torch.randint(0, 256, (3, 16))
    reference = model(tokens)[0]
    assembly.install_fused_rmsnorm_qkv(model, backend="function")
    torch.testing.assert_close(model(tokens)[0], reference, atol=1e-4, rtol=0)


def test_compile_wraps_the_model_the_trainer_calls_and_checkpoints_stay_plain(
    config, spy, monkeypatch, tmp_path
):
    wrapped = []

    class Compiled(torch.nn.Module):  # what torch.compile returns, minus minutes of compiling
        def __init__(self, module):
            super().__init__()
            self._orig_mod, self.calls = module, 0

        def forward(self, *args):
            self.calls += 1
            return self._orig_mod(*args)

    monkeypatch.setattr(
        torch, "compile", lambda module: wrapped.append(Compiled(module)) or wrapped[-1]
    )
    result = train_on_cpu(
        config(kernels={"compile": True}, train={"steps": 2}, telemetry={"enabled": False}),
        checkpoint_dir=str(tmp_path),
    )
    assert len(wrapped) == 1 and wrapped[0].calls == 2 and spy[0].forward is wrapped[0]
    reported = result.strategies["kernels.compile"]
    assert reported["requested"] is True and reported["mode"] == "compiled"
    assert reported["compile_s"] is not None and reported["fallback"] is None
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["model"]
    assert not any(k.startswith("_orig_mod") for k in saved)


def test_resume_maps_the_checkpoint_when_offload_mmap_is_set(config, monkeypatch, tmp_path):
    cfg = config(offload={"mmap": True}, telemetry={"enabled": False})
    train_on_cpu(cfg, steps=2, checkpoint_dir=str(tmp_path))
    seen = []
    original = torch.load
    monkeypatch.setattr(
        torch, "load", lambda *a, **k: seen.append(k.get("mmap")) or original(*a, **k)
    )
    assert train_on_cpu(cfg, steps=3, resume_from=str(tmp_path)).steps == 3
    assert seen == [True]


def _topology() -> Topology:
    """4 GPUs: 0-1 one PCIe switch, 2-3 NVLink, the pairs across the CPU."""
    pix, nvl, phb, same = LinkLevel.PIX, LinkLevel.NVLINK, LinkLevel.PHB, LinkLevel.SAME
    levels = (
        (same, pix, phb, phb),
        (pix, same, phb, phb),
        (phb, phb, same, nvl),
        (phb, phb, nvl, same),
    )
    return Topology(tuple(f"0000:{b:02x}:00.0" for b in (0x18, 0x3B, 0x86, 0xAF)), levels)


@pytest.mark.parametrize(
    ("strategy", "gpus", "busy", "want"),
    [
        ("topology_aware", 2, set(), [1, 0]),  # NVML 2-3 (NVLink) are CUDA 1 and 0 here
        ("round_robin", 2, set(), [3, 2]),  # NVML 0-1, whatever joins them
        ("topology_aware", 1, {0}, [2]),  # one GPU: the first idle one
    ],
)
def test_placement_picks_the_nvlink_pair_and_maps_it_to_cuda_indices(
    monkeypatch, strategy, gpus, busy, want
):
    import gpu_runtime.placement as placement

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(placement, "read_topology", _topology)
    monkeypatch.setattr(placement, "busy_gpus", lambda: busy)
    # CUDA enumerates in another order than NVML
    monkeypatch.setattr(
        placement,
        "cuda_bus_ids",
        lambda: ["0000:af:00.0", "0000:86:00.0", "0000:3b:00.0", "0000:18:00.0"],
    )
    device, report = choose_device(strategy=strategy, gpus=gpus, requested=None)
    assert report["devices"] == want and device == f"cuda:{want[0]}"
    assert (
        choose_device(strategy=strategy, gpus=gpus, requested="cuda:3")[0] == "cuda:3"
    )  # a worker's choice stands


def test_placement_without_a_gpu_places_nothing_and_multi_gpu_jobs_are_refused(config):
    result = train(
        config(train={"steps": 1}, telemetry={"enabled": False})
    )  # no device: placement decides
    if not torch.cuda.is_available():
        assert result.strategies["placement"] == {
            "strategy": "topology_aware",
            "gpus": 1,
            "devices": [],
            "how": "no GPU",
        }
    with pytest.raises(StrategyError) as info:
        train_on_cpu(config(placement={"gpus": 2}))
    assert [e["key"] for e in info.value.errors] == ["placement.gpus"]


def test_the_fused_optimizer_steps_with_the_fused_adamw_and_matches_the_default(config, spy):
    cfg = config(train={"steps": 3}, telemetry={"enabled": False})
    plain = train_on_cpu(cfg)
    fused = train_on_cpu(
        cfg.model_copy(update={"kernels": cfg.kernels.model_copy(update={"fused_optimizer": True})})
    )
    default_groups, fused_groups = spy[0].optimizer.param_groups, spy[1].optimizer.param_groups
    assert not any(g["fused"] for g in default_groups) and all(g["fused"] for g in fused_groups)
    assert fused.strategies["kernels.fused_optimizer"]["parameters"] > 0
    assert "kernels.fused_optimizer" not in plain.strategies
    assert fused.final_loss == pytest.approx(plain.final_loss, abs=1e-4)  # same update, one kernel


def test_the_fused_optimizer_refuses_a_parameter_it_cannot_step():
    from gpu_runtime.optim import build_adamw
    from gpu_runtime.schema import OptimizerSection

    with pytest.raises(
        StrategyError, match=r"kernels\.fused_optimizer: parameter scale is torch\.int64"
    ):
        build_adamw(
            [("scale", torch.zeros(3, dtype=torch.long))], OptimizerSection(), 1e-3, fused=True
        )
    # parameters on two devices (an offloaded embedding beside GPU weights; meta stands in here)
    with pytest.raises(
        StrategyError, match=r"kernels\.fused_optimizer: parameters live on cpu and meta"
    ):
        build_adamw(
            [("a", torch.zeros(3)), ("b", torch.zeros(3, device="meta"))],
            OptimizerSection(),
            1e-3,
            fused=True,
        )


@pytest.mark.parametrize("saved_fused, resumed_fused", [(False, True), (True, False)])
def test_a_resumed_run_steps_as_its_strategy_says_not_as_the_checkpoint_did(
    config, spy, tmp_path, saved_fused, resumed_fused
):
    def with_fused(cfg, on):
        return cfg.model_copy(
            update={"kernels": cfg.kernels.model_copy(update={"fused_optimizer": on})}
        )

    cfg = config(telemetry={"enabled": False})
    train_on_cpu(with_fused(cfg, saved_fused), steps=2, checkpoint_dir=str(tmp_path))
    resumed = train_on_cpu(with_fused(cfg, resumed_fused), steps=4, resume_from=str(tmp_path))
    assert resumed.steps == 4
    groups = spy[-1].optimizer.param_groups
    assert all(bool(g["fused"]) is resumed_fused for g in groups)
    assert ("kernels.fused_optimizer" in resumed.strategies) is resumed_fused
    state = spy[-1].optimizer.state
    assert state and all(
        s["step"].item() == 4 for s in state.values()
    )  # the moments carried on, not restarted


def test_math_attention_runs_in_every_block_and_trains_as_sdpa_does(config, spy, monkeypatch):
    """kernels.attention: math: every block's attention is the explicit path (each call counted
    while the run trains), and the run's losses are SDPA's."""
    from gpu_runtime import model as model_module

    calls = []
    real = model_module.math_attention

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(model_module, "math_attention", counted)
    cfg = config(train={"steps": 2}, telemetry={"enabled": False})
    plain = train_on_cpu(cfg)
    assert not calls and "kernels.attention" not in plain.strategies
    math = train_on_cpu(
        cfg.model_copy(update={"kernels": cfg.kernels.model_copy(update={"attention": "math"})})
    )
    blocks = spy[1].model.blocks
    assert all(block.attn.attention == "math" for block in blocks)
    assert math.strategies["kernels.attention"] == {"implementation": "math", "blocks": len(blocks)}
    assert len(calls) == 2 * len(blocks)  # a forward per block per step
    assert math.final_loss == pytest.approx(plain.final_loss, abs=1e-4)
