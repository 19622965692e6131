"""Compaction: a settled run's samples packed into one row per attempt and minute, every rank's.

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

STORED = ("attempt", *FIELDS)


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
    """Rows in time order, cut by minute, then by attempt; each group's rows in (rank, seq) order:
    a rank's readings side by side compress best."""
    minute, rows_of = None, {}
    for row in rows:
        m = _minute(row["ts"])
        if m != minute:
            yield from _by_attempt(minute, rows_of)
            minute, rows_of = m, {}
        rows_of.setdefault(row["attempt"], []).append(row)
    yield from _by_attempt(minute, rows_of)


def _by_attempt(minute, rows_of: dict[int, list[dict]]) -> Iterator[tuple[tuple, list[dict]]]:
    for attempt, group in sorted(rows_of.items()):
        yield (attempt, minute), sorted(group, key=lambda r: (r["rank"], r["seq"]))


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
        .order_by("ts", "seq")
        .values(*STORED)
        .iterator(chunk_size=20_000)
    )
    packed, count = [], 0
    for (attempt, minute), group in _groups(rows):
        seqs = [r["seq"] for r in group]
        packed.append(
            PackedMinute(
                run_id=run.pk,
                rank=group[0]["rank"],  # the lowest: the blob holds every rank's samples
                attempt=attempt,
                minute=minute,
                samples=len(group),
                seq_first=min(seqs),
                seq_last=max(seqs),
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
    """A packed run's samples, in seq order, a blob decoded at a time.

    A blob's rows go into a heap; a row leaves it once no blob still to decode can hold a lower
    seq: every row of a blob has a seq >= its seq_first, so the lowest seq_first of the blobs left
    is the bound. Ranks whose batches arrived late (higher seqs for earlier minutes) wait in the
    heap only as long as that."""
    minutes = list(
        PackedMinute.objects.filter(run_id=run.pk)
        .order_by("minute", "attempt", "rank")
        .only("rank", "attempt", "seq_first", "data")
    )
    floor = [float("inf")] * (len(minutes) + 1)
    for i in range(len(minutes) - 1, -1, -1):
        floor[i] = min(minutes[i].seq_first, floor[i + 1])
    heap: list[tuple[int, dict]] = []
    for i, m in enumerate(minutes):
        for row in unpack(bytes(m.data)):
            row.setdefault("rank", m.rank)  # a version 1 blob: one rank's, the row's
            out = {"rank": row["rank"], "attempt": m.attempt, **{f: row[f] for f in fields}}
            heapq.heappush(heap, (row["seq"], out))  # seqs are unique in a run: no tie
        while heap and heap[0][0] < floor[i + 1]:
            yield heapq.heappop(heap)[1]


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
