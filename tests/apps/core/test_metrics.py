"""/metrics: Prometheus text (parsed with prometheus_client's own parser),
for staff or the ops token."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from apps.core.models import PeriodicTaskRun
from apps.experiments.models import Run
from config.celery_app import app as celery_app
from tests.factories import RunFactory, TelemetrySampleFactory, UserFactory

pytestmark = pytest.mark.django_db


def scrape(client, **headers) -> dict[str, list]:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return {
        family.name: family.samples
        for family in text_string_to_metric_families(response.content.decode())
    }


def value(samples, **labels) -> float:
    matches = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) == 1, (labels, samples)
    return matches[0]


def test_anonymous_and_non_staff_callers_are_refused(client):
    assert client.get("/metrics").status_code == 401
    client.force_login(UserFactory(is_staff=False))
    assert client.get("/metrics").status_code == 401


def test_runs_queue_age_attempts_ingest_and_the_tick(client, settings):
    settings.COSTLAB_OPS_TOKEN = "ops-token-for-metrics"
    now = timezone.now()
    old = RunFactory(status=Run.Status.QUEUED, queue="cpu")
    Run.objects.filter(pk=old.pk).update(queued_at=now - timedelta(seconds=120))
    RunFactory(status=Run.Status.QUEUED, queue="cpu")
    RunFactory(status=Run.Status.QUEUED, queue="gpu")
    running = RunFactory(status=Run.Status.RUNNING, queue="cpu", attempts=2)
    RunFactory(status=Run.Status.SUCCEEDED, queue="cpu", attempts=1)
    for seq in range(30):
        TelemetrySampleFactory(run=running, seq=seq, ts=now - timedelta(seconds=seq))
    PeriodicTaskRun.objects.create(
        name="attribution_tick",
        last_started_at=now - timedelta(seconds=7),
        last_duration_s=0.25,
        runs=40,
    )

    m = scrape(client, HTTP_AUTHORIZATION="Bearer ops-token-for-metrics")
    assert value(m["costlab_database_up"]) == 1 and value(m["costlab_broker_up"]) == 1
    assert value(m["costlab_runs"], state="queued", queue="cpu") == 2
    assert value(m["costlab_runs"], state="queued", queue="gpu") == 1
    assert value(m["costlab_runs"], state="running", queue="cpu") == 1
    assert value(m["costlab_run_attempts"], state="running", queue="cpu") == 2
    assert 119 <= value(m["costlab_queued_run_oldest_age_seconds"], queue="cpu") < 130
    assert value(m["costlab_ingest_samples_per_second"]) == pytest.approx(30 / 60)
    assert value(m["costlab_attribution_tick_duration_seconds"]) == 0.25
    assert 7 <= value(m["costlab_attribution_tick_lag_seconds"]) < 20
    assert value(m["costlab_attribution_ticks"]) == 40


def test_staff_see_the_broker_down(client):
    client.force_login(UserFactory(is_staff=True))
    original = celery_app.conf.broker_url
    celery_app.conf.broker_url = "redis://127.0.0.1:1/0"
    try:
        m = scrape(client)
    finally:
        celery_app.conf.broker_url = original
    assert value(m["costlab_broker_up"]) == 0 and value(m["costlab_database_up"]) == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="partitions are Postgres's")
def test_the_samples_partitions_their_bytes_and_stray_rows(client, settings):
    from apps.ops.telemetry_upkeep import telemetry_upkeep
    from apps.telemetry.partitions import partitions

    settings.COSTLAB_OPS_TOKEN = "ops-token-for-metrics"
    now = timezone.now()
    telemetry_upkeep(now=now)
    run = RunFactory(status=Run.Status.RUNNING)
    for seq in range(20):
        TelemetrySampleFactory(run=run, seq=seq, ts=now - timedelta(seconds=seq))
    TelemetrySampleFactory(run=run, seq=99, ts=now - timedelta(days=400))  # no partition yet
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE telemetry_telemetrysample")
    m = scrape(client, HTTP_AUTHORIZATION="Bearer ops-token-for-metrics")
    dated = [p for p in partitions() if not p.is_default]
    assert value(m["costlab_telemetry_partitions"], kind="time") == len(dated) >= 5
    assert value(m["costlab_telemetry_default_partition_rows"]) == 1
    assert value(m["costlab_telemetry_bytes"]) > 0
    assert value(m["costlab_telemetry_bytes_per_sample"]) > 20  # a few rows in many pages: large
    assert value(m["costlab_telemetry_oldest_partition_start_seconds"]) == dated[0].lo.timestamp()
    assert value(m["costlab_telemetry_compaction_lag_seconds"]) == 0  # no run has finished
    assert value(m["costlab_telemetry_bytes_per_packed_sample"]) == 0
