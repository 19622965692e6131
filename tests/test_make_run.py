"""`make run`'s launcher on the embedded default: web, worker and beat come up together,
the worker answers a ping over the filesystem broker, and Ctrl-C stops all three."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.helpers import ROOT, clean_env, run_python

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_launcher_serves_admin_answers_ping_and_stops_cleanly_on_ctrl_c(tmp_path):
    port = free_port()
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.local",
        COSTLAB_VAR_DIR=str(tmp_path / "var"),
        COSTLAB_PORT=str(port),
    )
    for args in (["migrate", "--noinput", "-v0"], ["seed_demo"]):
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr

    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{env['PATH']}"
    proc = subprocess.Popen(
        ["bash", str(ROOT / "platform" / "run-local.sh")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/admin/login/", timeout=2).status_code
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert status == 200, "the admin login page never answered"
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()
        assert health["status"] == "ok", health

        pong = run_python(
            "import django; django.setup(); from workers.tasks import ping; print(ping.delay().get(timeout=45))",
            env,
            timeout=90,
        )
        assert pong.stdout.strip().endswith("pong"), pong.stdout + pong.stderr

        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        output, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, output
        assert "costlab: stopped." in output
        time.sleep(0.5)
        assert not group_alive(proc.pid), "a process of the launcher outlived Ctrl-C"
    finally:
        if proc.poll() is None or group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
