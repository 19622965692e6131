"""A DDP run's telemetry: one stream per rank in the run's one seq space, stored once per (run,
seq).

Each rank's samples close their own intervals; time and energy add up over the devices, the
world's progress (tokens, steps) counts once. The stored totals equal apps.billing.bill over
the sorted set whatever the delivery (order, batching, retries), as for a single stream.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.billing.bill import run_bill
from apps.experiments.models import Run
from apps.pricing.prices import Prices
from tests.apps.billing.test_billing_property import _world, deliver_and_check

pytestmark = pytest.mark.django_db


@st.composite
def world_sample_sets(draw, world: int):
    """Ticks of `world` ranks: each rank's own clock and counters; the ranks' order within a tick,
    and so their seqs, drawn; a few samples lost."""
    ticks = draw(st.integers(1, 12))
    clocks, energies = [0.0] * world, [0.0] * world
    tokens = step = 0
    rows = []
    for _ in range(ticks):
        tokens += draw(st.integers(0, 4096))
        step += draw(st.integers(0, 3))
        order = draw(st.permutations(range(world)))
        for rank in order:
            clocks[rank] += draw(st.one_of(st.just(1.0), st.floats(0, 7.5, allow_subnormal=False)))
            energies[rank] += draw(st.floats(0, 5000, allow_subnormal=False))
            rows.append(
                {
                    "rank": rank,
                    "t": clocks[rank],
                    "step": step,
                    "tokens": tokens,
                    "power_w": draw(
                        st.one_of(st.none(), st.floats(50, 700, allow_subnormal=False))
                    ),
                    "energy_j": energies[rank] if draw(st.booleans()) else None,
                    "util_pct": draw(
                        st.one_of(st.none(), st.floats(0, 100, allow_subnormal=False))
                    ),
                }
            )
    keep = draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))
    keep[0] = True
    return [dict(r, seq=seq) for seq, (r, k) in enumerate(zip(rows, keep, strict=True)) if k]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    data=st.data(),
    world=st.integers(2, 3),
    gpus_per_rank=st.integers(0, 2),
    vcpus=st.integers(0, 8),
)
@pytest.mark.slow
def test_stored_totals_of_a_world_equal_the_bill_whatever_the_delivery(
    data, world, gpus_per_rank, vcpus
):
    t0 = timezone.now().replace(microsecond=0) - timedelta(days=2)
    run = _world(gpus_per_rank * world, vcpus * world, 0.0, [], t0)
    Run.objects.filter(pk=run.pk).update(world_size=world)
    run.refresh_from_db()
    deliver_and_check(data, run, data.draw(world_sample_sets(world)), t0)


def test_two_devices_bill_twice_the_time_and_the_world_progress_once():
    """Hand check: two ranks, each sampled at 0 s and 100 s, on a 2-GPU run at 3.6 USD per
    GPU-hour."""
    t0 = datetime(2026, 5, 1, tzinfo=UTC)
    prices = Prices(
        gpu_hour_usd=3.6, electricity_usd_per_kwh=0, pue=1, vcpu_hour_usd=0, memory_gb_hour_usd=0
    )
    blank = {"attempt": 1, "power_w": None, "util_pct": None, "estimated": False}
    samples = [
        {**blank, "seq": 0, "rank": 1, "ts": t0, "tokens": 0, "step": 0, "energy_j": 0.0},
        {
            **blank,
            "seq": 1,
            "rank": 0,
            "ts": t0 + timedelta(seconds=1),
            "tokens": 0,
            "step": 0,
            "energy_j": 0.0,
        },
        {
            **blank,
            "seq": 2,
            "rank": 0,
            "ts": t0 + timedelta(seconds=101),
            "tokens": 640,
            "step": 10,
            "energy_j": 500.0,
        },
        {
            **blank,
            "seq": 3,
            "rank": 1,
            "ts": t0 + timedelta(seconds=100),
            "tokens": 640,
            "step": 10,
            "energy_j": 300.0,
        },
    ]
    bill = run_bill(
        samples, starts=[t0 - timedelta(days=1)], prices=[prices], gpu_count=1
    )  # one GPU per stream
    assert bill.usage.device_seconds == pytest.approx(200.0)  # 100 s on each of two devices
    assert bill.usage.energy_j == pytest.approx(800.0)  # summed over the devices
    assert bill.usage.tokens == 640 and bill.usage.steps == 10  # the world's progress, once
    assert bill.cost.total_usd == pytest.approx(200 / 3600 * 3.6)
