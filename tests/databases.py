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

Postgres only: on SQLite the test database is migrated as before.
"""

from __future__ import annotations

import fcntl
import hashlib
import tempfile
from contextlib import contextmanager
from pathlib import Path

import django
from django.db import DatabaseError, connections

ROOT = Path(__file__).resolve().parent.parent


def template_key(connection) -> str:
    from datetime import UTC, datetime

    digest = hashlib.sha256()
    # constraints.txt pins the third-party apps whose migrations run too (Celery beat, knox, axes)
    for path in [*sorted(ROOT.glob("apps/*/migrations/*.py")), ROOT / "constraints.txt"]:
        if path.exists():
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    digest.update(django.get_version().encode())
    with connection._nodb_cursor() as cursor:
        cursor.execute("SHOW server_version_num")
        digest.update(cursor.fetchone()[0].encode())
    digest.update(datetime.now(UTC).date().isoformat().encode())
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
    return target


def drop_test_database(name: str, alias: str = "default") -> None:
    connection = connections[alias]
    connections.close_all()
    with connection._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {connection.ops.quote_name(name)} WITH (FORCE)")
