"""`costlab submit --wait` rides out a web outage: the web server is killed while the CLI waits,
comes back 8 s later, and the CLI completes with the run's result (it used to give up after
about 4 s: four quick attempts)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from apps.api.services import api_token_create
from tests.factories import ArmFactory, ExperimentFactory, GpuPriceFactory
from tests.helpers import ROOT, clean_env, start_web, stop_group
from tests.reliability.private import free_port
from tests.workers.test_runs_on_a_worker import SHORT, wait_for

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


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
        [
            sys.executable,
            "-m",
            "costlab_cli",
            "submit",
            "--experiment",
            str(exp.pk),
            "--strategy",
            str(strategy),
            "--wait",
            "--poll",
            "0.5",
            "--retry-for",
            "60",
        ],
        cwd=ROOT,
        env=clean_env(COSTLAB_URL=f"http://127.0.0.1:{port}", COSTLAB_TOKEN=secret),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: exp.runs.exists(), 60, "the CLI's submit")
        time.sleep(1)
        stop_group(web)  # gunicorn's master and its worker, at once
        time.sleep(8)
        web = start_web(port)
        out, err = cli.communicate(timeout=180)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        stop_group(web)
    assert cli.returncode == 0, (out, err)
    assert "succeeded" in out.splitlines()[-1]
    assert "retrying for up to 60 s (--retry-for)" in err and "reached the site again" in err
