"""Samples in time partitions (Postgres): every read of a run prunes to the partitions of its days
(checked with EXPLAIN), a seq is stored once under any timestamp, maintenance makes partitions
ahead and moves stray rows into their own, and retention drops old partitions while a finished
run's bill, chart and CSV rows stay as they were and an open run's partition is kept.

Here rather than in tests/apps/telemetry: the reads checked include the dashboard's."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from apps.billing.services import run_totals_recompute, telemetry_ingest
from apps.core.exceptions import ApplicationError
from apps.dashboard import series as series_module
from apps.dashboard.runs import comparison_csv_rows, runs_csv_rows
from apps.dashboard.selectors import run_page
from apps.dashboard.series import run_series
from apps.dashboard.services import series_blocks_roll_due
from apps.experiments.models import Run
from apps.ops.telemetry_upkeep import telemetry_upkeep
from apps.telemetry.models import TelemetrySample
from apps.telemetry.partitions import (
    DEFAULT,
    PARENT,
    partition_name,
    partitions,
    partitions_maintain,
)
from apps.telemetry.selectors import samples_downsampled, telemetry_by_rank
from tests.apps.dashboard.world import run_of, samples

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="partitions are Postgres's; SQLite keeps one table",
    ),
]
NOW = datetime.now(UTC).replace(microsecond=0)
DAY = timedelta(days=1)
FIELDS = ("util_pct", "power_w")


def day_of(ts: datetime) -> datetime:
    return ts.replace(hour=0, minute=0, second=0, microsecond=0)


def open_at(run: Run, start: datetime) -> Run:
    """The run as created and started at `start` (its samples may be stamped from then on)."""
    Run.objects.filter(pk=run.pk).update(
        created_at=start, started_at=start, status=Run.Status.RUNNING
    )
    run.refresh_from_db()
    return run


def ingest(run: Run, *, start: datetime, n: int, first_seq: int = 0, **kwargs) -> None:
    for i in range(0, n, 2000):
        telemetry_ingest(
            run_id=run.pk,
            samples=samples(
                start=start + timedelta(seconds=i),
                first_seq=first_seq + i,
                n=min(2000, n - i),
                **kwargs,
            ),
            attempt=run.attempts,
        )


def finish(run: Run) -> Run:
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, finished_at=run.samples_to)
    run.refresh_from_db()
    return run


def partitions_read(sql: str) -> set[str]:
    """The sample partitions a statement's plan touches (EXPLAIN, not run)."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    return set(re.findall(rf"\b({PARENT}_(?:p\d{{8}}|default))\b", plan))


def test_every_read_of_a_run_prunes_to_its_days_partitions(w):
    telemetry_upkeep(now=NOW)  # partitions from yesterday on
    start = day_of(NOW - 3 * DAY) + timedelta(hours=23, minutes=50)  # spans two days
    run = open_at(run_of(w.control, world_size=1), start)
    other = open_at(run_of(w.candidate), day_of(NOW - DAY) + timedelta(hours=1))
    ingest(other, start=other.created_at, n=300)
    ingest(run, start=start, n=100)  # 20 minutes, into the next day, with a hole at 100..149
    ingest(run, start=start + timedelta(seconds=150), n=1050, first_seq=150)
    telemetry_upkeep(now=NOW)  # their days' partitions, filled from the default one
    series_blocks_roll_due()  # the other run's blocks: not due again below
    mine = {partition_name(day_of(start)), partition_name(day_of(start + DAY))}
    assert mine <= {p.name for p in partitions()}

    with CaptureQueriesContext(connection) as queries:
        # A late batch filling the hole (the staging path with its stored-seq lookup, and the
        # re-billed ranges around it), an appended one, then the reads.
        ingest(run, start=start + timedelta(seconds=100), n=50, first_seq=100)
        ingest(run, start=start + timedelta(seconds=1200), n=10, first_seq=1200)
        run.refresh_from_db()
        run_series(runs=[run], fields=FIELDS, budget=100)
        samples_downsampled(runs=[run], fields=["power_w"], budget=50)
        samples_downsampled(run_ids=[run.pk], fields=["power_w"], budget=50)
        telemetry_by_rank(run=run)
        run_totals_recompute(run=run)
        finish(run)
        series_blocks_roll_due()
    statements = [  # the reads and writes of samples (COPY and the staging table's DDL aside)
        q["sql"]
        for q in queries
        if PARENT in q["sql"]
        and q["sql"].lstrip().split(None, 1)[0].upper() in ("SELECT", "WITH", "INSERT", "DELETE")
    ]
    assert len(statements) >= 8
    for sql in statements:
        touched = partitions_read(sql)
        assert touched, f"no partition in the plan of: {sql[:300]}"
        assert touched <= mine, f"read {sorted(touched - mine)} beyond the run's days: {sql[:300]}"


def test_a_seq_sent_again_under_another_timestamp_is_stored_once(w):
    run = open_at(run_of(w.control), NOW - timedelta(minutes=30))
    ingest(run, start=run.created_at, n=20)
    again = samples(start=run.created_at + timedelta(minutes=5), first_seq=5, n=3)
    result = telemetry_ingest(run_id=run.pk, samples=again, attempt=run.attempts)
    assert (result.inserted, result.duplicates) == (0, 3)
    assert TelemetrySample.objects.filter(run=run).count() == 20


def test_maintenance_makes_partitions_ahead_and_moves_stray_rows_into_their_own(w):
    old = day_of(NOW - 40 * DAY) + timedelta(hours=6)
    run = open_at(run_of(w.control), old)  # a historical upload, 40 days back
    ingest(run, start=old, n=100)
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT count(*) FROM "{DEFAULT}"')
        assert cursor.fetchone()[0] == 100, "no partition for that day yet: the default holds it"
    done = telemetry_upkeep(now=NOW)
    assert partition_name(day_of(old)) in done.created and done.moved_rows == 100
    for ahead in range(4):
        assert partition_name(day_of(NOW + ahead * DAY)) in {p.name for p in partitions()}
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT count(*) FROM "{DEFAULT}"')
        assert cursor.fetchone()[0] == 0
        cursor.execute(f'SELECT count(*) FROM "{partition_name(day_of(old))}"')
        assert cursor.fetchone()[0] == 100
    assert telemetry_upkeep(now=NOW).created == [], "idempotent"


def test_retention_keeps_a_finished_runs_bill_chart_and_csv_and_an_open_runs_partition(
    w, monkeypatch, settings
):
    monkeypatch.setattr(series_module, "RAW_MAX", 500)  # a chart of blocks, without 8k samples
    old = day_of(NOW - 120 * DAY) + timedelta(hours=2)
    gone = open_at(run_of(w.control), old)
    ingest(gone, start=old, n=1000, util=70.0)
    gone = finish(gone)
    still = open_at(run_of(w.candidate), day_of(NOW - 100 * DAY) + timedelta(hours=3))
    ingest(still, start=still.created_at, n=100)
    telemetry_upkeep(now=NOW - 200 * DAY)  # their days' partitions (nothing is that old yet)
    series_blocks_roll_due()  # beat: the finished run's blocks, its last one included

    def seen(run: Run):
        run.refresh_from_db()
        chart = run_series(runs=[run], fields=FIELDS, budget=100).series[run.pk]
        csv = [r for r in runs_csv_rows(Run.objects.filter(pk=run.pk))]
        bands = {f: (b.x, b.y, b.lo, b.hi) for f, b in chart.items()}
        return run.cost_usd, run.device_seconds, run.energy_j, bands, csv

    before = seen(gone)
    comparison = list(comparison_csv_rows(experiment=w.experiment))
    settings.COSTLAB_TELEMETRY_RETENTION_DAYS = 90
    assert before[0] > 0 and before[3]["util_pct"][0], "billed and charted"

    done = telemetry_upkeep(now=NOW)
    assert partition_name(day_of(old)) in done.dropped
    kept = partition_name(day_of(still.created_at))
    assert done.kept == {kept: [still.pk]}, "the open run's partition stays, and is said"
    assert kept in {p.name for p in partitions()}
    assert not TelemetrySample.objects.filter(run=gone).exists()
    assert TelemetrySample.objects.filter(run=still).count() == 100

    assert seen(gone) == before, "bill, totals, chart and CSV row unchanged"
    assert list(comparison_csv_rows(experiment=w.experiment)) == comparison
    gone.refresh_from_db()
    assert gone.raw_dropped_before == day_of(old) + DAY
    with pytest.raises(ApplicationError, match="dropped by telemetry retention"):
        run_totals_recompute(run=gone)
    notice = [n for n in run_page(run=gone)["notices"] if n.title == "Raw samples dropped"]
    assert notice and "before" in notice[0].text


def test_the_run_page_says_when_raw_samples_are_gone(w, member):
    run = run_of(w.control)
    Run.objects.filter(pk=run.pk).update(raw_dropped_before=NOW - 90 * DAY)
    page = member.get(reverse("dashboard:run", args=[run.pk]))
    assert page.status_code == 200 and b"Raw samples dropped" in page.content


def nvml_batches(run: Run, *, start: datetime, n: int) -> None:
    """n samples as a GPU reports them (the codec test's minute), through ingest."""
    from tests.apps.telemetry.test_packing import nvml_like

    rows = nvml_like(n)
    first = rows[0]["ts"]
    for row in rows:
        row["ts"] = (start + (row["ts"] - first)).isoformat()
    for i in range(0, n, 2000):
        telemetry_ingest(run_id=run.pk, samples=rows[i : i + 2000], attempt=run.attempts)


def test_compaction_packs_a_settled_run_and_every_read_sees_the_same_samples(w, client):
    from apps.telemetry.models import PackedMinute

    start = NOW - timedelta(hours=3)
    run = open_at(run_of(w.control), start)
    nvml_batches(run, start=start, n=1800)
    run = finish(run)
    running = open_at(run_of(w.candidate), start)
    nvml_batches(running, start=start, n=120)
    partitions_maintain(now=NOW)  # these days' partitions (the default one holds nothing then)
    run_totals_recompute(run=run)  # the bill from the raw rows
    run.refresh_from_db()
    bill = (run.cost_usd, run.device_seconds, run.energy_j, run.tokens, run.cost_breakdown)
    series = samples_downsampled(runs=[run], fields=["power_w", "loss", "util_pct"], budget=60)
    full = samples_downsampled(runs=[run], fields=["energy_j"], budget=5000)
    ranks = telemetry_by_rank(run=run)

    done = telemetry_upkeep(now=NOW)
    assert done.runs_packed == 1 and done.samples_packed == 1800, "only the finished run"
    run.refresh_from_db()
    assert run.packed_at is not None
    assert not TelemetrySample.objects.filter(run=run).exists()
    assert TelemetrySample.objects.filter(run=running).count() == 120
    minutes = PackedMinute.objects.filter(run=run)
    assert minutes.count() in (30, 31) and sum(m.samples for m in minutes) == 1800

    # Reads of the packed run see what the rows showed.
    again = samples_downsampled(runs=[run], fields=["power_w", "loss", "util_pct"], budget=60)
    assert again.series == series.series and again.samples == series.samples
    assert samples_downsampled(runs=[run], fields=["energy_j"], budget=5000).series == full.series
    assert telemetry_by_rank(run=run) == ranks
    assert not TelemetrySample.objects.filter(run=run).exists(), "the read put nothing back"
    run_totals_recompute(run=run)  # the bill from packed samples, to the cent
    run.refresh_from_db()
    assert (run.cost_usd, run.device_seconds, run.energy_j, run.tokens) == bill[:4]
    assert run.cost_breakdown == bill[4]

    assert telemetry_upkeep(now=NOW).runs_packed == 0, "packed once"


def test_a_ddp_runs_ranks_pack_into_one_row_a_minute_and_read_back_in_seq_order(w):
    """Four ranks, the last one's batches arriving after the others' later minutes (so its
    earlier samples hold higher seqs): every minute is one packed row holding every rank, and
    the samples come back in seq order, by rank and billed as the rows were."""
    from apps.telemetry.compaction import stored_rows
    from apps.telemetry.models import PackedMinute
    from tests.apps.telemetry.test_packing import nvml_like

    start = NOW - timedelta(hours=3)
    run = open_at(run_of(w.control), start)
    ranks = [nvml_like(180, seed=r, rank=r) for r in range(4)]
    t0 = min(rs[0]["ts"] for rs in ranks)
    arrivals = [(r, k) for k in range(3) for r in range(3)] + [(3, 0), (3, 1), (3, 2)]
    seq = 0
    for r, k in arrivals:
        batch = ranks[r][k * 60 : (k + 1) * 60]
        for row in batch:
            row["seq"], seq = seq, seq + 1
            row["ts"] = start + (row["ts"] - t0)
        batch = [{**row, "ts": row["ts"].isoformat()} for row in batch]
        telemetry_ingest(run_id=run.pk, samples=batch, attempt=run.attempts)
    run = finish(run)
    partitions_maintain(now=NOW)
    run_totals_recompute(run=run)
    run.refresh_from_db()
    bill = (run.cost_usd, run.device_seconds, run.energy_j, run.tokens, run.cost_breakdown)
    fields = ("ts", "step", "power_w", "energy_j", "loss", "device")
    raw = list(stored_rows(run, fields))
    assert [r["seq"] for r in raw] == list(range(720))
    by_rank = telemetry_by_rank(run=run)

    assert telemetry_upkeep(now=NOW).samples_packed == 720
    run.refresh_from_db()
    minutes = PackedMinute.objects.filter(run=run)
    taken = {row["ts"].replace(second=0, microsecond=0) for rs in ranks for row in rs}
    assert sorted(m.minute for m in minutes) == sorted(taken), "one row a minute, every rank in it"
    assert sum(m.samples for m in minutes) == 720
    assert list(stored_rows(run, fields)) == raw
    assert telemetry_by_rank(run=run) == by_rank
    run_totals_recompute(run=run)
    run.refresh_from_db()
    assert (run.cost_usd, run.device_seconds, run.energy_j, run.tokens, run.cost_breakdown) == bill


def test_minutes_packed_a_rank_a_blob_still_read_as_that_rank(w):
    """Packed minutes of version 1 (one rank's each, no rank column) read as their row's rank."""
    from apps.telemetry.compaction import stored_rows
    from apps.telemetry.models import PackedMinute
    from tests.apps.telemetry.test_packing import V1_BLOB, nvml_like

    run = finish(open_at(run_of(w.control), NOW - timedelta(hours=3)))
    minute = NOW.replace(second=0) - timedelta(hours=2)
    PackedMinute.objects.create(
        run=run, rank=2, minute=minute, samples=4, seq_first=0, seq_last=3, data=V1_BLOB
    )
    Run.objects.filter(pk=run.pk).update(packed_at=NOW)
    run.refresh_from_db()
    rows = list(stored_rows(run, ("step", "power_w")))
    expected = [(2, 1, e["seq"], e["step"], e["power_w"]) for e in nvml_like(4, seed=7)]
    assert [(r["rank"], r["attempt"], r["seq"], r["step"], r["power_w"]) for r in rows] == expected


def test_a_sample_older_than_retention_is_refused_alone_and_said(w, settings):
    """It would land in a partition retention drops next: refused at the door, naming why."""
    settings.COSTLAB_TELEMETRY_RETENTION_DAYS = 90
    run = open_at(run_of(w.control), NOW - 100 * DAY)  # a historical upload
    batch = samples(start=NOW - 95 * DAY, first_seq=0, n=2) + samples(
        start=NOW - 80 * DAY, first_seq=2, n=2
    )
    result = telemetry_ingest(run_id=run.pk, samples=batch, attempt=run.attempts)
    assert result.inserted == 2 and [r["seq"] for r in result.refused] == [0, 1]
    assert "older than the telemetry retention of 90 days" in result.refused[0]["reason"]
    settings.COSTLAB_TELEMETRY_RETENTION_DAYS = 0  # kept for good: nothing is too old
    again = telemetry_ingest(run_id=run.pk, samples=batch[:2], attempt=run.attempts)
    assert again.inserted == 2 and not again.refused
