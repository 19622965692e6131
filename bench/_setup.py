"""Shared start-up for benchmarks that need the Django platform on a real Postgres.

Each benchmark has a database of its own, BENCH_DATABASE_URL with `_<benchmark>` appended (default:
`costlab_bench_ingest`, `costlab_bench_attribution` ... on the local Postgres), created and migrated
when needed: what one benchmark leaves behind never changes another's result, in any order.
BENCH_TEMPLATE_DATABASE names a migrated database to create it from (tests/bench: its own).
A `--smoke` run (every benchmark has one: tiny sizes, the same code path, seconds; its figures mean
nothing) gets `_<benchmark>_smoke`, so it never replaces the data a full run keeps and reuses.
Benchmarks are not tests: CI does not run them; tests/bench runs each one's --smoke.
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import sys
import threading
from collections.abc import Callable
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
            _create_database(conn, name, template=os.environ.get("BENCH_TEMPLATE_DATABASE"))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _create_database(conn, name: str, *, template: str | None) -> None:
    """CREATE DATABASE, copied from `template` (a migrated database on the same server, one no
    session is using: tests/bench passes its own test database) where it can be: migrate then has
    nothing to do, where migrating from scratch costs seconds of CPU. Otherwise an empty one."""
    import psycopg

    if template:
        try:
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            return
        except psycopg.Error as exc:  # in use, or gone: migrate from scratch instead
            print(f"# {template} cannot be copied ({str(exc).strip()}): migrating", flush=True)
    conn.execute(f'CREATE DATABASE "{name}"')


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


GRACE_S = 10.0  # after SIGTERM, how long the step (or GEMM) under way may take before exit anyway
INTERRUPTED_RC = 143  # 128 + SIGTERM, what a shell reports for a process that SIGTERM ended


class Interrupted(Exception):
    """SIGTERM arrived: start no further arm, round, strategy or GEMM pass."""


class Stopper:
    """SIGTERM as a flag the bench checks between its runs, and a deadline after it.

    train() installs its own SIGTERM handler while it trains (stop at the next step boundary)
    and puts this one back after; either handler's signal also reaches a wake-up fd
    (signal.set_wakeup_fd), which a watcher thread reads: it sets the flag whichever handler
    took the signal, and if the bench has not finished GRACE_S later (a long step, a GEMM),
    prints what was measured (``on_timeout``) and exits 143 at once.
    """

    def __init__(self, grace_s: float = GRACE_S):
        self.grace_s = grace_s
        self.event = threading.Event()
        self.done = threading.Event()
        self.on_timeout: Callable[[], None] | None = None

    def install(self) -> Stopper:
        signal.signal(signal.SIGTERM, lambda signum, frame: self.event.set())
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read_fd,), daemon=True).start()
        return self

    def _watch(self, read_fd: int) -> None:
        while signal.SIGTERM not in os.read(read_fd, 64):
            pass
        self.event.set()
        if self.done.wait(self.grace_s):
            return
        with contextlib.suppress(Exception):
            if self.on_timeout is not None:
                self.on_timeout()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(INTERRUPTED_RC)

    @property
    def stopped(self) -> bool:
        return self.event.is_set()

    def check(self) -> None:
        if self.event.is_set():
            raise Interrupted
