"""Leases: one worker holds a run; an expired lease is swept, requeued, and finally failed."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.experiments import leases
from apps.experiments.models import Run
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db


def expire(run):
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def test_only_one_worker_claims_a_run():
    run = RunFactory(status="queued")
    first = leases.run_claim(run_id=run.pk, owner="w1")
    assert first is not None and first.attempts == 1 and first.status == "running"
    assert leases.run_claim(run_id=run.pk, owner="w2") is None
    assert leases.run_claim(run_id=999_999, owner="w2") is None  # a missing run: quietly nothing


def test_heartbeat_renews_and_reports_cancel_and_lost_lease():
    run = RunFactory(status="queued")
    leases.run_claim(run_id=run.pk, owner="w1")
    state = leases.run_heartbeat(run_id=run.pk, owner="w1")
    assert state.held and not state.cancel
    Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    assert leases.run_heartbeat(run_id=run.pk, owner="w1").cancel
    assert not leases.run_heartbeat(run_id=run.pk, owner="someone-else").held


def test_expired_leases_are_requeued_until_attempts_run_out_then_failed(django_capture_on_commit_callbacks):
    run = RunFactory(status="queued", max_attempts=2)
    with django_capture_on_commit_callbacks(execute=False) as enqueued:
        leases.run_claim(run_id=run.pk, owner="w1")
        expire(run)
        assert leases.runs_sweep_lost() == [run.pk]
        run.refresh_from_db()
        assert run.status == "queued" and "w1 lost" in run.error
        leases.run_claim(run_id=run.pk, owner="w2")
        expire(run)
        leases.runs_sweep_lost()
    run.refresh_from_db()
    assert run.status == "failed" and run.attempts == 2
    assert "no attempts left (2/2)" in run.error
    assert len(enqueued) == 1  # requeued once, then never again: no loop
    assert leases.runs_sweep_lost() == []


def test_a_fresh_lease_is_not_swept_and_a_stale_owner_cannot_finish():
    run = RunFactory(status="queued")
    leases.run_claim(run_id=run.pk, owner="w1")
    assert leases.runs_sweep_lost() == []
    assert not leases.run_finish(run_id=run.pk, owner="w-old", status="succeeded")
    assert leases.run_finish(run_id=run.pk, owner="w1", status="succeeded")
    run.refresh_from_db()
    assert run.status == "succeeded" and run.finished_at and not run.lease_owner
