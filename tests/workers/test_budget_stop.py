"""The monthly budget acts while a run trains: once the bill passes it, the tenant's running
runs stop at their next step with the reason in their notes, and submits are refused."""

from decimal import Decimal

import pytest

from apps.core.exceptions import ApplicationError
from apps.experiments.models import Run
from apps.experiments.services import run_submit
from apps.pricing.models import PricingTable
from apps.tenants.models import Tenant
from tests.workers.test_runs_on_a_worker import LONG, experiment_with, wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_run_that_spends_the_budget_stops_at_its_next_step(celery_worker_process):
    exp = experiment_with(LONG)
    # 360 USD per vCPU-hour: the 0.01 USD budget is spent within the first priced batch.
    PricingTable.objects.filter(tenant=exp.tenant).update(vcpu_hour_usd=Decimal("360"))
    Tenant.objects.filter(pk=exp.tenant_id).update(monthly_budget_usd=Decimal("0.01"))
    run = run_submit(experiment=exp)
    run = wait_for(
        lambda: Run.objects.filter(pk=run.pk).exclude(status__in=Run.ACTIVE_STATUSES).first(),
        120,
        "the run to stop on its budget",
    )
    assert run.status == Run.Status.CANCELLED, (run.status, run.error)
    assert "the budget is spent; this run was stopped at its next step" in run.notes
    assert run.cost_usd >= Decimal("0.01") and run.steps < 100000
    assert Tenant.objects.get(pk=exp.tenant_id).budget_state == "exceeded"
    with pytest.raises(ApplicationError) as refused:
        run_submit(experiment=exp)
    assert refused.value.code == "budget_exceeded"
