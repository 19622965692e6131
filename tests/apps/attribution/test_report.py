"""The report: the design document's comparison per arm, measured and projected to target steps."""

from datetime import timedelta
from decimal import Decimal

import pytest

from apps.attribution.say.report import experiment_report
from apps.attribution.services import attribution_tick
from apps.experiments.models import Run
from tests.apps.attribution.lab import T0, priced_tenant
from tests.factories import ArmFactory, ExperimentFactory, RunFactory

pytestmark = pytest.mark.django_db


def finished_run(arm, *, cost, energy_usd, status=Run.Status.SUCCEEDED, estimated=False):
    # One GPU-hour, 1 kWh, 100 steps and 1M tokens per run.
    sku = arm.experiment.tenant.pricing_tables.get().gpu_prices.get().sku
    return RunFactory(
        arm=arm,
        status=status,
        gpu_count=1,
        gpu_sku=sku,
        tokens=1_000_000,
        steps=100,
        priced_seq=99,
        device_seconds=3600.0,
        energy_j=3_600_000.0,
        energy_estimated=estimated,
        cost_usd=Decimal(cost),
        cost_breakdown={"energy_usd": energy_usd, "total_usd": float(cost)},
        started_at=T0,
        finished_at=T0 + timedelta(hours=1),
    )


@pytest.fixture
def experiment():
    price = priced_tenant()
    exp = ExperimentFactory(tenant=price.pricing_table.tenant, status="active", target_steps=1000)
    control = ArmFactory(experiment=exp, name="baseline", is_control=True)
    optimized = ArmFactory(experiment=exp, name="optimized")
    for _ in range(2):
        finished_run(control, cost="3.500000", energy_usd=0.18)
        finished_run(optimized, cost="3.850000", energy_usd=0.20, estimated=True)
    Run.objects.filter(
        pk=finished_run(optimized, cost="9.0", energy_usd=1.0, status=Run.Status.RUNNING).pk
    ).update(finished_at=None)
    return exp


def test_measured_figures_per_arm(experiment, django_assert_max_num_queries):
    # + the evaluation curves (cost to a quality) and the unpriced SKUs: one query each
    with django_assert_max_num_queries(7):
        report = experiment_report(experiment=experiment)
    baseline, optimized = report.arms
    assert (baseline.name, baseline.is_control, optimized.name) == ("baseline", True, "optimized")
    assert baseline.runs == 2 and baseline.runs_succeeded == 2
    assert baseline.gpu_hours == pytest.approx(2.0) and baseline.energy_kwh == pytest.approx(2.0)
    assert baseline.electricity_usd == pytest.approx(0.36) and baseline.total_usd == pytest.approx(
        7.0
    )
    assert baseline.usd_per_mtok == pytest.approx(3.5) and baseline.deviation == pytest.approx(0.0)
    assert baseline.completion_s == pytest.approx(3600.0)
    assert baseline.throughput_tok_s == pytest.approx(1_000_000 / 3600)
    assert not baseline.energy_estimated and optimized.energy_estimated
    # The running third run counts in what was spent, not in the completion time.
    assert (
        optimized.runs == 3
        and optimized.runs_succeeded == 2
        and optimized.completion_s == pytest.approx(3600.0)
    )
    assert optimized.total_usd == pytest.approx(16.7) and optimized.usd_per_mtok == pytest.approx(
        16.7 / 3
    )
    assert optimized.deviation == pytest.approx((16.7 / 3) / 3.5 - 1)
    assert optimized.state == "active"


def test_projected_to_the_target_steps(experiment):
    baseline = experiment_report(experiment=experiment).arms[0]
    # 200 steps measured -> 1000: x5. One run of 1000 steps at 36 s per step.
    p = baseline.projected
    assert p.target_steps == 1000
    assert (p.gpu_hours, p.electricity_usd, p.total_usd) == pytest.approx((10.0, 1.8, 35.0))
    assert p.completion_s == pytest.approx(36_000.0)


def test_deviation_bounds_come_from_the_latest_attribution_window(experiment):
    assert experiment_report(experiment=experiment).arms[1].deviation_low is None
    attribution_tick(now=T0 + timedelta(hours=2))
    report = experiment_report(experiment=experiment)
    snapshot = experiment.snapshots.get(arm__name="optimized")
    assert report.arms[1].deviation_low == snapshot.deviation_low is not None
    assert report.arms[1].deviation_high == snapshot.deviation_high
    assert report.window_end == T0 + timedelta(hours=2)


def test_no_target_steps_no_projection(experiment):
    experiment.target_steps = None
    experiment.save()
    assert all(arm.projected is None for arm in experiment_report(experiment=experiment).arms)


def test_a_tiered_model_projects_piecewise_through_its_tiers():
    price = priced_tenant()
    tiers = [{"up_to": 100, "usd_per_unit": "0.01"}, {"up_to": None, "usd_per_unit": "0.005"}]
    exp = ExperimentFactory(
        tenant=price.pricing_table.tenant,
        status="active",
        target_steps=1000,
        cost_model__kind="tiered_per_call",
        cost_model__unit="step",
        cost_model__tiers=tiers,
    )
    arm = ArmFactory(experiment=exp, name="baseline", is_control=True)
    finished_run(arm, cost="1.000000", energy_usd=0.0)  # 100 steps x 0.01 USD
    p = experiment_report(experiment=exp).arms[0].projected
    # One run of 1000 steps: 100 x 0.01 + 900 x 0.005 USD, not 10 x the first hundred.
    assert p.total_usd == pytest.approx(100 * 0.01 + 900 * 0.005) == pytest.approx(5.50)
    assert p.estimated is True


def test_a_cpu_ddp_runs_wall_time_is_its_device_seconds_per_rank():
    """A CPU run's device-seconds add up over its DDP ranks; its wall time (completion, throughput,
    the observation's wall_s) is the time one rank took, not the sum."""
    price = priced_tenant()
    exp = ExperimentFactory(tenant=price.pricing_table.tenant, status="active")
    arm = ArmFactory(experiment=exp, name="ddp", is_control=True)
    run = RunFactory(
        arm=arm,
        status=Run.Status.SUCCEEDED,
        gpu_count=0,
        world_size=2,
        tokens=1_000_000,
        steps=100,
        priced_seq=99,
        device_seconds=7200.0,
        energy_j=0.0,
        cost_usd=Decimal("1.0"),
        cost_breakdown={"total_usd": 1.0},
        started_at=T0,
        finished_at=T0 + timedelta(hours=1),
    )
    report = experiment_report(experiment=exp).arms[0]
    assert report.completion_s == pytest.approx(3600.0)
    assert report.throughput_tok_s == pytest.approx(1_000_000 / 3600)
    attribution_tick(now=T0 + timedelta(hours=2))
    assert float(run.attribution_windows.get().wall_s) == pytest.approx(3600.0)
