"""Which stored rows a telemetry batch can change the bill of, read with as few queries as possible.

A batch changes only the intervals it touches: the ones its new samples close, and the one
after each (whose predecessor it now is). They lie in a few seq ranges around the batch:
(lo, hi] from the stored row just before a cluster of its seqs to the one just after it.
apps.billing.services bills each range as it is now and as it was, by the bill's rules
(apps.billing.bill, a floor above: named here, never imported).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Q

from apps.core.db import is_postgres
from apps.experiments.models import Run
from apps.telemetry.models import TelemetrySample

# Seqs further apart than this in one batch are looked at as separate ranges (a batch of
# stragglers from all over a run re-prices a few rows around each, not everything between).
CLUSTER_GAP = 64
SEQ_MAX = 2**62

# What the bill (apps.billing.bill) reads of a row.
BILL_FIELDS = (
    "seq",
    "attempt",
    "ts",
    "step",
    "rank",
    "tokens",
    "energy_j",
    "power_w",
    "util_pct",
    "estimated",
)


def seq_clusters(seqs: list[int]) -> list[tuple[int, int]]:
    """Sorted seqs as (first, last) clusters, split where they are more than CLUSTER_GAP apart."""
    out: list[tuple[int, int]] = []
    for s in seqs:
        if out and s - out[-1][1] <= CLUSTER_GAP:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def window_sql(lo: datetime | None, hi: datetime | None, alias: str = "") -> tuple[str, list]:
    """`ts` bounded to [lo, hi] (a run's stored span: Run.samples_from, samples_to), for raw SQL:
    Postgres reads only the partitions of those days. None: no span known, no bound."""
    if lo is None or hi is None:
        return "1 = 1", []
    ops = connection.ops
    col = f"{alias}.ts" if alias else "ts"
    return (
        f"{col} >= %s AND {col} <= %s",
        [ops.adapt_datetimefield_value(lo), ops.adapt_datetimefield_value(hi)],
    )


def batch_ranges(*, run: Run, seqs: list[int]) -> list[tuple[int, int]]:
    """The (lo, hi] seq ranges a batch touches, from the rows stored before it (one query).

    lo: the stored row just before a cluster (-1: none, count from the run's start); hi: the
    stored row just after it (SEQ_MAX: none). Overlapping ranges are merged, so no row is
    counted twice. A run of several ranks (one stream each, interleaved in seq): lo is the
    earliest of each rank's row before the cluster and hi the latest of each rank's row
    after it, so every stream's neighbours are in the range.
    """
    clusters = seq_clusters(seqs)
    table = TelemetrySample._meta.db_table
    values = ", ".join(["(%s, %s)"] * len(clusters))
    within, span = window_sql(run.samples_from, run.samples_to)
    if run.world_size > 1:
        before = (
            f"(SELECT MIN(m) FROM (SELECT MAX(seq) AS m FROM {table} WHERE run_id = %s AND "
            f"{within} AND seq < c.lo GROUP BY rank) AS b)"
        )
        after = (
            f"(SELECT MAX(m) FROM (SELECT MIN(seq) AS m FROM {table} WHERE run_id = %s AND "
            f"{within} AND seq > c.hi GROUP BY rank) AS a)"
        )
    else:
        before = f"(SELECT MAX(seq) FROM {table} WHERE run_id = %s AND {within} AND seq < c.lo)"
        after = f"(SELECT MIN(seq) FROM {table} WHERE run_id = %s AND {within} AND seq > c.hi)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH c(lo, hi) AS (VALUES {values}) SELECT {before}, {after} FROM c ORDER BY c.lo",
            [v for c in clusters for v in c] + [run.pk, *span, run.pk, *span],
        )
        bounds = [
            (-1 if lo is None else lo, SEQ_MAX if hi is None else hi)
            for lo, hi in cursor.fetchall()
        ]
    merged: list[tuple[int, int]] = []
    for lo, hi in bounds:
        if merged and lo < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


# An appended batch's ranks' predecessors are looked for first among the rows stored this long
# before the run's latest sample (stream_predecessors).
TAIL_WINDOW = timedelta(minutes=5)


def stream_predecessors(
    *, run: Run, seq: int, ranks: set[int] | None, stored_to: datetime | None = None
) -> list[dict]:
    """Each rank's last stored row at or before seq (what an appended batch's intervals start from),
    in seq order, in one query on the common path. ranks=None: the one last row (a run of one
    stream). stored_to: the latest ts stored before the batch (None: the run's span end).

    On Postgres, first among the rows of the last TAIL_WINDOW before stored_to: a read whose cost
    does not grow with the run, whichever index the planner picks (on a run newer than the day
    partition's statistics it takes `(run, ts)` and would read the whole span). That is exact
    while the stored rows share one attempt (Run.samples_attempt): within an attempt a rank's
    samples never go back in time against seq (ingest refuses them), so no later row of that
    rank lies before the window. A rank not found there, or rows of several attempts (or not
    known), are looked up over the whole span (one LATERAL lookup per rank)."""
    if not is_postgres():
        return _predecessors_orm(run=run, seq=seq, ranks=ranks)
    table, cols = TelemetrySample._meta.db_table, ", ".join(f"s.{f}" for f in BILL_FIELDS)
    wanted = None if ranks is None else sorted(ranks)
    one = "SELECT {cols} FROM {table} s WHERE s.run_id = %s AND s.seq <= %s AND {within} "
    with connection.cursor() as cursor:

        def fetch(sql: str, params: list) -> list[dict]:
            cursor.execute(sql, params)
            return [dict(zip(BILL_FIELDS, row, strict=True)) for row in cursor.fetchall()]

        stored_to = stored_to or run.samples_to
        if run.samples_attempt and stored_to is not None and run.samples_from is not None:
            within, span = window_sql(
                max(run.samples_from, stored_to - TAIL_WINDOW), run.samples_to, "s"
            )
            if wanted is None:
                sql = one.format(cols=cols, table=table, within=within)
                rows = fetch(sql + "ORDER BY s.seq DESC LIMIT 1", [run.pk, seq, *span])
            else:
                sql = one.format(cols=f"DISTINCT ON (s.rank) {cols}", table=table, within=within)
                rows = fetch(
                    sql + "AND s.rank = ANY(%s::int[]) ORDER BY s.rank, s.seq DESC",
                    [run.pk, seq, *span, wanted],
                )
            if len(rows) == (1 if wanted is None else len(wanted)):
                return sorted(rows, key=lambda r: r["seq"])
        within, span = window_sql(run.samples_from, run.samples_to, "s")
        sql = one.format(cols=cols, table=table, within=within)
        if wanted is None:
            return fetch(sql + "ORDER BY s.seq DESC LIMIT 1", [run.pk, seq, *span])
        return fetch(
            f"SELECT p.* FROM unnest(%s::int[]) AS r(rank) CROSS JOIN LATERAL ({sql}"
            "AND s.rank = r.rank ORDER BY s.seq DESC LIMIT 1) p ORDER BY p.seq",
            [wanted, run.pk, seq, *span],
        )


def _predecessors_orm(*, run: Run, seq: int, ranks: set[int] | None) -> list[dict]:
    """stream_predecessors on SQLite (one table: no partitions, no plan to steer)."""
    base = TelemetrySample.objects.of_run(run).filter(seq__lte=seq).order_by("-seq")
    if ranks is None:
        return list(base.values(*BILL_FIELDS)[:1])
    parts = [base.filter(rank=r).values(*BILL_FIELDS)[:1] for r in sorted(ranks)]
    rows = list(parts[0].union(*parts[1:], all=True)) if len(parts) > 1 else list(parts[0])
    return sorted(rows, key=lambda r: r["seq"])


def contiguous_end(*, run: Run, after_seq: int) -> int | None:
    """The last seq of the gap-free stretch that follows after_seq
    (None: after_seq + 1 is missing)."""
    table = TelemetrySample._meta.db_table
    within, span = window_sql(run.samples_from, run.samples_to)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT MAX(seq) FROM ("
            f"SELECT seq, ROW_NUMBER() OVER (ORDER BY seq) AS rn FROM {table} "
            f"WHERE run_id = %s AND {within} AND seq > %s) AS t WHERE seq - %s = rn",
            [run.pk, *span, after_seq, after_seq],
        )
        return cursor.fetchone()[0]


def rows_in_ranges(*, run: Run, ranges: list[tuple[int, int]]) -> list[list[dict]]:
    """The stored rows of each (lo, hi] range, the row at lo included (one query), in seq order."""
    where = Q()
    for lo, hi in ranges:
        where |= Q(seq__gte=lo, seq__lte=hi)
    rows = list(
        TelemetrySample.objects.of_run(run).filter(where).order_by("seq").values(*BILL_FIELDS)
    )
    out, i = [], 0
    for lo, hi in ranges:  # ranges are sorted and disjoint: one pass splits the rows
        while i < len(rows) and rows[i]["seq"] < lo:
            i += 1
        j = i
        while j < len(rows) and rows[j]["seq"] <= hi:
            j += 1
        out.append(rows[i:j])
        i = j
    return out
