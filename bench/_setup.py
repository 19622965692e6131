"""Shared start-up for benchmarks that need the Django platform on a real Postgres.

Each benchmark has a database of its own, BENCH_DATABASE_URL with `_<benchmark>` appended (default:
`costlab_bench_ingest`, `costlab_bench_attribution` ... on the local Postgres), created and migrated
when needed: what one benchmark leaves behind never changes another's result, in any order.
A `--smoke` run (every benchmark has one: tiny sizes, the same code path, seconds; its figures mean
nothing) gets `_<benchmark>_smoke`, so it never replaces the data a full run keeps and reuses.
Benchmarks are not tests: CI does not run them; tests/bench runs each one's --smoke.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/costlab_bench"


def django_on_postgres(*, smoke: bool = False) -> None:
    bench = Path(getattr(sys.modules["__main__"], "__file__", "bench")).stem
    url = f"{os.environ.get('BENCH_DATABASE_URL', DEFAULT_URL)}_{bench}{'_smoke' if smoke else ''}"
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
    os.environ.setdefault("DJANGO_LOG_LEVEL", "WARNING")
    import psycopg

    name = url.rsplit("/", 1)[1]
    admin_url = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


SPREAD_KEYS = ("median", "min", "max", "q1", "q3", "rounds")


def spread(values: list[float], keys: tuple[str, ...] = SPREAD_KEYS) -> dict:
    """Median with the min, max and interquartile range, and how many values (`rounds`): these
    machines are noisy. `keys`: the ones a benchmark reports (each keeps its JSON's shape)."""
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    figures = {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "q1": q[0],
        "q3": q[2],
        "rounds": len(values),
    }
    return {key: figures[key] for key in keys}
