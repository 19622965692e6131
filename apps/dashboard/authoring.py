"""The dashboard's writes on experiments, arms and runs: one transaction per form, through the same
services (and so the same rules and messages) as the API."""

from __future__ import annotations

from django.db import transaction

from apps.core.exceptions import ApplicationError
from apps.experiments.models import Arm, Experiment, Run
from apps.experiments.services import (
    arm_create,
    arm_delete,
    arm_update,
    experiment_create,
    experiment_update,
    run_submit,
    strategy_device_warnings,
)
from apps.tenants.models import Tenant


class ArmRefused(ApplicationError):
    """A service refused one arm of the form: `index` says which, so the form shows it there."""

    def __init__(self, exc: ApplicationError, index: int):
        super().__init__(exc.message, exc.extra, code=exc.code, status=exc.status_code)
        self.index = index


@transaction.atomic
def experiment_author(
    *,
    tenant: Tenant | None = None,
    experiment: Experiment | None = None,
    fields: dict,
    arms: list[dict],
    actor=None,
) -> Experiment:
    """Create (with tenant) or edit (with experiment) an experiment and its arms, all or nothing.

    Each arm: name, strategy_yaml, weight, is_control, and arm_id and delete for an existing one
    (an arm with runs is refused: they need it). Deletions and arms that give up the control role
    are saved first, so the role can move from one arm to another."""
    if experiment is None:
        experiment = experiment_create(tenant=tenant, **fields)
    else:
        experiment = experiment_update(experiment=experiment, **fields)
    existing = {arm.pk: arm for arm in experiment.arms.all()}
    for arm in sorted(arms, key=lambda a: (not a.get("delete"), bool(a.get("is_control")))):
        try:
            values = {k: arm.get(k) for k in ("name", "strategy_yaml", "weight", "is_control")}
            if arm.get("arm_id"):
                if arm["arm_id"] not in existing:
                    raise ApplicationError(
                        f"arm_id: {arm['arm_id']} is not an arm of experiment '{experiment.name}'",
                        code="invalid",
                    )
                if arm.get("delete"):
                    arm_delete(arm=existing[arm["arm_id"]])
                else:
                    arm_update(arm=existing[arm["arm_id"]], actor=actor, **values)
            else:
                arm_create(experiment=experiment, **values)
        except ApplicationError as exc:
            raise ArmRefused(exc, arm["index"]) from None
    return experiment


def arm_device_warnings(*, experiment: Experiment, arms: list[dict]) -> list[str]:
    """After experiment_author: what the training queues' measured devices say of each arm the
    form saved (created or edited, not deleted), one notice per warning naming the arm and the key,
    e.g. "Arm 'bf16': precision.compute_dtype: bf16 runs at 0.02x fp32 on cpu (...)". The same
    warnings as the API's arm writes (strategy_device_warnings, every training queue); they never
    refuse a save."""
    names = [arm["name"] for arm in arms if not arm.get("delete")]
    saved = experiment.arms.filter(name__in=names).order_by("-is_control", "name")
    return [
        f"Arm '{arm.name}': {warning['message']}"
        for arm in saved
        for warning in strategy_device_warnings(arm.strategy_yaml)
    ]


@transaction.atomic
def runs_submit(
    *, experiment: Experiment, count: int, arm: Arm | None = None, git_sha: str = ""
) -> list[Run]:
    """Queue `count` runs, all or none: a quota that lets only some through queues none, saying
    why."""
    runs = []
    for i in range(count):
        try:
            runs.append(run_submit(experiment=experiment, arm=arm, git_sha=git_sha))
        except ApplicationError as exc:
            if exc.code in ("quota_exceeded", "budget_exceeded"):
                raise ApplicationError(
                    f"count: none of the {count} runs was queued, run {i + 1} was refused: "
                    f"{exc.message}",
                    exc.extra,
                    code=exc.code,
                    status=exc.status_code,
                ) from None
            raise
    return runs
