"""Helpers for tests that run the project as a separate process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICE_VARS = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DJANGO_SECRET_KEY")


def clean_env(**overrides: str) -> dict[str, str]:
    """The current environment without service settings, plus overrides."""
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARS and k != "DJANGO_SETTINGS_MODULE"}
    env.update(overrides)
    return env


def run_python(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
