"""The beat path on a real Celery worker: the tick task freezes an arm, the commit queues the
alert task, the worker POSTs it to a local receiver once."""

import time

import pytest

from apps.alerts.models import AlertChannel, AlertDelivery
from apps.attribution.models import FreezeEvent
from apps.experiments.models import Arm
from config.celery_app import app
from tests.apps.attribution.lab import Lab
from tests.apps.attribution.receiver import webhook_receiver
from tests.workers.test_runs_on_a_worker import wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_the_tick_on_a_worker_freezes_and_the_receiver_gets_one_alert(celery_worker_process):
    with webhook_receiver() as receiver:
        lab = Lab({"control": 1.0, "b": 1.25}, runs_per_arm=9, seed=70, dynamic_weights=False)
        AlertChannel.objects.create(
            tenant=lab.experiment.tenant, name="hooks", webhook_url=receiver.url
        )
        lab.run_ticks(
            3
        )  # 9 runs per arm: one run short of the evidence minimum (COSTLAB_CS_MIN_RUNS)
        assert lab.arm("b").state == Arm.State.ACTIVE
        for arm in ("control", "b"):
            lab.add_run(lab.arms[arm])
        lab.step()
        app.send_task("costlab.attribution_tick")  # what beat sends
        wait_for(
            lambda: lab.arm("b").state == Arm.State.FROZEN, 60, "the worker's tick to freeze b"
        )
        alerts = receiver.wait_for(1, timeout_s=30)
        time.sleep(1.0)  # anything extra would have arrived by now
        assert len(receiver.requests) == 1 and len(alerts) == 1
        assert (
            alerts[0]["body"]["event"] == "arm_freeze" and alerts[0]["body"]["arm"]["name"] == "b"
        )
        assert alerts[0]["body"]["event_id"] == FreezeEvent.objects.get(arm=lab.arms["b"]).pk
        assert AlertDelivery.objects.get().status == AlertDelivery.Status.SENT
