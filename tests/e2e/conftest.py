"""Real-browser tests: Debian's Chromium driven by Playwright (sync API) through its executable
path.

No `playwright install`: the browser is the system's /usr/bin/chromium (or $COSTLAB_CHROMIUM).
Without it these tests skip with the reason, except under CI=true, where they fail.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.conftest import IN_CI

CHROMIUM = Path(os.environ.get("COSTLAB_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"


def charts_drawn(at_least: int, scope: str = "") -> str:
    """JavaScript, true once the page has at least `at_least` charts (`.chart` under `scope`) and
    every one of them is drawn. Charts are drawn after the load event, one per task, those in view
    first (dashboard/lazy.js): the load event says nothing about them."""
    selector = f"{scope} .chart".strip()
    return (
        f"() => {{ const c = [...document.querySelectorAll('{selector}')]; "
        f"return c.length >= {at_least} && c.every(el => el.querySelector('.main-svg')); }}"
    )


def wait_for_charts(page, at_least: int, scope: str = "") -> None:
    page.wait_for_function(charts_drawn(at_least, scope), timeout=20_000)


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        message = (
            f"needs Chromium at {CHROMIUM} (apt-get install chromium, or set COSTLAB_CHROMIUM)"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in the test's thread; the ORM calls the tests make
    # between browser steps are still synchronous, so Django's async guard must stand aside, for
    # the browser tests only (and never in a deployment: `check --deploy` refuses it).
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
            )
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser):
    context = browser.new_context(
        viewport={"width": 1400, "height": 1000}, locale="en-US", timezone_id="UTC"
    )
    page = context.new_page()
    page.set_default_timeout(10_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.js_errors = errors
    yield page
    context.close()
    server_requests_finished()


def server_requests_finished(timeout_s: float = 15.0) -> None:
    """Wait until no other session on this test's database runs a statement or holds a
    transaction open: the live server may still be answering a request the page made before it
    closed (a poll, a chart's data), and the transactional test's flush (TRUNCATE of every table)
    would deadlock against its locks. Postgres only; a test without database access has no flush."""
    from django.db import connection

    try:
        if connection.vendor != "postgresql":
            return
        deadline = time.monotonic() + timeout_s
        with connection.cursor() as cursor:
            while True:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                    " AND state IS NOT NULL AND state <> 'idle'"
                )
                if cursor.fetchone()[0] == 0 or time.monotonic() > deadline:
                    return
                time.sleep(0.05)
    except RuntimeError:  # pytest-django: this test may not touch the database
        return


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS
