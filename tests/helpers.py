"""Helpers for tests that run the project as a separate process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICE_VARS = (
    "DATABASE_URL",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "CELERY_RESULT_BACKEND",
    "DJANGO_SECRET_KEY",
    "DJANGO_ALLOW_ASYNC_UNSAFE",
    "COSTLAB_EMBEDDED_REDIS",
)


def clean_env(**overrides: str) -> dict[str, str]:
    """The current environment without service settings, plus overrides."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in SERVICE_VARS and k != "DJANGO_SETTINGS_MODULE"
    }
    env.update(overrides)
    return env


def installed_tool(env_var: str, command: str) -> Path | None:
    """A tool installed beside this project (in an environment of its own): $`env_var`, else
    `command` on the PATH, resolved through links (its environment's python sits beside the real
    script); None where neither is set."""
    import shutil

    named = os.environ.get(env_var) or shutil.which(command)
    return Path(named).resolve() if named else None


def run_python(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_worker(
    *,
    lease_s: float | None = None,
    queues: str = "default,cpu,gpu,alerts",
    pool: str = "prefork",
    concurrency: int = 1,
    beat: bool = False,
    **extra_env: str,
):
    """Start a real Celery worker on the test database and broker;
    return (process, name) once it answers.

    Prefork with one child, as deployed: the main process keeps answering control pings while
    the child trains. The worker leads its own process group, so a test can kill it whole.
    DATABASE_URL / REDIS_URL / CELERY_BROKER_URL in extra_env point it at private servers; beat=True
    embeds beat (-B).
    """
    import time
    import uuid

    from django.conf import settings

    from config.celery_app import app as celery_app

    database_url = db_url_for_subprocesses()
    name = f"test-{uuid.uuid4().hex[:8]}@localhost"
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.test",
        DATABASE_URL=database_url,
        REDIS_URL=settings.REDIS_URL,
    )
    if lease_s is not None:
        env["COSTLAB_RUN_LEASE_S"] = str(lease_s)
    # Device profiles in half a second: the verdicts stand at this budget, and workers start often;
    # not at start (a process that imports torch again), unless a test asks: a run measures its
    # device itself when none is recorded (workers.devices.run_profile).
    env.setdefault("COSTLAB_DEVICE_PROFILE_BUDGET_S", "0.5")
    env.setdefault("COSTLAB_DEVICE_PROFILE_AT_START", "false")
    env.update(extra_env)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config.celery_app",
            "worker",
            "--pool",
            pool,
            "--concurrency",
            str(concurrency),
            "--queues",
            queues,
            "--hostname",
            name,
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "WARNING",
            *(["-B"] if beat else []),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    pinger = celery_app
    broker = env.get("CELERY_BROKER_URL") or env["REDIS_URL"]
    if broker != settings.REDIS_URL:
        from celery import Celery

        pinger = Celery("costlab-test-ping", broker=broker, set_as_current=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"celery worker exited at start with status {proc.returncode}")
        if pinger.control.ping(destination=[name], timeout=1.0):
            return proc, name
    proc.kill()
    raise RuntimeError("celery worker did not answer a ping within 60 s")


def stop_worker(proc) -> None:
    import os
    import signal

    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of the group is left, children included
    except ProcessLookupError:
        pass
    proc.wait()


def purge_run_queues() -> None:
    """Drop messages waiting on costlab's queues of the test broker
    (run ids restart per test DB)."""
    from django.conf import settings

    if not settings.REDIS_URL:
        return
    from apps.core.queues import CeleryQueue
    from config.celery_app import app

    with app.connection_for_write() as conn:
        for queue in CeleryQueue:
            try:
                conn.default_channel.queue_purge(queue.value)
            except Exception:  # the queue was never declared
                continue


def db_url_for_subprocesses() -> str:
    from django.db import connection

    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def start_web(port: int, **extra_env: str):
    """gunicorn serving the project on the test database and broker (or extra_env's),
    once it answers."""
    import time

    import httpx
    from django.conf import settings

    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.test",
        REDIS_URL=settings.REDIS_URL,
        DATABASE_URL=db_url_for_subprocesses(),
        **extra_env,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "config.wsgi", "-b", f"127.0.0.1:{port}", "-w", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited at start with status {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code in (200, 503):
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    stop_group(proc)
    raise RuntimeError("the web server did not answer within 60 s")


def stop_group(proc) -> None:
    """SIGKILL a process started with start_new_session=True, and all of its children."""
    import os
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.1):
    """predicate()'s first truthy value, polled until timeout_s;
    an AssertionError naming `what` after."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def rank_processes(root: int | None = None) -> list:
    """The DDP ranks below a process (default this one), however they were started
    (gpu_runtime.distributed._rank_entry): a new interpreter running gpu_runtime.rank, or a process
    forked from a rank forkserver, which shares their command line and stays between launches,
    so it is not one of them."""
    import psutil

    def forkserver(p) -> bool:
        return "multiprocessing.forkserver" in " ".join(p.cmdline())

    out = []
    for child in psutil.Process(root).children(recursive=True):
        try:
            if not any("gpu_runtime.rank" in part for part in child.cmdline()):
                continue
            parent = child.parent()
            if forkserver(child) and not (parent is not None and forkserver(parent)):
                continue  # the server itself
            out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out
