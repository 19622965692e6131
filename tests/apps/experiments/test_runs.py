"""Leases: one worker holds a run; an expired lease is swept, requeued, and finally failed."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from apps.experiments import runs
from apps.experiments.models import Run
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db


def expire(run):
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def test_only_one_worker_claims_a_run():
    run = RunFactory(status="queued")
    first = runs.run_claim(run_id=run.pk, owner="w1")
    assert first is not None and first.attempts == 1 and first.status == "running"
    assert runs.run_claim(run_id=run.pk, owner="w2") is None
    assert runs.run_claim(run_id=999_999, owner="w2") is None  # a missing run: quietly nothing


def test_heartbeat_renews_and_reports_cancel_and_lost_lease():
    run = RunFactory(status="queued")
    runs.run_claim(run_id=run.pk, owner="w1")
    state = runs.run_heartbeat(run_id=run.pk, owner="w1")
    assert state.held and not state.cancel
    Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    assert runs.run_heartbeat(run_id=run.pk, owner="w1").cancel
    assert not runs.run_heartbeat(run_id=run.pk, owner="someone-else").held


def test_expired_leases_are_requeued_until_attempts_run_out_then_failed(
    django_capture_on_commit_callbacks,
):
    run = RunFactory(status="queued", max_attempts=2)
    with django_capture_on_commit_callbacks(execute=False) as enqueued:
        runs.run_claim(run_id=run.pk, owner="w1")
        expire(run)
        assert runs.runs_sweep_lost() == [run.pk]
        run.refresh_from_db()
        assert run.status == "queued" and "w1 lost" in run.error
        runs.run_claim(run_id=run.pk, owner="w2")
        expire(run)
        runs.runs_sweep_lost()
    run.refresh_from_db()
    assert run.status == "failed" and run.attempts == 2
    assert "no attempts left (2/2)" in run.error
    assert len(enqueued) == 1  # requeued once, then never again: no loop
    assert runs.runs_sweep_lost() == []


def test_a_fresh_lease_is_not_swept_and_a_stale_owner_cannot_finish():
    run = RunFactory(status="queued")
    runs.run_claim(run_id=run.pk, owner="w1")
    assert runs.runs_sweep_lost() == []
    assert not runs.run_finish(run_id=run.pk, owner="w-old", status="succeeded")
    assert runs.run_finish(run_id=run.pk, owner="w1", status="succeeded")
    run.refresh_from_db()
    assert run.status == "succeeded" and run.finished_at and not run.lease_owner


def test_graceful_stops_requeue_without_using_an_attempt_and_each_attempt_keeps_its_record():
    run = RunFactory(status="queued", max_attempts=3)
    for n in range(1, 4):  # three deploys in a row: SIGTERM each time
        assert runs.run_claim(run_id=run.pk, owner=f"w{n}", host="host-a") is not None
        assert runs.run_release(
            run_id=run.pk, owner=f"w{n}", reason="worker stopped before the run finished"
        )
    assert runs.run_claim(run_id=run.pk, owner="w4", host="host-b") is not None
    assert runs.run_finish(run_id=run.pk, owner="w4", status="succeeded")
    run.refresh_from_db()
    assert run.status == "succeeded" and run.attempts == 4
    log = list(run.attempt_log.values_list("number", "worker", "outcome"))
    assert log == [
        (1, "w1", "stopped"),
        (2, "w2", "stopped"),
        (3, "w3", "stopped"),
        (4, "w4", "succeeded"),
    ]
    assert all(a.ended_at and a.started_at <= a.ended_at for a in run.attempt_log.all())


def test_a_lost_attempt_counts_and_its_history_survives_the_final_success():
    run = RunFactory(status="queued", max_attempts=3)
    runs.run_claim(run_id=run.pk, owner="w1")
    expire(run)
    runs.runs_sweep_lost()
    runs.run_claim(run_id=run.pk, owner="w2")
    assert runs.run_finish(run_id=run.pk, owner="w2", status="succeeded")
    run.refresh_from_db()
    assert run.status == "succeeded" and "attempt 1: worker w1 lost" in run.error
    assert list(run.attempt_log.values_list("outcome", flat=True)) == ["lost", "succeeded"]


def test_claim_and_finish_repeated_by_their_owner_are_idempotent():
    """What a worker does when the answer to a committed call was lost with its connection."""
    run = RunFactory(status="queued")
    first = runs.run_claim(run_id=run.pk, owner="w1")
    again = runs.run_claim(run_id=run.pk, owner="w1")
    assert again is not None and again.attempts == first.attempts == 1
    assert runs.run_finish(run_id=run.pk, owner="w1", status="succeeded")
    assert runs.run_finish(run_id=run.pk, owner="w1", status="succeeded")
    assert not runs.run_finish(run_id=run.pk, owner="w1", status="failed")
    run.refresh_from_db()
    assert run.status == "succeeded" and run.attempt_log.count() == 1


STEPS_6 = (
    "model: {preset: tiny, seq_len: 32}\ndata: {source: synthetic}\n"
    "train: {steps: 6, global_batch: 2}\n"
)


def _samples(run, attempt, steps):
    from tests.factories import TelemetrySampleFactory

    for i, step in enumerate(steps):
        TelemetrySampleFactory(run=run, seq=run.samples.count() + i, attempt=attempt, step=step)


def test_the_sweeper_never_retrains_a_run_whose_telemetry_shows_every_step_trained():
    run = RunFactory(status="queued", arm__strategy_yaml=STEPS_6, config_yaml=STEPS_6)
    runs.run_claim(run_id=run.pk, owner="w1")
    _samples(
        run, 1, [2, 4, 6]
    )  # the final sample: all 6 steps done; the finish never reached the database
    expire(run)
    assert runs.runs_sweep_lost() == [run.pk]
    run.refresh_from_db()
    assert run.status == "succeeded" and run.attempts == 1
    assert "not trained again" in run.error
    assert list(run.attempt_log.values_list("outcome", flat=True)) == ["succeeded"]
    # ... and the worker's finish, arriving once the database is back, agrees instead of failing.
    assert runs.run_finish(run_id=run.pk, owner="w1", status="succeeded")


def test_a_partly_trained_lost_run_is_requeued():
    run = RunFactory(status="queued", arm__strategy_yaml=STEPS_6, config_yaml=STEPS_6)
    runs.run_claim(run_id=run.pk, owner="w1")
    _samples(run, 1, [2, 4])
    expire(run)
    runs.runs_sweep_lost()
    run.refresh_from_db()
    assert run.status == "queued"


def test_a_finish_recorded_after_the_sweep_counts_while_nobody_took_the_run():
    run = RunFactory(status="queued", arm__strategy_yaml=STEPS_6, config_yaml=STEPS_6)
    runs.run_claim(run_id=run.pk, owner="w1")
    expire(run)
    runs.runs_sweep_lost()  # no telemetry stored yet: requeued
    assert runs.run_finish(run_id=run.pk, owner="w1", status="succeeded")
    run.refresh_from_db()
    assert run.status == "succeeded" and run.attempts == 1
    assert list(run.attempt_log.values_list("outcome", flat=True)) == ["succeeded"]
    # Once another worker has taken it, the late finish is refused: that attempt owns the run now.
    other = RunFactory(status="queued")
    runs.run_claim(run_id=other.pk, owner="w1")
    expire(other)
    runs.runs_sweep_lost()
    runs.run_claim(run_id=other.pk, owner="w2")
    assert not runs.run_finish(run_id=other.pk, owner="w1", status="succeeded")


def test_the_reconciler_sends_queued_runs_that_never_reached_the_broker_and_backs_off():
    from datetime import timedelta as td

    never = RunFactory(status="queued")
    fresh = RunFactory(status="queued")
    claimed = RunFactory(status="queued")
    runs.run_claim(run_id=claimed.pk, owner="w1")
    cancelled = RunFactory(status="queued", cancel_requested=True)
    past = timezone.now() - td(seconds=60)
    Run.objects.filter(pk__in=[never.pk, claimed.pk, cancelled.pk]).update(updated_at=past)
    sent = runs.runs_reconcile_queued()
    assert sent == [
        never.pk
    ]  # not the one just submitted (its own send is in flight), nor the others
    never.refresh_from_db()
    assert never.sends == 1 and never.sent_at is not None
    assert runs.runs_reconcile_queued() == []  # just sent
    now = timezone.now()
    after = settings.COSTLAB_RUN_RESEND_AFTER_S
    assert never.pk in runs.runs_reconcile_queued(now=now + td(seconds=after + 1))
    # Sent twice now: the next send waits twice as long.
    assert never.pk not in runs.runs_reconcile_queued(now=timezone.now() + td(seconds=after + 1))
    assert never.pk in runs.runs_reconcile_queued(now=timezone.now() + td(seconds=2 * after + 1))
    assert fresh.pk not in runs.runs_reconcile_queued()


def test_a_swept_attempts_last_samples_land_until_another_worker_takes_the_run():
    from apps.billing.services import telemetry_ingest
    from apps.core.exceptions import ApplicationError

    run = RunFactory(status="queued", arm__strategy_yaml=STEPS_6, config_yaml=STEPS_6)
    runs.run_claim(run_id=run.pk, owner="w1")
    expire(run)
    runs.runs_sweep_lost()  # the database was away longer than the lease: requeued

    def batch(seq):
        return [{"seq": seq, "ts": timezone.now().isoformat(), "step": 6, "tokens": 384}]

    assert telemetry_ingest(run_id=run.pk, samples=batch(0), attempt=1).inserted == 1
    assert runs.run_finish(
        run_id=run.pk, owner="w1", status="succeeded"
    )  # ... and so is its finish
    run.refresh_from_db()
    assert run.status == "succeeded" and run.tokens == 384

    other = RunFactory(status="queued")
    runs.run_claim(run_id=other.pk, owner="w1")
    expire(other)
    runs.runs_sweep_lost()
    runs.run_claim(run_id=other.pk, owner="w2")
    with pytest.raises(ApplicationError, match="attempt 1 no longer holds run"):
        telemetry_ingest(run_id=other.pk, samples=batch(0), attempt=1)


def test_a_retried_submit_sends_again_a_run_whose_message_never_left(
    django_capture_on_commit_callbacks,
):
    """Resubmitting the same run key used to answer 200 and leave a never-sent run
    queued for good."""
    from apps.experiments.services import run_submit

    run = RunFactory(status="queued", run_key="gh-1")  # committed, but its send never happened
    with django_capture_on_commit_callbacks(execute=False) as sends:
        assert run_submit(experiment=run.experiment, run_key="gh-1").pk == run.pk
    assert len(sends) == 1
    Run.objects.filter(pk=run.pk).update(sent_at=timezone.now())
    with django_capture_on_commit_callbacks(execute=False) as sends:
        run_submit(experiment=run.experiment, run_key="gh-1")
    assert sends == []  # sent already: the reconciler, not every retry, decides when to send again
