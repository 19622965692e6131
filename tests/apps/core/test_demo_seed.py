"""The demo seed labels its prices as examples and can run any number of times."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from apps.experiments.models import Arm, Experiment
from apps.pricing.models import GpuPrice, GpuSku, PricingTable
from apps.tenants.models import Membership, Tenant

pytestmark = pytest.mark.django_db

MODELS = (Tenant, PricingTable, GpuSku, GpuPrice, Experiment, Arm, Membership, get_user_model())


def counts():
    return {m.__name__: m.objects.count() for m in MODELS}


def test_seed_is_idempotent_and_prints_a_generated_password_once(capsys):
    call_command("seed_demo")
    first_out = capsys.readouterr().out
    after_first = counts()
    call_command("seed_demo")
    second_out = capsys.readouterr().out
    assert counts() == after_first
    assert all(n >= 1 for n in after_first.values())

    assert "password:" in first_out and "password:" not in second_out
    password = first_out.split("password:")[1].split()[0]
    assert len(password) >= 12
    assert get_user_model().objects.get(username="admin").check_password(password)


def test_seeded_prices_are_labelled_example():
    call_command("seed_demo")
    table = PricingTable.objects.get()
    assert table.is_example and "EXAMPLE" in table.notes
    assert "example" in str(table).lower()
    assert Arm.objects.filter(is_control=True).count() == 1


def test_seed_can_queue_demo_runs_once(django_capture_on_commit_callbacks):
    from apps.experiments.models import Run

    with django_capture_on_commit_callbacks(execute=False) as enqueued:
        call_command("seed_demo", "--submit-runs", "2")
        call_command("seed_demo", "--submit-runs", "2")  # runs still queued: nothing more
    assert Run.objects.count() == 4 and len(enqueued) == 4
    assert set(Run.objects.values_list("arm__name", flat=True)) == {"pytorch-baseline", "costlab-optimized"}


def test_seeding_again_after_the_demo_runs_finished_queues_nothing(django_capture_on_commit_callbacks):
    from apps.experiments.models import Run

    with django_capture_on_commit_callbacks(execute=False):
        call_command("seed_demo", "--submit-runs", "2")
    Run.objects.update(status=Run.Status.SUCCEEDED)  # the demo ran to the end; make run starts again
    with django_capture_on_commit_callbacks(execute=False) as enqueued:
        call_command("seed_demo", "--submit-runs", "2")
    assert Run.objects.count() == 4 and enqueued == []


def test_the_demo_leaves_room_in_the_quota_for_a_new_users_runs(django_capture_on_commit_callbacks):
    """make run queues 2 runs per arm; a new user's first submissions must not be refused by the quota,
    and once it is full, the refusal names the limit."""
    from apps.core.exceptions import ApplicationError
    from apps.experiments.models import Run
    from apps.experiments.services import run_submit

    with django_capture_on_commit_callbacks(execute=False):
        call_command("seed_demo", "--submit-runs", "2")
        experiment = Experiment.objects.get()
        for _ in range(4):
            run_submit(experiment=experiment)  # a new user's first runs
        tenant = Tenant.objects.get(slug="demo")
        while Run.objects.filter(status__in=Run.ACTIVE_STATUSES).count() < tenant.max_concurrent_runs:
            run_submit(experiment=experiment)
        with pytest.raises(ApplicationError) as refused:
            run_submit(experiment=experiment)
    assert str(refused.value).startswith("max_concurrent_runs:") and f"limit {tenant.max_concurrent_runs}" in str(
        refused.value)
