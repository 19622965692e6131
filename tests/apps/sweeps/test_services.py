"""Sweep services on the real database: validation (nothing queued on a 400), proposals without
duplicates, a probe trained in-process and priced like a run, infeasible probes, cancel, promote."""

from decimal import Decimal

import pytest

from apps.core.exceptions import ApplicationError
from apps.experiments.models import Arm
from apps.sweeps import probes, services
from apps.sweeps.models import Probe, Sweep
from apps.sweeps.selectors import sweep_frontier
from tests.factories import CostModelFactory, ExperimentFactory, GpuPriceFactory, TenantFactory
from workers.sweeps import probe_execute

pytestmark = pytest.mark.django_db

BASE = """\
model: {preset: tiny, seq_len: 32}
data: {source: synthetic}
train: {steps: 1000, global_batch: 2, seed: 1}
"""


def create(tenant, **overrides):
    fields = dict(
        tenant=tenant,
        name="s",
        base_strategy_yaml=BASE,
        probe_count=4,
        probe_steps=4,
        space={"train.global_batch": [1, 2], "model.seq_len": [16, 32]},
    )
    fields.update(overrides)
    return services.sweep_create(**fields)


@pytest.fixture
def tenant():
    return (
        GpuPriceFactory().pricing_table.tenant
    )  # a pricing table: CPU probes pay vCPU-hours and energy


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"space": {"train.global_batch": []}}, "space.train.global_batch"),
        ({"space": {"model.seq_len": {"low": 64, "high": 16}}}, "space.model.seq_len"),
        ({"space": {"train.bogus": [1]}}, "space.train.bogus"),
        ({"space": {"precision.compute_dtype": ["fp32", "fp12"]}}, "space.precision.compute_dtype"),
        ({"sampler": "grid", "probe_count": 3}, "space"),
        ({"objectives": ["usd_per_mtok", "beauty"]}, "objectives"),
        ({"parallelism": 99}, "parallelism"),
        ({"base_strategy_yaml": "model: {preset: huge}\n"}, "base_strategy_yaml"),
        ({"probe_count": 0}, "probe_count"),
    ],
)
def test_bad_input_names_the_field_and_queues_nothing(
    tenant, overrides, field, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as sent, pytest.raises(ApplicationError) as err:
        create(tenant, **overrides)
    assert err.value.message.startswith(f"{field}:"), err.value.message
    assert field in err.value.extra["fields"]
    assert not sent and not Sweep.objects.exists() and not Probe.objects.exists()


def test_a_spent_monthly_budget_refuses_the_sweep(tenant):
    tenant.monthly_budget_usd = Decimal("0")
    tenant.save()
    with pytest.raises(ApplicationError, match="^probe_count: .*monthly budget"):
        create(tenant)


def test_create_picks_the_sampler_and_queues_parallelism_distinct_probes(
    tenant, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as sent:
        sweep = create(tenant, parallelism=3)
    assert sweep.sampler == "grid" and sweep.objectives == ["usd_per_mtok", "peak_mem_mb"]
    probes = list(sweep.probes.all())
    assert len(probes) == 3 == len(sent) and len({p.params_key for p in probes}) == 3
    bigger = create(
        tenant, name="t", space={"train.global_batch": [1, 2, 4], "model.seq_len": [16, 32]}
    )
    assert bigger.sampler == "tpe"  # 6 points, 4 probes: subsampled


@pytest.mark.slow
def test_probes_train_for_real_are_priced_and_the_next_one_is_queued(
    tenant, django_capture_on_commit_callbacks
):
    sweep = create(tenant, parallelism=1, probe_steps=6)
    first = sweep.probes.get()
    with django_capture_on_commit_callbacks() as sent:
        probe_execute(first.pk)
    first.refresh_from_db()
    assert first.status == "succeeded", first.reason
    assert first.steps_timed >= 1 and first.step_time_s > 0 and first.tokens_per_s > 0
    assert (
        first.usd_per_mtok > 0
        and first.cost_usd > 0
        and first.energy_j > 0
        and first.energy_estimated
    )
    assert first.peak_mem_mb is not None and first.mem_estimated and first.final_loss > 0
    assert first.device == "cpu"
    assert len(sent) == 1 and sweep.probes.count() == 2  # the proposer queued the next probe
    assert sweep.probes.exclude(pk=first.pk).get().params_key != first.params_key


@pytest.mark.slow
def test_an_infeasible_probe_is_recorded_with_its_reason_and_the_sweep_goes_on(tenant):
    sweep = create(
        tenant,
        parallelism=1,
        probe_count=2,
        space={"train.global_batch": [1, 2], "train.micro_batch": [2]},
    )  # 2 > 1: refused together
    while sweep.probes.filter(status="queued").exists():
        probe_execute(sweep.probes.get(status="queued").pk)
    by_gb = {p.params["train.global_batch"]: p for p in sweep.probes.all()}
    assert by_gb[1].status == "infeasible" and "train.micro_batch" in by_gb[1].reason
    assert by_gb[2].status == "succeeded"
    sweep.refresh_from_db()
    assert sweep.status == "completed"
    assert [p.on_frontier for p in sweep_frontier(sweep=sweep) if p.status == "infeasible"] == [
        False
    ]


@pytest.mark.slow
def test_the_space_exhausted_ends_the_sweep_without_duplicates(tenant):
    sweep = create(
        tenant,
        parallelism=2,
        probe_count=50,
        probe_steps=3,
        space={"model.seq_len": [16, 32]},
        sampler="nsga2",
    )
    assert sweep.probe_count == 2  # never more probes than points
    while sweep.probes.filter(status="queued").exists():
        probe_execute(sweep.probes.filter(status="queued").first().pk)
    sweep.refresh_from_db()
    assert sweep.status == "completed" and sweep.probes.count() == 2
    assert sorted(p.params["model.seq_len"] for p in sweep.probes.all()) == [16, 32]


def test_cancel_ends_queued_probes_and_a_worker_does_not_take_them(tenant):
    sweep = create(tenant)
    services.sweep_cancel(sweep=sweep)
    assert set(sweep.probes.values_list("status", flat=True)) == {"cancelled"}
    assert probes.probe_claim(probe_id=sweep.probes.first().pk, owner="w") is None
    with pytest.raises(ApplicationError, match="^status:"):
        services.sweep_cancel(sweep=sweep)


@pytest.mark.slow
def test_promote_a_frontier_point_into_a_new_experiment_and_refuse_others(tenant):
    CostModelFactory(tenant=tenant)
    sweep = create(tenant, parallelism=1, probe_count=2, space={"model.seq_len": [16, 32]})
    while sweep.probes.filter(status="queued").exists():
        probe_execute(sweep.probes.get(status="queued").pk)
    probes = sweep_frontier(sweep=sweep)
    on = [p for p in probes if p.on_frontier]
    assert on, [(p.status, p.reason) for p in probes]
    arm = services.sweep_promote(
        sweep=sweep, probe=on[0], weight=Decimal("0.5"), experiment_name="confirm"
    )
    assert arm.weight == Decimal("0.5") and arm.strategy_yaml == on[0].strategy_yaml
    assert {a.name for a in arm.experiment.arms.all()} == {"base", arm.name}
    assert arm.experiment.arms.get(is_control=True).strategy_yaml == BASE
    existing = ExperimentFactory(tenant=tenant)
    again = services.sweep_promote(
        sweep=sweep, probe=on[0], weight=Decimal("2"), experiment=existing, arm_name="x"
    )
    assert again.experiment == existing and Arm.objects.filter(experiment=existing).count() == 1
    off = [p for p in probes if not p.on_frontier]
    if off:
        with pytest.raises(ApplicationError, match="^probe:"):
            services.sweep_promote(
                sweep=sweep, probe=off[0], weight=Decimal("1"), experiment=existing
            )
    with pytest.raises(ApplicationError, match="^experiment:"):
        services.sweep_promote(
            sweep=sweep,
            probe=on[0],
            weight=Decimal("1"),
            experiment=ExperimentFactory(tenant=TenantFactory()),
        )


def test_reconcile_marks_a_silent_probe_lost_and_resends_an_unsent_one(
    tenant, monkeypatch, settings
):
    from datetime import timedelta

    from django.utils import timezone

    sent = []
    monkeypatch.setattr(probes, "probe_send", lambda **kw: sent.append(kw["probe_id"]))
    sweep = create(tenant, parallelism=2, probe_count=3)
    first, second = sweep.probes.order_by("number")
    assert probes.probe_claim(probe_id=first.pk, owner="w1") is not None
    assert probes.probe_heartbeat(probe_id=first.pk, owner="w1") is False  # renewed, keep going
    assert probes.probe_heartbeat(probe_id=first.pk, owner="someone else") is True
    later = timezone.now() + timedelta(seconds=settings.COSTLAB_PROBE_LOST_AFTER_S + 1)
    sent.clear()
    outcome = probes.probes_reconcile(now=later)
    first.refresh_from_db()
    assert (
        outcome["lost"] == [first.pk]
        and first.status == "infeasible"
        and first.reason.startswith("lost:")
    )
    assert second.pk in outcome["resent"]  # never sent (the broker was "down"): sent again
    assert sweep.probes.count() == 3  # the lost probe's slot went to a new candidate
    assert probes.probes_reconcile(now=timezone.now()) == {"lost": [], "resent": []}
