import math
import time

import pytest
import torch
from torch import nn

from gpu_runtime.strategies.batch_scaler import (
    BatchScaler,
    GradientNormTracker,
    GradientStats,
    MicroBatchFloorError,
    NoiseScaleEstimator,
    ScalerConfig,
    plan_accumulation,
    run_step_with_oom_retry,
)
from tests.gpu_runtime.faults import SimulatedOom


def synthetic_stats(gen, *, sizes, grad_sq=1.0, trace=64.0, dim=256):
    """Micro-batch mean gradients g_i = G + N(0, trace/(dim*b_i) I): B_simple = trace / grad_sq."""
    true_grad = torch.zeros(dim)
    true_grad[0] = grad_sq**0.5
    small = [true_grad + torch.randn(dim, generator=gen) * (trace / dim / b) ** 0.5 for b in sizes]
    big = sum(g * b for g, b in zip(small, sizes, strict=True)) / sum(sizes)
    return GradientStats(
        tuple(float(g.square().sum()) for g in small),
        tuple(sizes),
        float(big.square().sum()),
        sum(sizes),
    )


def scaler(**overrides):
    kwargs = dict(global_batch=64, min_micro_batch=4, max_micro_batch=64, stability_window=5)
    return BatchScaler(ScalerConfig(**{**kwargs, **overrides}))


def test_plan_keeps_the_global_batch_exactly():
    plan = plan_accumulation(64, 24)
    assert plan.micro_batch_sizes == (24, 24, 16)
    assert plan.global_batch == 64 and plan.accumulation_steps == 3
    assert math.isclose(sum(plan.loss_weight(i) for i in range(3)), 1.0)
    assert plan_accumulation(64, 16).micro_batch_sizes == (16,) * 4


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        (dict(min_micro_batch=8, max_micro_batch=4), "min_micro_batch"),
        (dict(min_micro_batch=128, max_micro_batch=256), "min_micro_batch"),
        (dict(stability_window=0), "stability_window"),
        (dict(policy="magic"), "policy"),
        (dict(lr_scaling="cubic"), "lr_scaling"),
        (dict(probe_steps=0), "probe_steps"),
        (dict(adaptive_global_batch=True, min_global_batch=128), "min_global_batch"),
    ],
)
def test_bad_settings_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=f"optimizer.dynamic_batching.*{key}"):
        scaler(**kwargs)


def test_noise_scale_estimate_recovers_a_known_noise_scale():
    gen = torch.Generator().manual_seed(0)
    estimator = NoiseScaleEstimator(ema_decay=0.98)
    for _ in range(400):
        assert estimator.observe(synthetic_stats(gen, sizes=(8, 8, 8, 6)))
    assert estimator.noise_scale == pytest.approx(64.0, rel=0.25)


def test_noise_scale_needs_two_micro_batches():
    estimator = NoiseScaleEstimator()
    assert not estimator.observe(GradientStats((1.0,), (64,), 1.0, 64))
    assert estimator.noise_scale is None


def timed(s, steps, seconds_per_sample):
    """Feed `steps` finished steps whose compute time is seconds_per_sample(micro_batch) per
    sample."""
    seen = []
    for _ in range(steps):
        plan = s.plan
        seen.append((plan.micro_batch, plan.global_batch))
        s.update(step_seconds=seconds_per_sample(plan.micro_batch) * plan.global_batch)
    return seen


def overhead_bound(micro_batch):
    """A step costs 1 ms per sample plus 8 ms per micro-batch: larger micro-batches are faster."""
    return 0.001 + 0.008 / micro_batch


def test_micro_batch_grows_with_headroom_while_it_is_faster_and_the_global_batch_stays():
    s = scaler(initial_micro_batch=4, probe_steps=3)
    seen = timed(s, 40, overhead_bound)
    assert s.micro_batch == 64
    assert {g for _, g in seen} == {64}, "the global batch changed"
    assert [(e.kind, e.old_micro_batch, e.new_micro_batch) for e in s.events] == [
        ("grow", 4, 8),
        ("grow", 8, 16),
        ("grow", 16, 32),
        ("grow", 32, 64),
    ]
    # each size runs one warm-up step and probe_steps timed ones before the next probe
    assert [e.step for e in s.events] == [4, 8, 12, 16]
    assert s.events[1].detail["speedup"] > 0.03 and "reason" in s.events[1].detail


def test_a_larger_micro_batch_that_is_not_faster_is_left_and_probing_stops():
    s = scaler(initial_micro_batch=8, probe_steps=2)
    seen = timed(
        s, 30, {8: 0.0012, 16: 0.001, 32: 0.0011}.get
    )  # 16 is faster than 8, 32 slower than 16
    assert [(e.kind, e.old_micro_batch, e.new_micro_batch) for e in s.events] == [
        ("grow", 8, 16),
        ("grow", 16, 32),
        ("shrink", 32, 16),
    ]
    assert "not faster" in s.events[-1].detail["reason"] and s.events[-1].detail["speedup"] < 0
    assert s.micro_batch == 16 and seen[-1] == (16, 64)  # it stays: no more probing
    flat = scaler(initial_micro_batch=8, probe_steps=2, min_speedup=0.05)
    timed(flat, 20, lambda m: 0.001 * (1 - 0.01 * m / 8))  # 1 % faster: below min_speedup
    assert [(e.kind, e.new_micro_batch) for e in flat.events] == [("grow", 16), ("shrink", 8)]


def test_growth_stops_where_the_memory_model_says_it_would_not_fit():
    mib = 2**20
    s = scaler(initial_micro_batch=8, memory_capacity_bytes=100 * mib, probe_steps=1)
    # 10 MiB of weights and state, 4 MiB per sample: 16 fits in 90 MiB, 32 does not
    for _ in range(10):
        m = s.micro_batch
        s.update(
            peak_memory_bytes=10 * mib + m * 4 * mib,
            baseline_memory_bytes=10 * mib,
            step_seconds=overhead_bound(m) * 64,
        )
    assert [(e.kind, e.old_micro_batch, e.new_micro_batch) for e in s.events] == [
        ("grow", 8, 16),
        ("memory_cap", 16, 16),
    ]
    assert (
        s.events[-1].detail["predicted_peak_bytes"] > 0.9 * 100 * mib
        and s.events[-1].detail["wanted"] == 32
    )
    assert s.micro_batch == 16


def test_global_batch_follows_the_noise_scale_only_when_opted_in():
    gen = torch.Generator().manual_seed(1)
    fixed = scaler(initial_micro_batch=8)
    adaptive = scaler(
        initial_micro_batch=8, adaptive_global_batch=True, min_global_batch=8, lr_scaling="sqrt"
    )
    assert adaptive.global_batch == 8 and adaptive.lr_scale == pytest.approx((8 / 64) ** 0.5)
    globals_seen = []
    for trace, steps in ((4096.0, 40), (1.0, 150)):  # very noisy (B_simple ~ 4096), then clean (~1)
        for _ in range(steps):
            for s in (fixed, adaptive):
                s.update(synthetic_stats(gen, sizes=s.plan.micro_batch_sizes, trace=trace))
            globals_seen.append(adaptive.global_batch)
            assert fixed.plan.global_batch == 64 and fixed.lr_scale == 1.0
        if trace > 1:
            assert adaptive.global_batch == 64 and adaptive.lr_scale == 1.0, "it never grew"
    assert adaptive.global_batch == 8, "it never came back down"
    assert not fixed.events
    kinds = [e.kind for e in adaptive.events]
    assert set(kinds) == {"global_grow", "global_shrink"}
    assert all(
        e.detail["lr_scale"] == pytest.approx((e.detail["global_batch"] / 64) ** 0.5)
        for e in adaptive.events
    )
    change_steps = [e.step for e in adaptive.events]
    assert all(b - a >= 5 for a, b in zip(change_steps, change_steps[1:], strict=False))
    assert all(
        adaptive.micro_batch <= g // 2 for g in globals_seen[-1:]
    )  # two micro-batches for the estimate
    linear = scaler(adaptive_global_batch=True, min_global_batch=16, lr_scaling="linear")
    assert linear.lr_scale == pytest.approx(0.25)


def test_grad_variance_policy_grows_the_global_batch_with_variance_and_shrinks_without():
    s = scaler(
        policy="grad_variance",
        initial_micro_batch=4,
        stability_window=10,
        adaptive_global_batch=True,
        min_global_batch=8,
    )
    for i in range(10):  # relative variance 0.25 >> threshold 0.1
        s.update(GradientStats((1.0,), (4,), (1.0 if i % 2 else 3.0) ** 2, 8))
    assert s.global_batch == 64
    for _ in range(10):  # constant norms: variance 0
        s.update(GradientStats((1.0,), (4,), 1.0, 64))
    assert s.global_batch == 16  # tanh's floor: 8 + 56 * 0.12 = 14.7, nearest candidate 16


def test_memory_model_separates_fixed_from_per_sample_cost():
    from gpu_runtime.strategies.batch_scaler import MemoryModel

    mib = 2**20
    model = MemoryModel()
    model.record(
        micro_batch=8, peak_bytes=100 * mib + 10 * mib + 8 * 4 * mib, baseline_bytes=100 * mib
    )
    assert model.predict_peak(16) == 100 * mib + 2 * 42 * mib  # one size seen: all of it per sample
    model.record(
        micro_batch=16, peak_bytes=100 * mib + 10 * mib + 16 * 4 * mib, baseline_bytes=100 * mib
    )
    assert model.predict_peak(64) == pytest.approx(100 * mib + 10 * mib + 64 * 4 * mib)


def test_forced_oom_is_survived_by_halving_and_recorded():
    s = scaler(global_batch=128, initial_micro_batch=64, stability_window=1)
    hook = SimulatedOom(fits_up_to=16)
    ran = []

    def step(plan):
        hook.check(plan.micro_batch)
        ran.append(plan.micro_batch_sizes)
        return "ok"

    assert run_step_with_oom_retry(step, s) == "ok"
    assert ran == [(16,) * 8]
    assert [(e.kind, e.old_micro_batch, e.new_micro_batch) for e in s.events] == [
        ("oom", 64, 32),
        ("oom", 32, 16),
    ]
    # the size that failed is not tried again, however much faster larger ones would be
    timed(s, 20, overhead_bound)
    assert s.micro_batch == 16 and len(s.events) == 2


def test_oom_at_the_minimum_micro_batch_is_a_clear_error():
    s = scaler(initial_micro_batch=4)
    hook = SimulatedOom(fits_up_to=2)
    with pytest.raises(MicroBatchFloorError, match="min_micro_batch"):
        run_step_with_oom_retry(lambda plan: hook.check(plan.micro_batch), s)
    assert hook.raised == 3  # the first try and two retries


def test_other_errors_are_not_swallowed():
    def step(plan):
        raise ValueError("bad data")

    with pytest.raises(ValueError, match="bad data"):
        run_step_with_oom_retry(step, scaler())


def small_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def accumulate(model, tracker, x, y, plan, oom_hook=None):
    start = 0
    for i, size in enumerate(plan.micro_batch_sizes):
        xb, yb = x[start : start + size], y[start : start + size]
        start += size
        if oom_hook is not None and i == 1:
            oom_hook.check(plan.micro_batch)  # fails after one micro-batch already accumulated
        (nn.functional.mse_loss(model(xb), yb) * plan.loss_weight(i)).backward()
        tracker.after_micro_batch(plan, i)


def test_tracker_norms_equal_separately_computed_gradients():
    model = small_model()
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 8, generator=gen), torch.randn(12, 1, generator=gen)
    plan = plan_accumulation(12, 5)
    params = list(model.parameters())
    first = torch.autograd.grad(nn.functional.mse_loss(model(x[:5]), y[:5]), params)
    expected_small = sum(g.square().sum() for g in first).item()
    full = torch.autograd.grad(nn.functional.mse_loss(model(x), y), params)
    expected_big = sum(g.square().sum() for g in full).item()

    tracker = GradientNormTracker(model.parameters())
    accumulate(model, tracker, x, y, plan)
    stats = tracker.step_stats()
    assert stats.small_sizes == (5,) and stats.big_size == 12
    assert stats.small_sq_norms[0] == pytest.approx(expected_small, rel=1e-5)
    assert stats.big_sq_norm == pytest.approx(expected_big, rel=1e-5)
    assert stats.big_sq_norm == pytest.approx(
        sum(p.grad.square().sum().item() for p in params), rel=1e-5
    )


def test_retried_step_after_oom_yields_the_clean_gradient():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 8, generator=gen), torch.randn(32, 1, generator=gen)
    clean = small_model()
    clean_tracker = GradientNormTracker(clean.parameters())
    accumulate(clean, clean_tracker, x, y, plan_accumulation(32, 8))

    model = small_model()
    tracker = GradientNormTracker(model.parameters())
    s = BatchScaler(
        ScalerConfig(
            global_batch=32,
            min_micro_batch=4,
            max_micro_batch=32,
            stability_window=1,
            initial_micro_batch=16,
        )
    )
    hook = SimulatedOom(fits_up_to=8)
    run_step_with_oom_retry(
        lambda plan: accumulate(model, tracker, x, y, plan, hook),
        s,
        cleanup=lambda: model.zero_grad(set_to_none=True),
        tracker=tracker,
    )
    stats = tracker.step_stats()
    assert s.micro_batch == 8 and stats.small_sizes == (8,) and stats.big_size == 32
    for p, q in zip(model.parameters(), clean.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5)


def regression_run(noise_std, dim, steps=60):
    """Linear regression trained with the real tracker and scaler; returns the scaler."""
    gen = torch.Generator().manual_seed(0)
    true_w = torch.randn(dim, 1, generator=gen)
    model = nn.Linear(dim, 1, bias=False)
    nn.init.zeros_(model.weight)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracker = GradientNormTracker(model.parameters())
    s = BatchScaler(
        ScalerConfig(
            global_batch=64,
            min_micro_batch=4,
            max_micro_batch=64,
            stability_window=10,
            initial_micro_batch=4,
            adaptive_global_batch=True,
            min_global_batch=8,
        )
    )
    for _ in range(steps):
        x = torch.randn(s.global_batch, dim, generator=gen)
        y = x @ true_w + noise_std * torch.randn(s.global_batch, 1, generator=gen)
        accumulate(model, tracker, x, y, s.plan)
        s.update(tracker.step_stats())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return s


def test_real_gradients_drive_the_micro_batch_both_ways():
    noisy = regression_run(noise_std=10.0, dim=4)
    clean = regression_run(noise_std=0.0, dim=2)
    assert noisy.global_batch == 64 and noisy.noise.noise_scale > 64
    assert clean.global_batch == 8 and clean.noise.noise_scale < 8


def _accumulated_step(model, tracker, tokens, plan):
    for i, rows in enumerate(plan.micro_batch_sizes):
        chunk = tokens[i * plan.micro_batch : i * plan.micro_batch + rows]
        (model(chunk[:, :-1], chunk[:, 1:])[1] * plan.loss_weight(i)).backward()
        tracker.after_micro_batch(plan, i)
    return tracker.step_stats()


def test_statistics_read_each_gradient_twice_a_step_and_copy_none():
    """The cost in operations, free of timing noise: two fused norms a step,
    whatever the accumulation."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestOutput(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple | list) else (out,):
                if isinstance(t, torch.Tensor):
                    self.numel = max(self.numel, t.numel())
            return out

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    tracker = GradientNormTracker(model.parameters())
    x = torch.randn(32, 64)
    for micro_batch in (16, 4, 2):
        plan = plan_accumulation(32, micro_batch)
        before, spy = tracker.norm_calls, LargestOutput()
        for i, rows in enumerate(plan.micro_batch_sizes):
            model(x[i * micro_batch : i * micro_batch + rows]).square().mean().mul(
                plan.loss_weight(i)
            ).backward()
            with spy:
                tracker.after_micro_batch(plan, i)
        assert tracker.norm_calls - before == 2, micro_batch
        assert tracker.step_stats() is not None
        # norms only: nothing the size of a gradient (64*64) is materialised
        assert 0 < spy.numel <= len(list(model.parameters())), spy.numel
        model.zero_grad(set_to_none=True)


@pytest.mark.slow
def test_statistics_cost_at_most_two_percent_of_step_time(one_torch_thread):
    """Timed on a real step: the tiny preset at the schema's default seq_len (256) and global batch
    (8).

    The statistics read every gradient twice a step whatever the tokens; the step's work
    grows with them. So the share falls as 1/tokens-per-step: at 2048 tokens it is ~0.6 %
    on the CI box, at 512 about 2 %. Best of several steps, as a shared CPU only ever adds time.
    """
    from gpu_runtime.model import Transformer, preset_args

    torch.manual_seed(0)
    model = Transformer(preset_args("tiny", 256))
    tracker = GradientNormTracker(model.parameters())
    plan = plan_accumulation(8, 4)
    tokens = torch.randint(0, 256, (8, 257))
    steps, stats = [], []
    for _ in range(5):
        started, overhead_before = time.perf_counter(), tracker.overhead_s
        assert _accumulated_step(model, tracker, tokens, plan) is not None
        steps.append(time.perf_counter() - started)
        stats.append(tracker.overhead_s - overhead_before)
        model.zero_grad(set_to_none=True)
    share = min(stats[1:]) / min(steps[1:])  # the first step warms the allocator and caches
    assert 0 < share <= 0.02, (
        f"statistics took {share:.2%} of a step ({min(steps[1:]) * 1e3:.0f} ms)"
    )


def test_reconfigure_clamps_into_new_bounds_at_once_and_keeps_what_was_learnt():
    s = scaler(initial_micro_batch=16, stability_window=3)
    s.on_out_of_memory()  # 16 -> 8, and nothing above 15 again
    s.reconfigure(min_micro_batch=4, max_micro_batch=4, stability_window=1)
    assert s.micro_batch == 4 and s.events[-1].kind == "bounds" and s.stability_window == 1
    s.reconfigure(min_micro_batch=4, max_micro_batch=64, stability_window=1)
    assert (
        s.micro_batch == 4 and s.max_micro_batch == 64
    )  # the global batch (64) is the only other cap
    assert max(s._candidates()) == 8  # the out-of-memory limit survives a wider max (16 failed)
    with pytest.raises(ValueError, match="min_micro_batch"):
        s.reconfigure(min_micro_batch=8, max_micro_batch=4, stability_window=1)


def test_pending_norms_read_later_give_the_same_stats_as_step_stats():
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    x = torch.randn(16, 8)
    plan = plan_accumulation(16, 4)
    results = []
    for read_later in (False, True):
        tracker = GradientNormTracker(model.parameters())
        for i in range(plan.accumulation_steps):
            (model(x[4 * i : 4 * i + 4]).square().mean() * plan.loss_weight(i)).backward()
            tracker.after_micro_batch(plan, i)
        if read_later:
            pair = tracker.pending_sq_norms(divide_by=torch.tensor(4.0))
            results.append(tracker.stats_from(*(pair * 4).tolist()))
        else:
            results.append(tracker.step_stats())
        model.zero_grad(set_to_none=True)
    assert (
        results[0].small_sizes == results[1].small_sizes
        and results[0].big_size == results[1].big_size
    )
    assert results[0].big_sq_norm == pytest.approx(results[1].big_sq_norm)
    assert results[0].small_sq_norms == pytest.approx(results[1].small_sq_norms)
