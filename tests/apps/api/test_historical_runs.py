"""Historical uploads through POST /api/v1/runs/: an external run declares when it started and
ended; its samples must lie in that window (give or take the clock skew), and it finishes at the
end it declared."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.experiments.models import Run
from apps.telemetry.models import TelemetrySample
from tests.apps.api.conftest import error
from tests.factories import PricingTableFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def priced(experiment):
    return PricingTableFactory(
        tenant=experiment.tenant, valid_from=timezone.now() - timedelta(days=30)
    )


def external(api, experiment, **fields):
    body = {"experiment": experiment.pk, "kind": "external", **fields}
    for name in ("started_at", "ended_at"):
        if name in body:
            body[name] = body[name].isoformat()
    return api.post("/api/v1/runs/", body, format="json")


def test_ended_at_is_after_started_at_and_not_in_the_future(api, experiment, priced):
    now = timezone.now()
    start = now - timedelta(days=2)
    cases = [
        ({"started_at": start, "ended_at": now + timedelta(hours=1)}, "is in the future"),
        ({"started_at": start, "ended_at": start}, "is not after started_at"),
        ({"started_at": start, "ended_at": start - timedelta(seconds=1)}, "is not after"),
        ({"ended_at": now - timedelta(hours=1)}, "needs started_at"),
    ]
    for fields, reason in cases:
        refused = external(api, experiment, **fields)
        assert refused.status_code == 400, (fields, refused.content)
        message = error(refused)["message"]
        assert message.startswith("ended_at:") and reason in message, message
        assert list(error(refused)["fields"]) == ["ended_at"]
    worker = api.post(
        "/api/v1/runs/",
        {"experiment": experiment.pk, "ended_at": (now - timedelta(hours=1)).isoformat()},
        format="json",
    )
    assert worker.status_code == 400 and error(worker)["message"].startswith("ended_at:")
    assert not Run.objects.exists()


def test_started_at_is_bounded_by_now_and_the_oldest_price(api, experiment, priced):
    future = external(api, experiment, started_at=timezone.now() + timedelta(minutes=5))
    assert future.status_code == 400 and "is in the future" in error(future)["message"]
    before = external(api, experiment, started_at=priced.valid_from - timedelta(seconds=1))
    message = error(before)["message"]
    assert before.status_code == 400 and message.startswith("started_at:")
    assert f"the oldest pricing table starts {priced.valid_from.isoformat()}" in message


def test_samples_outside_the_declared_window_are_refused_naming_the_field(
    api, experiment, priced, settings
):
    start = (timezone.now() - timedelta(days=2)).replace(microsecond=0)
    end = start + timedelta(hours=1)
    created = external(api, experiment, started_at=start, ended_at=end)
    assert created.status_code == 201, created.content
    run = created.json()
    assert run["started_at"] and run["declared_ended_at"] and run["last_seq"] == -1
    slack = timedelta(seconds=settings.COSTLAB_TELEMETRY_CLOCK_SKEW_S)
    stamps = [
        start - slack - timedelta(seconds=1),  # refused: before the start's slack
        start - slack,  # the edges, slack included, are in
        start,
        end,
        end + slack,
        end + slack + timedelta(seconds=1),  # refused: after the declared end's slack
    ]
    samples = [{"seq": i, "ts": ts.isoformat(), "step": i} for i, ts in enumerate(stamps)]
    answer = api.post(f"/api/v1/runs/{run['id']}/telemetry/", {"samples": samples}, format="json")
    assert answer.status_code == 200, answer.content
    refused = answer.json()["refused"]
    assert [(r["seq"], r["field"]) for r in refused] == [(0, "samples[0].ts"), (5, "samples[5].ts")]
    window = f"{(start - slack).isoformat()} .. {(end + slack).isoformat()}"
    assert window in refused[0]["reason"] and "before the run started" in refused[0]["reason"]
    assert (
        window in refused[1]["reason"]
        and "after the run's declared ended_at" in refused[1]["reason"]
    )
    stored = TelemetrySample.objects.filter(run_id=run["id"]).values_list("seq", flat=True)
    assert sorted(stored) == [1, 2, 3, 4]
    finished = api.post(f"/api/v1/runs/{run['id']}/finish/", {"status": "succeeded"}, format="json")
    assert finished.status_code == 200, finished.content
    # A historical run ended when it said, not when its upload finished.
    assert Run.objects.get(pk=run["id"]).finished_at == end
