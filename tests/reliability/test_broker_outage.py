"""A private Redis killed (kill -9) with runs queued and one running, with and without persistence:
every submitted run ends succeeded, trained once; none stuck, none lost. A submit while Redis is
down answers 201 at once and its run trains once Redis is back.

Before the fix a committed run whose message never left stayed `queued` forever, a Redis restart
without persistence lost the queued runs outright, and a submit during the outage hung 20 s and
failed with "Retry limit exceeded".
"""

from __future__ import annotations

import time

import httpx
import pytest
from django.db.models import Max

from apps.api.services import api_token_create
from apps.experiments.models import Run
from tests.factories import ArmFactory, ExperimentFactory, GpuPriceFactory
from tests.helpers import start_web, start_worker, stop_group, stop_worker
from tests.reliability.private import PrivateRedis, free_port
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
    """This test's private Redis, as the broker of the worker, beat and the web server."""
    redis = PrivateRedis(persistent=request.param)
    try:
        yield redis
    finally:
        redis.close()


@pytest.mark.parametrize(
    "broker", [False, True], ids=["no-persistence", "append-only"], indirect=True
)
def test_a_redis_crash_loses_no_run_and_a_submit_during_it_answers_201(broker):
    price = GpuPriceFactory()
    tenant = price.pricing_table.tenant
    tenant.max_concurrent_runs = 10
    tenant.save()
    exp = ExperimentFactory(tenant=tenant, status="active")
    ArmFactory(experiment=exp, name="control", is_control=True, strategy_yaml=STRATEGY)
    _token, secret = api_token_create(tenant=tenant, name="ci")
    # Cache and results stay on the suite's Redis: only the broker goes down.
    on_private = {"CELERY_BROKER_URL": broker.url}
    port = free_port()
    web = start_web(port, **on_private)
    worker, _ = start_worker(
        beat=True, COSTLAB_RUN_RESEND_AFTER_S="3", COSTLAB_RUN_RECONCILE_S="1", **on_private
    )
    api = httpx.Client(
        base_url=f"http://127.0.0.1:{port}/api/v1/",
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    )

    def submit(key):
        return api.post("runs/", json={"experiment": exp.pk, "run_key": key})

    try:
        first = [submit(f"before-{i}").json()["id"] for i in range(3)]
        # One state, read at once: a run has trained (the worker works) while another still waits
        # in the queue (the crash hits queued messages). Two reads raced a fast worker: between
        # them the second run could end and the third start.
        wait_for(
            lambda: (
                Run.objects.filter(pk__in=first, samples__isnull=False).exists()
                and Run.objects.filter(pk__in=first, status="queued").exists()
            ),
            120,
            "one run training while another is queued",
        )

        broker.kill()
        asked = time.monotonic()
        response = submit("during")
        took = time.monotonic() - asked
        assert response.status_code == 201, response.text
        assert response.json()["status"] == "queued" and took < 5, f"submit took {took:.1f} s"
        during = Run.objects.get(pk=response.json()["id"])
        assert during.sent_at is None  # nothing reached the broker: the reconciler owes it a send

        time.sleep(3)
        broker.start()  # empty without persistence; with it, the queued messages come back
        ids = [*first, during.pk]
        wait_for(
            lambda: not Run.objects.filter(pk__in=ids, status__in=Run.ACTIVE_STATUSES).exists(),
            300,
            "every run to end",
        )
    finally:
        api.close()
        stop_worker(worker)
        stop_group(web)
    ended = list(Run.objects.filter(pk__in=ids).order_by("pk"))
    assert [r.status for r in ended] == ["succeeded"] * 4, [
        (r.pk, r.status, r.error) for r in ended
    ]
    for run in ended:
        assert run.steps == STEPS and run.tokens == STEPS * BATCH * SEQ  # trained once, billed once
        assert run.samples.aggregate(m=Max("attempt"))["m"] == run.attempts
        assert run.sends >= 1
