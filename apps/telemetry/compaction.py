"""Compaction: a settled run's samples packed into one row per rank, attempt and minute.

A run is settled when it has finished, every stored sample is in its bill (priced_seq ==
last_seq) and the charts' blocks hold them all (the caller rolls those first:
apps.ops.telemetry_upkeep). Its rows are then packed losslessly (apps.telemetry.packing) into
PackedMinutes and deleted, in one transaction under the run's row lock; Run.packed_at says so.

Reads see packed and raw samples the same way: `stored_rows` gives a run's samples from both in
seq order (a bill recomputed from it equals the bill from the rows, to the cent), and
`rehydrated` puts a packed run's samples back into the samples table inside a savepoint that is
rolled back, so a read written for raw rows (the API's downsampled series) runs unchanged.
Charts, CSV exports and comparisons never read samples of a finished run: they read its totals
and blocks.
"""

from __future__ import annotations

import contextlib
import heapq
from collections.abc import Iterable, Iterator
from datetime import datetime

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from apps.core.db import copy_rows
from apps.experiments.models import Run
from apps.telemetry.gpm_means import gpm_means
from apps.telemetry.ingest import COLUMNS
from apps.telemetry.models import PackedMinute, TelemetrySample
from apps.telemetry.packing import FIELDS, pack, unpack

STORED = ("attempt", "rank", *FIELDS)


def settled_unpacked():
    """The finished runs whose samples are all billed and not packed yet, the oldest first."""
    return (
        Run.objects.exclude(status__in=Run.ACTIVE_STATUSES)
        .filter(packed_at=None, raw_dropped_before=None, last_seq__gte=0)
        .filter(priced_seq=F("last_seq"))
        .order_by("finished_at", "pk")
    )


def runs_compactable(*, limit: int = 50) -> list[int]:
    return list(settled_unpacked().values_list("pk", flat=True)[:limit])


def _minute(ts: datetime) -> datetime:
    return ts.replace(second=0, microsecond=0)


def _groups(rows: Iterable[dict]) -> Iterator[tuple[tuple, list[dict]]]:
    """Rows in (rank, attempt, seq) order, cut where the rank, attempt or minute changes."""
    key, group = None, []
    for row in rows:
        k = (row["rank"], row["attempt"], _minute(row["ts"]))
        if k != key and group:
            yield key, group
            group = []
        key = k
        group.append(row)
    if group:
        yield key, group


@transaction.atomic
def run_compact(*, run_id: int) -> int:
    """Pack one settled run's raw samples; how many were packed (0: not settled, or none)."""
    run = Run.objects.select_for_update(of=("self",)).get(pk=run_id)
    if (
        run.status in Run.ACTIVE_STATUSES
        or run.priced_seq != run.last_seq
        or run.raw_dropped_before is not None
    ):
        return 0
    rows = (
        TelemetrySample.objects.of_run(run)
        .order_by("rank", "attempt", "seq")
        .values(*STORED)
        .iterator(chunk_size=20_000)
    )
    packed, count = [], 0
    for (rank, attempt, minute), group in _groups(rows):
        packed.append(
            PackedMinute(
                run_id=run.pk,
                rank=rank,
                attempt=attempt,
                minute=minute,
                samples=len(group),
                seq_first=group[0]["seq"],
                seq_last=group[-1]["seq"],
                data=pack(group),
            )
        )
        count += len(group)
        if len(packed) >= 500:
            PackedMinute.objects.bulk_create(packed)
            packed = []
    PackedMinute.objects.bulk_create(packed)
    run.kernel_means = gpm_means(run=run)  # read before the rows go: the page's diagnosis
    TelemetrySample.objects.of_run(run).delete()
    run.packed_at = timezone.now()
    run.save(update_fields=["packed_at", "kernel_means", "updated_at"])
    return count


def runs_compact(*, limit: int = 50) -> int:
    """Pack up to `limit` settled runs, a transaction each; the samples packed."""
    return sum(run_compact(run_id=pk) for pk in runs_compactable(limit=limit))


def _packed_rows(run: Run, fields: tuple[str, ...]) -> Iterator[dict]:
    """A packed run's samples, in seq order (each rank's minutes in order, merged by seq)."""
    minutes = PackedMinute.objects.filter(run_id=run.pk).order_by("rank", "attempt", "minute")
    streams: dict[tuple, list] = {}
    for m in minutes.iterator(chunk_size=500):
        streams.setdefault((m.rank, m.attempt), []).append(m)

    def stream(items: list[PackedMinute]) -> Iterator[dict]:
        for m in items:
            for row in unpack(bytes(m.data)):
                yield {"rank": m.rank, "attempt": m.attempt, **{f: row[f] for f in fields}}

    yield from heapq.merge(*(stream(s) for s in streams.values()), key=lambda r: r["seq"])


def stored_rows(run: Run, fields: tuple[str, ...]) -> Iterator[dict]:
    """The run's samples with these fields (and attempt, rank, seq), raw and packed alike, in seq
    order."""
    fields = tuple(dict.fromkeys(("seq", *fields)))
    wanted = tuple(f for f in fields if f not in ("attempt", "rank"))
    raw = (
        TelemetrySample.objects.of_run(run)
        .order_by("seq")
        .values("attempt", "rank", *wanted)
        .iterator(chunk_size=10_000)
    )
    if run.packed_at is None:
        yield from raw
        return
    yield from heapq.merge(_packed_rows(run, wanted), raw, key=lambda r: r["seq"])


@contextlib.contextmanager
def rehydrated(runs: list[Run]):
    """Inside: the packed samples of these runs are back in the samples table (a savepoint, rolled
    back on the way out), so a read written for raw rows sees them. No-op for unpacked runs."""
    packed = [r for r in runs if r.packed_at is not None]
    if not packed:
        yield
        return
    from django.db import connection

    table = TelemetrySample._meta.db_table
    columns = ("run_id", "attempt", *COLUMNS)
    with transaction.atomic():
        sid = transaction.savepoint()
        try:
            with connection.cursor() as cursor:
                for run in packed:
                    # Decoded first: the COPY holds the connection, which the decoding reads on.
                    rows = [
                        (run.pk, *(row[c] for c in columns[1:]))
                        for row in _packed_rows(run, FIELDS)
                    ]
                    copy_rows(cursor, f"{table} ({', '.join(columns)})", rows)
            yield
        finally:
            transaction.savepoint_rollback(sid)
