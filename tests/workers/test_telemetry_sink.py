"""The worker's sink: batches off the training path, retries a failed flush with the same
seqs, stays bounded while the database is away, and says so."""

import logging
import threading
from datetime import UTC, datetime

import pytest
from django.db import OperationalError

from apps.billing.services import telemetry_ingest
from apps.experiments.models import Run
from apps.telemetry.models import TelemetrySample
from tests.factories import RunFactory
from workers.telemetry_sink import TelemetrySink

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 6, 1, tzinfo=UTC).timestamp()


def sample(i):
    return {
        "seq": i,
        "ts": T0 + i,
        "step": i,
        "tokens": 10 * i,
        "energy_j": float(i),
        "util_pct": 50.0,
    }


class DatabaseOutage:
    """Wraps the real ingest; the first `failures` calls meet a database that is down."""

    def __init__(self, failures):
        self.failures, self.calls, self.lock = failures, [], threading.Lock()

    def __call__(self, **kwargs):
        with self.lock:
            self.calls.append([s["seq"] for s in kwargs["samples"]])
            if len(self.calls) <= self.failures:
                raise OperationalError("connection refused")
        return telemetry_ingest(**kwargs)


def test_a_failed_flush_is_retried_with_the_same_seqs_and_everything_lands(caplog):
    run = RunFactory(
        status=Run.Status.RUNNING, attempts=1, created=datetime.fromtimestamp(T0 - 60, UTC)
    )
    outage = DatabaseOutage(failures=2)
    sink = TelemetrySink(run_id=run.pk, attempt=1, seq_base=100, ingest=outage, flush_s=0.05)
    with caplog.at_level(logging.WARNING):
        for i in range(50):
            sink.put(sample(i))
        sink.close(timeout_s=30)
    stored = list(
        TelemetrySample.objects.filter(run=run).order_by("seq").values_list("seq", flat=True)
    )
    assert stored == list(range(100, 150))  # offset by the base, none lost, none twice
    assert outage.calls[0] == outage.calls[1] == outage.calls[2][: len(outage.calls[0])]
    assert "telemetry flush failed" in caplog.text and "keeping" in caplog.text
    assert sink.pending == 0 and sink.dropped == 0


def test_the_buffer_is_bounded_and_drops_oldest_loudly(caplog):
    run = RunFactory(status=Run.Status.RUNNING, attempts=1)
    outage = DatabaseOutage(failures=10**9)
    sink = TelemetrySink(
        run_id=run.pk, attempt=1, seq_base=0, ingest=outage, max_buffered=20, flush_s=0.05
    )
    with caplog.at_level(logging.ERROR):
        for i in range(30):
            sink.put(sample(i))
        assert sink.pending == 20 and sink.dropped == 10
        assert "telemetry buffer full" in caplog.text
        sink.close(timeout_s=1)  # gives up while the database is still down, and says so
    assert "could not be stored before close" in caplog.text


def test_a_refused_batch_is_dropped_not_retried_forever(caplog):
    run = RunFactory(status=Run.Status.RUNNING, attempts=2)  # this sink's attempt 1 was swept
    sink = TelemetrySink(
        run_id=run.pk, attempt=1, seq_base=0, ingest=telemetry_ingest, flush_s=0.05
    )
    with caplog.at_level(logging.ERROR):
        for i in range(10):
            sink.put(sample(i))
        sink.close(timeout_s=10)
    assert "telemetry refused" in caplog.text and sink.dropped == 10 and sink.pending == 0
    assert not TelemetrySample.objects.filter(run=run).exists()


def test_the_sink_flushes_at_the_servers_send_cadence_where_one_is_set(settings):
    """COSTLAB_TELEMETRY_SEND_EVERY_S sets how often a worker's sink sends (a fleet raises it);
    unset, every second; a sink given its own keeps it."""
    run = RunFactory(
        status=Run.Status.RUNNING, attempts=1, created=datetime.fromtimestamp(T0 - 60, UTC)
    )
    sinks = [TelemetrySink(run_id=run.pk, attempt=1, seq_base=0, ingest=telemetry_ingest)]
    settings.COSTLAB_TELEMETRY_SEND_EVERY_S = 60.0
    sinks += [
        TelemetrySink(run_id=run.pk, attempt=1, seq_base=0, ingest=telemetry_ingest),
        TelemetrySink(run_id=run.pk, attempt=1, seq_base=0, ingest=telemetry_ingest, flush_s=0.5),
    ]
    try:
        assert [s.FLUSH_S for s in sinks] == [1.0, 60.0, 0.5]
    finally:
        for sink in sinks:
            sink.close(timeout_s=5)
