"""Held-out loss in a sweep: as an objective (a frontier of cost and quality), as a constraint
(within the margin of the base strategy), and as a gate on promotion (refused beyond the margin
unless forced). Probes land through probe_finish with a worker's hand-back made up here (samples
and a result), so nothing trains."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace

import pytest
import yaml

from apps.core.exceptions import ApplicationError
from apps.sweeps import probes, services
from apps.sweeps.models import Probe, Sweep
from apps.sweeps.probes import candidate_yaml
from apps.sweeps.selectors import sweep_frontier
from apps.sweeps.space import params_key
from tests.factories import ExperimentFactory, GpuPriceFactory

pytestmark = pytest.mark.django_db

BASE = """\
model: {preset: tiny, seq_len: 32}
data: {source: synthetic}
train: {steps: 1000, global_batch: 2, seed: 1}
"""
EVAL_BASE = BASE + "eval: {every_steps: 4, holdout: 0.1, max_tokens: 512}\n"
SPACE = {"train.global_batch": [1, 2, 4]}


@pytest.fixture
def tenant():
    return GpuPriceFactory().pricing_table.tenant  # CPU probes pay vCPU-hours and energy


def _runtime_evaluates() -> bool:
    from gpu_runtime.schema import StrategyConfig

    return "eval" in StrategyConfig.model_fields


def sweep_of(tenant, *, objectives, quality_margin=None, base_yaml=EVAL_BASE, batches=(2, 1, 4)):
    """A running sweep whose probes are all proposed: the base (global_batch 2) first, then the
    others, as sweep_create queues them when the base evaluates."""
    sweep = Sweep.objects.create(
        tenant=tenant,
        name="quality",
        base_strategy_yaml=base_yaml,
        space=SPACE,
        objectives=objectives,
        sampler=Sweep.Sampler.GRID,
        probe_count=len(batches),
        probe_steps=4,
        parallelism=len(batches),
        quality_margin=quality_margin,
    )
    for number, batch in enumerate(batches):
        params = {"train.global_batch": batch}
        Probe.objects.create(
            sweep=sweep,
            number=number,
            params=params,
            params_key=params_key(params),
            # the text a promoted arm gets, without eval: so that it validates whether or not the
            # runtime has that section yet; the gate reads the measured losses, not this
            strategy_yaml=candidate_yaml(yaml.safe_load(BASE), params),
            is_base=number == 0,
        )
    return sweep


def land(probe: Probe, *, step_s: float, eval_loss: float | None, mem_mb: float = 100.0):
    """Claim the probe and hand back what a worker would: 6 samples (2 of warm-up), a result."""
    assert probes.probe_claim(probe_id=probe.pk, owner="w") is not None
    start = datetime.now(UTC) - timedelta(minutes=1)
    # the bill follows time: a longer step costs more per token at the same vCPU price
    dt = step_s
    samples = [
        {
            "seq": i,
            "ts": (start + timedelta(seconds=dt * i)).timestamp(),
            "step": i,
            "rank": 0,
            "device": "cpu",
            "util_pct": 100.0,
            "mem_used_mb": 1000.0 + mem_mb,
            "power_w": 50.0,
            "energy_j": 50.0 * dt * i,
            "step_time_s": dt,
            "tokens": 64 * i,
            "loss": 5.0,
            "estimated": True,
        }
        for i in range(1, 7)
    ]
    result = SimpleNamespace(
        peak_mem_mb=1000.0 + mem_mb,
        energy_estimated=True,
        final_loss=5.0,
        eval_loss=eval_loss,
        eval_s=0.2 if eval_loss is not None else None,
    )
    probes.probe_finish(
        probe_id=probe.pk,
        owner="w",
        samples=samples,
        result=result,
        device="cpu",
        vcpus=2,
        baseline_mem_mb=1000.0,
    )
    probe.refresh_from_db()
    return probe


def landed(sweep, figures):
    """Land every probe in the order given: {global_batch: (seconds per step, eval_loss)}."""
    by_batch = {p.params["train.global_batch"]: p for p in sweep.probes.all()}
    for batch, (step_s, loss) in figures.items():
        land(by_batch[batch], step_s=step_s, eval_loss=loss)
    return {p.params["train.global_batch"]: p for p in sweep_frontier(sweep=sweep)}


def test_eval_loss_as_an_objective_keeps_the_cheap_but_worse_point_and_the_good_one(tenant):
    sweep = sweep_of(tenant, objectives=["usd_per_mtok", "eval_loss"])
    # batch 1: cheapest, 7.7 % worse held-out loss; 2 (the base): dearer, better; 4: dominated
    front = landed(sweep, {2: (1.5, 3.25), 1: (1.0, 3.50), 4: (1.6, 3.60)})
    assert all(p.status == "succeeded" for p in front.values()), [p.reason for p in front.values()]
    assert front[1].eval_loss == 3.50 and front[1].eval_s == 0.2
    assert front[1].usd_per_mtok < front[2].usd_per_mtok
    assert {b for b, p in front.items() if p.on_frontier} == {1, 2}  # a trade-off, both kept
    # cost alone would keep only the cheap point: quality is what keeps the good one
    sweep.objectives = ["usd_per_mtok"]
    sweep.save()
    assert [p.params for p in sweep_frontier(sweep=sweep) if p.on_frontier] == [
        {"train.global_batch": 1}
    ]


def test_under_a_quality_margin_a_worse_probe_is_infeasible_with_the_reason(tenant):
    sweep = sweep_of(tenant, objectives=["usd_per_mtok"], quality_margin=Decimal("0.01"))
    by_batch = {p.params["train.global_batch"]: p for p in sweep.probes.all()}
    worse = land(by_batch[1], step_s=1.0, eval_loss=3.50)
    assert worse.status == "succeeded"  # not judged before the base has landed
    land(by_batch[2], step_s=1.5, eval_loss=3.25)
    land(by_batch[4], step_s=1.2, eval_loss=3.27)  # 0.6 % worse: within the 1 % margin
    front = {p.params["train.global_batch"]: p for p in sweep_frontier(sweep=sweep)}
    assert front[1].status == "infeasible" and not front[1].on_frontier
    assert front[1].reason.startswith("quality_margin: ")
    for said in ("3.5000", "7.7 % above", "3.2500", "the margin is 1 %"):
        assert said in front[1].reason, front[1].reason
    assert front[1].usd_per_mtok is not None  # measured: the figures stay on the row
    assert front[4].status == "succeeded" and front[4].on_frontier
    assert Sweep.objects.get(pk=sweep.pk).status == "completed"


def test_a_base_that_failed_certifies_no_candidate_under_a_margin(tenant):
    sweep = sweep_of(tenant, objectives=["usd_per_mtok"], quality_margin=Decimal("0.01"))
    base, cheap, _ = sweep.probes.order_by("number")
    land(cheap, step_s=1.0, eval_loss=3.25)
    assert probes.probe_claim(probe_id=base.pk, owner="w") is not None
    probes.probe_finish(probe_id=base.pk, owner="w", error="out of memory: 2 GiB asked")
    cheap.refresh_from_db()
    assert cheap.status == "infeasible"
    assert "the base strategy's held-out loss was not measured" in cheap.reason
    assert "probe #0 is infeasible: out of memory" in cheap.reason


def test_a_candidate_that_reports_no_held_out_loss_is_off_an_eval_loss_frontier(tenant):
    sweep = sweep_of(tenant, objectives=["usd_per_mtok", "eval_loss"], batches=(2, 1))
    front = landed(sweep, {2: (1.5, 3.25), 1: (1.0, None)})
    assert front[1].status == "infeasible" and front[1].reason.startswith("eval_loss: ")
    assert [b for b, p in front.items() if p.on_frontier] == [2]


def test_promote_refuses_a_point_worse_than_the_margin_naming_the_reason_and_force_takes_it(
    tenant,
):
    sweep = sweep_of(tenant, objectives=["usd_per_mtok", "eval_loss"])
    front = landed(sweep, {2: (1.5, 3.25), 1: (1.0, 3.50)})
    experiment = ExperimentFactory(tenant=tenant, quality_margin=Decimal("0.02"))
    with pytest.raises(ApplicationError) as refused:
        services.sweep_promote(
            sweep=sweep, probe=front[1], weight=Decimal("1"), experiment=experiment
        )
    error = refused.value
    assert error.status_code == 409 and error.code == "quality_worse"
    assert error.message.startswith("probe: ") and "probe" in error.extra["fields"]
    margin_from = f"quality_margin of experiment '{experiment.name}'"
    for said in ("3.5000", "3.2500", "7.7 % above", "the margin is 2 %", margin_from):
        assert said in error.message, error.message
    assert not experiment.arms.exists()
    arm = services.sweep_promote(
        sweep=sweep, probe=front[1], weight=Decimal("1"), experiment=experiment, force=True
    )
    audit = Probe.objects.get(pk=front[1].pk).promotions
    assert [(a["arm"], a["forced"], a["quality"]["verdict"]) for a in audit] == [
        (arm.pk, True, "worse")
    ]
    assert audit[0]["quality"]["eval_loss"] == 3.50
    assert Decimal(audit[0]["quality"]["margin"]) == Decimal("0.02")
    # the good point needs no force, and says so
    services.sweep_promote(sweep=sweep, probe=front[2], weight=Decimal("1"), experiment=experiment)
    assert Probe.objects.get(pk=front[2].pk).promotions[0]["forced"] is False


def test_promote_refuses_a_point_whose_held_out_loss_was_not_measured_unless_forced(tenant):
    sweep = sweep_of(tenant, objectives=["usd_per_mtok"], batches=(2, 1))
    front = landed(sweep, {2: (1.5, 3.25), 1: (1.0, None)})
    experiment = ExperimentFactory(tenant=tenant)
    with pytest.raises(ApplicationError, match="^probe: .*not measured") as refused:
        services.sweep_promote(
            sweep=sweep, probe=front[1], weight=Decimal("1"), experiment=experiment
        )
    assert refused.value.code == "quality_not_measured"
    services.sweep_promote(
        sweep=sweep, probe=front[1], weight=Decimal("1"), experiment=experiment, force=True
    )
    assert Probe.objects.get(pk=front[1].pk).promotions[0]["quality"]["verdict"] == "not_measured"


def test_promote_under_the_constraint_gives_the_quality_reason_and_force_takes_the_point(tenant):
    sweep = sweep_of(tenant, objectives=["usd_per_mtok"], quality_margin=Decimal("0.05"))
    front = landed(sweep, {2: (1.5, 3.25), 1: (1.0, 3.50), 4: (1.6, 3.25)})
    assert front[1].status == "infeasible" and not front[1].on_frontier
    experiment = ExperimentFactory(tenant=tenant, quality_margin=Decimal("0.5"))
    with pytest.raises(ApplicationError, match="the sweep's quality_margin") as refused:
        services.sweep_promote(
            sweep=sweep, probe=front[1], weight=Decimal("1"), experiment=experiment
        )
    assert refused.value.code == "quality_worse" and "5 %" in refused.value.message
    arm = services.sweep_promote(
        sweep=sweep, probe=front[1], weight=Decimal("1"), experiment=experiment, force=True
    )
    assert arm.strategy_yaml == front[1].strategy_yaml
    with pytest.raises(ApplicationError, match="not on the sweep's frontier"):  # force is no more
        services.sweep_promote(
            sweep=sweep, probe=front[4], weight=Decimal("1"), experiment=experiment, force=True
        )


def test_a_sweep_that_measures_no_quality_promotes_unchecked(tenant):
    sweep = sweep_of(tenant, objectives=["usd_per_mtok"], base_yaml=BASE, batches=(2, 1))
    front = landed(sweep, {2: (1.5, None), 1: (1.0, None)})
    experiment = ExperimentFactory(tenant=tenant)
    services.sweep_promote(sweep=sweep, probe=front[1], weight=Decimal("1"), experiment=experiment)
    assert Probe.objects.get(pk=front[1].pk).promotions[0]["quality"]["verdict"] == "unchecked"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"objectives": ["usd_per_mtok", "eval_loss"]}, "objectives"),
        ({"quality_margin": Decimal("0.01")}, "quality_margin"),
    ],
)
def test_create_refuses_held_out_loss_without_an_eval_section(
    tenant, overrides, field, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as sent, pytest.raises(ApplicationError) as err:
        services.sweep_create(
            tenant=tenant,
            name="s",
            base_strategy_yaml=BASE,
            space=SPACE,
            probe_count=3,
            probe_steps=4,
            **overrides,
        )
    assert err.value.message.startswith(f"{field}: ") and field in err.value.extra["fields"]
    assert "needs an eval: section in the base strategy" in err.value.message
    assert not sent and not Sweep.objects.exists()


@pytest.mark.skipif(not _runtime_evaluates(), reason="the runtime has no eval: section yet")
@pytest.mark.parametrize(
    ("space", "probe_count", "in_space"),
    [
        ({"train.global_batch": [1, 2, 4]}, 3, True),  # the base's batch (2) is a point
        ({"train.global_batch": [1, 4]}, 3, False),  # outside: probed on top of the budget
    ],
)
def test_create_probes_the_base_first_when_it_evaluates(
    tenant, space, probe_count, in_space, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as sent:
        sweep = services.sweep_create(
            tenant=tenant,
            name="s",
            base_strategy_yaml=EVAL_BASE,
            space=space,
            probe_count=probe_count,
            probe_steps=4,
            parallelism=2,
            objectives=["usd_per_mtok", "eval_loss"],
            quality_margin=Decimal("0.01"),
        )
    first, second = sweep.probes.order_by("number")
    assert first.is_base and first.params == {"train.global_batch": 2} and len(sent) == 2
    assert "eval" in first.strategy_yaml and second.params != first.params
    assert sweep.probe_count == len(space["train.global_batch"]) + (0 if in_space else 1)


def test_the_api_refuses_a_worse_point_with_409_and_promotes_it_with_force(tenant):
    from tests.apps.api.conftest import token_client

    api = token_client(tenant)
    refused = api.post(
        "/api/v1/sweeps/",
        {
            "name": "s",
            "base_strategy_yaml": BASE,
            "space": SPACE,
            "probe_count": 3,
            "probe_steps": 4,
            "objectives": ["usd_per_mtok", "eval_loss"],
        },
        format="json",
    )
    assert refused.status_code == 400 and "objectives" in refused.json()["error"]["fields"]
    sweep = sweep_of(tenant, objectives=["usd_per_mtok", "eval_loss"], batches=(2, 1))
    front = landed(sweep, {2: (1.5, 3.25), 1: (1.0, 3.50)})
    experiment = ExperimentFactory(tenant=tenant)
    url = f"/api/v1/sweeps/{sweep.pk}/promote/"
    asked = {"probe": front[1].pk, "experiment": experiment.pk}
    worse = api.post(url, asked, format="json")
    assert worse.status_code == 409, worse.json()
    error = worse.json()["error"]
    assert error["code"] == "quality_worse" and "probe" in error["fields"]
    assert "3.5000" in error["message"] and "3.2500" in error["message"]
    forced = api.post(url, {**asked, "force": True}, format="json")
    assert forced.status_code == 201, forced.json()
    probes_seen = {p["number"]: p for p in api.get(f"/api/v1/sweeps/{sweep.pk}/frontier/").json()}
    assert probes_seen[0]["is_base"] and probes_seen[1]["eval_loss"] == 3.50
    assert [a["forced"] for a in probes_seen[1]["promotions"]] == [True]
    assert api.get(f"/api/v1/sweeps/{sweep.pk}/").json()["quality_margin"] is None
