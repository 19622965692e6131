"""The polling endpoints: new samples since the cursor, and the attribution charts when they
change."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.attribution.services import arm_freeze, attribution_tick
from apps.billing.services import telemetry_ingest
from apps.experiments.models import Run
from tests.apps.dashboard.world import run_of, samples, train

pytestmark = pytest.mark.django_db


def ms(ts) -> int:
    return int(ts.timestamp() * 1000)


@pytest.fixture
def live(w):
    for arm in (w.control, w.candidate):
        train(run_of(arm), n=30, start=timezone.now() - timedelta(minutes=5))
    attribution_tick(now=timezone.now())
    running = train(
        run_of(w.candidate, status=Run.Status.RUNNING),
        n=20,
        start=timezone.now() - timedelta(seconds=60),
    )
    return w, running


def poll(client, w, since, av=""):
    response = client.get(
        reverse("dashboard:experiment-live", args=[w.experiment.pk]), {"since": since, "av": av}
    )
    assert response.status_code == 200, response.content
    return response.json()


def test_a_new_sample_comes_back_on_the_next_poll(member, live):
    w, running = live
    first = poll(member, w, ms(timezone.now()))
    assert first["active"] is True and list(first["runs"]) == [str(running.pk)]
    assert first["series"]["util_pct"] == {}, "nothing in the last 10 s yet"
    new = samples(start=timezone.now(), first_seq=running.last_seq + 1, n=1, util=42.5)
    telemetry_ingest(run_id=running.pk, samples=new, attempt=1)
    update = poll(member, w, first["cursor"])
    band = update["series"]["util_pct"][str(running.pk)]
    assert band["y"] == [42.5] and band["x"] == [ms(timezone.datetime.fromisoformat(new[0]["ts"]))]
    assert update["cursor"] >= first["cursor"]


def test_finished_runs_are_not_polled(member, live):
    w, running = live
    Run.objects.filter(pk=running.pk).update(
        status=Run.Status.SUCCEEDED,
        finished_at=timezone.now() - timedelta(hours=1),
        heartbeat_at=timezone.now() - timedelta(hours=1),
    )
    assert poll(member, w, ms(timezone.now()))["active"] is False


def test_attribution_is_sent_only_when_it_changed(member, live):
    w, _ = live
    first = poll(member, w, ms(timezone.now()))
    version = first["attribution"]["version"]
    assert poll(member, w, first["cursor"], av=version)["attribution"] is None
    arm_freeze(arm_id=w.candidate.pk, reason="forced", evidence={})
    changed = poll(member, w, first["cursor"], av=version)["attribution"]
    assert changed is not None and changed["version"] != version
    assert [(f["arm"], f["action"]) for f in changed["freezes"]] == [(w.candidate.pk, "freeze")]
    assert changed["arms"][str(w.candidate.pk)] == {"state": "frozen", "weight": 0.0}
    assert changed["weights"][str(w.candidate.pk)]["y"][-1] == 0.0
    assert changed["threshold_pct"] == 5.0


def test_the_cursor_must_be_recent_and_well_formed(member, live):
    w, running = live
    url = reverse("dashboard:experiment-live", args=[w.experiment.pk])
    for since in ("", "yesterday", str(ms(timezone.now() - timedelta(hours=1)))):
        response = member.get(url, {"since": since})
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid", since


def test_run_live_polls_one_run(member, live):
    w, running = live
    telemetry_ingest(
        run_id=running.pk,
        samples=samples(
            start=timezone.now(), first_seq=running.last_seq + 1, n=2, step_time_s=0.25
        ),
        attempt=1,
    )
    response = member.get(
        reverse("dashboard:run-live", args=[running.pk]), {"since": ms(timezone.now())}
    )
    data = response.json()
    assert list(data["runs"]) == [str(running.pk)]
    # Throughput is the run's tokens per step (1,024) over each step's time, not the samples' own.
    assert data["series"]["tokens_per_s"][str(running.pk)]["y"][-2:] == [4096.0, 4096.0]
    # Where the run was, for the charts drawn against steps or tokens: step seq + 1, 1,024 a step.
    progress = data["progress"][str(running.pk)]
    assert progress["step"]["y"][-1] == running.last_seq + 3
    assert progress["tokens"]["y"][-1] == 1024 * (running.last_seq + 3)


def test_the_comparison_fragment_renders_alone(member, live):
    w, _ = live
    response = member.get(reverse("dashboard:experiment-comparison", args=[w.experiment.pk]))
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html
    assert f'data-arm="{w.candidate.pk}"' in html and "Cost per arm" in html
