"""Submission: routing by weight, frozen arms, quotas, strategy validation, idempotency, cancel."""

from collections import Counter
from decimal import Decimal

import pytest

from apps.core.exceptions import ApplicationError
from apps.experiments.models import Arm, Run
from apps.experiments.services import arm_update, run_cancel, run_submit
from tests.factories import ArmFactory, ExperimentFactory, RunFactory

pytestmark = pytest.mark.django_db

GOOD = (
    "model: {preset: tiny, seq_len: 32}\ndata: {source: synthetic}\n"
    "train: {steps: 5, global_batch: 2}\n"
)


@pytest.fixture
def experiment():
    exp = ExperimentFactory(tenant__max_concurrent_runs=1000, status="active")
    ArmFactory(
        experiment=exp, name="control", is_control=True, strategy_yaml=GOOD, weight=Decimal("3")
    )
    ArmFactory(experiment=exp, name="candidate", strategy_yaml=GOOD, weight=Decimal("1"))
    return exp


@pytest.mark.slow
def test_runs_follow_traffic_weights_and_a_retry_lands_on_the_same_arm(
    experiment, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False):
        arms = Counter(
            run_submit(experiment=experiment, run_key=f"k{i}").arm.name for i in range(400)
        )
        again = run_submit(experiment=experiment, run_key="k7")
    assert arms["control"] == 300  # weight 3 of 4, exactly: routing is stratified
    assert again.pk == Run.objects.get(run_key="k7").pk
    assert Run.objects.count() == 400


def test_small_counts_follow_the_weights_exactly_in_submission_order(
    experiment, django_capture_on_commit_callbacks
):
    """Issue 25: 4 runs at weights 1:1 went 3 to the candidate and 1 to the control (a hash of
    the run key). Routing is stratified by submission order: every prefix is as close to the
    weights as whole runs allow."""
    Arm.objects.filter(experiment=experiment).update(weight=Decimal("1"))
    with django_capture_on_commit_callbacks(execute=False):
        names = [run_submit(experiment=experiment).arm.name for _ in range(4)]
        assert Counter(names) == {"control": 2, "candidate": 2}
        assert names[0] != names[1] and names[2] != names[3]  # interleaved, never 2 in a row
        # A change of the split starts the count again: 3:1 from here gives 3 and 1 in 4.
        arm_update(arm=experiment.arms.get(name="control"), weight=Decimal("3"))
        later = Counter(run_submit(experiment=experiment).arm.name for _ in range(4))
    assert later == {"control": 3, "candidate": 1}


def test_a_frozen_arm_gets_no_new_runs(experiment, django_capture_on_commit_callbacks):
    candidate = experiment.arms.get(name="candidate")
    Arm.objects.filter(pk=candidate.pk).update(state="frozen", weight=0)
    candidate.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=False):
        assert {run_submit(experiment=experiment).arm.name for _ in range(50)} == {"control"}
        with pytest.raises(ApplicationError, match="arm: 'candidate' is frozen"):
            run_submit(experiment=experiment, arm=candidate)


def test_submission_snapshots_the_strategy_and_queues_once_committed(
    experiment, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run = run_submit(experiment=experiment, git_sha="abc123")
    assert len(callbacks) == 1  # enqueue happens only after commit
    assert run.status == "queued" and run.queue == "cpu" and run.git_sha == "abc123"
    assert run.config_yaml == GOOD and run.config_sha256 == run.arm.strategy_sha256
    # Editing the arm later does not change what the run trains.
    Arm.objects.filter(pk=run.arm_id).update(strategy_yaml=GOOD + "# edited\n")
    run.refresh_from_db()
    assert run.config_yaml == GOOD


def test_concurrency_quota_refuses_with_the_limit_named(
    experiment, django_capture_on_commit_callbacks
):
    tenant = experiment.tenant
    tenant.max_concurrent_runs = 2
    tenant.save()
    with django_capture_on_commit_callbacks(execute=False):
        run_submit(experiment=experiment)
        run_submit(experiment=experiment)
        with pytest.raises(ApplicationError, match=r"max_concurrent_runs: .* \(limit 2\)") as err:
            run_submit(experiment=experiment)
    assert err.value.code == "quota_exceeded"
    assert Run.objects.count() == 2


def test_monthly_budget_refuses_once_spent(experiment, django_capture_on_commit_callbacks):
    tenant = experiment.tenant
    tenant.monthly_budget_usd = Decimal("10")
    tenant.save()
    RunFactory(arm=experiment.arms.first(), status="succeeded", cost_usd=Decimal("10.5"))
    with (
        django_capture_on_commit_callbacks(execute=False),
        pytest.raises(ApplicationError, match="monthly_budget_usd"),
    ):
        run_submit(experiment=experiment)


def test_a_bad_strategy_is_refused_naming_the_key(experiment):
    arm = experiment.arms.get(name="candidate")
    Arm.objects.filter(pk=arm.pk).update(
        strategy_yaml=GOOD + "optimizer: {dynamic_batching: {min_micro_batch: -3}}\n"
    )
    arm.refresh_from_db()
    with pytest.raises(ApplicationError) as err:
        run_submit(experiment=experiment, arm=arm)
    assert "min_micro_batch" in str(err.value)
    assert not Run.objects.exists()


def test_cancel_ends_a_queued_run_now_and_flags_a_running_one(experiment):
    queued = RunFactory(arm=experiment.arms.first(), status="queued")
    running = RunFactory(arm=experiment.arms.first(), status="running")
    assert run_cancel(run=queued).status == "cancelled"
    running = run_cancel(run=running)
    assert running.status == "running" and running.cancel_requested
    with pytest.raises(ApplicationError, match="already cancelled"):
        run_cancel(run=queued)


def test_tenants_share_a_queue_fairly(experiment, django_capture_on_commit_callbacks):
    """Issue 25: one team's flood of runs held another team's first run back (a plain FIFO).
    Within a priority a team's first runs go before another team's later ones."""
    from apps.experiments.selectors import queue_places

    other = ExperimentFactory(tenant__max_concurrent_runs=1000, status="active")
    ArmFactory(experiment=other, name="control", is_control=True, strategy_yaml=GOOD)
    with django_capture_on_commit_callbacks(execute=False):
        flood = [run_submit(experiment=experiment) for _ in range(6)]
        theirs = run_submit(experiment=other)
        ci = run_submit(experiment=experiment, priority=Run.Priority.CI)
    places = queue_places()
    assert places[ci.pk].position == 1  # ci first, whoever's
    assert places[flood[0].pk].position == 2  # each team's first normal run ...
    assert places[theirs.pk].position == 3  # ... before the flood's second, submitted earlier
    assert [places[r.pk].position for r in flood[1:]] == [4, 5, 6, 7, 8]
    assert [r.queue_level for r in (ci, flood[0], flood[1], flood[4], theirs)] == [0, 3, 4, 5, 3]
