"""Test databases copied from one migrated template, not migrated once per xdist worker.

Migrating an empty Postgres database takes about 10 CPU-s of Django and more of Postgres; three
xdist workers did it at once as each session started. Now the first worker to get here migrates a
template (`<test database>_tmpl_<key>`) while the others wait on a file lock, and every worker's
database is a `CREATE DATABASE ... TEMPLATE` copy of it, made in about a second.

The key is a hash of everything a migrated database depends on: every migration file, the pinned
versions of the third-party apps (constraints.txt), Django's version, the Postgres server's
version and today's date (the telemetry partitions are created around the day the migration runs).
A template whose key no longer matches is never used again, and is dropped by the next session that
makes a new one. A template is made under another name and renamed once migrated, so a session
killed while migrating leaves no half-made template behind.

Postgres only: on SQLite the test database is migrated as before. Each worker's test database
commits without waiting for the disk (`commits_unflushed`).

The tests that start `make run`'s embedded default (its own SQLite database in a var dir of its
own: `make run`'s drill, the soak benchmark's smoke) copy one migrated SQLite database
(`sqlite_template`) instead of migrating from scratch each.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import django
from django.db import DatabaseError, connections

ROOT = Path(__file__).resolve().parent.parent


def _migrations_digest():
    from datetime import UTC, datetime

    digest = hashlib.sha256()
    # constraints.txt pins the third-party apps whose migrations run too (Celery beat, knox, axes)
    for path in [*sorted(ROOT.glob("apps/*/migrations/*.py")), ROOT / "constraints.txt"]:
        if path.exists():
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    digest.update(django.get_version().encode())
    digest.update(datetime.now(UTC).date().isoformat().encode())
    return digest


def template_key(connection) -> str:
    digest = _migrations_digest()
    with connection._nodb_cursor() as cursor:
        cursor.execute("SHOW server_version_num")
        digest.update(cursor.fetchone()[0].encode())
    return digest.hexdigest()[:10]


@contextmanager
def _locked(name: str):
    with open(Path(tempfile.gettempdir()) / f"costlab-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _exists(cursor, name: str) -> bool:
    cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
    return cursor.fetchone() is not None


def _migrate_into(connection, name: str) -> None:
    """Migrate a new database `name` through Django's own test-database creation, then point the
    connection back at the database it named before."""
    before_name = connection.settings_dict["NAME"]
    before_test = dict(connection.settings_dict["TEST"])
    connection.settings_dict["TEST"]["NAME"] = name
    try:
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    finally:
        connection.close()
        connection.settings_dict["NAME"] = before_name
        connection.settings_dict["TEST"] = before_test
        from django.conf import settings

        settings.DATABASES[connection.alias]["NAME"] = before_name


def copy_test_database_from_template(alias: str = "default") -> str | None:
    """Make this session's test database a copy of the migrated template; return the test
    database's name, or None where the database is not Postgres (nothing was done)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return None
    target = connection.creation._get_test_db_name()
    base = target.rsplit("_gw", 1)[0]  # one template for every xdist worker of a session
    template = f"{base}_tmpl_{template_key(connection)}"
    qn = connection.ops.quote_name
    with _locked(template):
        with connection._nodb_cursor() as cursor:
            if not _exists(cursor, template):
                making = f"{template}_making"
                cursor.execute(f"DROP DATABASE IF EXISTS {qn(making)} WITH (FORCE)")
                _migrate_into(connection, making)
                cursor.execute(f"ALTER DATABASE {qn(making)} RENAME TO {qn(template)}")
                cursor.execute(
                    "SELECT datname FROM pg_database WHERE datname LIKE %s AND datname <> %s",
                    [f"{base}\\_tmpl\\_%", template],
                )
                for (stale,) in cursor.fetchall():
                    try:  # another session may be copying it right now: it is dropped next time
                        cursor.execute(f"DROP DATABASE IF EXISTS {qn(stale)}")
                    except DatabaseError:
                        pass
            cursor.execute(f"DROP DATABASE IF EXISTS {qn(target)} WITH (FORCE)")
            cursor.execute(f"CREATE DATABASE {qn(target)} TEMPLATE {qn(template)}")
            commits_unflushed(cursor, target, qn)
    return target


def commits_unflushed(cursor, name: str, qn) -> None:
    """Every session on database `name` (this process's, and those of the workers, servers and
    benchmarks a test starts) commits without waiting for its WAL to reach the disk
    (synchronous_commit off): what a commit makes visible, and when, is unchanged; only a crash of
    the Postgres server itself could lose the last fraction of a second of commits, which no test of
    the shared server makes (the crash drills run private clusters). A bare commit took 1 to 3.3 ms
    against 0.09 ms, an ORM save that commits 1.1 ms against 0.55 (Intel(R) Xeon(R) Processor, 2
    cores), and the suite commits thousands of times: every transactional test's flush, every
    run's telemetry, lease and bill (2,600 commits in tests/workers/test_runs_on_a_worker.py and
    tests/cli/test_cli.py alone)."""
    cursor.execute(f"ALTER DATABASE {qn(name)} SET synchronous_commit TO off")


def drop_test_database(name: str, alias: str = "default") -> None:
    connection = connections[alias]
    connections.close_all()
    with connection._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {connection.ops.quote_name(name)} WITH (FORCE)")


SQLITE_FILE = "costlab.sqlite3"  # config.settings.base: the embedded default's database, in var/
SQLITE_STALE_S = 2 * 86400  # a template of another key is removed once this old


def sqlite_template() -> Path:
    """A SQLite database migrated as `make run` migrates one (`manage.py migrate` on
    config.settings.local, in a COSTLAB_VAR_DIR of its own), made once per key (the template key's
    inputs, less the Postgres server) by the first process to ask while the others wait on a file
    lock, and kept in the temporary directory for the next session. A test that starts the embedded
    default copies it into its var dir as costlab.sqlite3 (`copy_sqlite_template`): its own
    `manage.py migrate` still runs, and finds nothing left to apply, where migrating from scratch
    took 15 s and about 12 CPU-s a process (Intel(R) Xeon(R) Processor, 2 cores). A migration that
    fails on SQLite fails here, in the test that asked."""
    key = _migrations_digest().hexdigest()[:10]
    folder = Path(tempfile.gettempdir())
    path = folder / f"costlab-sqlite-tmpl-{key}.sqlite3"
    with _locked("sqlite-tmpl"):
        if path.exists():
            return path
        making = Path(tempfile.mkdtemp(prefix="costlab-sqlite-making-"))
        try:
            from tests.helpers import clean_env

            env = clean_env(
                DJANGO_SETTINGS_MODULE="config.settings.local", COSTLAB_VAR_DIR=str(making)
            )
            done = subprocess.run(
                [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if done.returncode:
                raise RuntimeError(f"manage.py migrate on SQLite failed:\n{done.stderr[-3000:]}")
            os.replace(making / SQLITE_FILE, path)  # whole or not at all
        finally:
            shutil.rmtree(making, ignore_errors=True)
        for stale in folder.glob("costlab-sqlite-tmpl-*.sqlite3"):
            try:  # another checkout's key may still be in use today: only old ones go
                if stale != path and time.time() - stale.stat().st_mtime > SQLITE_STALE_S:
                    stale.unlink()
            except OSError:
                pass
    return path


def copy_sqlite_template(var_dir: Path) -> Path:
    """The migrated SQLite template copied into `var_dir` (made if need be), as the embedded
    default's database."""
    var_dir.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(sqlite_template(), var_dir / SQLITE_FILE))
