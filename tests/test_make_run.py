"""`make run`'s supervised stack on the embedded default: the embedded Redis, web, workers and beat
come up together, a worker answers a ping over Redis, killing the web server only restarts it, and
Ctrl-C stops every process (a run in training goes back to the queue) and repeats where to sign
in."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from tests.helpers import ROOT, clean_env, run_python

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, seconds: float, proc) -> int | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            return httpx.get(url, timeout=2).status_code
        except httpx.HTTPError:
            time.sleep(0.3)
    return None


def test_stack_serves_restarts_a_killed_web_server_and_stops_everything_on_ctrl_c(tmp_path):
    port = free_port()
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.local",
        COSTLAB_VAR_DIR=str(tmp_path / "var"),
        COSTLAB_PORT=str(port),
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr

    proc = subprocess.Popen(
        ["bash", str(ROOT / "platform" / "run-local.sh"), "--submit-runs", "1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    descendants: list[psutil.Process] = []
    try:
        assert wait_for(f"http://127.0.0.1:{port}/admin/login/", 60, proc) == 200, (
            "the admin never answered"
        )
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()
        assert health["status"] == "ok", health

        pong = run_python(
            "import django; django.setup(); from workers.tasks import ping; "
            "print(ping.delay().get(timeout=45))",
            env,
            timeout=90,
        )
        assert pong.stdout.strip().endswith("pong"), pong.stdout + pong.stderr

        supervisor = psutil.Process(proc.pid)
        children = supervisor.children()
        names = " ".join(" ".join(c.cmdline()) for c in children)
        assert "redis-server" in names and "runserver" in names and names.count(" worker ") == 3, (
            names
        )
        descendants = supervisor.children(recursive=True)
        web = next(c for c in children if "runserver" in " ".join(c.cmdline()))
        others = [c for c in children if c.pid != web.pid]
        web.kill()
        web.wait(5)
        assert wait_for(f"http://127.0.0.1:{port}/admin/login/", 30, proc) == 200, (
            "web was not restarted"
        )
        assert proc.poll() is None and all(c.is_running() for c in others), (
            "killing web took others down"
        )
        descendants += supervisor.children(recursive=True)

        running = run_python(
            "import django, time; django.setup(); from apps.experiments.models import Run\n"
            "for _ in range(120):\n"
            "    if Run.objects.filter(status='running').exists(): break\n"
            "    time.sleep(0.5)\n"
            "print(list(Run.objects.filter(status='running').values_list('pk', flat=True)))",
            env,
            timeout=90,
        )
        in_training = json.loads(running.stdout.strip().splitlines()[-1])
        assert in_training, "no demo run started training: " + running.stderr

        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, output
        assert "web: exited with status -9" in output and "restarting in" in output
        assert "costlab: stopped." in output
        # The sign-in banner comes after the start-up output, not buried under it.
        assert output.index("costlab is up.") > output.rindex(" ready.")
        assert "sign in as 'admin', password " in output[output.index("costlab is up.") :]
        closing = output[output.index("costlab: stopped.") :]
        assert f"http://127.0.0.1:{port}/admin/" in closing and "changepassword admin" in closing
        # The password once (the stop banner points back to it), and a clean stop reads clean.
        shown = re.search(r"password (\S+) \(shown only this time", output)
        assert shown and output.count(shown.group(1)) == 1, output[-3000:]
        assert "shown when it started" in closing
        stopping = output[output.index("costlab: stopping") :]
        assert "Traceback" not in stopping and "WorkerLostError" not in stopping, stopping
        time.sleep(0.5)
        left = [p.pid for p in descendants if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not left, f"processes outlived Ctrl-C: {left}"
        after = run_python(
            "import django; django.setup(); from apps.experiments.models import Run; "
            f"print(list(Run.objects.filter(pk__in={in_training})"
            ".values_list('status', flat=True)))",
            env,
        )
        assert json.loads(after.stdout.strip().splitlines()[-1].replace("'", '"')) == ["queued"], (
            after.stdout
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in descendants:
            if p.is_running():
                p.kill()
