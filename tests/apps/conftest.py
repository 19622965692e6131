"""Fixtures the apps' tests share: a real local webhook receiver, and alert deliveries run in
the test's process."""

from __future__ import annotations

import pytest

from tests.apps.attribution.receiver import webhook_receiver


@pytest.fixture
def receiver():
    with webhook_receiver() as r:
        yield r


@pytest.fixture
def eager_delivery(monkeypatch):
    """Deliveries run in this process, as the Celery task would run them (retries included);
    the ids sent, in order."""
    from apps.alerts import services as alerts
    from workers.alerts import alert_deliver

    sent = []

    def send(*, delivery_ids, countdown=None):
        for pk in delivery_ids:
            sent.append(pk)
            alert_deliver.apply(args=[pk])

    monkeypatch.setattr(alerts, "deliveries_send", send)
    return sent
