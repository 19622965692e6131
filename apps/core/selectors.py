"""Read-only checks of the platform's own dependencies."""

from __future__ import annotations

from celery import current_app as celery_app
from django.db import connection


def database_reachable() -> tuple[bool, str]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:  # any driver error means "down"; the text says why
        return False, f"{type(exc).__name__}: {exc}".strip()[:300]
    return True, connection.vendor


def broker_reachable(timeout_s: float = 2.0) -> tuple[bool, str]:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(
                max_retries=1, interval_start=0, interval_step=0, timeout=timeout_s
            )
            transport = conn.transport_cls
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}".strip()[:300]
    return True, str(transport)


def system_health() -> dict:
    db_ok, db_detail = database_reachable()
    broker_ok, broker_detail = broker_reachable()
    return {
        "status": "ok" if db_ok and broker_ok else "degraded",
        "database": {"ok": db_ok, "detail": db_detail},
        "broker": {"ok": broker_ok, "detail": broker_detail},
    }
