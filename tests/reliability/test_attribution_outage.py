"""A beat outage loses nothing and counts nothing twice, with telemetry landing through the real
ingest path: batches out of order, a gap filled late, a long pause between ticks."""

import itertools
from datetime import timedelta

import pytest

from apps.attribution.models import AttributionWindow, RunWindow
from apps.attribution.services import attribution_tick
from apps.billing import cost_engine
from apps.billing.services import telemetry_ingest
from apps.experiments.models import Run
from apps.pricing.selectors import price_schedule
from apps.telemetry.models import TelemetrySample
from tests import pricing_reference
from tests.apps.attribution.lab import T0, priced_tenant
from tests.factories import ArmFactory, ExperimentFactory, RunFactory

pytestmark = pytest.mark.django_db


def samples(seqs, speed, **override):
    return [
        {
            "seq": i,
            "ts": T0.timestamp() + i,
            "step": i,
            "device": "cuda:0 Test GPU",
            "util_pct": 90.0,
            "power_w": 300.0,
            "energy_j": 300.0 * i,
            "tokens": int(speed * i),
            "estimated": False,
            **override,
        }
        for i in seqs
    ]


def test_a_beat_outage_loses_nothing_and_counts_nothing_twice():
    price = priced_tenant()
    exp = ExperimentFactory(tenant=price.pricing_table.tenant, status="active")
    arms = [
        ArmFactory(experiment=exp, name="control", is_control=True),
        ArmFactory(experiment=exp, name="b"),
    ]
    runs = [
        RunFactory(
            arm=arm,
            status=Run.Status.RUNNING,
            attempts=1,
            gpu_sku=price.sku,
            gpu_count=1,
            started_at=T0,
            created=T0 - timedelta(minutes=1),
        )
        for arm in arms
        for _ in range(2)
    ]
    speed = {r.pk: 1000 + 100 * i for i, r in enumerate(runs)}

    def land(seqs, **override):
        for run in runs:
            telemetry_ingest(run_id=run.pk, samples=samples(seqs, speed[run.pk], **override))

    land(range(0, 10))
    assert attribution_tick(now=T0 + timedelta(seconds=30)).observations == 4
    # Beat is down for ten minutes; batches keep landing, one of them late.
    for chunk in ([40, 41, 42, 43, 44], range(10, 30), range(45, 60)):
        land(chunk)
    result = attribution_tick(now=T0 + timedelta(minutes=10, seconds=30))
    assert result.windows == 1  # one window covers the outage
    # Priced at once, gap and all; the gap-free mark (upto_seq) waits for the gap.
    assert set(RunWindow.objects.filter(window__number=2).values_list("upto_seq", flat=True)) == {
        29
    }
    # The gap fills with samples drawing 600 W and no counter: re-priced below the watermark.
    land(range(30, 40), power_w=600.0, energy_j=None)
    attribution_tick(now=T0 + timedelta(minutes=11))
    window_3 = RunWindow.objects.filter(window__number=3)
    assert set(window_3.values_list("upto_seq", flat=True)) == {59} and all(
        o.cost_usd != 0 for o in window_3
    )

    weights = cost_engine.Weights.from_cost_model(exp.cost_model)
    for run in Run.objects.filter(pk__in=[r.pk for r in runs]):
        rows = list(TelemetrySample.objects.filter(run=run).order_by("seq").values())
        usage, cost = pricing_reference.price_samples(
            rows,
            prices_at=price_schedule(tenant_id=run.tenant_id, gpu_sku_id=run.gpu_sku_id).at,
            weights=weights,
            gpu_count=1,
        )
        observed = list(RunWindow.objects.filter(run=run).order_by("window__number"))
        assert [o.window.number for o in observed] == [1, 2, 3]
        assert sum(o.samples for o in observed) == 60
        assert sum(o.tokens for o in observed) == run.tokens == usage.tokens == 59 * speed[run.pk]
        assert sum(o.cost_usd for o in observed) == run.cost_usd
        assert float(run.cost_usd) == pytest.approx(cost.total_usd, abs=1e-6)
        assert float(sum(o.energy_j for o in observed)) == pytest.approx(usage.energy_j)
    windows = list(AttributionWindow.objects.filter(experiment=exp).order_by("number"))
    for before, after in itertools.pairwise(windows):
        assert after.window_start == before.window_end  # contiguous, no overlap
