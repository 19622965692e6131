"""Telemetry is stored once per (run, seq), whatever order or how often it arrives,
and the run's totals move forward incrementally to what a full recompute would give."""

import random
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from apps.billing import cost_engine
from apps.billing.services import telemetry_ingest
from apps.core.exceptions import ApplicationError
from apps.experiments.models import Run
from apps.pricing.selectors import price_schedule
from apps.telemetry.models import TelemetrySample
from tests import pricing_reference
from tests.factories import ArmFactory, GpuPriceFactory, PricingTableFactory, RunFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC).timestamp()


def samples(n, *, start=0, util=80.0):
    return [
        {
            "seq": i,
            "ts": T0 + i,
            "step": i,
            "device": "cuda:0 Test GPU",
            "util_pct": util,
            "power_w": 300.0,
            "energy_j": 300.0 * i,
            "tokens": 1000 * i,
            "loss": 5.0 - i * 0.01,
            "estimated": False,
        }
        for i in range(start, start + n)
    ]


@pytest.fixture
def gpu_run():
    price = GpuPriceFactory(
        pricing_table=PricingTableFactory(valid_from=datetime(2026, 1, 1, tzinfo=UTC))
    )
    arm = ArmFactory(experiment__tenant=price.pricing_table.tenant)
    return RunFactory(
        arm=arm,
        gpu_sku=price.sku,
        gpu_count=1,
        status=Run.Status.RUNNING,
        attempts=1,
        created=datetime.fromtimestamp(T0 - 60, UTC),
    )


def full_recompute(run):
    rows = list(TelemetrySample.objects.filter(run=run).order_by("seq").values())
    prices_at = price_schedule(tenant_id=run.tenant_id, gpu_sku_id=run.gpu_sku_id).at
    weights = cost_engine.Weights.from_cost_model(run.experiment.cost_model)
    return pricing_reference.price_samples(rows, prices_at=prices_at, weights=weights, gpu_count=1)


def test_a_batch_sent_twice_is_stored_once(gpu_run):
    first = telemetry_ingest(run_id=gpu_run.pk, samples=samples(20))
    again = telemetry_ingest(run_id=gpu_run.pk, samples=samples(20))
    assert (first.inserted, again.inserted, again.duplicates) == (20, 0, 20)
    assert TelemetrySample.objects.filter(run=gpu_run).count() == 20
    gpu_run.refresh_from_db()
    assert gpu_run.tokens == 19_000 and gpu_run.last_seq == 19 and gpu_run.priced_seq == 19


def test_out_of_order_and_overlapping_batches_give_the_in_order_totals(gpu_run):
    batch = samples(60)
    chunks = [batch[i : i + 7] for i in range(0, 60, 7)]
    random.Random(4).shuffle(chunks)
    for chunk in chunks + chunks[:3]:  # every chunk, then some again
        telemetry_ingest(run_id=gpu_run.pk, samples=chunk)
    gpu_run.refresh_from_db()
    usage, cost = full_recompute(gpu_run)
    assert TelemetrySample.objects.filter(run=gpu_run).count() == 60
    assert gpu_run.priced_seq == 59
    assert gpu_run.tokens == usage.tokens == 59_000
    assert float(gpu_run.cost_usd) == pytest.approx(cost.total_usd, abs=1e-6)
    assert gpu_run.cost_usd > 0
    # 59 s on one GPU at 3.00 USD/h, plus 17.7 kJ x PUE 1.2 at 0.15 USD/kWh.
    assert cost.total_usd == pytest.approx(59 / 3600 * 3.00 + 17_700 / 3.6e6 * 1.2 * 0.15, rel=1e-9)


def test_a_gap_is_priced_across_at_once_and_re_priced_when_it_fills(gpu_run):
    batch = samples(10)
    telemetry_ingest(run_id=gpu_run.pk, samples=batch[:4] + batch[6:])
    gpu_run.refresh_from_db()
    usage, cost = full_recompute(gpu_run)
    # In the totals at once; the gap-free mark waits for the gap.
    assert (gpu_run.priced_seq, gpu_run.last_seq, gpu_run.tokens) == (3, 9, 9000)
    assert float(gpu_run.cost_usd) == pytest.approx(cost.total_usd, abs=1e-6)
    telemetry_ingest(run_id=gpu_run.pk, samples=batch[4:6])
    gpu_run.refresh_from_db()
    usage, cost = full_recompute(gpu_run)
    assert gpu_run.priced_seq == 9 and gpu_run.tokens == usage.tokens == 9000
    assert float(gpu_run.cost_usd) == pytest.approx(cost.total_usd, abs=1e-6)


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"seq": -1}, "samples[2].seq"),
        ({"ts": "yesterday"}, "samples[2].ts"),
        ({"util_pct": 140}, "samples[2].util_pct"),
        ({"energy_j": float("nan")}, "samples[2].energy_j"),
        ({"tokens": "many"}, "samples[2].tokens"),
    ],
)
def test_a_bad_sample_names_its_index_and_field_and_nothing_is_stored(gpu_run, bad, field):
    batch = samples(5)
    batch[2].update(bad)
    with pytest.raises(ApplicationError) as err:
        telemetry_ingest(run_id=gpu_run.pk, samples=batch)
    assert str(err.value).startswith(field)
    assert not TelemetrySample.objects.filter(run=gpu_run).exists()
    gpu_run.refresh_from_db()
    assert gpu_run.cost_usd == Decimal("0")


def test_a_second_attempt_restarts_counters_without_billing_the_first_twice(gpu_run):
    telemetry_ingest(run_id=gpu_run.pk, samples=samples(10), attempt=1)
    gpu_run.refresh_from_db()
    first_tokens, first_cost = gpu_run.tokens, gpu_run.cost_usd
    # Attempt 2 starts over: its seqs continue, its cumulative counters start from zero.
    Run.objects.filter(pk=gpu_run.pk).update(attempts=2)
    retry = [dict(s, seq=s["seq"] + 10, ts=s["ts"] + 100) for s in samples(10)]
    telemetry_ingest(run_id=gpu_run.pk, samples=retry, attempt=2)
    gpu_run.refresh_from_db()
    assert gpu_run.tokens == 2 * first_tokens
    # The 91 s between the attempts (no worker held the run) are not billed.
    assert gpu_run.cost_usd == pytest.approx(2 * first_cost, abs=Decimal("0.000002"))


def test_a_swept_attempt_cannot_write_into_the_run_that_replaced_it(gpu_run):
    telemetry_ingest(run_id=gpu_run.pk, samples=samples(5), attempt=1)
    Run.objects.filter(pk=gpu_run.pk).update(attempts=2)  # swept and claimed again
    with pytest.raises(ApplicationError, match="attempt 1 no longer holds") as err:
        telemetry_ingest(run_id=gpu_run.pk, samples=samples(5, start=5), attempt=1)
    assert err.value.code == "stale_attempt"
    Run.objects.filter(pk=gpu_run.pk).update(status=Run.Status.FAILED)
    with pytest.raises(ApplicationError, match="now failed"):
        telemetry_ingest(run_id=gpu_run.pk, samples=samples(5, start=5), attempt=2)
    assert TelemetrySample.objects.filter(run=gpu_run).count() == 5


def test_a_sample_landing_below_the_watermark_is_priced_in_its_own_interval(gpu_run):
    batch = samples(30)
    batch[10]["util_pct"] = (
        0.0  # idle for the second before seq 10: the late sample changes the idle share
    )
    telemetry_ingest(run_id=gpu_run.pk, samples=batch[:10] + batch[11:], attempt=1)
    gpu_run.refresh_from_db()
    idle_before = gpu_run.cost_breakdown["idle_usd"]
    telemetry_ingest(run_id=gpu_run.pk, samples=[batch[10]], attempt=1)  # seq 10, late
    gpu_run.refresh_from_db()
    usage, cost = full_recompute(gpu_run)
    assert gpu_run.tokens == usage.tokens and float(gpu_run.cost_usd) == pytest.approx(
        cost.total_usd, abs=1e-6
    )
    # One second of one GPU at 3.00 USD/h went idle (seq 10's interval), nothing else moved.
    assert gpu_run.cost_breakdown["idle_usd"] - idle_before == pytest.approx(
        3.0 / 3600 - 0.2 * 3.0 / 3600
    )


def test_a_gap_that_never_fills_stops_holding_the_gap_free_mark_back(gpu_run):
    from apps.billing.services import GAP_PATIENCE_SAMPLES

    batch = samples(GAP_PATIENCE_SAMPLES + 20)
    telemetry_ingest(run_id=gpu_run.pk, samples=batch[:10], attempt=1)
    telemetry_ingest(run_id=gpu_run.pk, samples=batch[11:30], attempt=1)  # seq 10 is lost
    gpu_run.refresh_from_db()
    assert gpu_run.priced_seq == 9 and gpu_run.last_seq == 29  # it may arrive late
    telemetry_ingest(run_id=gpu_run.pk, samples=batch[30:], attempt=1)
    gpu_run.refresh_from_db()
    assert gpu_run.priced_seq == batch[-1]["seq"]


def test_an_appended_batch_skips_the_staging_table(gpu_run):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "postgresql":
        pytest.skip("the COPY paths are Postgres-only")
    telemetry_ingest(run_id=gpu_run.pk, samples=samples(10))
    with CaptureQueriesContext(connection) as appended:
        telemetry_ingest(run_id=gpu_run.pk, samples=samples(10, start=10))
    with CaptureQueriesContext(connection) as resent:
        telemetry_ingest(run_id=gpu_run.pk, samples=samples(5, start=15))
    assert not any("telemetry_staging" in q["sql"] for q in appended.captured_queries)
    assert any("telemetry_staging" in q["sql"] for q in resent.captured_queries)
    assert TelemetrySample.objects.filter(run=gpu_run).count() == 20


def test_rows_stored_behind_the_watermark_fall_back_to_the_idempotent_path(gpu_run):
    # Samples written without moving the run's watermark: the fast path's guess is wrong,
    # its savepoint is rolled back, and the batch still lands once per seq.
    TelemetrySample.objects.bulk_create(
        [
            TelemetrySample(run=gpu_run, seq=s["seq"], ts=datetime.fromtimestamp(s["ts"], UTC))
            for s in samples(3, start=5)
        ]
    )
    result = telemetry_ingest(run_id=gpu_run.pk, samples=samples(10))
    assert (result.inserted, result.duplicates) == (7, 3)
    assert sorted(
        TelemetrySample.objects.filter(run=gpu_run).values_list("seq", flat=True)
    ) == list(range(10))
