"""Strategy-search probes are priced by the bill runs are priced by (issue 24: probes went
through what is now tests.pricing_reference.price_samples, which prices a whole interval at the
table in force when it closed and models no board power)."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.billing.services import samples_bill, telemetry_ingest
from apps.experiments.models import Run
from tests.factories import (
    ArmFactory,
    ExperimentFactory,
    GpuPriceFactory,
    GpuSkuFactory,
    PricingTableFactory,
    RunFactory,
)

pytestmark = pytest.mark.django_db

T0 = timezone.now().replace(microsecond=0) - timedelta(hours=2)


def stretch(n: int, *, power: bool) -> list[dict]:
    """n samples 10 s apart from T0, counters from 0; with or without power readings."""
    return [
        {
            "seq": s,
            "ts": T0 + timedelta(seconds=10 * s),
            "step": s,
            "tokens": 1000 * s,
            "util_pct": 80.0,
            "power_w": 400.0 if power else None,
            "energy_j": 4000.0 * s if power else None,
        }
        for s in range(n)
    ]


@pytest.mark.parametrize("power", [True, False], ids=["measured power", "modelled power"])
def test_a_probes_cost_equals_a_runs_bill_for_the_same_samples(power):
    sku = GpuSkuFactory(tdp_w=700)
    first = PricingTableFactory(valid_from=T0 - timedelta(days=1))
    tenant = first.tenant
    GpuPriceFactory(pricing_table=first, sku=sku, hourly_usd=Decimal("3.00"))
    # A new version 105 s in: mid-interval (samples at 100 s and 110 s), so the bill splits it.
    doubled = PricingTableFactory(
        tenant=tenant,
        valid_from=T0 + timedelta(seconds=105),
        electricity_usd_per_kwh=first.electricity_usd_per_kwh * 2,
    )
    GpuPriceFactory(pricing_table=doubled, sku=sku, hourly_usd=Decimal("6.00"))
    experiment = ExperimentFactory(tenant=tenant, status="active")
    run = RunFactory(
        arm=ArmFactory(experiment=experiment, is_control=True),
        kind="external",
        status="running",
        gpu_sku=sku,
        gpu_count=1,
        created=T0 - timedelta(minutes=1),
    )
    samples = stretch(30, power=power)
    telemetry_ingest(run_id=run.pk, samples=[{**s, "ts": s["ts"].isoformat()} for s in samples])
    billed = Run.objects.get(pk=run.pk)
    probe = samples_bill(
        samples=samples[1:],
        after=samples[0],
        tenant_id=tenant.pk,
        gpu_sku=sku,
        cost_model=experiment.cost_model,
        gpu_count=1,
        vcpus=0,
    )
    assert billed.cost_usd > 0
    assert Decimal(str(round(probe.cost.total_usd, 6))) == billed.cost_usd
    assert probe.usage.tokens == billed.tokens == 29_000
    assert probe.energy_estimated is (not power) and billed.energy_estimated is (not power)
