"""`costlab submit --wait` rides out a web outage: the web server is killed while the CLI waits,
comes back 8 s later, and the CLI completes with the run's result (it used to give up after
about 4 s: four quick attempts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from apps.api.services import api_token_create
from tests.factories import ArmFactory, ExperimentFactory, GpuPriceFactory
from tests.helpers import ROOT, clean_env
from tests.reliability.private import free_port
from tests.workers.test_runs_on_a_worker import SHORT, wait_for

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def start_web(port: int):
    from django.conf import settings
    from django.db import connection

    db = connection.settings_dict
    env = clean_env(DJANGO_SETTINGS_MODULE="config.settings.test", REDIS_URL=settings.REDIS_URL,
                    DATABASE_URL=f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}")
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "config.wsgi", "-b", f"127.0.0.1:{port}", "-w", "1"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)

    def up():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code in (200, 503)
        except httpx.TransportError:
            return False

    wait_for(up, 60, "the web server to answer")
    return proc


def test_submit_wait_rides_out_a_web_outage(celery_worker_process, tmp_path):
    price = GpuPriceFactory()
    exp = ExperimentFactory(tenant=price.pricing_table.tenant, status="active")
    arm = ArmFactory(experiment=exp, name="control", is_control=True, strategy_yaml=SHORT)
    _token, secret = api_token_create(tenant=exp.tenant, name="ci")
    strategy = tmp_path / "strategy.yaml"
    strategy.write_text(arm.strategy_yaml)
    port = free_port()
    web = start_web(port)
    cli = subprocess.Popen(
        [sys.executable, "-m", "costlab_cli", "submit", "--experiment", str(exp.pk), "--strategy", str(strategy),
         "--wait", "--poll", "0.5", "--retry-for", "60"],
        cwd=ROOT, env=clean_env(COSTLAB_URL=f"http://127.0.0.1:{port}", COSTLAB_TOKEN=secret),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: exp.runs.exists(), 60, "the CLI's submit")
        time.sleep(1)
        os.killpg(web.pid, signal.SIGKILL)  # gunicorn's master and its worker, at once
        web.wait(10)
        time.sleep(8)
        web = start_web(port)
        out, err = cli.communicate(timeout=180)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        try:
            os.killpg(web.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        web.wait()
    assert cli.returncode == 0, (out, err)
    assert "succeeded" in out.splitlines()[-1]
    assert "retrying for up to 60 s (--retry-for)" in err and "reached the site again" in err
