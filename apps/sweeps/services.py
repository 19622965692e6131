"""Writes on sweeps: create (validate, propose, enqueue), cancel, promote, and a run's sizing
sweep (its figures are apps.sweeps.sizing's). A probe's life (its lease, measurement and the next
proposal) is apps.sweeps.probes."""

from __future__ import annotations

import logging
import os
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from apps.core.exceptions import ApplicationError
from apps.core.queues import CeleryQueue
from apps.experiments.models import Arm, Experiment, Run
from apps.experiments.services import arm_create, experiment_create
from apps.pricing.models import CostModel, GpuSku
from apps.sweeps.models import OBJECTIVES, Probe, Sweep
from apps.sweeps.probes import (
    base_document,
    base_missing,
    base_params,
    probe_base,
    probe_next,
)
from apps.sweeps.pruning import dominated_values, space_pruned
from apps.sweeps.quality import EVAL_LOSS, Judgement, evaluates, in_space, judge
from apps.sweeps.selectors import sweep_frontier
from apps.sweeps.space import SpaceError, space_expand, space_size, strategy_with
from apps.tenants.models import Tenant

logger = logging.getLogger(__name__)

MAX_PROBES = 500


def invalid(field: str, message: str, code: str = "invalid") -> ApplicationError:
    return ApplicationError(f"{field}: {message}", {"fields": {field: [message]}}, code=code)


def _check_values(base: dict[str, Any], expanded: dict[str, list[Any]]) -> None:
    """Each value alone must make a valid strategy: a typo'd dtype is a 400,
    not an infeasible probe."""
    from gpu_runtime import StrategyError, strategy_from_dict

    for key, values in expanded.items():
        for value in values:
            try:
                strategy_from_dict(strategy_with(base, {key: value}))
            except StrategyError as exc:
                reasons = "; ".join(f"{e['key']}: {e['message']}" for e in exc.errors)
                raise invalid(
                    f"space.{key}", f"value {value!r} makes an invalid strategy ({reasons})"
                ) from None


def _quota_check(*, tenant: Tenant, parallelism: int) -> None:
    if parallelism > tenant.max_concurrent_runs:
        raise invalid(
            "parallelism",
            f"{parallelism} probes at once is above tenant '{tenant.slug}''s "
            f"max_concurrent_runs ({tenant.max_concurrent_runs})",
            "quota_exceeded",
        )
    month_start = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    spent = (
        Run.objects.filter(tenant=tenant, queued_at__gte=month_start).aggregate(s=Sum("cost_usd"))[
            "s"
        ]
        or 0
    )
    spent += (
        Probe.objects.filter(sweep__tenant=tenant, created_at__gte=month_start).aggregate(
            s=Sum("cost_usd")
        )["s"]
        or 0
    )
    if spent >= tenant.monthly_budget_usd:
        raise invalid(
            "probe_count",
            f"tenant '{tenant.slug}' has spent {spent:.2f} USD of its monthly budget "
            f"({tenant.monthly_budget_usd} USD); no probe is queued",
            "budget_exceeded",
        )


@transaction.atomic
def sweep_create(
    *,
    tenant: Tenant,
    name: str,
    base_strategy_yaml: str,
    space: Any,
    probe_count: int,
    probe_steps: int,
    objectives: list[str] | None = None,
    sampler: str = "auto",
    seed: int = 0,
    warmup_steps: int = 2,
    parallelism: int = 2,
    gpu_sku: GpuSku | None = None,
    cost_model: CostModel | None = None,
    tie_tolerance: Decimal = Decimal("0.02"),
    quality_margin: Decimal | None = None,
    probe_the_base: bool = True,
) -> Sweep:
    """Validate a sweep, store it and queue its first probes once committed;
    a 400 names the bad field.

    When the base strategy evaluates (an ``eval:`` section), its first probe is the base itself
    (``probe_the_base``; a sizing sweep, whose points differ only in threads, skips it): the
    reference for the ``quality_margin`` constraint, the ``eval_loss`` objective and promotion.
    A base outside the space is probed on top of ``probe_count``."""
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    base = base_document(base_strategy_yaml)
    try:
        expanded = space_expand(space)
    except SpaceError as exc:
        raise invalid(exc.key, exc.message) from None
    _check_values(base, expanded)
    queue = CeleryQueue.GPU if gpu_sku is not None else CeleryQueue.CPU
    pruned = dominated_values(expanded=expanded, queue=queue)
    expanded = space_pruned(expanded, pruned)
    objectives = list(objectives) if objectives else ["usd_per_mtok", "peak_mem_mb"]
    for name_ in objectives:
        if name_ not in OBJECTIVES:
            raise invalid(
                "objectives", f"unknown objective {name_!r}; choose from {', '.join(OBJECTIVES)}"
            )
    if len(set(objectives)) != len(objectives):
        raise invalid("objectives", "an objective is listed twice")
    # Refused rather than given a default eval: section, so a probe measures the strategy its
    # promoted arm will run: evaluation costs time, and a holdout takes data from training.
    measures_quality = evaluates(base)
    if EVAL_LOSS in objectives and not measures_quality:
        raise invalid(
            "objectives",
            "eval_loss needs an eval: section in the base strategy (every_steps, holdout, "
            "max_tokens), so each probe reports its held-out loss",
        )
    if quality_margin is not None and not measures_quality:
        raise invalid(
            "quality_margin",
            "a quality constraint needs an eval: section in the base strategy (every_steps, "
            "holdout, max_tokens), so each probe reports its held-out loss",
        )
    if not 1 <= probe_count <= MAX_PROBES:
        raise invalid("probe_count", f"must be between 1 and {MAX_PROBES}, got {probe_count}")
    size = space_size(expanded)
    if sampler == "auto":
        # TPE over NSGA-II when subsampling: on bench/sweep.py (12 points, 6 probes) TPE found the
        # grid's cheapest point for every seed tried, NSGA-II for one in three
        # (its first generation is random).
        sampler = Sweep.Sampler.GRID if size <= probe_count else Sweep.Sampler.TPE
    elif sampler == Sweep.Sampler.GRID and size > probe_count:
        raise invalid(
            "space",
            f"the grid has {size} points but probe_count is {probe_count}; raise probe_count "
            f"or use sampler nsga2 or tpe, which subsample",
        )
    elif sampler not in Sweep.Sampler.values:
        raise invalid("sampler", f"unknown sampler {sampler!r}; choose auto, grid, nsga2 or tpe")
    if cost_model is not None and cost_model.tenant_id != tenant.pk:
        raise invalid("cost_model", f"{cost_model.pk} belongs to another tenant")
    _quota_check(tenant=tenant, parallelism=parallelism)
    reference = base_params(base, expanded) if measures_quality and probe_the_base else None
    extra = 1 if reference is not None and not in_space(reference, expanded) else 0
    sweep = Sweep(
        tenant=tenant,
        name=name,
        base_strategy_yaml=base_strategy_yaml,
        space=space,
        objectives=objectives,
        sampler=sampler,
        seed=seed,
        probe_count=min(probe_count, size) + extra,
        probe_steps=probe_steps,
        warmup_steps=warmup_steps,
        parallelism=parallelism,
        queue=queue,
        pruned=pruned,
        gpu_sku=gpu_sku,
        cost_model=cost_model,
        tie_tolerance=tie_tolerance,
        quality_margin=quality_margin,
    )
    sweep.full_clean()
    sweep.save()
    queued = 0
    if reference is not None:
        probe_base(sweep, base, reference)
        queued = 1
    for _ in range(min(parallelism, sweep.probe_count) - queued):
        probe_next(sweep, base, expanded)
    return sweep


@transaction.atomic
def sweep_cancel(*, sweep: Sweep) -> Sweep:
    """Cancel: queued probes end now; a running probe stops at its next step
    (its task polls the sweep)."""
    sweep = Sweep.objects.select_for_update().get(pk=sweep.pk)
    if sweep.status != Sweep.Status.RUNNING:
        raise ApplicationError(
            f"status: sweep {sweep.pk} is already {sweep.status}; only a running sweep cancels",
            code="not_cancellable",
            status=409,
        )
    now = timezone.now()
    sweep.probes.filter(status=Probe.Status.QUEUED).update(
        status=Probe.Status.CANCELLED, finished_at=now
    )
    sweep.status, sweep.finished_at = Sweep.Status.CANCELLED, now
    sweep.save(update_fields=["status", "finished_at", "updated_at"])
    return sweep


def promote_quality(*, sweep: Sweep, probe: Probe, experiment: Experiment | None) -> Judgement:
    """The held-out check a promote passes: the probe's loss against the base's probe, within the
    sweep's quality_margin, else the experiment's (a new experiment's default); ``unchecked`` when
    the sweep measures no quality (its base strategy has no eval: section)."""
    from gpu_runtime.yaml_loader import read_strategy_yaml

    if not evaluates(read_strategy_yaml(sweep.base_strategy_yaml)):
        return Judgement("unchecked")
    if sweep.quality_margin is not None:
        margin, margin_from = sweep.quality_margin, "the sweep's quality_margin"
    elif experiment is not None:
        margin = experiment.quality_margin
        margin_from = f"the quality_margin of experiment '{experiment.name}'"
    else:
        margin = Experiment._meta.get_field("quality_margin").get_default()
        margin_from = "the default quality_margin of a new experiment"
    base = sweep.probes.filter(is_base=True).first()
    missing = base_missing(base)
    return judge(
        eval_loss=probe.eval_loss,
        base_eval_loss=None if missing else base.eval_loss,
        margin=margin,
        margin_from=margin_from,
        base_missing=missing,
    )


@transaction.atomic
def sweep_promote(
    *,
    sweep: Sweep,
    probe: Probe,
    weight: Decimal,
    experiment: Experiment | None = None,
    experiment_name: str = "",
    arm_name: str = "",
    force: bool = False,
    actor=None,
) -> Arm:
    """Turn a frontier point into an arm: of an existing experiment,
    or of a new one whose control is the base.

    A point whose held-out loss is worse than the base's beyond the margin, or not measured, is
    refused with both losses and the margin (409) unless ``force``; a forced promote may take a
    point the quality constraint alone kept off the frontier. Each promote is kept in the probe's
    ``promotions``, with what was forced."""
    if probe.sweep_id != sweep.pk:
        raise invalid("probe", f"probe {probe.pk} is not a probe of sweep {sweep.pk}")
    named = f"probe {probe.pk} (#{probe.number} of the sweep)"
    if experiment is not None and experiment.tenant_id != sweep.tenant_id:
        raise invalid("experiment", f"{experiment.pk} belongs to another tenant")
    quality = promote_quality(sweep=sweep, probe=probe, experiment=experiment)
    if not quality.acceptable and not force:
        raise ApplicationError(
            f"probe: {named}: {quality.detail}; force: true promotes it anyway",
            {"fields": {"probe": [f"held-out loss {quality.verdict.replace('_', ' ')}"]}},
            code=f"quality_{quality.verdict}",
            status=409,
        )
    frontier = {p.pk for p in sweep_frontier(sweep=sweep, waive_quality=force) if p.on_frontier}
    if probe.pk not in frontier:
        raise ApplicationError(
            f"probe: {named} is not on the sweep's frontier ({probe.status}); only a frontier "
            f"point is promoted",
            {"fields": {"probe": ["not on the frontier"]}},
            code="not_on_frontier",
            status=409,
        )
    arm_name = arm_name or f"sweep-{sweep.pk}-probe-{probe.number}"
    if experiment is None:
        if not experiment_name:
            raise invalid(
                "experiment", "give an existing experiment or an experiment_name for a new one"
            )
        cost_model = (
            sweep.cost_model or CostModel.objects.filter(tenant=sweep.tenant).order_by("pk").first()
        )
        if cost_model is None:
            raise invalid(
                "experiment_name",
                f"tenant '{sweep.tenant.slug}' has no cost model for a new experiment",
            )
        experiment = experiment_create(
            tenant=sweep.tenant, name=experiment_name, cost_model=cost_model
        )
        arm_create(
            experiment=experiment,
            name="base",
            strategy_yaml=sweep.base_strategy_yaml,
            is_control=True,
        )
    arm = arm_create(
        experiment=experiment, name=arm_name, strategy_yaml=probe.strategy_yaml, weight=weight
    )
    forced = force and not quality.acceptable
    if forced:
        logger.warning(
            "sweep %s: %s promoted to arm %s by force: %s", sweep.pk, named, arm.pk, quality.detail
        )
    probe = Probe.objects.select_for_update().get(pk=probe.pk)
    probe.promoted_to = arm
    probe.promotions = [
        *probe.promotions,
        {
            "arm": arm.pk,
            "experiment": experiment.pk,
            "at": timezone.now().isoformat(),
            "by": getattr(actor, "username", "") or "",
            "forced": forced,
            "quality": quality.as_dict(),
        },
    ]
    probe.save(update_fields=["promoted_to", "promotions"])
    return arm


def sizing_max_threads() -> int:
    return settings.COSTLAB_SIZING_MAX_THREADS or os.cpu_count() or 1


@transaction.atomic
def run_sizing_start(*, run: Run, max_threads: int | None = None, probe_steps: int = 12) -> Sweep:
    """Probe a finished run's strategy at 1..N CPU threads, one probe at a time (parallel probes
    would share the cores they are sizing); the report compares it with the design document's
    estimate."""
    if run.status != Run.Status.SUCCEEDED:
        raise invalid(
            "run", f"run {run.pk} is {run.status}; size a succeeded run (its strategy and profile)"
        )
    n = max_threads or sizing_max_threads()
    if not 1 <= n <= 256:
        raise invalid("max_threads", f"must be between 1 and 256, got {n}")
    sweep = sweep_create(
        tenant=run.tenant,
        name=f"vCPU sizing of run {run.pk}",
        base_strategy_yaml=run.config_yaml,
        space={"resources.threads": list(range(1, n + 1))},
        probe_count=n,
        probe_steps=probe_steps,
        objectives=["usd_per_mtok", "step_time_s"],
        sampler=Sweep.Sampler.GRID,
        parallelism=1,
        gpu_sku=run.gpu_sku,
        cost_model=run.experiment.cost_model,
        probe_the_base=False,  # threads do not change the model: no quality reference needed
    )
    sweep.run = run
    sweep.save(update_fields=["run"])
    return sweep
