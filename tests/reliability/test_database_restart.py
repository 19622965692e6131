"""A Postgres restart under a live run (a private cluster, stopped the hard way): the run ends once,
is billed for one training, and its cost equals a recompute from its stored samples.

Before the fix, the task's main thread kept its connection from claim time: the finish failed on the
dead connection, the run stayed `running` until its lease ran out,
and was trained again from step 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, clean_env, start_worker, stop_worker, wait_for
from tests.reliability.private import PrivatePostgres, PrivateRedis

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STEPS, BATCH, SEQ = 80, 2, 32
STRATEGY = f"""\
model: {{preset: tiny, seq_len: {SEQ}}}
data: {{source: synthetic}}
train: {{steps: {STEPS}, global_batch: {BATCH}, seed: 5}}
telemetry: {{interval_s: 0.2}}
"""

SUBMIT = """
import django, json; django.setup()
from apps.experiments.services import run_submit
from tests.factories import ArmFactory, ExperimentFactory, GpuPriceFactory
price = GpuPriceFactory()
exp = ExperimentFactory(tenant=price.pricing_table.tenant, status="active")
ArmFactory(experiment=exp, name="control", is_control=True, strategy_yaml={strategy!r})
print(json.dumps(run_submit(experiment=exp).pk))
"""

RECOMPUTE = """
import django, json; django.setup()
from apps.experiments.models import Run
from tests.reliability.test_worker_killed import recompute
run = Run.objects.get(pk={run_id})
usage, cost = recompute(run)
print(json.dumps([usage.tokens, cost.total_usd]))
"""


@pytest.fixture
def cluster():
    """A fresh private cluster (the test database's schema) and broker per test."""
    from django.db import connection

    pg = PrivatePostgres()
    redis = PrivateRedis(persistent=False)
    try:
        pg.load_schema_of(connection.settings_dict)
        yield pg, redis
    finally:
        redis.close()
        pg.close()


def _python(code: str, pg, redis) -> subprocess.Popen:
    """`code` in a Django process on the private cluster and broker, started: `_output` waits for
    it. Started while this test does something else (the worker starting, stopping), not before."""
    env = clean_env(
        DJANGO_SETTINGS_MODULE="config.settings.test", DATABASE_URL=pg.url, REDIS_URL=redis.url
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _output(proc: subprocess.Popen, timeout: float = 120) -> str:
    """The last line `proc` printed, once it exited 0."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    return out.strip().splitlines()[-1]


def _row(pg, run_id: int) -> dict:
    cols = ["status", "attempts", "steps", "tokens", "cost_usd", "error"]
    for _ in range(100):  # the cluster may be coming back up
        try:
            (values,) = pg.query(
                f"SELECT {', '.join(cols)} FROM experiments_run WHERE id = %s", run_id
            )
            return dict(zip(cols, values, strict=True))
        except Exception:
            time.sleep(0.2)
    raise AssertionError("the private Postgres did not answer")


def _max_step(pg, run_id: int) -> int:
    try:
        return pg.query(
            "SELECT coalesce(max(step), -1) FROM telemetry_telemetrysample WHERE run_id = %s",
            run_id,
        )[0][0]
    except Exception:
        return -1


@pytest.mark.parametrize("when", ["during training", "at the finish"])
def test_a_postgres_restart_ends_the_run_once_billed_for_one_training(cluster, when):
    pg, redis = cluster
    # The run is submitted while the worker starts (a Django process each): it waits in the queue.
    submit = _python(SUBMIT.format(strategy=STRATEGY), pg, redis)
    # Beat's sweeper runs beside the worker, and the lease outlasts the outage (as 30 s outlasts 10
    # s in production): a run left `running` by a failed finish is swept and trained again,
    # as it was before.
    try:
        worker, _ = start_worker(
            lease_s=12,
            beat=True,
            DATABASE_URL=pg.url,
            REDIS_URL=redis.url,
            COSTLAB_WORKER_DB_RETRY_S="120",
        )
    except BaseException:
        submit.kill()
        submit.wait()
        raise
    try:
        run_id = json.loads(_output(submit))
        if when == "during training":
            wait_for(
                lambda: 5 <= _max_step(pg, run_id) < STEPS // 2, 300, "the run to be a few steps in"
            )
        else:  # the last steps: the run ends while the database is down
            wait_for(lambda: _max_step(pg, run_id) >= STEPS - 12, 400, "the run's last steps")
        pg.restart(down_s=8)
        row = wait_for(
            lambda: (r := _row(pg, run_id))["status"] not in ("queued", "running") and r,
            240,
            "the run to end",
        )
        time.sleep(6)  # a sweep after the end must change nothing
        row = _row(pg, run_id)
        # Priced again from its stored samples, as they stand now, while the worker stops.
        recompute = _python(RECOMPUTE.format(run_id=run_id), pg, redis)
    finally:
        stop_worker(worker)
    tokens, cost_usd = json.loads(_output(recompute))
    assert row["status"] == "succeeded", row["error"]
    assert row["tokens"] == STEPS * BATCH * SEQ and row["steps"] == STEPS  # one training, not two
    attempts = pg.query(
        "SELECT number, outcome FROM experiments_runattempt WHERE run_id = %s ORDER BY number",
        run_id,
    )
    assert attempts == [(1, "succeeded")], attempts
    assert tokens == row["tokens"] and float(row["cost_usd"]) == pytest.approx(cost_usd, abs=2e-6)
