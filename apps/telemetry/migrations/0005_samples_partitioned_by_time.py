"""Postgres: the samples table becomes range-partitioned by ts (apps.telemetry.partitions), its rows
moved in. Every run gets the span of its stored samples (Run.samples_from .. samples_to), which
reads use to prune partitions. SQLite keeps its one table; only the spans are filled there.

On Postgres the table's keys change shape, since a partitioned table's unique index must hold the
partition key: unique (run_id, seq, ts), the row id without a primary-key index (nothing looks a
sample up by id; Django's model state keeps its `id` primary key and (run, seq) unique, which
SQLite enforces as they are).
"""

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import migrations
from django.db.models import Max, Min, OuterRef, Subquery

T = "telemetry_telemetrysample"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
COLUMNS_SQL = (
    "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
    "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped"
)


def _keys(cursor, table: str, unique_cols: str) -> None:
    cursor.execute(
        f'ALTER TABLE "{table}" ADD CONSTRAINT sample_unique_run_seq UNIQUE ({unique_cols})'
    )
    cursor.execute(f'CREATE INDEX sample_run_ts_idx ON "{table}" (run_id, ts)')
    cursor.execute(
        f'ALTER TABLE "{table}" ADD CONSTRAINT {T}_run_id_fk_experiments_run_id FOREIGN KEY '
        "(run_id) REFERENCES experiments_run(id) DEFERRABLE INITIALLY DEFERRED"
    )


def _copy(cursor, source: str, target: str) -> None:
    cursor.execute(COLUMNS_SQL, [target])
    cols = cursor.fetchone()[0]
    cursor.execute(f'INSERT INTO "{target}" ({cols}) SELECT {cols} FROM "{source}"')
    cursor.execute(
        f"SELECT setval(pg_get_serial_sequence(%s, 'id'), "
        f'(SELECT COALESCE(MAX(id), 0) + 1 FROM "{source}"), false)',
        [target],
    )


def partition(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    width = timedelta(days=max(1, int(settings.COSTLAB_TELEMETRY_PARTITION_DAYS)))
    width_s = int(width.total_seconds())
    with schema_editor.connection.cursor() as c:
        c.execute(
            f'CREATE TABLE "{T}_new" (LIKE "{T}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS '
            "INCLUDING IDENTITY INCLUDING STORAGE INCLUDING COMPRESSION) PARTITION BY RANGE (ts)"
        )
        c.execute(f'CREATE TABLE "{T}_default" PARTITION OF "{T}_new" DEFAULT')
        c.execute(f'SELECT DISTINCT floor(extract(epoch FROM ts) / %s) FROM "{T}"', [width_s])
        starts = {EPOCH + int(k) * width for (k,) in c.fetchall()}
        today = EPOCH + ((datetime.now(UTC) - EPOCH) // width) * width
        starts |= {today + i * width for i in range(-1, settings.COSTLAB_TELEMETRY_PARTITIONS_AHEAD + 1)}
        for lo in sorted(starts):
            c.execute(
                f'CREATE TABLE "{T}_p{lo:%Y%m%d}" PARTITION OF "{T}_new" '
                "FOR VALUES FROM (%s) TO (%s)",
                [lo, lo + width],
            )
        _copy(c, T, f"{T}_new")
        c.execute(f'DROP TABLE "{T}"')
        c.execute(f'ALTER TABLE "{T}_new" RENAME TO "{T}"')
        c.execute(f"SELECT pg_get_serial_sequence('{T}', 'id')")
        c.execute(f"ALTER SEQUENCE {c.fetchone()[0]} RENAME TO {T}_id_seq")
        _keys(c, T, "run_id, seq, ts")
        c.execute(f'ANALYZE "{T}"')


def unpartition(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as c:
        c.execute(
            f'CREATE TABLE "{T}_plain" (LIKE "{T}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS '
            "INCLUDING IDENTITY INCLUDING STORAGE INCLUDING COMPRESSION)"
        )
        _copy(c, T, f"{T}_plain")
        c.execute(f'DROP TABLE "{T}"')
        c.execute(f'ALTER TABLE "{T}_plain" RENAME TO "{T}"')
        c.execute(f"SELECT pg_get_serial_sequence('{T}', 'id')")
        c.execute(f"ALTER SEQUENCE {c.fetchone()[0]} RENAME TO {T}_id_seq")
        c.execute(f'ALTER TABLE "{T}" ADD PRIMARY KEY (id)')
        c.execute(f'CREATE INDEX {T}_run_id_ab981d77 ON "{T}" (run_id)')
        _keys(c, T, "run_id, seq")


def spans(apps, schema_editor):
    Run = apps.get_model("experiments", "Run")
    Sample = apps.get_model("telemetry", "TelemetrySample")
    of_run = Sample.objects.filter(run=OuterRef("pk")).values("run")
    Run.objects.filter(last_seq__gte=0).update(
        samples_from=Subquery(of_run.annotate(v=Min("ts")).values("v")),
        samples_to=Subquery(of_run.annotate(v=Max("ts")).values("v")),
    )


class Migration(migrations.Migration):
    atomic = True

    dependencies = [
        ("telemetry", "0004_sample_gpm_metrics"),
        ("experiments", "0016_run_samples_window"),
    ]

    operations = [
        migrations.RunPython(partition, unpartition),
        migrations.RunPython(spans, migrations.RunPython.noop),
    ]
