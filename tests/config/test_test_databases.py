"""The test databases are copies of one migrated template (tests/databases.py): this session's
database is one, and the template is used only while its key matches the migrations."""

import pytest
from django.db import connection

from tests import databases

pytestmark = [pytest.mark.services, pytest.mark.django_db]


def test_this_sessions_database_is_a_copy_of_the_current_template(_test_database_from_template):
    if connection.vendor != "postgresql":
        pytest.skip("templates are made on Postgres only")
    if not _test_database_from_template:
        pytest.skip("--reuse-db keeps the database it finds: no template is copied")
    key = databases.template_key(connection)
    with connection.cursor() as cursor:
        cursor.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", ["%\\_tmpl\\_%"])
        templates = {name for (name,) in cursor.fetchall()}
        cursor.execute("SELECT count(*) FROM django_migrations")
        applied = cursor.fetchone()[0]
    assert any(name.endswith(f"_tmpl_{key}") for name in templates), (key, templates)
    assert applied >= len(list(databases.ROOT.glob("apps/*/migrations/0*.py")))


def test_a_changed_migration_or_pin_changes_the_key(tmp_path, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("templates are made on Postgres only")
    migration = tmp_path / "apps" / "things" / "migrations" / "0001_initial.py"
    migration.parent.mkdir(parents=True)
    migration.write_text("operations = []\n")
    monkeypatch.setattr(databases, "ROOT", tmp_path)
    first = databases.template_key(connection)
    assert databases.template_key(connection) == first
    migration.write_text("operations = ['one more']\n")
    second = databases.template_key(connection)
    assert second != first
    (tmp_path / "constraints.txt").write_text("django-celery-beat==2.8.1\n")  # a third-party app
    assert databases.template_key(connection) != second


@pytest.mark.slow  # makes the template with `manage.py migrate` where this session has none yet
def test_the_sqlite_template_is_migrated_and_named_by_the_current_key():
    """The SQLite database the embedded-default tests copy (`make run`'s drill, the soak smoke):
    every migration applied, and the file named by today's key of the migrations."""
    import sqlite3
    from contextlib import closing

    path = databases.sqlite_template()
    assert (
        path.name
        == f"costlab-sqlite-tmpl-{databases._migrations_digest().hexdigest()[:10]}.sqlite3"
    )
    with closing(sqlite3.connect(path)) as db:
        applied = {tuple(row) for row in db.execute("SELECT app, name FROM django_migrations")}
    ours = {(p.parent.parent.name, p.stem) for p in databases.ROOT.glob("apps/*/migrations/0*.py")}
    assert ours <= applied, sorted(ours - applied)
