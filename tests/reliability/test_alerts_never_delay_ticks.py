"""Attribution never waits on a side effect: with three slow webhook receivers taking 4 s an
answer, beat's ticks still run on schedule, because alert deliveries have their own queue and
worker (as in make run and docker-compose), and a tick that goes stale expires unrun."""

import time

import pytest

from apps.alerts.models import AlertDelivery
from apps.attribution.models import FreezeEvent
from apps.core.models import PeriodicTaskRun
from config.celery_app import app
from tests.apps.attribution.lab import Lab
from tests.apps.attribution.receiver import webhook_receiver
from tests.helpers import start_worker, stop_worker
from tests.workers.test_runs_on_a_worker import wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.slow]

TICK_S = 1.0
SLOW_S = 4.0


@pytest.fixture
def platform_and_alerts_workers(django_db_setup):
    """The two workers of make run that matter here:
    default queue (concurrency 1), alerts (threads)."""
    started = [
        start_worker(queues="default"),
        start_worker(queues="alerts", pool="threads", concurrency=4),
    ]
    yield
    for proc, _ in started:
        stop_worker(proc)


def tick_starts(seconds: float) -> list[float]:
    """Act as beat: send the tick every TICK_S, expiring when stale; return when each one ran."""
    seen, starts = None, []
    next_send = deadline = time.monotonic()
    deadline += seconds
    while time.monotonic() < deadline:
        if time.monotonic() >= next_send:
            app.send_task("costlab.attribution_tick", expires=TICK_S * 0.9)
            next_send += TICK_S
        row = PeriodicTaskRun.objects.filter(name="attribution_tick").first()
        if row is not None and row.last_started_at != seen:
            seen = row.last_started_at
            starts.append(seen.timestamp())
        time.sleep(0.05)
    return starts


def test_three_slow_receivers_do_not_delay_the_tick(platform_and_alerts_workers):
    lab = Lab({"control": 1.0, "b": 1.25}, seed=71, dynamic_weights=False)
    with webhook_receiver() as r1, webhook_receiver() as r2, webhook_receiver() as r3:
        receivers = [r1, r2, r3]
        deliveries = []
        for n in range(3):
            event = FreezeEvent.objects.create(
                experiment=lab.experiment, arm=lab.arms["b"], action="freeze", reason=f"test {n}"
            )
            for receiver in receivers:
                receiver.script = [(200, SLOW_S)] * 10
                deliveries.append(
                    AlertDelivery.objects.create(
                        event=event,
                        kind="webhook",
                        target=receiver.url,
                        payload={"event": "arm_freeze", "n": n},
                    )
                )
        for delivery in deliveries:
            app.send_task("costlab.alert_deliver", args=[delivery.pk])

        starts = tick_starts(12.0)
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        assert len(starts) >= 9, f"only {len(starts)} ticks ran in 12 s at one a second: {gaps}"
        assert max(gaps) <= 2.5, f"a tick waited: gaps between ticks {gaps}"
        # ... and the alerts were delivered meanwhile, not starved either.
        wait_for(
            lambda: AlertDelivery.objects.filter(status="sent").count() == len(deliveries),
            60,
            "all nine slow deliveries to be sent",
        )
        assert sum(len(r.alerts()) for r in receivers) == len(deliveries)
