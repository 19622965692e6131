"""Cancelling asks first in the browser (issue 25): a dismissed question cancels nothing, an
accepted one cancels the experiment's queued runs."""

from __future__ import annotations

import pytest

from apps.experiments.models import Run
from tests.apps.dashboard.world import PASSWORD, run_of, world

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_bulk_and_single_cancel_ask_before_they_act(page, live_server):
    w = world()
    queued = [run_of(arm, status=Run.Status.QUEUED, started_at=None) for arm in (w.control,) * 2]
    page.goto(live_server.url + f"/experiments/{w.experiment.pk}/")
    page.fill("#id_username", w.user.username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"**/experiments/{w.experiment.pk}/")
    asked: list[str] = []

    def dismiss(dialog):
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    page.click("#cancel-runs button[type=submit]")
    page.wait_for_timeout(300)
    assert asked and "Cancel every queued and running run" in asked[0]
    assert set(
        Run.objects.filter(pk__in=[r.pk for r in queued]).values_list("status", flat=True)
    ) == {"queued"}
    # One run's Cancel asks too.
    page.goto(live_server.url + f"/runs/{queued[0].pk}/")
    page.once("dialog", dismiss)
    page.click("form.inline-form button.button-danger")
    page.wait_for_timeout(300)
    assert len(asked) == 2 and f"Cancel run {queued[0].pk}?" in asked[1]
    assert Run.objects.get(pk=queued[0].pk).status == "queued"

    page.goto(live_server.url + f"/experiments/{w.experiment.pk}/")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-runs button[type=submit]")
    page.wait_for_load_state()
    assert "2 run(s) cancelled" in page.content()
    assert set(
        Run.objects.filter(pk__in=[r.pk for r in queued]).values_list("status", flat=True)
    ) == {"cancelled"}
