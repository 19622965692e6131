"""`make run`'s supervised stack on the embedded default: the embedded Redis, web, workers and beat
come up together, a worker answers a ping over Redis, killing the web server only restarts it, and
Ctrl-C stops every process (a run in training goes back to the queue) and repeats where to sign
in."""

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing

import httpx
import psutil
import pytest

from tests.databases import copy_sqlite_template
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


def runs_where(database, where: str, column: str) -> list:
    """A column of the runs matching `where`, read straight from the stack's SQLite file (the rows
    the ORM reads; no second Django process to start)."""
    with closing(sqlite3.connect(database, timeout=20)) as db:
        return [row[0] for row in db.execute(f"SELECT {column} FROM experiments_run WHERE {where}")]


def test_stack_serves_restarts_a_killed_web_server_and_stops_everything_on_ctrl_c(tmp_path):
    port = free_port()
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.local",
        COSTLAB_VAR_DIR=str(tmp_path / "var"),
        COSTLAB_PORT=str(port),
        # The training worker profiles its device as it starts: in half a second, as the workers
        # that tests start do (tests.helpers.start_worker), not the default two.
        COSTLAB_DEVICE_PROFILE_BUDGET_S="0.5",
    )
    # `make run` migrates first: on a copy of the migrated template (tests/databases.py), as on a
    # database a first `make run` left, so there is nothing left to apply.
    database = copy_sqlite_template(tmp_path / "var")
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

        in_training = []
        for _ in range(120):
            in_training = runs_where(database, "status = 'running'", "id")
            if in_training:
                break
            time.sleep(0.5)
        assert in_training, "no demo run started training"

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
        after = runs_where(database, f"id IN ({', '.join(map(str, in_training))})", "status")
        assert after == ["queued"], after
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in descendants:
            if p.is_running():
                p.kill()
