"""/metrics for operators, in the Prometheus text format, read from the system of record.

Every process of the platform writes its state to Postgres (runs, samples, the tick's own
record), so one scrape of any web process sees the whole platform: no per-process counters
to aggregate. A database that is down yields `costlab_database_up 0` and nothing else from it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Count, Min, Sum
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from apps.core.models import PeriodicTaskRun
from apps.core.selectors import broker_reachable, database_reachable
from apps.devices.models import Device
from apps.experiments.models import Run
from apps.telemetry.compaction import settled_unpacked
from apps.telemetry.models import TelemetrySample
from apps.telemetry.partitions import (
    default_rows,
    packed_estimate,
    partitions,
    samples_estimated,
)

INGEST_WINDOW_S = 60


class PlatformCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        db_ok, _ = database_reachable()
        broker_ok, _ = broker_reachable(timeout_s=1.0)
        yield GaugeMetricFamily(
            "costlab_database_up", "1 when the database answers.", value=int(db_ok)
        )
        yield GaugeMetricFamily(
            "costlab_broker_up", "1 when the Celery broker answers.", value=int(broker_ok)
        )
        if db_ok:
            try:
                yield from self._from_database()
            except (
                DatabaseError
            ):  # went down between the check and the queries: up says 1, the rest is missing
                return

    def _from_database(self) -> Iterator[Metric]:
        now = timezone.now()
        runs = GaugeMetricFamily(
            "costlab_runs", "Runs by state and queue.", labels=["state", "queue"]
        )
        # A gauge, not a counter: a run's attempts move with it from state to state.
        attempts = GaugeMetricFamily(
            "costlab_run_attempts",
            "Attempts made by the runs in each state and queue.",
            labels=["state", "queue"],
        )
        for row in Run.objects.values("status", "queue").annotate(
            n=Count("id"), attempts=Sum("attempts")
        ):
            runs.add_metric([row["status"], row["queue"]], row["n"])
            attempts.add_metric([row["status"], row["queue"]], row["attempts"] or 0)
        yield runs
        yield attempts

        age = GaugeMetricFamily(
            "costlab_queued_run_oldest_age_seconds",
            "Seconds the oldest queued run of each queue has waited.",
            labels=["queue"],
        )
        for row in (
            Run.objects.filter(status=Run.Status.QUEUED)
            .values("queue")
            .annotate(oldest=Min("queued_at"))
        ):
            age.add_metric([row["queue"]], (now - row["oldest"]).total_seconds())
        yield age

        running = list(Run.objects.filter(status=Run.Status.RUNNING).values_list("pk", flat=True))
        recent = TelemetrySample.objects.filter(
            run_id__in=running, ts__gte=now - timedelta(seconds=INGEST_WINDOW_S)
        )
        yield GaugeMetricFamily(
            "costlab_ingest_samples_per_second",
            "Telemetry samples of running runs stamped in the last "
            f"{INGEST_WINDOW_S} s, per second.",
            value=(recent.count() / INGEST_WINDOW_S) if running else 0.0,
        )

        yield from _device_metrics()
        yield from _telemetry_storage_metrics(now)

        tick = PeriodicTaskRun.objects.filter(name="attribution_tick").first()
        if tick is not None:
            yield GaugeMetricFamily(
                "costlab_attribution_tick_duration_seconds",
                "How long the latest attribution tick took.",
                value=tick.last_duration_s,
            )
            yield GaugeMetricFamily(
                "costlab_attribution_tick_lag_seconds",
                "Seconds since the latest attribution tick started (beat sends one every "
                "COSTLAB_ATTRIBUTION_TICK_S).",
                value=(now - tick.last_started_at).total_seconds(),
            )
            yield CounterMetricFamily(
                "costlab_attribution_ticks", "Attribution ticks run.", value=tick.runs
            )


def _telemetry_storage_metrics(now) -> Iterator[Metric]:
    """The samples' time partitions (Postgres): how many, their bytes on disk and per sample, the
    oldest kept, the stray rows waiting in the default partition, and those past retention (kept
    for an open run, or waiting for beat). Catalog reads and one count of a small table."""
    parts = partitions()
    if not parts:
        return
    dated = [p for p in parts if not p.is_default]
    count = GaugeMetricFamily(
        "costlab_telemetry_partitions", "Time partitions of the samples table.", labels=["kind"]
    )
    count.add_metric(["time"], len(dated))
    cutoff = now - timedelta(days=settings.COSTLAB_TELEMETRY_RETENTION_DAYS)
    past = [p for p in dated if settings.COSTLAB_TELEMETRY_RETENTION_DAYS and p.hi <= cutoff]
    count.add_metric(["past_retention"], len(past))
    yield count
    total = sum(p.bytes for p in parts)
    rows = samples_estimated()
    yield GaugeMetricFamily(
        "costlab_telemetry_bytes", "Bytes on disk of the samples, indexes included.", value=total
    )
    yield GaugeMetricFamily(
        "costlab_telemetry_bytes_per_sample",
        "Bytes on disk per stored sample, indexes included (rows estimated by the planner's "
        "statistics, so approximate).",
        value=total / rows if rows else 0.0,
    )
    if dated:
        yield GaugeMetricFamily(
            "costlab_telemetry_oldest_partition_start_seconds",
            "Start (Unix time) of the oldest time partition kept: raw samples before it are gone.",
            value=dated[0].lo.timestamp(),
        )
    packed_bytes, packed = packed_estimate()
    yield GaugeMetricFamily(
        "costlab_telemetry_bytes_per_packed_sample",
        "Bytes on disk per sample packed by compaction, indexes included (approximate).",
        value=packed_bytes / packed if packed else 0.0,
    )
    oldest = settled_unpacked().values_list("finished_at", flat=True).first()
    yield GaugeMetricFamily(
        "costlab_telemetry_compaction_lag_seconds",
        "How long the oldest settled run has waited for compaction (0: none waits).",
        value=(now - oldest).total_seconds() if oldest else 0.0,
    )
    yield GaugeMetricFamily(
        "costlab_telemetry_default_partition_rows",
        "Samples in the default partition, waiting for beat to move them into their own day's.",
        value=default_rows(),
    )


def _device_metrics() -> Iterator[Metric]:
    """Each device's latest profile: GEMM GFLOP/s and native (1) or emulated (0) per dtype."""
    gflops = GaugeMetricFamily(
        "costlab_device_gemm_gflops",
        "Measured GEMM throughput of each device per dtype (GOP/s for int8).",
        labels=["host", "device", "device_class", "dtype"],
    )
    native = GaugeMetricFamily(
        "costlab_device_dtype_native",
        "1 when the device runs the dtype natively, 0 when it is emulated (measured).",
        labels=["host", "device", "device_class", "dtype"],
    )
    failed = GaugeMetricFamily(
        "costlab_device_profile_failed",
        "1 when the device's last measurement failed (its reason is on the Devices page).",
        labels=["host", "device"],
    )
    for device in Device.objects.select_related("latest"):
        failed.add_metric([device.host, device.label], int(bool(device.error)))
        if device.latest is None:
            continue
        for dtype, row in (device.latest.profile.get("dtypes") or {}).items():
            labels = [device.host, device.label, device.device_class, dtype]
            if row.get("gflops") is not None:
                gflops.add_metric(labels, row["gflops"])
            native.add_metric(labels, int(bool(row.get("native"))))
    yield gflops
    yield native
    yield failed


def metrics_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PlatformCollector())
    return registry
