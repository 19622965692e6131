"""A running run's control thread hears a cancel as it is committed (Redis pub/sub), not at its next
heartbeat: here the heartbeat is 30 s away, so only the push can stop it in time."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.billing.services import _budget_step
from apps.core.notify import RUN_CANCELS
from apps.experiments.models import Run
from apps.experiments.services import run_cancel, runs_cancel
from apps.tenants.models import Tenant
from tests.factories import RunFactory
from tests.helpers import wait_for
from workers import training

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

OWNER = "test-owner"


@pytest.fixture
def slow_heartbeat(monkeypatch):
    monkeypatch.setattr(training, "HEARTBEAT_S", 30.0)


def running_run(**fields) -> Run:
    return RunFactory(
        status=Run.Status.RUNNING,
        kind=Run.Kind.WORKER,
        lease_owner=OWNER,
        lease_expires_at=timezone.now() + timedelta(minutes=5),
        **fields,
    )


def control_of(run: Run) -> training.RunControl:
    control = training.RunControl(
        run_id=run.pk, owner=OWNER, arm_id=run.arm_id, revision=run.arm.revision, config=None
    )
    assert control._stop_listening, "push notifications are off: REDIS_URL is not set"
    return control


def subscribed(count: int) -> None:
    """Wait until Redis has `count` subscribers on the cancel channel (SUBSCRIBE is not awaited)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        wait_for(
            lambda: dict(client.pubsub_numsub(RUN_CANCELS)).get(RUN_CANCELS.encode(), 0) >= count,
            5,
            "the subscriptions",
            poll_s=0.02,
        )
    finally:
        client.close()


def test_a_cancel_reaches_the_running_run_before_its_next_heartbeat(slow_heartbeat):
    run, other = running_run(), running_run()
    control, bystander = control_of(run), control_of(other)
    subscribed(2)
    try:
        run_cancel(run=run)
        assert control.stop_requested.wait(5), "the cancel waited for the 30 s heartbeat"
        assert not bystander.stop_requested.wait(1), "a cancel stopped another run"
        with transaction.atomic():  # a bulk cancel: one message for every run it stops
            cancelled = runs_cancel(experiment=other.experiment)
        assert cancelled.stopping == [other.pk]
        assert bystander.stop_requested.wait(5), "the bulk cancel waited for the heartbeat"
    finally:
        control.close()
        bystander.close()


def test_a_spent_budget_reaches_every_running_run_before_its_next_heartbeat(slow_heartbeat):
    run = running_run()
    control = control_of(run)
    subscribed(1)
    try:
        with transaction.atomic():  # as the budget check calls it; the push goes at the commit
            _budget_step(
                tenant=run.tenant,
                month=timezone.now().date().replace(day=1),
                state=Tenant.BudgetState.EXCEEDED,
                spent=Decimal(100),
                budget=Decimal(100),
            )
        assert control.stop_requested.wait(5), "the budget's stop waited for the heartbeat"
    finally:
        control.close()
