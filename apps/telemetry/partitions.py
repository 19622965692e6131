"""Time partitions of the samples table on Postgres: created ahead, filled, dropped a day at a time.

The table is range-partitioned by `ts` (declarative partitioning, migration 0005): one partition
per COSTLAB_TELEMETRY_PARTITION_DAYS days, aligned on the Unix epoch in UTC, plus a DEFAULT
partition. Beat (`partitions_maintain`) keeps COSTLAB_TELEMETRY_PARTITIONS_AHEAD partitions ready
past today, so a live sample lands in its own day's partition and the ingest path does no DDL.
A sample outside every partition (a historical upload of last month) lands in the default one, and
the next maintenance moves it into a partition of its own (created, filled from the default, then
attached, in one transaction: the pattern of pg_partman's `partition_data_proc`; pg_partman itself
has no package for every Postgres costlab runs on, and this is all of it that costlab needs).

Reads prune: every read of a run's samples bounds `ts` by the run's stored span
(Run.samples_from .. samples_to, apps.telemetry.selectors.run_window), so the planner touches only
the partitions of those days (tests/apps/telemetry/test_partitions.py checks with EXPLAIN).

Postgres cannot keep a unique index across partitions without the partition key, so the index is
(run, seq, ts); ingest, which holds the run's row lock, leaves out seqs already stored before it
inserts (apps.telemetry.ingest), so (run, seq) stays unique. SQLite, the embedded default, keeps
one plain table with a (run, seq) unique index; nothing here runs there.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import OperationalError, connection, transaction

from apps.core.db import is_postgres
from apps.telemetry.models import PackedMinute, TelemetrySample

log = logging.getLogger(__name__)
PARENT = TelemetrySample._meta.db_table
DEFAULT = f"{PARENT}_default"
PACKED = PackedMinute._meta.db_table
# Each partitioned table and its partition key: compaction's packed minutes are cut like the
# samples, so a day's raw and packed samples go together.
KEYS = {PARENT: "ts", PACKED: "minute"}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# pg_get_expr of a range partition's bound, as the server's TimeZone prints it.
_BOUND = re.compile(r"^FOR VALUES FROM \('([^']+)'\) TO \('([^']+)'\)$")
# pg_advisory_xact_lock key: one maintenance at a time (beat may overlap a manual call).
_LOCK = 0x7E1E_0001
# How long retention's DETACH/DROP waits for the tables' locks before it gives up until next time.
DDL_LOCK_TIMEOUT = "10s"


@dataclass(frozen=True)
class Partition:
    name: str
    lo: datetime | None  # None: the default partition
    hi: datetime | None
    bytes: int = 0

    @property
    def is_default(self) -> bool:
        return self.lo is None


def span() -> timedelta:
    return timedelta(days=max(1, int(settings.COSTLAB_TELEMETRY_PARTITION_DAYS)))


def bounds_of(ts: datetime) -> tuple[datetime, datetime]:
    """The [lo, hi) of the partition that holds `ts`."""
    width = span()
    lo = EPOCH + ((ts - EPOCH) // width) * width
    return lo, lo + width


def partition_name(lo: datetime, parent: str = PARENT) -> str:
    return f"{parent}_p{lo:%Y%m%d}"


def is_partitioned(parent: str = PARENT) -> bool:
    """Postgres, and the table is the partitioned one (migrations 0005 and 0006 ran)."""
    if not is_postgres():
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [parent])
        row = cursor.fetchone()
    return bool(row and row[0] == "p")


def partitions(parent: str = PARENT) -> list[Partition]:
    """The partitions in time order, the default one last, each with its size on disk (indexes
    and TOAST included)."""
    if not is_partitioned(parent):
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), pg_total_relation_size(c.oid) "
            "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(%s)",
            [parent],
        )
        rows = cursor.fetchall()
    out = []
    for name, bound, size in rows:
        found = _BOUND.match(bound)
        if found is None:  # DEFAULT
            out.append(Partition(name=name, lo=None, hi=None, bytes=size))
            continue
        lo, hi = (datetime.fromisoformat(v).astimezone(UTC) for v in found.groups())
        out.append(Partition(name=name, lo=lo, hi=hi, bytes=size))
    return sorted(out, key=lambda p: (p.lo is None, p.lo or EPOCH))


def samples_estimated() -> int:
    """Rows in all partitions, from the planner's statistics (no scan; as fresh as the last
    ANALYZE or autovacuum)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(SUM(GREATEST(c.reltuples, 0)), 0) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
            [PARENT],
        )
        return int(cursor.fetchone()[0])


def packed_estimate() -> tuple[int, int]:
    """(bytes on disk, samples) of the packed minutes: the samples from the planner's row count
    times the mean samples of up to 1,000 packed rows (no scan; approximate)."""
    if not is_partitioned(PACKED):
        return 0, 0
    size = sum(p.bytes for p in partitions(PACKED))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(SUM(GREATEST(c.reltuples, 0)), 0) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
            [PACKED],
        )
        rows = float(cursor.fetchone()[0])
        cursor.execute(f'SELECT AVG(samples) FROM (SELECT samples FROM "{PACKED}" LIMIT 1000) s')
        mean = cursor.fetchone()[0]
    return size, int(rows * float(mean or 0))


def default_rows() -> int:
    """Rows waiting in the default partition (a small table: counted)."""
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT count(*) FROM "{DEFAULT}"')
        return cursor.fetchone()[0]


def _create(cursor, lo: datetime, hi: datetime, parent: str = PARENT) -> str:
    """A partition for [lo, hi): created detached, filled with the default partition's rows of
    that range, then attached (so the default never holds a row a partition's range covers)."""
    name, key = partition_name(lo, parent), KEYS[parent]
    cursor.execute(
        f'CREATE TABLE "{name}" (LIKE "{parent}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS '
        "INCLUDING STORAGE INCLUDING COMPRESSION)"
    )
    cursor.execute(
        f'WITH moved AS (DELETE FROM "{parent}_default" WHERE {key} >= %s AND {key} < %s '
        f'RETURNING *) INSERT INTO "{name}" SELECT * FROM moved',
        [lo, hi],
    )
    # The range as a CHECK first: ATTACH then skips its own scan of the new table.
    cursor.execute(
        f'ALTER TABLE "{name}" ADD CONSTRAINT "{name}_range" CHECK ({key} IS NOT NULL AND '
        f"{key} >= %s AND {key} < %s)",
        [lo, hi],
    )
    cursor.execute(
        f'ALTER TABLE "{parent}" ATTACH PARTITION "{name}" FOR VALUES FROM (%s) TO (%s)', [lo, hi]
    )
    cursor.execute(f'ALTER TABLE "{name}" DROP CONSTRAINT "{name}_range"')
    return name


@dataclass
class Maintained:
    created: list[str]
    moved_rows: int  # rows moved out of the default partition


@transaction.atomic
def partitions_maintain(*, now: datetime | None = None, ahead: int | None = None) -> Maintained:
    """Partitions from yesterday to `ahead` past today, and one for every range the default
    partitions hold rows of (moved there); the packed minutes get the samples' ranges. Idempotent;
    one caller at a time (an advisory lock)."""
    report = Maintained(created=[], moved_rows=0)
    if not is_partitioned():
        return report
    now = now or datetime.now(UTC)
    ahead = settings.COSTLAB_TELEMETRY_PARTITIONS_AHEAD if ahead is None else ahead
    width = span()
    width_s = int(width.total_seconds())
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK])
        wanted = {bounds_of(now - width)[0] + i * width for i in range(ahead + 2)}
        # Ranges the default partitions hold rows of (small tables: only stray rows land there).
        for parent, key in KEYS.items():
            if not is_partitioned(parent):
                continue
            cursor.execute(
                f'SELECT floor(extract(epoch FROM {key}) / %s), count(*) FROM "{parent}_default" '
                "GROUP BY 1",
                [width_s],
            )
            for k, rows in cursor.fetchall():
                wanted.add(EPOCH + timedelta(seconds=int(k) * width_s))
                report.moved_rows += rows if parent == PARENT else 0
        taken = [(p.lo, p.hi) for p in partitions() if not p.is_default]
        have = {lo for lo, _ in taken}
        for lo in sorted(wanted - have):
            # After a change of COSTLAB_TELEMETRY_PARTITION_DAYS, old partitions keep their span:
            # a new one is cut to fit between them.
            hi = min([lo + width, *(a for a, _ in taken if a > lo)])
            lo = max([lo, *(b for _, b in taken if b > lo and _ <= lo)])
            if lo < hi:
                report.created.append(_create(cursor, lo, hi))
                taken.append((lo, hi))
        if is_partitioned(PACKED):  # the packed minutes: the samples' ranges, exactly
            packed = {p.lo for p in partitions(PACKED) if not p.is_default}
            for lo, hi in sorted(taken):
                if lo not in packed:
                    _create(cursor, lo, hi, PACKED)
    return report


@dataclass
class Dropped:
    dropped: list[str]
    kept: dict[str, list[int]]  # partition -> the open runs that hold it back ([]: locks busy)
    runs_marked: int


def partitions_drop_before(*, cutoff: datetime, before_drop=None) -> Dropped:
    """Drop the partitions wholly older than `cutoff`, and the packed minutes' partition of the
    same range with each.

    A partition that holds samples of a run still open (queued or running) is kept, and said in
    the result. Otherwise, in a first transaction, `before_drop(run_ids)` (the dashboard's final
    roll-up) runs for the runs with samples in it and their raw_dropped_before moves to its end;
    then, in a second, the partitions are detached and dropped. The DDL holds no run's row lock
    (a tick committing its reads of those runs would deadlock with it) and waits at most
    DDL_LOCK_TIMEOUT for the tables: a partition it could not lock in time is dropped by the next
    maintenance, and said in the result.
    """
    from apps.experiments.models import Run

    out = Dropped(dropped=[], kept={}, runs_marked=0)
    twins = {(p.lo, p.hi): p for p in partitions(PACKED) if not p.is_default}
    for part in partitions():
        if part.is_default or part.hi > cutoff:
            continue
        with transaction.atomic():
            runs = Run.objects.filter(samples_from__lt=part.hi, samples_to__gte=part.lo)
            open_ids = list(
                runs.filter(status__in=Run.ACTIVE_STATUSES)
                .order_by("pk")
                .values_list("pk", flat=True)
            )
            if open_ids:
                out.kept[part.name] = open_ids
                continue
            ids = list(runs.order_by("pk").values_list("pk", flat=True))
            if before_drop is not None and ids:
                before_drop(ids)
            out.runs_marked += (
                Run.objects.filter(pk__in=ids)
                .exclude(raw_dropped_before__gte=part.hi)
                .update(raw_dropped_before=part.hi)
            )
        twin = twins.get((part.lo, part.hi))
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'")
                for parent, gone in [(PARENT, part)] + ([(PACKED, twin)] if twin else []):
                    cursor.execute(f'ALTER TABLE "{parent}" DETACH PARTITION "{gone.name}"')
                    cursor.execute(f'DROP TABLE "{gone.name}"')
        except OperationalError as exc:  # lock_timeout: busy tables, the next maintenance retries
            out.kept[part.name] = []
            log.warning("telemetry retention: %s not dropped this time (%s)", part.name, exc)
            continue
        out.dropped.append(part.name)
    return out
