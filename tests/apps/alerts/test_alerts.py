"""Alerts: a local webhook receiver gets exactly one alert per freeze, retried through 500s and
time-outs with backoff; e-mail and a structured log line too; the tick never waits on them.
Budget steps go to the tenant-wide channels (their webhooks: tests/apps/api/test_billing_rules)."""

import hashlib
import hmac
import json
import logging
import time
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.db import IntegrityError, transaction
from django.test import override_settings
from django.urls import reverse

from apps.alerts import services as alerts
from apps.alerts.models import AlertChannel, AlertDelivery
from apps.alerts.services import (
    alert_attempt,
    backoff_s,
    budget_event_record,
    deliveries_requeue_stale,
)
from apps.attribution.models import FreezeEvent
from apps.attribution.services import arm_unfreeze
from apps.experiments.models import Arm
from tests.apps.attribution.lab import Lab
from tests.factories import ExperimentFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db


def lab_with_channel(url="", emails="", secret="", **kwargs):
    lab = Lab({"control": 1.0, "b": 1.25}, seed=40, dynamic_weights=False, **kwargs)
    AlertChannel.objects.create(
        tenant=lab.experiment.tenant,
        experiment=lab.experiment,
        name="team",
        webhook_url=url,
        webhook_secret=secret,
        email_recipients=emails,
    )
    return lab


def tick_until_frozen(lab, capture, limit=30):
    for _ in range(limit):
        lab.step()
        with capture(execute=True):
            if lab.tick().frozen:
                return FreezeEvent.objects.get(arm=lab.arms["b"], action="freeze")
    raise AssertionError("never frozen")


def test_a_freeze_sends_exactly_one_webhook_alert(
    receiver, eager_delivery, django_capture_on_commit_callbacks
):
    lab = lab_with_channel(url=receiver.url)
    event = tick_until_frozen(lab, django_capture_on_commit_callbacks)
    for _ in range(5):  # later ticks do not alert again
        lab.step()
        with django_capture_on_commit_callbacks(execute=True):
            lab.tick()
    assert len(receiver.requests) == 1
    body = receiver.requests[0]["body"]
    assert body["event"] == "arm_freeze" and body["event_id"] == event.pk
    assert body["arm"] == {
        "id": lab.arms["b"].pk,
        "name": "b",
        "state": "frozen",
        "weight": "0.0000",
    }
    assert (
        body["experiment"]["name"] == lab.experiment.name
        and body["tenant"] == lab.experiment.tenant.slug
    )
    assert body["deviation_low"] == event.deviation_low > body["threshold"] == 0.05
    assert body["runs"] == 10 and body["metric"] == "usd_per_mtok" and body["control_value"] > 0
    headers = receiver.requests[0]["headers"]
    assert headers["Content-Type"] == "application/json"
    assert headers["Idempotency-Key"] == f"costlab-alert-{body['delivery_id']}"
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("sent", 1, 200)


def test_an_unfreeze_is_alerted_too(receiver, eager_delivery, django_capture_on_commit_callbacks):
    lab = lab_with_channel(url=receiver.url)
    tick_until_frozen(lab, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        arm_unfreeze(
            arm=lab.arms["b"],
            actor=UserFactory(is_staff=True, username="ops"),
            reason="false alarm",
        )
    assert [r["body"]["event"] for r in receiver.requests] == ["arm_freeze", "arm_unfreeze"]
    assert (
        receiver.requests[1]["body"]["actor"] == "ops"
        and receiver.requests[1]["body"]["reason"] == "false alarm"
    )


@override_settings(COSTLAB_ALERT_BACKOFF_S=2.0)
def test_a_receiver_that_fails_with_500_is_retried_with_backoff_until_it_accepts(
    receiver, eager_delivery, django_capture_on_commit_callbacks
):
    receiver.script = [(500, 0.0), (503, 0.0)]
    lab = lab_with_channel(url=receiver.url)
    tick_until_frozen(lab, django_capture_on_commit_callbacks)
    assert [r["status"] for r in receiver.requests] == [500, 503, 200]
    assert len(receiver.alerts("arm_freeze")) == 1  # accepted exactly once
    assert (
        len({r["headers"]["Idempotency-Key"] for r in receiver.requests}) == 1
    )  # one alert, three tries
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("sent", 3)
    assert [backoff_s(1), backoff_s(2), backoff_s(3)] == [2.0, 4.0, 8.0]


@override_settings(COSTLAB_ALERT_TIMEOUT_S=0.3)
def test_a_receiver_that_times_out_is_retried(
    receiver, django_capture_on_commit_callbacks, monkeypatch
):
    monkeypatch.setattr(alerts, "deliveries_send", lambda **kwargs: None)
    receiver.script = [(200, 1.5)]  # too slow the first time
    lab = lab_with_channel(url=receiver.url)
    tick_until_frozen(lab, django_capture_on_commit_callbacks)
    delivery = AlertDelivery.objects.get()
    first = alert_attempt(delivery_id=delivery.pk)
    assert first.status == "pending" and first.retry_in_s == backoff_s(1)
    assert first.detail.startswith("timeout after 0.3 s")
    second = alert_attempt(delivery_id=delivery.pk)
    assert second.status == "sent" and second.retry_in_s is None
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.status, delivery.last_error) == (2, "sent", "")


@override_settings(COSTLAB_ALERT_MAX_ATTEMPTS=3)
def test_a_receiver_that_keeps_failing_is_recorded_failed_and_the_freeze_stands(
    receiver, eager_delivery, django_capture_on_commit_callbacks, caplog
):
    receiver.script = [(500, 0.0)] * 10
    lab = lab_with_channel(url=receiver.url)
    with caplog.at_level(logging.ERROR, logger="costlab.alerts"):
        tick_until_frozen(lab, django_capture_on_commit_callbacks)
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("failed", 3, 500)
    assert delivery.last_error.startswith("HTTP 500")
    assert len(receiver.requests) == 3
    assert lab.arm("b").state == Arm.State.FROZEN
    assert any("alert_failed" in r.message for r in caplog.records)


def test_a_4xx_is_not_retried(receiver, eager_delivery, django_capture_on_commit_callbacks):
    receiver.script = [(404, 0.0)]
    lab = lab_with_channel(url=receiver.url)
    tick_until_frozen(lab, django_capture_on_commit_callbacks)
    assert len(receiver.requests) == 1
    assert AlertDelivery.objects.get().status == "failed"


def test_the_tick_does_not_wait_for_a_slow_receiver(receiver, django_capture_on_commit_callbacks):
    receiver.script = [(200, 5.0)]
    lab = lab_with_channel(url=receiver.url)
    queued = []
    for _ in range(30):
        lab.step()
        with django_capture_on_commit_callbacks() as callbacks:
            start = time.perf_counter()
            result = lab.tick()
            elapsed = time.perf_counter() - start
        queued += callbacks
        if result.frozen:
            break
    assert result.frozen and elapsed < 1.0
    assert receiver.requests == [] and AlertDelivery.objects.get().status == "pending"
    assert len(queued) == 2  # the log line and the send, both only once the freeze commits


def test_email_and_the_structured_log_line(
    eager_delivery, django_capture_on_commit_callbacks, caplog
):
    lab = lab_with_channel(emails="ml-team@example.com; oncall@example.com")
    with caplog.at_level(logging.WARNING, logger="costlab.alerts"):
        event = tick_until_frozen(lab, django_capture_on_commit_callbacks)
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["ml-team@example.com", "oncall@example.com"]
    assert "arm 'b' freeze" in message.subject and event.reason in message.body
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("arm_freeze "))
    logged = json.loads(line.removeprefix("arm_freeze "))
    assert (
        logged["event_id"] == event.pk
        and logged["arm"]["name"] == "b"
        and logged["deliveries"] == 1
    )
    assert logged["deviation"] == event.deviation


def test_a_signed_webhook_carries_an_hmac_of_its_body(
    receiver, eager_delivery, django_capture_on_commit_callbacks
):
    lab = lab_with_channel(url=receiver.url, secret="s3cret")
    tick_until_frozen(lab, django_capture_on_commit_callbacks)
    request = receiver.requests[0]
    body = json.dumps(request["body"], sort_keys=True).encode()
    expected = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert request["headers"]["X-Costlab-Signature"] == expected


@override_settings(COSTLAB_ALERT_WEBHOOK_URL="http://127.0.0.1:9/default")
def test_the_default_webhook_from_settings_is_used_alongside_the_channels(
    receiver, monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setattr(alerts, "deliveries_send", lambda **kwargs: None)
    lab = lab_with_channel(url=receiver.url)
    tick_until_frozen(lab, django_capture_on_commit_callbacks)
    assert sorted(AlertDelivery.objects.values_list("target", flat=True)) == sorted(
        [receiver.url, "http://127.0.0.1:9/default"]
    )


def test_pending_deliveries_whose_task_was_lost_are_queued_again(
    monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setattr(
        alerts, "deliveries_send", lambda **kwargs: None
    )  # the broker was down at commit
    lab = lab_with_channel(url="http://127.0.0.1:9/unused")
    tick_until_frozen(lab, django_capture_on_commit_callbacks)
    delivery = AlertDelivery.objects.get()
    requeued = []
    monkeypatch.setattr(
        alerts,
        "deliveries_send",
        lambda *, delivery_ids, countdown=None: requeued.extend(delivery_ids),
    )
    assert deliveries_requeue_stale() == [] and requeued == []  # not stale yet
    later = delivery.next_attempt_at + timedelta(seconds=61)
    assert deliveries_requeue_stale(now=later) == [delivery.pk] and requeued == [delivery.pk]


@pytest.mark.django_db(transaction=True)  # two threads, two connections: both must see the rows
def test_a_second_task_for_a_delivery_in_flight_does_not_send_it_again(
    receiver, django_capture_on_commit_callbacks, monkeypatch
):
    import threading

    monkeypatch.setattr(alerts, "deliveries_send", lambda **kwargs: None)
    receiver.script = [(200, 1.0)]  # the first attempt is still waiting for its answer...
    lab = lab_with_channel(url=receiver.url)
    tick_until_frozen(lab, django_capture_on_commit_callbacks)
    delivery = AlertDelivery.objects.get()
    with override_settings(COSTLAB_ALERT_TIMEOUT_S=5.0):
        first = threading.Thread(target=alert_attempt, kwargs={"delivery_id": delivery.pk})
        first.start()
        time.sleep(0.3)
        second = alert_attempt(delivery_id=delivery.pk)  # ...when a redelivered task arrives
        first.join()
    assert second.status == "claimed_elsewhere"
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("sent", 1)
    assert len(receiver.alerts()) == 1


def test_a_budget_step_is_mailed_to_the_tenant_wide_channels_only(
    eager_delivery, django_capture_on_commit_callbacks, admin_client
):
    tenant = TenantFactory(slug="acme")
    AlertChannel.objects.create(tenant=tenant, name="finance", email_recipients="fin@example.com")
    AlertChannel.objects.create(
        tenant=tenant,
        experiment=ExperimentFactory(tenant=tenant),
        name="ml",
        email_recipients="ml@example.com",
    )
    with django_capture_on_commit_callbacks(execute=True):
        event = budget_event_record(
            tenant=tenant,
            month=date(2026, 5, 1),
            state="exceeded",
            spend_usd=Decimal("101.254"),
            budget_usd=Decimal("100.00"),
            reason="the budget is spent",
            runs={"cancelled": [7], "flagged": []},
        )
    [message] = mail.outbox
    assert message.to == ["fin@example.com"]
    assert message.subject == "[costlab] acme: budget exceeded (101.25 of 100.00 USD in 2026-05)"
    assert "the budget is spent" in message.body and '"cancelled": [\n' in message.body
    delivery = AlertDelivery.objects.get()
    assert (delivery.budget_event_id, delivery.event_id, delivery.status) == (
        event.pk,
        None,
        "sent",
    )
    assert delivery.payload["share"] == 1.0125 and delivery.payload["runs"]["noted"] == []
    with pytest.raises(IntegrityError), transaction.atomic():  # an alert of nothing
        AlertDelivery.objects.create(kind="email", target="x@example.com")
    deliveries = admin_client.get(reverse("admin:alerts_alertdelivery_changelist"))
    assert str(event) in deliveries.content.decode()  # staff see which step was alerted
    events = admin_client.get(reverse("admin:alerts_budgetevent_changelist"))
    assert "the budget is spent" in events.content.decode() and "101.254" in events.content.decode()


def test_a_budget_step_that_stops_thousands_of_runs_names_a_hundred_and_counts_them_all(
    eager_delivery, django_capture_on_commit_callbacks
):
    tenant = TenantFactory(slug="fleet")
    AlertChannel.objects.create(tenant=tenant, name="finance", email_recipients="fin@example.com")
    cancelled = list(range(1, 40_021))  # what the 1,000-experiment benchmark's budget stop cancels
    with django_capture_on_commit_callbacks(execute=True):
        event = budget_event_record(
            tenant=tenant,
            month=date(2026, 5, 1),
            state="exceeded",
            spend_usd=Decimal("5846.25"),
            budget_usd=Decimal("1000.00"),
            reason="the budget is spent",
            runs={"cancelled": cancelled, "flagged": [40_021]},
        )
    payload = AlertDelivery.objects.get().payload
    assert payload["runs"] == {"noted": [], "cancelled": cancelled[:100], "flagged": [40_021]}
    assert payload["run_counts"] == {"noted": 0, "cancelled": 40_020, "flagged": 1}
    assert len(json.dumps(payload)) < 2_000 and len(mail.outbox[0].body) < 4_000
    event.refresh_from_db()
    assert event.runs["cancelled"] == cancelled  # the event keeps every id
