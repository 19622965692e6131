"""Arm assignment for training that runs elsewhere: the SDK (or `costlab upload --assign`) asks
which arm a run key trains before the run exists, and gets the same arm every time it asks.

- Sticky: one ArmAssignment row per (experiment, run key), chosen once under the experiment's
  row lock and guarded by a unique constraint, so two concurrent asks of one key get one arm and
  one row; later weight changes never move a key. A run already made with the key answers with
  the arm it really ran on.
- A new key is split like a worker run (services.arm_furthest_below_share): each goes to the
  routable arm furthest below its weight's share of the keys assigned since the split last
  changed, so over many keys the split follows the weights exactly. A frozen arm has weight 0
  and gets none; when no arm is routable, the control (unless it is frozen too).
- Only an active experiment assigns; a tenant at its concurrent-runs quota (or past its monthly
  budget) is refused with 429, as the run it is about to start would be.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.db.models import Count

from apps.core.exceptions import ApplicationError
from apps.experiments.models import Arm, ArmAssignment, Experiment, Run
from apps.experiments.services import (
    arm_furthest_below_share,
    arms_routable,
    split_changed_at,
    tenant_quota_check,
)
from apps.experiments.strategies import strategy_declared, strategy_filled

RUN_KEY_MAX = 200  # Run.run_key's length: the key is the run's key too


@dataclass(frozen=True)
class Assignment:
    experiment: Experiment
    run_key: str
    arm: Arm
    sticky: bool  # the key was assigned before (or already ran) and gets the same arm again

    @property
    def strategy(self) -> dict:
        """The arm's strategy parsed, defaults filled (gpu_runtime's schema)."""
        return strategy_filled(self.arm.strategy_yaml)

    @property
    def declared(self) -> dict:
        """The keys the arm's YAML sets, no defaults (what a trainer elsewhere should apply)."""
        return strategy_declared(self.arm.strategy_yaml)


@transaction.atomic
def arm_assign(*, experiment: Experiment, run_key: str) -> Assignment:
    """The arm `run_key` trains in `experiment`: the one it had, or a new one by weight."""
    if not 1 <= len(run_key) <= RUN_KEY_MAX:
        raise ApplicationError(
            f"run_key: must be 1 to {RUN_KEY_MAX} characters, got {len(run_key)}",
            {"fields": {"run_key": [f"1 to {RUN_KEY_MAX} characters"]}},
            code="invalid",
        )
    # One assignment of the experiment at a time: the split counts what came before it.
    experiment = (
        Experiment.objects.select_for_update(of=("self",))
        .select_related("tenant")
        .get(pk=experiment.pk)
    )
    if experiment.status != Experiment.Status.ACTIVE:
        raise ApplicationError(
            f"experiment: '{experiment.name}' is {experiment.status}; only an active experiment "
            "assigns arms",
            {
                "fields": {"experiment": [f"status {experiment.status}"]},
                "experiment_status": experiment.status,
            },
            code="experiment_not_active",
            status=409,
        )
    ran = Run.objects.filter(experiment=experiment, run_key=run_key).select_related("arm").first()
    held = (
        ArmAssignment.objects.filter(experiment=experiment, run_key=run_key)
        .select_related("arm")
        .first()
    )
    if ran is not None:  # sticky to what really ran
        if held is None:
            _record(experiment=experiment, run_key=run_key, arm=ran.arm)
        elif held.arm_id != ran.arm_id:
            ArmAssignment.objects.filter(pk=held.pk).update(arm=ran.arm)
        return Assignment(experiment=experiment, run_key=run_key, arm=ran.arm, sticky=True)
    # The key is about to start a run: refused as that run would be, before any arm is held.
    tenant_quota_check(tenant=experiment.tenant, status=429)
    if held is not None:
        return Assignment(experiment=experiment, run_key=run_key, arm=held.arm, sticky=True)
    held, created = _record(experiment=experiment, run_key=run_key, arm=_arm_by_weight(experiment))
    return Assignment(experiment=experiment, run_key=run_key, arm=held.arm, sticky=not created)


def _arm_by_weight(experiment: Experiment) -> Arm:
    arms = arms_routable(experiment=experiment)
    if not arms:
        control = experiment.arms.filter(is_control=True, state=Arm.State.ACTIVE).first()
        if control is None:
            raise ApplicationError(
                f"experiment: '{experiment.name}' has no active arm with weight > 0 and no "
                "active control to assign",
                {"fields": {"experiment": ["no routable arm"]}},
                code="no_active_arm",
                status=409,
            )
        return control
    routed = dict(
        ArmAssignment.objects.filter(arm__in=arms, created_at__gte=split_changed_at(arms))
        .values("arm_id")
        .annotate(n=Count("pk"))
        .values_list("arm_id", "n")
    )
    return arm_furthest_below_share(arms, routed)


def _record(*, experiment: Experiment, run_key: str, arm: Arm) -> tuple[ArmAssignment, bool]:
    """Store the key's arm (True: stored now); a row that won a race (the constraint fired) is
    the answer."""
    try:
        with transaction.atomic():
            row = ArmAssignment.objects.create(experiment=experiment, run_key=run_key, arm=arm)
            return row, True
    except IntegrityError:
        row = ArmAssignment.objects.select_related("arm").get(
            experiment=experiment, run_key=run_key
        )
        return row, False
