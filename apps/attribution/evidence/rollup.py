"""The attribution rollup: run totals -> one observation per run and window, set-based.

Run totals already move as telemetry lands (apps.billing.services), so a window's observation of a
run is its totals now minus its RunCursor (what earlier windows took). One INSERT ... SELECT records
every observation of every due experiment; one upsert moves the cursors by exactly what was
recorded, so a run's totals are counted once however long the gap between ticks. A late sample
re-prices a run below its priced_seq, so a run is observed when its cost or tokens moved, not only
its seq. The cursors also carry each run's sums over its arm's epoch, so the freeze rule's moments
read one row a run, not every observation since the epoch began. Nothing here reads telemetry
samples. Plain SQL that Postgres and SQLite both accept, but for the epoch sums' refresh (Postgres).
"""

from __future__ import annotations

from django.db import connection
from django.db.models import Count, OuterRef, Subquery

from apps.attribution.evidence.moments import epoch_params, epoch_ranges
from apps.attribution.models import AttributionSnapshot, AttributionWindow, RunCursor, RunWindow
from apps.core.db import is_postgres
from apps.experiments.models import Run

_DELTA_COLUMNS = ("cost_usd", "tokens", "steps", "gpu_seconds", "wall_s", "energy_j")


def observations_record(
    *, window_ids: list[int], run_ids: list[int] | None = None, restarted_arm_ids: list[int] = ()
) -> int:
    """Record what every run of these windows' experiments added since its cursor.

    `run_ids`: only these runs are looked at (the tick's `runs_moved`: read by key, not by
    comparing every run of the experiments with its cursor a second time); None: all.

    first_seen marks a run's first observation in its arm's epoch (the evidence since the arm's
    last unfreeze): a run not observed since the epoch began, by the previous snapshot's epoch;
    every observation of an arm whose epoch restarts with this window.

    The cursors move in `cursors_advance`, once the window's omitted observations are marked.
    """
    if not window_ids:
        return 0
    rw, cur, run, win, snap = (
        RunWindow._meta.db_table,
        RunCursor._meta.db_table,
        Run._meta.db_table,
        AttributionWindow._meta.db_table,
        AttributionSnapshot._meta.db_table,
    )
    ids = ", ".join(["%s"] * len(window_ids))
    only, params = "", list(window_ids)
    if run_ids is not None:  # by the primary key: a few hundred rows, not every run's
        if is_postgres():
            only, params = "AND r.id = ANY(%s)", [*params, list(run_ids)]
        else:
            only = f"AND r.id IN ({', '.join(['%s'] * len(run_ids)) or 'NULL'})"
            params += list(run_ids)
    # Devices: a GPU run's device_seconds are GPU-seconds; a CPU run's are wall seconds per rank
    # (a DDP run's summed over its world_size processes).
    insert = f"""
        INSERT INTO {rw} (window_id, run_id, arm_id, first_seen, omitted, upto_seq, samples,
                          cost_usd, tokens, steps, gpu_seconds, wall_s, energy_j, energy_estimated)
        SELECT w.id, r.id, r.arm_id,
               CASE WHEN c.run_id IS NULL OR cw.number <= COALESCE(ps.epoch_start, 0)
                    THEN TRUE ELSE FALSE END,
               FALSE,
               r.priced_seq,
               r.priced_seq - COALESCE(c.priced_seq, -1),
               r.cost_usd - COALESCE(c.cost_usd, 0),
               r.tokens - COALESCE(c.tokens, 0),
               r.steps - COALESCE(c.steps, 0),
               CAST(CASE WHEN r.gpu_count > 0 THEN r.device_seconds ELSE 0 END
                    - COALESCE(c.gpu_seconds, 0) AS NUMERIC(20, 6)),
               CAST(CASE WHEN r.gpu_count > 0 THEN r.device_seconds / r.gpu_count
                         WHEN r.world_size > 1 THEN r.device_seconds / r.world_size
                         ELSE r.device_seconds END
                    - COALESCE(c.wall_s, 0) AS NUMERIC(20, 6)),
               CAST(r.energy_j - COALESCE(c.energy_j, 0) AS NUMERIC(24, 6)),
               r.energy_estimated
        FROM {run} r
        JOIN {win} w ON w.experiment_id = r.experiment_id
        LEFT JOIN {cur} c ON c.run_id = r.id
        LEFT JOIN {win} cw ON cw.id = c.window_id
        LEFT JOIN {win} pw ON pw.experiment_id = w.experiment_id AND pw.number = w.number - 1
        LEFT JOIN {snap} ps ON ps.window_id = pw.id AND ps.arm_id = r.arm_id
        WHERE w.id IN ({ids}) {only} AND (r.priced_seq > COALESCE(c.priced_seq, -1)
                                   OR r.cost_usd <> COALESCE(c.cost_usd, 0)
                                   OR r.tokens <> COALESCE(c.tokens, 0))
    """
    with connection.cursor() as cursor:
        cursor.execute(insert, params)
        recorded = cursor.rowcount
        if restarted_arm_ids:
            arms = ", ".join(["%s"] * len(restarted_arm_ids))
            cursor.execute(
                f"UPDATE {rw} SET first_seen = TRUE "
                f"WHERE window_id IN ({ids}) AND arm_id IN ({arms})",
                [*window_ids, *restarted_arm_ids],
            )
    return recorded


def windows_observations_count(*, window_ids: list[int]) -> None:
    """Each window's `observations`: its runs whose totals moved (its RunWindows). One grouped
    UPDATE on Postgres (a correlated count per window took 0.17 s of a 1,000-window tick: AMD
    EPYC, 2 cores, bf16 emulated (slow)); a window with none keeps its 0."""
    if not window_ids:
        return
    if not is_postgres():
        observed = (
            RunWindow.objects.filter(window=OuterRef("pk"))
            .values("window")
            .annotate(n=Count("pk"))
            .values("n")
        )
        AttributionWindow.objects.filter(pk__in=window_ids).update(observations=Subquery(observed))
        return
    rw, win = RunWindow._meta.db_table, AttributionWindow._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {win} w SET observations = c.n FROM (SELECT window_id, count(*) AS n "
            f"FROM {rw} WHERE window_id = ANY(%s) GROUP BY window_id) c WHERE w.id = c.window_id",
            [window_ids],
        )


_EPOCH_SUMS = {  # cursor column: the observation's column it sums
    "epoch_cost_usd": "cost_usd",
    "epoch_tokens": "tokens",
    "epoch_steps": "steps",
}


_EPOCH_COUNTS = ("epoch_observations", *_EPOCH_SUMS)


def cursors_advance(
    *, window_ids: list[int], epochs: dict[int, int], upto_number: dict[int, int]
) -> None:
    """Move the cursors of the runs observed in these windows by what was observed, and their
    epoch sums (RunCursor.epoch_*) by what counts: the observations not omitted.

    `epochs`: per arm, the window number its epoch counts after (the tick's); `upto_number`: its
    window's number. A cursor whose epoch is another (the arm's restarted, or a cursor from
    before these columns) is marked unknown here; on Postgres, `epoch_sums_refresh` then sums its
    observations again.
    """
    if not window_ids:
        return
    cur, rw = RunCursor._meta.db_table, RunWindow._meta.db_table
    ids = ", ".join(["%s"] * len(window_ids))
    arms = ", ".join(["(%s, %s)"] * len(epochs)) or "(CAST(NULL AS BIGINT), CAST(NULL AS INTEGER))"
    counted = {k: f"CASE WHEN rw.omitted THEN 0 ELSE rw.{v} END" for k, v in _EPOCH_SUMS.items()}
    # The cursor moves by the observation just stored, never by a fresh read of the run:
    # totals that moved between the two statements are left for the next window.
    upsert = f"""
        WITH e(arm_id, after_n) AS (VALUES {arms})
        INSERT INTO {cur} (run_id, window_id, priced_seq, {", ".join(_DELTA_COLUMNS)},
                           epoch_after, epoch_observations, {", ".join(_EPOCH_SUMS)})
        SELECT rw.run_id, rw.window_id, rw.upto_seq, {", ".join(f"rw.{c}" for c in _DELTA_COLUMNS)},
               COALESCE(e.after_n, -1), CASE WHEN rw.omitted THEN 0 ELSE 1 END,
               {", ".join(counted.values())}
        FROM {rw} rw LEFT JOIN e ON e.arm_id = rw.arm_id
        WHERE rw.window_id IN ({ids})
        ON CONFLICT (run_id) DO UPDATE SET window_id = excluded.window_id,
            priced_seq = excluded.priced_seq,
            {", ".join(f"{c} = {cur}.{c} + excluded.{c}" for c in _DELTA_COLUMNS)},
            epoch_after = CASE WHEN {cur}.epoch_after = excluded.epoch_after
                               THEN {cur}.epoch_after ELSE -1 END,
            {", ".join(f"{c} = {cur}.{c} + excluded.{c}" for c in _EPOCH_COUNTS)}
    """
    with connection.cursor() as cursor:
        cursor.execute(upsert, [v for item in epochs.items() for v in item] + list(window_ids))
    if is_postgres():
        epoch_sums_refresh(epochs=epochs, upto_number=upto_number)


def epoch_sums_refresh(*, epochs: dict[int, int], upto_number: dict[int, int]) -> int:
    """Postgres: sum again, from their observations, the epoch of every cursor of these arms whose
    epoch is unknown (-1: a restarted epoch, or a cursor from before the sums), up to window
    upto_number[arm]. Found through a partial index: most ticks have none of their own (those of
    experiments that are over stay unknown, and are never looked at). A cursor of an arm whose
    epoch restarted that is not observed again keeps its old epoch, so no epoch sums count it;
    once it is observed, it is unknown and summed here. Returns the cursors refreshed."""
    if not epochs:
        return 0
    cur, rw, run = RunCursor._meta.db_table, RunWindow._meta.db_table, Run._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT EXISTS (SELECT 1 FROM {cur} c JOIN {run} r ON r.id = c.run_id "
            "WHERE c.epoch_after = -1 AND r.arm_id = ANY(%s))",
            [sorted(epochs)],
        )
        if not cursor.fetchone()[0]:
            return 0
        sums = ", ".join(f"COALESCE(SUM(rw.{v}), 0) AS {k}" for k, v in _EPOCH_SUMS.items())
        cursor.execute(
            f"""
            {epoch_ranges(len(epochs))},
            s AS (
                SELECT c.run_id, b.after_n, COUNT(rw.id) AS n, {sums}
                FROM {cur} c JOIN {run} r ON r.id = c.run_id JOIN b ON b.arm_id = r.arm_id
                LEFT JOIN {rw} rw ON rw.run_id = r.id AND rw.window_id > b.lo
                    AND rw.window_id <= b.hi AND NOT rw.omitted
                WHERE c.epoch_after = -1
                GROUP BY c.run_id, b.after_n
            )
            UPDATE {cur} SET epoch_after = s.after_n, epoch_observations = s.n,
                {", ".join(f"{k} = s.{k}" for k in _EPOCH_SUMS)}
            FROM s WHERE {cur}.run_id = s.run_id
            """,
            epoch_params(epochs, upto_number, {}),
        )
        return cursor.rowcount
