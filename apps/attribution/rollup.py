"""The attribution rollup: run totals -> one observation per run and window, set-based.

Run totals already move as telemetry lands (apps.billing.services), so a window's observation of a
run is its totals now minus its RunCursor (what earlier windows took). One INSERT ... SELECT records
every observation of every due experiment; one upsert moves the cursors by exactly what was
recorded, so a run's totals are counted once however long the gap between ticks. A late sample
re-prices a run below its priced_seq, so a run is observed when its cost or tokens moved, not only
its seq. Nothing here reads telemetry samples. Plain SQL that Postgres and SQLite both accept.
"""

from __future__ import annotations

from django.db import connection

from apps.attribution.models import AttributionSnapshot, AttributionWindow, RunCursor, RunWindow
from apps.experiments.models import Run

_DELTA_COLUMNS = ("cost_usd", "tokens", "steps", "gpu_seconds", "wall_s", "energy_j")


def observations_record(*, window_ids: list[int], restarted_arm_ids: list[int] = ()) -> int:
    """Record what every run of these windows' experiments added since its cursor;
    advance the cursors.

    first_seen marks a run's first observation in its arm's epoch (the evidence since the arm's
    last unfreeze): a run not observed since the epoch began, by the previous snapshot's epoch;
    every observation of an arm whose epoch restarts with this window.
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
        WHERE w.id IN ({ids}) AND (r.priced_seq > COALESCE(c.priced_seq, -1)
                                   OR r.cost_usd <> COALESCE(c.cost_usd, 0)
                                   OR r.tokens <> COALESCE(c.tokens, 0))
    """
    # The cursor moves by the observation just stored, never by a fresh read of the run:
    # totals that moved between the two statements are left for the next window.
    upsert = f"""
        INSERT INTO {cur} (run_id, window_id, priced_seq, {", ".join(_DELTA_COLUMNS)})
        SELECT run_id, window_id, upto_seq, {", ".join(_DELTA_COLUMNS)}
        FROM {rw} WHERE window_id IN ({ids})
        ON CONFLICT (run_id) DO UPDATE SET window_id = excluded.window_id,
            priced_seq = excluded.priced_seq,
            {", ".join(f"{c} = {cur}.{c} + excluded.{c}" for c in _DELTA_COLUMNS)}
    """
    with connection.cursor() as cursor:
        cursor.execute(insert, window_ids)
        recorded = cursor.rowcount
        if restarted_arm_ids:
            arms = ", ".join(["%s"] * len(restarted_arm_ids))
            cursor.execute(
                f"UPDATE {rw} SET first_seen = TRUE "
                f"WHERE window_id IN ({ids}) AND arm_id IN ({arms})",
                [*window_ids, *restarted_arm_ids],
            )
        cursor.execute(upsert, window_ids)
    return recorded
