"""Writes on sweeps: create (validate, propose, enqueue), a probe's claim and result, cancel,
promote."""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import yaml
from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from apps.billing.services import samples_bill
from apps.core.exceptions import ApplicationError
from apps.core.queues import CeleryQueue, TaskName, task_send
from apps.experiments.models import Arm, Experiment, Run
from apps.experiments.services import arm_create, experiment_create
from apps.experiments.strategies import strategy_validate
from apps.pricing.cost_engine import cost_per_million_tokens
from apps.pricing.models import CostModel, GpuSku
from apps.sweeps.measure import peak_memory_mb, timed_stretch
from apps.sweeps.models import OBJECTIVES, Probe, Sweep
from apps.sweeps.proposer import Known, propose
from apps.sweeps.pruning import dominated_values, space_pruned
from apps.sweeps.selectors import sweep_frontier
from apps.sweeps.space import SpaceError, params_key, space_expand, space_size, strategy_with
from apps.tenants.models import Tenant

logger = logging.getLogger(__name__)

PROBE_TASK = TaskName.SWEEP_PROBE
MAX_PROBES = 500


def _invalid(field: str, message: str, code: str = "invalid") -> ApplicationError:
    return ApplicationError(f"{field}: {message}", {"fields": {field: [message]}}, code=code)


def _base_document(base_strategy_yaml: str) -> dict[str, Any]:
    from gpu_runtime.yaml_loader import read_strategy_yaml

    strategy_validate(base_strategy_yaml, field="base_strategy_yaml")
    return read_strategy_yaml(base_strategy_yaml)


def _candidate_yaml(base: dict[str, Any], params: dict[str, Any]) -> str:
    return yaml.safe_dump(strategy_with(base, params), sort_keys=False)


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
                raise _invalid(
                    f"space.{key}", f"value {value!r} makes an invalid strategy ({reasons})"
                ) from None


def _quota_check(*, tenant: Tenant, parallelism: int) -> None:
    if parallelism > tenant.max_concurrent_runs:
        raise _invalid(
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
        raise _invalid(
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
) -> Sweep:
    """Validate a sweep, store it and queue its first probes once committed;
    a 400 names the bad field."""
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    base = _base_document(base_strategy_yaml)
    try:
        expanded = space_expand(space)
    except SpaceError as exc:
        raise _invalid(exc.key, exc.message) from None
    _check_values(base, expanded)
    queue = CeleryQueue.GPU if gpu_sku is not None else CeleryQueue.CPU
    pruned = dominated_values(expanded=expanded, queue=queue)
    expanded = space_pruned(expanded, pruned)
    objectives = list(objectives) if objectives else ["usd_per_mtok", "peak_mem_mb"]
    for name_ in objectives:
        if name_ not in OBJECTIVES:
            raise _invalid(
                "objectives", f"unknown objective {name_!r}; choose from {', '.join(OBJECTIVES)}"
            )
    if len(set(objectives)) != len(objectives):
        raise _invalid("objectives", "an objective is listed twice")
    if not 1 <= probe_count <= MAX_PROBES:
        raise _invalid("probe_count", f"must be between 1 and {MAX_PROBES}, got {probe_count}")
    size = space_size(expanded)
    if sampler == "auto":
        # TPE over NSGA-II when subsampling: on bench/sweep.py (12 points, 6 probes) TPE found the
        # grid's cheapest point for every seed tried, NSGA-II for one in three
        # (its first generation is random).
        sampler = Sweep.Sampler.GRID if size <= probe_count else Sweep.Sampler.TPE
    elif sampler == Sweep.Sampler.GRID and size > probe_count:
        raise _invalid(
            "space",
            f"the grid has {size} points but probe_count is {probe_count}; raise probe_count "
            f"or use sampler nsga2 or tpe, which subsample",
        )
    elif sampler not in Sweep.Sampler.values:
        raise _invalid("sampler", f"unknown sampler {sampler!r}; choose auto, grid, nsga2 or tpe")
    if cost_model is not None and cost_model.tenant_id != tenant.pk:
        raise _invalid("cost_model", f"{cost_model.pk} belongs to another tenant")
    _quota_check(tenant=tenant, parallelism=parallelism)
    sweep = Sweep(
        tenant=tenant,
        name=name,
        base_strategy_yaml=base_strategy_yaml,
        space=space,
        objectives=objectives,
        sampler=sampler,
        seed=seed,
        probe_count=min(probe_count, size),
        probe_steps=probe_steps,
        warmup_steps=warmup_steps,
        parallelism=parallelism,
        queue=queue,
        pruned=pruned,
        gpu_sku=gpu_sku,
        cost_model=cost_model,
        tie_tolerance=tie_tolerance,
    )
    sweep.full_clean()
    sweep.save()
    for _ in range(min(parallelism, sweep.probe_count)):
        _probe_next(sweep, base, expanded)
    return sweep


def _known(sweep: Sweep) -> list[Known]:
    known = []
    for probe in sweep.probes.order_by("number"):
        values = probe.objective_values(sweep.objectives)
        if probe.status == Probe.Status.SUCCEEDED and all(v is not None for v in values):
            state = "complete"
        else:
            state = "running" if probe.status in Probe.PENDING else "fail"
        known.append(
            Known(
                params=probe.params,
                state=state,
                values=values if state == "complete" else None,
                attrs=probe.sampler_attrs,
            )
        )
    return known


def _probe_next(sweep: Sweep, base: dict[str, Any], expanded: dict[str, list[Any]]) -> Probe | None:
    """Ask Optuna for the next point and queue its probe (on commit);
    None when the space is exhausted."""
    proposal = propose(
        sampler=sweep.sampler,
        seed=sweep.seed,
        expanded=expanded,
        directions=len(sweep.objectives),
        probe_count=sweep.probe_count,
        known=_known(sweep),
    )
    if proposal is None:
        return None
    params = proposal.params
    probe = Probe.objects.create(
        sweep=sweep,
        number=sweep.probes.count(),
        params=params,
        params_key=params_key(params),
        strategy_yaml=_candidate_yaml(base, params),
        sampler_attrs=proposal.attrs,
    )
    probe_id, queue = probe.pk, sweep.queue
    transaction.on_commit(lambda: _probe_send(probe_id=probe_id, queue=queue), robust=True)
    return probe


def _probe_send(*, probe_id: int, queue: str) -> None:
    """Publish the probe's id at batch priority (a ci or normal run waiting on the same queue is
    taken first); a broker that is down is logged, and the reconciler sends it later."""
    level = Run.PRIORITY_LEVEL[Run.Priority.BATCH]
    if task_send(PROBE_TASK, args=[probe_id], queue=queue, priority=level):
        Probe.objects.filter(pk=probe_id).update(sent_at=timezone.now())


@transaction.atomic
def probe_claim(*, probe_id: int, owner: str) -> Probe | None:
    """Take a queued probe of a running sweep; None when it is gone, taken or cancelled."""
    probe = (
        Probe.objects.select_for_update(of=("self",))
        .select_related("sweep", "sweep__tenant")
        .filter(pk=probe_id)
        .first()
    )
    if probe is not None and probe.status == Probe.Status.RUNNING and probe.worker == owner:
        return probe  # the claim committed but its answer was lost: a retry sees it done
    if (
        probe is None
        or probe.status != Probe.Status.QUEUED
        or probe.sweep.status != Sweep.Status.RUNNING
    ):
        return None
    probe.status, probe.worker, probe.started_at = Probe.Status.RUNNING, owner, timezone.now()
    probe.save(update_fields=["status", "worker", "started_at"])
    return probe


def _as_datetime(sample: dict[str, Any]) -> dict[str, Any]:
    ts = sample["ts"]
    return {**sample, "ts": ts if isinstance(ts, datetime) else datetime.fromtimestamp(ts, tz=UTC)}


def _measure(
    probe: Probe,
    *,
    samples: list[dict],
    result: Any,
    device: str,
    gpu_count: int,
    vcpus: int,
    baseline_mem_mb: float,
) -> None:
    """Fill the probe's measured fields, its timed samples priced by the bill a run's samples
    are priced by (apps.billing.services.samples_bill: an interval split at a price boundary,
    board power modelled from the SKU where nothing was measured)."""
    sweep = probe.sweep
    timed = timed_stretch(samples, warmup_steps=sweep.warmup_steps)
    if timed is None:
        probe.status = Probe.Status.INFEASIBLE
        probe.reason = (
            "probe_steps: too few steps were timed "
            f"after the {sweep.warmup_steps} warm-up steps to "
            f"measure anything; raise probe_steps"
        )
        return
    bill = samples_bill(
        samples=[_as_datetime(s) for s in timed.samples],
        after=_as_datetime(timed.boundary),
        tenant_id=sweep.tenant_id,
        gpu_sku=sweep.gpu_sku,
        cost_model=sweep.cost_model,
        gpu_count=gpu_count,
        vcpus=vcpus,
        as_of=probe.created_at,
    )
    usage, cost = bill.usage, bill.cost
    cuda = device.startswith("cuda")
    probe.status = Probe.Status.SUCCEEDED
    probe.steps_timed, probe.step_time_s, probe.step_time_spread = (
        timed.steps,
        timed.step_time_s,
        timed.step_time_spread,
    )
    probe.tokens_per_s = timed.tokens_per_s
    probe.peak_mem_mb = peak_memory_mb(
        samples, result.peak_mem_mb, cuda=cuda, baseline_mb=baseline_mem_mb
    )
    probe.mem_estimated = not cuda
    probe.energy_j, probe.energy_estimated = usage.energy_j, bool(result.energy_estimated)
    probe.cost_usd = Decimal(f"{cost.total_usd:.9f}")
    probe.usd_per_mtok = cost_per_million_tokens(cost.total_usd, usage.tokens)
    probe.final_loss = result.final_loss


@transaction.atomic
def probe_finish(
    *,
    probe_id: int,
    owner: str,
    samples: list[dict] | None = None,
    result: Any = None,
    error: str = "",
    cancelled: bool = False,
    device: str = "",
    gpu_count: int = 0,
    vcpus: int = 0,
    baseline_mem_mb: float = 0.0,
) -> Probe | None:
    """Record a probe's end (measured, infeasible with the reason, or cancelled) and queue
    the next one."""
    probe = Probe.objects.select_for_update(of=("self",)).filter(pk=probe_id).first()
    if probe is None or probe.status != Probe.Status.RUNNING or probe.worker != owner:
        return None
    sweep = Sweep.objects.select_for_update().get(pk=probe.sweep_id)
    probe.sweep = sweep
    probe.device, probe.finished_at = device, timezone.now()
    if cancelled or sweep.status == Sweep.Status.CANCELLED:
        probe.status = Probe.Status.CANCELLED
    elif error:
        probe.status, probe.reason = Probe.Status.INFEASIBLE, error[:4000]
    else:
        _measure(
            probe,
            samples=samples or [],
            result=result,
            device=device,
            gpu_count=gpu_count,
            vcpus=vcpus,
            baseline_mem_mb=baseline_mem_mb,
        )
    probe.save()
    if sweep.status == Sweep.Status.RUNNING:
        sweep_advance(sweep=sweep)
    return probe


def sweep_advance(*, sweep: Sweep) -> None:
    """Queue probes up to the parallelism while the budget lasts;
    close the sweep when all have landed."""
    probes = sweep.probes.count()
    pending = sweep.probes.filter(status__in=Probe.PENDING).count()
    exhausted = False
    if probes < sweep.probe_count and pending < sweep.parallelism:
        base = _base_document(sweep.base_strategy_yaml)
        expanded = space_pruned(space_expand(sweep.space), sweep.pruned)
        for _ in range(min(sweep.parallelism - pending, sweep.probe_count - probes)):
            if _probe_next(sweep, base, expanded) is None:
                exhausted = True
                break
            pending += 1
    if pending == 0:
        sweep.status, sweep.finished_at = Sweep.Status.COMPLETED, timezone.now()
        if exhausted:
            sweep.note = "every point of the space was probed before the budget was spent"
        sweep.save(update_fields=["status", "finished_at", "note", "updated_at"])


def probe_heartbeat(*, probe_id: int, owner: str) -> bool:
    """Renew a running probe's heartbeat; True when it should stop
    (its sweep ended, or it is no longer ours)."""
    renewed = Probe.objects.filter(
        pk=probe_id, status=Probe.Status.RUNNING, worker=owner, sweep__status=Sweep.Status.RUNNING
    ).update(heartbeat_at=timezone.now())
    return renewed == 0


def probes_reconcile(*, now=None) -> dict[str, list[int]]:
    """Beat: a running probe whose worker stopped renewing it is infeasible (lost), and its sweep
    goes on; a queued probe whose message never reached a worker is sent again."""
    now = now or timezone.now()
    lost_before = now - timedelta(seconds=settings.COSTLAB_PROBE_LOST_AFTER_S)
    lost = []
    for probe_id in (
        Probe.objects.filter(status=Probe.Status.RUNNING)
        .filter(
            Q(heartbeat_at__lt=lost_before)
            | Q(heartbeat_at__isnull=True, started_at__lt=lost_before)
        )
        .values_list("pk", flat=True)
    ):
        with transaction.atomic():
            probe = (
                Probe.objects.select_for_update(of=("self",))
                .filter(pk=probe_id, status=Probe.Status.RUNNING)
                .first()
            )
            if probe is None:
                continue
            probe_finish(
                probe_id=probe.pk,
                owner=probe.worker,
                error=(
                    f"lost: its worker ({probe.worker}) stopped renewing it for "
                    f"{settings.COSTLAB_PROBE_LOST_AFTER_S:g} s "
                    "(killed, or the host ran out of memory)"
                ),
            )
            lost.append(probe.pk)
    resend_before = now - timedelta(seconds=settings.COSTLAB_PROBE_RESEND_AFTER_S)
    resent = []
    for probe_id, queue in (
        Probe.objects.filter(status=Probe.Status.QUEUED, sweep__status=Sweep.Status.RUNNING)
        .filter(
            Q(sent_at__lt=resend_before) | Q(sent_at__isnull=True, created_at__lt=resend_before)
        )
        .values_list("pk", "sweep__queue")
    ):
        _probe_send(probe_id=probe_id, queue=queue)
        resent.append(probe_id)
    return {"lost": lost, "resent": resent}


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


@transaction.atomic
def sweep_promote(
    *,
    sweep: Sweep,
    probe: Probe,
    weight: Decimal,
    experiment: Experiment | None = None,
    experiment_name: str = "",
    arm_name: str = "",
) -> Arm:
    """Turn a frontier point into an arm: of an existing experiment,
    or of a new one whose control is the base."""
    if probe.sweep_id != sweep.pk:
        raise _invalid("probe", f"probe {probe.pk} is not a probe of sweep {sweep.pk}")
    frontier = {p.pk for p in sweep_frontier(sweep=sweep) if p.on_frontier}
    if probe.pk not in frontier:
        raise ApplicationError(
            f"probe: probe {probe.pk} (#{probe.number} of the sweep) is not on the sweep's "
            f"frontier ({probe.status}); only a frontier point is promoted",
            {"fields": {"probe": ["not on the frontier"]}},
            code="not_on_frontier",
            status=409,
        )
    arm_name = arm_name or f"sweep-{sweep.pk}-probe-{probe.number}"
    if experiment is None:
        if not experiment_name:
            raise _invalid(
                "experiment", "give an existing experiment or an experiment_name for a new one"
            )
        cost_model = (
            sweep.cost_model or CostModel.objects.filter(tenant=sweep.tenant).order_by("pk").first()
        )
        if cost_model is None:
            raise _invalid(
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
    elif experiment.tenant_id != sweep.tenant_id:
        raise _invalid("experiment", f"{experiment.pk} belongs to another tenant")
    arm = arm_create(
        experiment=experiment, name=arm_name, strategy_yaml=probe.strategy_yaml, weight=weight
    )
    Probe.objects.filter(pk=probe.pk).update(promoted_to=arm)
    return arm


def sizing_max_threads() -> int:
    return settings.COSTLAB_SIZING_MAX_THREADS or os.cpu_count() or 1


@transaction.atomic
def run_sizing_start(*, run: Run, max_threads: int | None = None, probe_steps: int = 12) -> Sweep:
    """Probe a finished run's strategy at 1..N CPU threads, one probe at a time (parallel probes
    would share the cores they are sizing); the report compares it with the design document's
    estimate."""
    if run.status != Run.Status.SUCCEEDED:
        raise _invalid(
            "run", f"run {run.pk} is {run.status}; size a succeeded run (its strategy and profile)"
        )
    n = max_threads or sizing_max_threads()
    if not 1 <= n <= 256:
        raise _invalid("max_threads", f"must be between 1 and 256, got {n}")
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
    )
    sweep.run = run
    sweep.save(update_fields=["run"])
    return sweep
