"""Suite-wide fixtures and the rule for real services.

Postgres and Redis are used when reachable (config.settings.test decides). Tests
marked `services` need both: without them they are skipped with the reason, except
under CI=true, where a missing service fails the run.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import tempfile

import pytest
from django.conf import settings

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# One torch (OpenMP/MKL) thread per process, inherited by every worker, rank and benchmark a test
# starts: three xdist workers and their processes share two cores, where a second thread per process
# only oversubscribes them (and spins while it waits). Tests about threads set their own counts.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# The compile payback rule's ledger and torch's compiled graphs: this session's own, never the
# user's cache directory (a test about them sets its own).
os.environ.setdefault("COSTLAB_COMPILE_CACHE_DIR", tempfile.mkdtemp(prefix="costlab-compile-"))


def services_missing() -> list[str]:
    # A URL that is configured but does not answer says so first (config.settings.test dropped it).
    missing = list(getattr(settings, "COSTLAB_TEST_UNREACHABLE", []))
    configured = " ".join(missing)
    if not getattr(settings, "USING_POSTGRES", False) and "DATABASE_URL" not in configured:
        missing.append("Postgres (set DATABASE_URL or run one on 127.0.0.1:5432)")
    if not settings.REDIS_URL and "REDIS_URL" not in configured:
        missing.append("Redis (set REDIS_URL or run one on 127.0.0.1:6379)")
    return missing


def pytest_configure(config):
    missing = services_missing()
    if IN_CI and missing:
        raise pytest.UsageError("CI=true but these services are unreachable: " + "; ".join(missing))


def pytest_report_header(config):
    missing = services_missing()
    if missing:
        return ["services: tests marked `services` are skipped: " + "; ".join(missing)]
    return []


def pytest_collection_modifyitems(config, items):
    # (`cuda` tests skip without a device in tests/gpu_runtime/conftest.py: bench/gpu_check.sh runs
    # them with that conftest alone.)
    missing = services_missing()
    for item in items:
        if missing and item.get_closest_marker("services"):
            item.add_marker(pytest.mark.skip(reason="needs a real service: " + "; ".join(missing)))


@pytest.fixture(autouse=True)
def processes_only_in_slow_tests(request, monkeypatch):
    """A test that starts a process (a worker, a server, a benchmark, a git or compose command) is
    marked `slow`, so `make test-fast` stays an edit loop: an unmarked one fails here, naming it."""
    if request.node.get_closest_marker("slow"):
        return

    def refused(*args, **kwargs):
        pytest.fail(
            f"{request.node.nodeid} starts a process: mark it `slow` (make test-fast leaves out "
            "every test that starts one)",
            pytrace=False,
        )

    if "celery_worker_process" in request.fixturenames:  # started before this fixture runs
        refused()
    monkeypatch.setattr(subprocess.Popen, "_execute_child", refused)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refused)


@pytest.fixture(scope="session")
def _test_database_from_template(request, django_db_modify_db_settings, django_db_blocker):
    """On Postgres, this session's test database is a copy of one migrated template
    (tests/databases.py), not migrated again by every xdist worker. Not with --reuse-db (the kept
    database is used) or --no-migrations."""
    from tests.databases import copy_test_database_from_template, drop_test_database

    option = request.config.getvalue
    if (option("reuse_db") and not option("create_db")) or option("nomigrations"):
        yield False
        return
    with django_db_blocker.unblock():
        copied = copy_test_database_from_template()
    yield copied is not None
    if copied is not None:
        with django_db_blocker.unblock():
            drop_test_database(copied)


@pytest.fixture(scope="session")
def django_db_keepdb(django_db_keepdb, _test_database_from_template):
    # A copied database is kept by pytest-django's setup (which then only checks its migrations);
    # the fixture above drops it at the end.
    return django_db_keepdb or _test_database_from_template


@pytest.fixture(scope="session")
def django_db_createdb(django_db_createdb, _test_database_from_template):
    return django_db_createdb and not _test_database_from_template


@pytest.fixture(scope="session", autouse=True)
def empty_test_queues():
    """Run ids restart with every test database: a message left by an earlier session must not
    reach this session's runs. Purges only costlab's queues on the test broker."""
    from tests.helpers import purge_run_queues

    purge_run_queues()


@pytest.fixture(scope="module")
def celery_worker_process(django_db_setup, django_db_blocker):
    """A real Celery worker in its own process, on the test broker and the test database.

    Module-scoped, so a module that kills workers on purpose can start its own.
    Tests that use it must commit what the worker should see (transactional_db).
    """
    from tests.helpers import start_worker, stop_worker

    missing = services_missing()
    if missing:
        pytest.skip("a real worker needs: " + "; ".join(missing))
    proc, name = start_worker()
    yield name
    stop_worker(proc)
