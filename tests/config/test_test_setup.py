"""`make test` tells the truth about its services: a configured DATABASE_URL / REDIS_URL that
does not answer skips the tests that need it with one message naming it (no errors), and under
CI=true stops the run at once with that message. Tests keep their state out of make run's var/."""

import subprocess
import sys
import time

import pytest
from django.conf import settings

from tests.helpers import ROOT, clean_env

pytestmark = pytest.mark.slow  # each test starts pytest in a process

UNREACHABLE = {
    "DATABASE_URL": "postgres://someone:secret@127.0.0.1:1/costlab",
    "REDIS_URL": "redis://127.0.0.1:1/0",
}
# One test that needs the services, and one that does not.
SELECTION = ["tests/reliability/test_attribution_worker.py", "tests/apps/core/test_local_stack.py"]


def pytest_run(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *SELECTION],
        cwd=ROOT,
        env=clean_env(COSTLAB_VAR_DIR=str(tmp_path), **UNREACHABLE, **env),
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_unreachable_configured_urls_skip_with_one_message(tmp_path):
    out = pytest_run(tmp_path, CI="")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "error" not in text.lower().split("short test summary")[0], text
    header = [line for line in text.splitlines() if line.startswith("services:")]
    assert header == [
        "services: tests marked `services` are skipped: "
        "DATABASE_URL is set (127.0.0.1:1) but nothing "
        "answers there; REDIS_URL is set (127.0.0.1:1) but nothing answers there"
    ], text
    assert "secret" not in text  # the password in the URL is never shown
    assert " skipped" in text and " passed" in text


def test_under_ci_unreachable_urls_fail_at_once(tmp_path):
    started = time.monotonic()
    out = pytest_run(tmp_path, CI="true")
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert (
        "CI=true but these services are unreachable: DATABASE_URL is set (127.0.0.1:1)" in text
    ), text
    assert " passed" not in text and time.monotonic() - started < 60


def test_tests_use_their_own_var_directory():
    assert settings.VAR_DIR != ROOT / "var"
    assert settings.VAR_DIR.name == "test" or "test" in str(settings.VAR_DIR)
