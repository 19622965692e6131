"""A run's bill is a function of its stored samples and the price tables, however they arrived.

For random sample sets (seq and time gaps, fractional intervals, power readings and energy
counters present or not, price tables starting anywhere, inside gaps too) and a random
delivery (permutation, batching, repeated batches, the first batch arriving last), the totals
stored after every batch has landed equal apps.billing.bill over the sorted set, to the
micro-dollar, and so do they after finish. Real Postgres; nothing mocked.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.billing import cost_engine
from apps.billing.bill import run_bill
from apps.billing.services import telemetry_ingest
from apps.experiments.models import Run
from apps.experiments.services import run_external_finish
from apps.pricing.prices import Prices
from apps.pricing.selectors import price_schedule
from apps.telemetry.models import TelemetrySample
from tests.factories import (
    ArmFactory,
    GpuPriceFactory,
    GpuSkuFactory,
    PricingTableFactory,
    RunFactory,
)

pytestmark = pytest.mark.django_db

MICRO = Decimal("0.000002")  # rounding of two 6-decimal figures; a cent is 5000 times more


@st.composite
def sample_sets(draw):
    """Samples of one run in seq order: seq gaps, time gaps of up to 2 h, fractional seconds."""
    n = draw(st.integers(1, 30))
    keep = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    keep[0] = True
    t, energy, tokens, step, out = 0.0, 0.0, 0, 0, []
    for seq in range(n):
        t += draw(
            st.one_of(
                st.just(1.0),
                st.floats(0, 7.5, allow_subnormal=False),
                st.sampled_from([0.0, 3601.0, 7200.25]),
            )
        )
        power = draw(st.one_of(st.none(), st.floats(50, 700, allow_subnormal=False)))
        energy += draw(st.floats(0, 5000, allow_subnormal=False))
        tokens += draw(st.integers(0, 4096))
        step += draw(st.integers(0, 3))
        if keep[seq]:
            out.append(
                {
                    "seq": seq,
                    "t": t,
                    "step": step,
                    "tokens": tokens,
                    "power_w": power,
                    "energy_j": energy if draw(st.booleans()) else None,
                    "util_pct": draw(
                        st.one_of(st.none(), st.floats(0, 100, allow_subnormal=False))
                    ),
                }
            )
    return out


@st.composite
def deliveries(draw, n):
    """Batches of indexes into the sorted set: any order, any size, some sent twice,
    the first late."""
    order = draw(st.permutations(range(n))) if draw(st.booleans()) else list(range(n))
    size = draw(st.integers(1, max(1, n)))
    batches = [order[i : i + size] for i in range(0, n, size)]
    if draw(st.booleans()):
        batches.append(batches[0])  # the first batch again: a retry
    if draw(st.booleans()) and len(batches) > 1:
        batches.append(batches.pop(0))  # the first batch lands last
    if draw(st.booleans()):
        batches = [list(reversed(b)) for b in batches]
    return batches


def _world(gpu_count: int, vcpus: int, memory_gb: float, table_offsets: list[float], t0: datetime):
    sku = GpuSkuFactory(tdp_w=700)
    first = GpuPriceFactory(
        sku=sku,
        hourly_usd=Decimal("3.00"),
        pricing_table=PricingTableFactory(valid_from=t0 - timedelta(days=30)),
    )
    tenant = first.pricing_table.tenant
    for i, offset in enumerate(sorted(set(table_offsets))):
        GpuPriceFactory(
            sku=sku,
            hourly_usd=Decimal("3.00") + i + 1,
            pricing_table=PricingTableFactory(
                tenant=tenant,
                valid_from=t0 + timedelta(seconds=offset),
                electricity_usd_per_kwh=Decimal("0.3"),
                vcpu_hour_usd=Decimal("0.05") * (i + 1),
            ),
        )
    run = RunFactory(
        arm=ArmFactory(experiment__tenant=tenant),
        kind=Run.Kind.EXTERNAL,
        status=Run.Status.RUNNING,
        gpu_sku=sku if gpu_count else None,
        gpu_count=gpu_count,
        vcpus=vcpus,
        memory_gb=memory_gb,
        created=t0 - timedelta(minutes=1),
    )
    return Run.objects.select_related("experiment__cost_model", "gpu_sku").get(pk=run.pk)


def reference(run: Run):
    """The bill of the stored rows; a DDP run's rank streams each hold their share of its
    resources."""
    rows = list(TelemetrySample.objects.filter(run=run).values())
    schedule = price_schedule(tenant_id=run.tenant_id, gpu_sku_id=run.gpu_sku_id)
    w = run.world_size
    return run_bill(
        rows,
        starts=schedule.starts,
        prices=schedule.prices,
        weights=cost_engine.Weights.from_cost_model(run.experiment.cost_model),
        gpu_count=run.gpu_count / w,
        vcpus=run.vcpus / w,
        memory_gb=run.memory_gb / w,
        modelled_power_w=700.0 * run.gpu_count / w,
    )


def assert_totals_are_the_bill(run: Run) -> None:
    run.refresh_from_db()
    bill = reference(run)
    assert run.tokens == bill.usage.tokens
    device_s = bill.usage.device_seconds if run.gpu_count else bill.usage.wall_s
    assert run.device_seconds == pytest.approx(device_s, rel=1e-9, abs=1e-6)
    assert run.energy_j == pytest.approx(bill.usage.energy_j, rel=1e-9, abs=1e-6)
    assert abs(run.cost_usd - Decimal(str(round(bill.cost.total_usd, 6)))) <= MICRO
    assert run.steps == bill.max_step
    assert run.energy_estimated == bill.energy_estimated


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    data=st.data(),
    gpu_count=st.integers(0, 8),
    vcpus=st.integers(0, 16),
    memory_gb=st.sampled_from([0.0, 7.5, 64.0]),
    table_offsets=st.lists(st.floats(-10, 9000).map(lambda s: round(s, 3)), max_size=3),
)
@pytest.mark.slow
def test_stored_totals_equal_the_bill_of_the_sorted_set_whatever_the_delivery(
    data, gpu_count, vcpus, memory_gb, table_offsets
):
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=2)
    run = _world(gpu_count, vcpus, memory_gb, table_offsets, t0)
    deliver_and_check(data, run, data.draw(sample_sets()), t0)


def deliver_and_check(data, run: Run, sorted_set: list[dict], t0: datetime) -> None:
    """Ingest the set in a drawn delivery; the totals are its bill, before and after the finish."""
    wire = [
        {
            k: v
            for k, v in dict(s, ts=(t0 + timedelta(seconds=s["t"])).isoformat()).items()
            if k != "t"
        }
        for s in sorted_set
    ]
    for batch in data.draw(deliveries(len(wire))):
        telemetry_ingest(run_id=run.pk, samples=[wire[i] for i in batch])
    assert TelemetrySample.objects.filter(run=run).count() == len(wire)
    assert_totals_are_the_bill(run)
    run_external_finish(run=Run.objects.get(pk=run.pk), status=Run.Status.SUCCEEDED)
    assert_totals_are_the_bill(run)


def test_the_reference_itself_splits_time_at_a_price_boundary():
    """Hand check of apps.billing.bill: 2 samples 100 s apart, a table starting 30 s in."""
    t0 = datetime(2026, 5, 1, tzinfo=UTC)
    cheap = Prices(
        gpu_hour_usd=3.6, electricity_usd_per_kwh=0, pue=1, vcpu_hour_usd=0, memory_gb_hour_usd=0
    )
    dear = Prices(
        gpu_hour_usd=36.0, electricity_usd_per_kwh=0, pue=1, vcpu_hour_usd=0, memory_gb_hour_usd=0
    )
    blank = {"attempt": 1, "energy_j": None, "power_w": None, "util_pct": None, "estimated": False}
    samples = [
        {**blank, "seq": 1, "ts": t0 + timedelta(seconds=100), "tokens": 10, "step": 1},
        {**blank, "seq": 0, "ts": t0, "tokens": 0, "step": 0},
    ]
    bill = run_bill(
        random.Random(0).sample(samples, 2),
        starts=[t0 - timedelta(days=1), t0 + timedelta(seconds=30)],
        prices=[cheap, dear],
        gpu_count=2,
    )
    # 30 s x 2 GPUs at 3.6 USD/h + 70 s x 2 GPUs at 36 USD/h = 0.06 + 1.4
    assert bill.cost.total_usd == pytest.approx(0.06 + 1.4, rel=1e-12)
    assert bill.periods[1].tokens == 10 and bill.periods[0].tokens == 0
