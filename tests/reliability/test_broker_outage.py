"""A private Redis killed (kill -9) with runs queued and one running, with and without persistence:
every submitted run ends succeeded, trained once; none stuck, none lost. A submit while Redis is
down answers 201 at once and its run trains once Redis is back.

Before the fix a committed run whose message never left stayed `queued` forever, a Redis restart
without persistence lost the queued runs outright, and a submit during the outage hung 20 s and
failed with "Retry limit exceeded".
"""

from __future__ import annotations

import time

import pytest
from django.db.models import Max

from apps.experiments.models import Run
from apps.experiments.services import run_submit
from config.celery_app import app as celery_app
from tests.apps.api.conftest import token_client
from tests.factories import ArmFactory, ExperimentFactory, GpuPriceFactory
from tests.helpers import start_worker, stop_worker
from tests.reliability.private import PrivateRedis
from tests.workers.test_runs_on_a_worker import wait_for

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STEPS, BATCH, SEQ = 20, 2, 32
STRATEGY = f"""\
model: {{preset: tiny, seq_len: {SEQ}}}
data: {{source: synthetic}}
train: {{steps: {STEPS}, global_batch: {BATCH}, seed: 2}}
telemetry: {{interval_s: 0.2}}
"""


@pytest.fixture
def broker(request):
    """This test's private Redis, as the broker of this process and of the worker."""
    redis = PrivateRedis(persistent=request.param)
    original = celery_app.conf.broker_url
    celery_app.conf.broker_url = redis.url
    try:
        yield redis
    finally:
        celery_app.conf.broker_url = original
        redis.close()


@pytest.mark.parametrize("broker", [False, True], ids=["no-persistence", "append-only"], indirect=True)
def test_a_redis_crash_loses_no_run_and_a_submit_during_it_answers_201(broker):
    price = GpuPriceFactory()
    tenant = price.pricing_table.tenant
    tenant.max_concurrent_runs = 10
    tenant.save()
    exp = ExperimentFactory(tenant=tenant, status="active")
    ArmFactory(experiment=exp, name="control", is_control=True, strategy_yaml=STRATEGY)
    worker, _ = start_worker(beat=True, REDIS_URL=broker.url, COSTLAB_RUN_RESEND_AFTER_S="3",
                             COSTLAB_RUN_RECONCILE_S="1")
    try:
        first = [run_submit(experiment=exp, run_key=f"before-{i}") for i in range(3)]
        wait_for(lambda: Run.objects.filter(pk__in=[r.pk for r in first], status="running",
                                            samples__isnull=False).exists(), 120, "one run training")
        assert Run.objects.filter(pk__in=[r.pk for r in first], status="queued").count() >= 1

        broker.kill()
        asked = time.monotonic()
        response = token_client(tenant).post("/api/v1/runs/", {"experiment": exp.pk, "run_key": "during"},
                                             format="json")
        took = time.monotonic() - asked
        assert response.status_code == 201, response.content
        assert response.json()["status"] == "queued" and took < 5, f"submit took {took:.1f} s"
        during = Run.objects.get(pk=response.json()["id"])
        assert during.sent_at is None  # nothing reached the broker: the reconciler owes it a send

        time.sleep(3)
        broker.start()  # empty without persistence; with it, the queued messages come back
        ids = [r.pk for r in first] + [during.pk]
        wait_for(lambda: not Run.objects.filter(pk__in=ids, status__in=Run.ACTIVE_STATUSES).exists(), 300,
                 "every run to end")
    finally:
        stop_worker(worker)
    ended = list(Run.objects.filter(pk__in=ids).order_by("pk"))
    assert [r.status for r in ended] == ["succeeded"] * 4, [(r.pk, r.status, r.error) for r in ended]
    for run in ended:
        assert run.steps == STEPS and run.tokens == STEPS * BATCH * SEQ  # trained once, billed once
        assert run.samples.aggregate(m=Max("attempt"))["m"] == run.attempts
        assert run.sends >= 1
