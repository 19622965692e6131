"""Cost engine: hand-computed figures and hypothesis properties. Pure; no database."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.billing.cost_engine import (
    CostBreakdown,
    Projection,
    Usage,
    Weights,
    cost_per_million_tokens,
    project,
    resource_weighted_cost,
    tiered_cost,
)
from apps.pricing.prices import Prices
from tests.pricing_reference import price_samples, usage_between

# 3.00 USD per GPU-hour, 0.15 USD/kWh, PUE 1.2, 0.04 USD per vCPU-hour, 0.005 USD per GB-hour.
PRICES = Prices(
    gpu_hour_usd=3.0,
    electricity_usd_per_kwh=0.15,
    pue=1.2,
    vcpu_hour_usd=0.04,
    memory_gb_hour_usd=0.005,
)
TIERS = [
    {"up_to": 1000, "usd_per_unit": "0.002"},
    {"up_to": 5000, "usd_per_unit": "0.001"},
    {"up_to": None, "usd_per_unit": "0.0005"},
]
COST_FIELDS = [f.name for f in dataclasses.fields(CostBreakdown)]
PRICE_FIELDS = [f.name for f in dataclasses.fields(Prices) if f.name != "unpriced"]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def assert_costs_close(a: CostBreakdown, b: CostBreakdown) -> None:
    for name in COST_FIELDS:
        assert close(getattr(a, name), getattr(b, name)), (name, getattr(a, name), getattr(b, name))


def assert_usage_close(a: Usage, b: Usage) -> None:
    assert (a.tokens, a.steps) == (b.tokens, b.steps)
    for name in (
        "wall_s",
        "device_seconds",
        "busy_device_seconds",
        "energy_j",
        "vcpu_seconds",
        "memory_gb_seconds",
    ):
        assert close(getattr(a, name), getattr(b, name)), name


def sample(ts, *, energy_j=None, power_w=None, tokens=0, step=0, util_pct=None):
    return {
        "ts": ts,
        "energy_j": energy_j,
        "power_w": power_w,
        "tokens": tokens,
        "step": step,
        "util_pct": util_pct,
    }


# --- hand-computed figures ---------------------------------------------------------------


def test_half_hour_on_two_gpus_hand_computed():
    prev = sample(0.0, energy_j=0.0)
    cur = sample(1800.0, energy_j=1_800_000.0, tokens=1_500_000, step=100, util_pct=50.0)
    usage = usage_between(prev, cur, gpu_count=2, vcpus=8, memory_gb=32.0)
    assert usage == Usage(
        wall_s=1800.0,
        device_seconds=3600.0,
        busy_device_seconds=1800.0,
        energy_j=1_800_000.0,
        vcpu_seconds=14_400.0,
        memory_gb_seconds=57_600.0,
        tokens=1_500_000,
        steps=100,
    )
    cost = resource_weighted_cost(usage, PRICES)
    assert close(cost.gpu_hours, 1.0)  # 2 GPUs x 1800 s = 1 GPU-hour
    assert close(cost.gpu_usd, 3.00)  # 1 GPU-hour x 3.00 USD/h
    assert close(cost.energy_kwh, 0.5)  # 1.8e6 J / 3.6e6 J/kWh
    assert close(cost.energy_usd, 0.09)  # 0.5 kWh x PUE 1.2 x 0.15 USD/kWh
    assert close(cost.cpu_usd, 0.16)  # 8 vCPU x 0.5 h x 0.04 USD
    assert close(cost.memory_usd, 0.08)  # 32 GB x 0.5 h x 0.005 USD
    assert close(cost.total_usd, 3.33)  # 3.00 + 0.09 + 0.16 + 0.08
    assert close(cost.idle_usd, 1.50)  # 50 % idle of the 3.00 USD device cost
    assert close(cost.used_usd, 1.83)  # 1.50 busy device + 0.09 + 0.16 + 0.08
    assert close(cost_per_million_tokens(cost.total_usd, usage.tokens), 2.22)  # 3.33 / 1.5 M tokens


def test_weights_scale_each_term():
    usage = Usage(
        device_seconds=3600.0, busy_device_seconds=3600.0, energy_j=3_600_000.0, vcpu_seconds=3600.0
    )
    cost = resource_weighted_cost(usage, PRICES, Weights(gpu=0.5, energy=2.0, cpu=0.0, memory=1.0))
    assert close(cost.gpu_usd, 1.50)  # 1 GPU-hour x 3.00 x 0.5
    assert close(cost.energy_usd, 0.36)  # 1 kWh x 1.2 x 0.15 x 2
    assert cost.cpu_usd == 0.0  # weight 0
    assert close(cost.total_usd, 1.86)
    assert cost.idle_usd == 0.0


def test_fully_idle_device_is_all_idle_cost():
    cost = resource_weighted_cost(Usage(device_seconds=1800.0, busy_device_seconds=0.0), PRICES)
    assert close(cost.idle_usd, 1.50)  # 0.5 GPU-hour x 3.00, nothing busy
    assert cost.used_usd == 0.0


def test_unknown_utilisation_counts_as_busy():
    usage = usage_between(sample(0.0), sample(600.0, util_pct=None))
    assert usage.busy_device_seconds == usage.device_seconds == 600.0
    assert resource_weighted_cost(usage, PRICES).idle_usd == 0.0


def test_first_sample_counts_cumulative_from_zero_and_bills_no_time():
    # 360 000 J = 0.1 kWh -> 0.1 x 1.2 x 0.15 = 0.018 USD; dt = 0 so no GPU, CPU or memory time.
    usage = usage_between(
        None, sample(12_345.0, energy_j=360_000.0, tokens=4096, step=2), vcpus=4, memory_gb=8
    )
    assert usage == Usage(energy_j=360_000.0, tokens=4096, steps=2)
    cost = resource_weighted_cost(usage, PRICES)
    assert close(cost.total_usd, 0.018)
    assert cost.gpu_usd == cost.cpu_usd == cost.memory_usd == 0.0


def test_energy_falls_back_to_mean_power_times_time():
    # counter missing at one end: mean of 200 W and 300 W = 250 W x 60 s = 15 000 J
    usage = usage_between(sample(0.0, power_w=200.0, energy_j=5.0), sample(60.0, power_w=300.0))
    assert close(usage.energy_j, 15_000.0)
    # one power reading only: 100 W x 10 s
    assert close(usage_between(sample(0.0), sample(10.0, power_w=100.0)).energy_j, 1000.0)
    # nothing known: no energy
    assert usage_between(sample(0.0), sample(10.0)).energy_j == 0.0


def test_counter_reset_and_out_of_order_clamp_to_zero():
    prev = sample(100.0, energy_j=1_000_000.0, tokens=50_000, step=500)
    reset = sample(160.0, energy_j=1_000.0, tokens=10, step=1)
    usage = usage_between(prev, reset)
    assert usage.energy_j == 0.0 and usage.tokens == 0 and usage.steps == 0
    assert usage.wall_s == 60.0
    earlier = sample(40.0, energy_j=2_000_000.0, tokens=60_000, step=600)
    usage = usage_between(prev, earlier)
    assert usage.wall_s == usage.device_seconds == 0.0
    assert usage.energy_j == 1_000_000.0 and usage.tokens == 10_000 and usage.steps == 100


def test_objects_with_datetimes_and_decimal_tables():
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    prev = SimpleNamespace(ts=t0, energy_j=0.0, power_w=None, tokens=0, step=0, util_pct=100.0)
    cur = SimpleNamespace(
        ts=t0 + timedelta(hours=1), energy_j=None, power_w=None, tokens=1, step=1, util_pct=25.0
    )
    usage = usage_between(prev, cur)
    assert usage.wall_s == 3600.0 and usage.busy_device_seconds == 900.0
    decimal_host = usage_between(
        sample(0.0), sample(3600.0), vcpus=Decimal("2"), memory_gb=Decimal("1.5")
    )
    assert (decimal_host.vcpu_seconds, decimal_host.memory_gb_seconds) == (7200.0, 5400.0)
    table = SimpleNamespace(
        electricity_usd_per_kwh=Decimal("0.150000"),
        pue=Decimal("1.20"),
        vcpu_hour_usd=Decimal("0.040000"),
        memory_gb_hour_usd=Decimal("0.005000"),
        carbon_g_per_kwh=Decimal("0"),
    )
    prices = Prices.from_table(table, Decimal("3.000000"))
    assert prices == PRICES and all(type(getattr(prices, n)) is float for n in PRICE_FIELDS)
    model = SimpleNamespace(
        gpu_weight=Decimal("1.5"),
        energy_weight=Decimal("1"),
        cpu_weight=Decimal("0"),
        memory_weight=Decimal("2"),
    )
    assert Weights.from_cost_model(model) == Weights(gpu=1.5, energy=1.0, cpu=0.0, memory=2.0)


def test_negative_inputs_are_rejected():
    with pytest.raises(ValueError, match="gpu_hour_usd"):
        dataclasses.replace(PRICES, gpu_hour_usd=-1.0)
    with pytest.raises(ValueError, match="pue"):
        dataclasses.replace(PRICES, pue=math.nan)
    with pytest.raises(ValueError, match="energy"):
        Weights(energy=-0.1)
    with pytest.raises(ValueError):
        usage_between(None, sample(0.0), gpu_count=-1)


def test_tiered_cost_across_a_tier_boundary():
    # 800 already billed: 200 units left in tier 1 at 0.002 + 300 in tier 2 at 0.001 = 0.4 + 0.3
    assert close(tiered_cost(800, 500, TIERS), 0.7)
    # from zero: 1000 x 0.002 + 4000 x 0.001 + 5000 x 0.0005 = 2 + 4 + 2.5
    assert close(tiered_cost(0, 10_000, TIERS), 8.5)
    # wholly inside the open tier
    assert close(tiered_cost(1_000_000, 2000, TIERS), 1.0)
    assert tiered_cost(123, 0, TIERS) == 0.0
    # Decimal and float prices work too; a closed last tier keeps its price beyond its bound:
    # 10 x 1 + (30 - 10) x 0.5 = 20
    closed = [{"up_to": 10, "usd_per_unit": Decimal("1")}, {"up_to": 20, "usd_per_unit": 0.5}]
    assert close(tiered_cost(0, 30, closed), 20.0)


def test_tiered_cost_rejects_bad_tiers():
    for bad in (
        [],
        [{"up_to": None, "usd_per_unit": "1"}, {"up_to": 10, "usd_per_unit": "1"}],
        [{"up_to": 10, "usd_per_unit": "1"}, {"up_to": 10, "usd_per_unit": "1"}],
        [{"up_to": None, "usd_per_unit": "-1"}],
    ):
        with pytest.raises(ValueError):
            tiered_cost(0, 1, bad)
    with pytest.raises(ValueError):
        tiered_cost(-1, 1, TIERS)


def test_cost_per_million_tokens_without_tokens():
    assert cost_per_million_tokens(5.0, 0) is None
    assert close(cost_per_million_tokens(3.0, 1_500_000), 2.0)


def test_projection_is_linear_per_step():
    usage = Usage(wall_s=600.0, steps=100)
    cost = CostBreakdown(gpu_hours=0.5, energy_usd=0.09, total_usd=3.33)
    p = project(usage, cost, target_steps=1000)  # x10
    assert p == Projection(
        target_steps=1000,
        gpu_hours=pytest.approx(5.0),
        electricity_usd=pytest.approx(0.9),
        total_usd=pytest.approx(33.3),
        completion_s=pytest.approx(6000.0),
    )
    assert project(Usage(wall_s=5.0), cost, target_steps=1000) is None
    with pytest.raises(ValueError):
        project(usage, cost, target_steps=0)


def test_pricing_table_change_mid_run():
    # Table B (4.00 USD/h) is in force from ts 1800. Intervals are priced by their closing sample:
    # (0, 900] under A = 0.25 h x 2.00 = 0.50; (900, 1800], (1800, 2700], (2700, 3600] under B
    # = 0.75 h x 4.00 = 3.00; total 3.50 USD.
    a = Prices(
        gpu_hour_usd=2.0, electricity_usd_per_kwh=0, pue=1, vcpu_hour_usd=0, memory_gb_hour_usd=0
    )
    b = dataclasses.replace(a, gpu_hour_usd=4.0)
    seen = []

    def prices_at(ts):
        seen.append(ts)
        return b if ts >= 1800 else a

    samples = [sample(float(t), util_pct=100.0) for t in (0, 900, 1800, 2700, 3600)]
    usage, cost = price_samples(samples, prices_at=prices_at, weights=Weights())
    assert seen == [0.0, 900.0, 1800.0, 2700.0, 3600.0]
    assert usage.wall_s == 3600.0
    assert close(cost.gpu_hours, 1.0)
    assert close(cost.total_usd, 3.50)


def realistic_run(n: int) -> list[dict]:
    return [
        sample(
            10.0 * i,
            energy_j=2500.0 * i,
            tokens=4096 * i,
            step=i,
            util_pct=(i * 37) % 101,
            power_w=250.0,
        )
        for i in range(n)
    ]


def test_incremental_pricing_equals_all_at_once():
    samples = realistic_run(20)
    kw = dict(prices_at=lambda ts: PRICES, weights=Weights(), gpu_count=2, vcpus=4, memory_gb=16.0)
    u1, c1 = price_samples(samples[:10], **kw)
    u2, c2 = price_samples(samples[10:], previous=samples[9], **kw)
    u, c = price_samples(samples, **kw)
    assert_usage_close(u1 + u2, u)
    assert_costs_close(c1 + c2, c)
    # 19 intervals of 10 s on 2 GPUs = 380 GPU-seconds; 19 x 2500 J of energy
    assert close(u.device_seconds, 380.0) and close(u.energy_j, 47_500.0)
    assert u.tokens == 19 * 4096 and u.steps == 19
    assert price_samples([], **kw) == (Usage.zero(), CostBreakdown.zero())


# --- properties ---------------------------------------------------------------------------

finite = dict(allow_nan=False, allow_infinity=False)
money = st.floats(0, 100, **finite)
prices_st = st.builds(
    Prices,
    gpu_hour_usd=money,
    electricity_usd_per_kwh=money,
    pue=st.floats(1, 3, **finite),
    vcpu_hour_usd=money,
    memory_gb_hour_usd=money,
)
weights_st = st.builds(
    Weights,
    gpu=st.floats(0, 5, **finite),
    energy=st.floats(0, 5, **finite),
    cpu=st.floats(0, 5, **finite),
    memory=st.floats(0, 5, **finite),
)
maybe = st.none().__or__


@st.composite
def runs(draw) -> list[dict]:
    """Samples of one run: mostly growing counters, with resets, gaps, reordering and Nones."""
    out, t, e, tok, step = [], 0.0, 0.0, 0, 0
    for _ in range(draw(st.integers(1, 12))):
        t += draw(st.floats(-30, 120, **finite))
        e = (
            draw(st.floats(0, 1e6, **finite))
            if draw(st.booleans())
            else e + draw(st.floats(0, 1e5, **finite))
        )
        tok = max(0, tok + draw(st.integers(-5000, 50_000)))
        step = max(0, step + draw(st.integers(-3, 20)))
        out.append(
            sample(
                t,
                energy_j=draw(maybe(st.just(e))),
                power_w=draw(maybe(st.floats(0, 1000, **finite))),
                tokens=tok,
                step=step,
                util_pct=draw(maybe(st.floats(0, 100, **finite))),
            )
        )
    return out


resources = dict(
    gpu_count=st.integers(0, 8), vcpus=st.integers(0, 64), memory_gb=st.floats(0, 512, **finite)
)


def two_tables(a: Prices, b: Prices, switch: float):
    return lambda ts: b if ts >= switch else a


@settings(max_examples=75, deadline=None)
@given(
    samples=runs(),
    a=prices_st,
    b=prices_st,
    switch=st.floats(-100, 1000, **finite),
    weights=weights_st,
    **resources,
)
@pytest.mark.slow
def test_cost_is_never_negative_and_used_plus_idle_is_total(
    samples, a, b, switch, weights, gpu_count, vcpus, memory_gb
):
    usage, cost = price_samples(
        samples,
        prices_at=two_tables(a, b, switch),
        weights=weights,
        gpu_count=gpu_count,
        vcpus=vcpus,
        memory_gb=memory_gb,
    )
    assert all(v >= 0 for v in dataclasses.astuple(usage))
    assert usage.busy_device_seconds <= usage.device_seconds
    assert all(v >= 0 for v in dataclasses.astuple(cost))
    assert close(cost.used_usd + cost.idle_usd, cost.total_usd)
    assert close(cost.gpu_usd + cost.energy_usd + cost.cpu_usd + cost.memory_usd, cost.total_usd)
    assert cost.idle_usd <= cost.gpu_usd


@settings(max_examples=75, deadline=None)
@given(
    samples=runs(),
    data=st.data(),
    a=prices_st,
    b=prices_st,
    switch=st.floats(-100, 1000, **finite),
    weights=weights_st,
    **resources,
)
def test_additive_over_disjoint_windows(
    samples, data, a, b, switch, weights, gpu_count, vcpus, memory_gb
):
    k = data.draw(st.integers(0, len(samples)), label="split")
    kw = dict(
        prices_at=two_tables(a, b, switch),
        weights=weights,
        gpu_count=gpu_count,
        vcpus=vcpus,
        memory_gb=memory_gb,
    )
    u1, c1 = price_samples(samples[:k], **kw)
    u2, c2 = price_samples(samples[k:], previous=samples[k - 1] if k else None, **kw)
    u, c = price_samples(samples, **kw)
    assert_usage_close(u1 + u2, u)
    assert_costs_close(c1 + c2, c)


@settings(max_examples=75, deadline=None)
@given(
    samples=runs(),
    prices=prices_st,
    weights=weights_st,
    field=st.sampled_from(PRICE_FIELDS),
    bump=st.floats(0, 50, **finite),
    **resources,
)
def test_monotone_in_every_price(
    samples, prices, weights, field, bump, gpu_count, vcpus, memory_gb
):
    dearer = dataclasses.replace(prices, **{field: getattr(prices, field) + bump})
    kw = dict(weights=weights, gpu_count=gpu_count, vcpus=vcpus, memory_gb=memory_gb)
    _, cheap = price_samples(samples, prices_at=lambda ts: prices, **kw)
    _, dear = price_samples(samples, prices_at=lambda ts: dearer, **kw)
    for name in ("gpu_usd", "energy_usd", "cpu_usd", "memory_usd", "idle_usd", "total_usd"):
        assert getattr(dear, name) >= getattr(cheap, name), name


tiers_st = st.lists(
    st.tuples(st.integers(1, 10_000), st.decimals(0, 1, places=6, allow_nan=False)),
    min_size=1,
    max_size=5,
).map(
    lambda rows: [
        {
            "up_to": None if i == len(rows) - 1 else sum(r[0] for r in rows[: i + 1]),
            "usd_per_unit": str(r[1]),
        }
        for i, r in enumerate(rows)
    ]
)


@settings(max_examples=200, deadline=None)
@given(tiers_st, st.integers(0, 100_000), st.integers(0, 50_000), st.integers(0, 50_000))
def test_tiered_cost_is_additive_and_non_negative(tiers, before, x, y):
    whole = tiered_cost(before, x + y, tiers)
    assert whole >= 0
    assert math.isclose(
        tiered_cost(before, x, tiers) + tiered_cost(before + x, y, tiers),
        whole,
        rel_tol=1e-9,
        abs_tol=1e-9,
    )
    assert tiered_cost(before, x, tiers) <= whole
