"""Writes on experiments, arms and runs: submission, routing, quotas, cancel."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import Count
from django.dispatch import Signal
from django.utils import timezone

from apps.core.exceptions import ApplicationError
from apps.core.notify import ARM_REVISIONS, RUN_CANCELS, publish_on_commit
from apps.core.queues import CeleryQueue
from apps.experiments.models import Arm, Experiment, Run
from apps.experiments.resources import resource_id_check
from apps.experiments.runs import run_end, run_enqueue
from apps.experiments.search import note_check, tags_normalise
from apps.experiments.selectors import tenant_month_spend
from apps.experiments.strategies import (
    strategy_device_warnings,
    strategy_normalise,
    strategy_sha256,
    strategy_validate,
    strategy_world_size,
)
from apps.pricing.models import GpuSku
from apps.tenants.models import Tenant

# sender=Arm, arm=<Arm>, old=<Decimal>, new=<Decimal>, actor=<User or None>: a weight set by hand
arm_weight_changed = Signal()


@dataclass(frozen=True)
class ArmUpdate:
    arm: Arm
    live_keys: dict  # reaches running runs at their next step boundary
    new_runs_only: list[str]  # changed keys that only runs started from now on will use


@transaction.atomic
def arm_update(
    *,
    arm: Arm,
    strategy_yaml: str | None = None,
    weight: Decimal | None = None,
    name: str | None = None,
    is_control: bool | None = None,
    actor=None,
) -> ArmUpdate:
    """Edit an arm. A strategy change bumps its revision; its live keys reach running runs.
    A weight change is audited with its `actor` (arm_weight_changed: attribution keeps it as a
    WeightChange of kind manual)."""
    from gpu_runtime import load_strategy
    from gpu_runtime.live import live_changes

    arm = Arm.objects.select_for_update().get(pk=arm.pk)
    old_weight = arm.weight
    live, others = {}, []
    if strategy_yaml is not None:
        strategy_yaml = strategy_normalise(strategy_yaml)
    if strategy_yaml is not None and strategy_yaml != arm.strategy_yaml:
        strategy_validate(strategy_yaml)
        live, others = live_changes(load_strategy(arm.strategy_yaml), load_strategy(strategy_yaml))
        arm.strategy_yaml = strategy_yaml
        arm.revision += 1
    if weight is not None:
        if weight < 0:
            raise ApplicationError("weight: must be >= 0", code="invalid")
        if arm.state == Arm.State.FROZEN and weight > 0:
            raise ApplicationError(
                f"weight: arm '{arm.name}' is frozen; unfreeze it before giving it traffic",
                code="arm_frozen",
            )
        arm.weight = weight
    if name is not None and name != arm.name:
        if arm.experiment.arms.filter(name=name).exclude(pk=arm.pk).exists():
            raise ApplicationError(
                f"name: experiment '{arm.experiment.name}' already has an arm named '{name}'",
                {"fields": {"name": ["already exists"]}},
                code="invalid",
                status=409,
            )
        arm.name = name
    if is_control is not None and is_control != arm.is_control:
        if is_control and arm.experiment.arms.filter(is_control=True).exclude(pk=arm.pk).exists():
            raise ApplicationError(
                f"is_control: experiment '{arm.experiment.name}' already has a control arm",
                {"fields": {"is_control": ["a control arm exists"]}},
                code="invalid",
                status=409,
            )
        arm.is_control = is_control
    arm.full_clean()
    arm.save()
    if weight is not None and weight != old_weight:
        arm_weight_changed.send(sender=Arm, arm=arm, old=old_weight, new=weight, actor=actor)
    if live:
        arm_id, revision = arm.pk, arm.revision
        publish_on_commit(ARM_REVISIONS, f"{arm_id}:{revision}")
    return ArmUpdate(arm=arm, live_keys=live, new_runs_only=others)


def arms_routable(*, experiment: Experiment) -> list[Arm]:
    """The arms new runs may go to: active with weight > 0, the control first, then arm order."""
    return [
        a
        for a in experiment.arms.order_by("-is_control", "pk")
        if a.state == Arm.State.ACTIVE and a.weight > 0
    ]


def arm_furthest_below_share(arms: list[Arm], routed: dict[int, int]) -> Arm:
    """The arm furthest below its weight's share once one more is routed (`routed`: arm id ->
    how many went to it since the split last changed); ties: the control, then arm order."""
    total, n = sum(a.weight for a in arms), sum(routed.values()) + 1
    return max(arms, key=lambda a: (a.weight / total * n - routed.get(a.pk, 0), -arms.index(a)))


def split_changed_at(arms: list[Arm]):
    """When the split last changed: an arm's weight, state or strategy saved (the arms' latest
    updated_at)."""
    return max(a.updated_at for a in arms)


def arm_pick(*, experiment: Experiment) -> Arm:
    """Choose an active arm by traffic weight, stratified by submission order.

    Since the split last changed (split_changed_at), each run goes to the arm furthest below its
    share of the runs routed so far (arm_furthest_below_share), so every prefix follows the
    weights as closely as whole runs allow: 1:1 gives 2 and 2 in 4, never 3 and 1, and the arms
    interleave, so drift on the machine hits them alike. The caller holds the tenant's row lock:
    submissions are serialised. A retried submission (its run_key seen) returns its run before
    any arm is picked. Training that runs elsewhere is split the same way by
    apps.experiments.assignment.
    """
    arms = arms_routable(experiment=experiment)
    if not arms:
        raise ApplicationError(
            f"experiment '{experiment.name}' has no active arm with weight > 0 to route a run to",
            code="no_active_arm",
        )
    routed = dict(
        Run.objects.filter(arm__in=arms, created_at__gte=split_changed_at(arms))
        .values("arm_id")
        .annotate(n=Count("pk"))
        .values_list("arm_id", "n")
    )
    return arm_furthest_below_share(arms, routed)


def tenant_quota_check(*, tenant: Tenant, status: int | None = None) -> None:
    """Refuse a new run of a tenant at its concurrent-runs quota or past its monthly budget,
    naming the quota (`status`: the HTTP status of the refusal, 400 unless given)."""
    active = Run.objects.filter(tenant=tenant, status__in=Run.ACTIVE_STATUSES).count()
    if active >= tenant.max_concurrent_runs:
        raise ApplicationError(
            f"max_concurrent_runs: tenant '{tenant.slug}' has {active} runs queued or running "
            f"(limit {tenant.max_concurrent_runs}); wait for one to finish or raise the quota",
            {"limit": tenant.max_concurrent_runs, "active": active},
            code="quota_exceeded",
            status=status,
        )
    spent = tenant_month_spend(tenant_id=tenant.pk)
    if spent >= tenant.monthly_budget_usd:
        raise ApplicationError(
            f"monthly_budget_usd: tenant '{tenant.slug}' has spent {spent:.2f} USD this month "
            f"(budget {tenant.monthly_budget_usd} USD); "
            "new runs are refused until the budget is raised",
            {"budget_usd": str(tenant.monthly_budget_usd), "spent_usd": f"{spent:.6f}"},
            code="budget_exceeded",
            status=status,
        )


@transaction.atomic
def run_submit(
    *,
    experiment: Experiment,
    arm: Arm | None = None,
    run_key: str = "",
    git_sha: str = "",
    dataset_sha256: str = "",
    kind: str = Run.Kind.WORKER,
    gpu_sku: GpuSku | None = None,
    gpu_count: int | None = None,
    vcpus: int = 0,
    memory_gb: float = 0.0,
    started_at: datetime | None = None,
    ended_at: datetime | None = None,
    priority: str = Run.Priority.NORMAL,
    tags="",
    note: str = "",
    resource_id: str = "",
) -> Run:
    """Queue a run of an experiment (idempotent by run_key) and enqueue it once committed, at its
    priority (ci before normal before batch on its queue).

    An external run declares the vCPUs and host memory it holds (they are priced); a worker
    records its own when it claims the run. An external run may declare when it started
    (`started_at`: not in the future, not before the tenant's oldest pricing table) and ended
    (`ended_at`: after started_at, not in the future), so a historical upload's samples fall
    inside its time window, and the cloud resource it trains on (`resource_id`, as the invoice's
    FOCUS ResourceId names it), which billing's reconciliation matches to the invoice.
    """
    # One submission per tenant at a time, so two cannot both pass the quota check.
    tenant = Tenant.objects.select_for_update().get(pk=experiment.tenant_id)
    if run_key:
        existing = Run.objects.filter(experiment=experiment, run_key=run_key).first()
        if existing:
            if (
                existing.status == Run.Status.QUEUED
                and existing.kind == Run.Kind.WORKER
                and existing.sent_at is None
            ):
                run_enqueue(
                    run=existing
                )  # its message never reached the broker: a retried submit sends it
            return existing
    if experiment.status == Experiment.Status.COMPLETED:
        raise ApplicationError(
            f"experiment '{experiment.name}' is completed: it takes no new runs",
            code="experiment_completed",
        )
    if arm is None:
        arm = arm_pick(experiment=experiment)
    elif arm.experiment_id != experiment.pk:
        raise ApplicationError(
            f"arm: '{arm.name}' is not an arm of experiment '{experiment.name}'", code="invalid"
        )
    elif arm.state == Arm.State.FROZEN:
        raise ApplicationError(
            f"arm: '{arm.name}' is frozen; new runs are not routed to a frozen arm",
            code="arm_frozen",
        )
    strategy_validate(arm.strategy_yaml)
    declared = (
        ("vcpus", vcpus),
        ("memory_gb", memory_gb),
        ("started_at", started_at),
        ("ended_at", ended_at),
        ("resource_id", resource_id),
    )
    for name, value in declared:
        if value and kind == Run.Kind.WORKER:
            raise ApplicationError(
                f"{name}: only an external run declares it; a worker records what it holds",
                {"fields": {name: ["external runs only"]}},
                code="invalid",
            )
    resource_id = resource_id_check(resource_id)
    if started_at is not None:
        _started_at_check(tenant=tenant, started_at=started_at)
    if ended_at is not None:
        _ended_at_check(started_at=started_at, ended_at=ended_at)
    tenant_quota_check(tenant=tenant)

    queue = CeleryQueue.GPU if gpu_sku is not None else CeleryQueue.CPU
    world_size, nnodes = strategy_world_size(
        arm.strategy_yaml, gpu=gpu_sku is not None, gpu_count=gpu_count
    )
    if kind == Run.Kind.WORKER:  # a dtype no device of its queue can run is refused here
        strategy_device_warnings(arm.strategy_yaml, queue=queue.value)
    run = Run.objects.create(
        tenant=tenant,
        experiment=experiment,
        arm=arm,
        kind=kind,
        run_key=run_key,
        queue=queue,
        config_yaml=arm.strategy_yaml,
        config_sha256=arm.strategy_sha256,
        config_revision=arm.revision,
        git_sha=git_sha,
        dataset_sha256=dataset_sha256,
        gpu_sku=gpu_sku,
        gpu_count=gpu_count if gpu_count is not None else (world_size if gpu_sku else 0),
        world_size=world_size,
        nnodes=nnodes,
        vcpus=vcpus,
        memory_gb=memory_gb,
        priority=priority,
        tags=tags_normalise(tags),
        note=note_check(note),
        status=Run.Status.QUEUED if kind == Run.Kind.WORKER else Run.Status.RUNNING,
        started_at=None if kind == Run.Kind.WORKER else started_at or timezone.now(),
        declared_ended_at=ended_at,
        resource_id=resource_id,
    )
    if kind == Run.Kind.WORKER:
        run_enqueue(run=run)
    return run


def _started_at_check(*, tenant: Tenant, started_at: datetime) -> None:
    now = timezone.now()
    if started_at > now:
        raise ApplicationError(
            f"started_at: {started_at.isoformat()} is in the future (now {now.isoformat()})",
            {"fields": {"started_at": ["in the future"]}},
            code="invalid",
        )
    oldest = tenant.pricing_tables.order_by("valid_from").values_list("valid_from", flat=True)
    first = oldest.first()
    if first is None or started_at < first:
        since = (
            "the tenant has no pricing table"
            if first is None
            else (f"the oldest pricing table starts {first.isoformat()}")
        )
        raise ApplicationError(
            f"started_at: {started_at.isoformat()} is before any price ({since}); "
            "nothing before it could be billed",
            {"fields": {"started_at": ["before the oldest price"]}},
            code="invalid",
        )


def _ended_at_check(*, started_at: datetime | None, ended_at: datetime) -> None:
    now = timezone.now()
    if started_at is None:
        raise ApplicationError(
            f"ended_at: {ended_at.isoformat()} needs started_at too (a run that has ended "
            "started before now)",
            {"fields": {"ended_at": ["without started_at"]}},
            code="invalid",
        )
    if ended_at <= started_at:
        raise ApplicationError(
            f"ended_at: {ended_at.isoformat()} is not after started_at {started_at.isoformat()}",
            {"fields": {"ended_at": ["not after started_at"]}},
            code="invalid",
        )
    if ended_at > now:
        raise ApplicationError(
            f"ended_at: {ended_at.isoformat()} is in the future (now {now.isoformat()}); "
            "a run still training declares no end",
            {"fields": {"ended_at": ["in the future"]}},
            code="invalid",
        )


@transaction.atomic
def run_annotate(*, run: Run, tags=None, note: str | None = None) -> Run:
    """Set a run's tags and/or note (the team's labels; any status)."""
    run = Run.objects.select_for_update().get(pk=run.pk)
    fields = []
    if tags is not None:
        run.tags = tags_normalise(tags)
        fields.append("tags")
    if note is not None:
        run.note = note_check(note)
        fields.append("note")
    if fields:
        run.save(update_fields=[*fields, "updated_at"])
    return run


@transaction.atomic
def run_cancel(*, run: Run) -> Run:
    """Cancel: a queued or external run ends now; a running one stops at its next step."""
    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.status not in Run.ACTIVE_STATUSES:
        raise ApplicationError(
            f"status: run {run.pk} is already {run.status}; only queued or running runs cancel",
            code="not_cancellable",
        )
    if not _cancel(run):
        runs_stopping_push([run.pk])
    return run


def runs_stopping_push(run_ids: list[int]) -> None:
    """Tell the workers of these runs, once the cancel commits, to stop now: one message, however
    many runs (without Redis, each worker's heartbeat sees the cancel within a second)."""
    if run_ids:
        publish_on_commit(RUN_CANCELS, ",".join(map(str, run_ids)))


def _cancel(run: Run) -> bool:
    """Cancel one locked active run: a queued or external one ends now (what an external run sent
    so far is priced, as at a finish); a running worker run stops at its next step. True: ended."""
    run.cancel_requested = True
    run.save(update_fields=["cancel_requested", "updated_at"])
    if run.status == Run.Status.QUEUED or run.kind == Run.Kind.EXTERNAL:
        run_end(run, Run.Status.CANCELLED)
        return True
    return False


@dataclass(frozen=True)
class RunsCancelled:
    """What a bulk cancel did: runs ended now (queued, external) and runs asked to stop at
    their next step (running on a worker)."""

    ended: list[int]
    stopping: list[int]


@transaction.atomic
def runs_cancel(*, experiment: Experiment, arm: Arm | None = None) -> RunsCancelled:
    """Cancel every queued or running run of an experiment (or of one of its arms), as run_cancel
    cancels one: locked in pk order, so a worker's claim or a finish either comes first or sees
    the cancel."""
    if arm is not None and arm.experiment_id != experiment.pk:
        raise ApplicationError(
            f"arm: '{arm.name}' is not an arm of experiment '{experiment.name}'",
            {"fields": {"arm": ["other experiment"]}},
            code="invalid",
        )
    runs = Run.objects.filter(experiment=experiment, status__in=Run.ACTIVE_STATUSES)
    if arm is not None:
        runs = runs.filter(arm=arm)
    ended, stopping = [], []
    for run in runs.select_for_update().order_by("pk"):
        (ended if _cancel(run) else stopping).append(run.pk)
    runs_stopping_push(stopping)
    return RunsCancelled(ended=ended, stopping=stopping)


# ------------------------------------------------------------------------------
# Experiments and arms: create, update, delete (the API's writes)
# ------------------------------------------------------------------------------
EXPERIMENT_EDITABLE = (
    "name",
    "description",
    "status",
    "cost_model",
    "pricing_table",
    "freeze_threshold",
    "attribution_interval_s",
    "min_runs_per_arm",
    "min_samples_per_arm",
    "min_cs_runs_per_arm",
    "alpha",
    "freeze_policy",
    "dynamic_weights",
    "target_steps",
    "tags",
    "quality_metric",
    "quality_direction",
    "quality_margin",
)


def _same_tenant(experiment: Experiment) -> None:
    taken = Experiment.objects.filter(tenant_id=experiment.tenant_id, name=experiment.name).exclude(
        pk=experiment.pk
    )
    if taken.exists():
        raise ApplicationError(
            f"name: the tenant already has an experiment named '{experiment.name}'",
            {"fields": {"name": ["already exists"]}},
            code="invalid",
            status=409,
        )
    for field in ("cost_model", "pricing_table"):
        related = getattr(experiment, field)
        if related is not None and related.tenant_id != experiment.tenant_id:
            raise ApplicationError(
                f"{field}: {related.pk} belongs to another tenant",
                {"fields": {field: ["not found"]}},
                code="invalid",
            )


@transaction.atomic
def experiment_create(*, tenant: Tenant, name: str, cost_model, **fields) -> Experiment:
    """A new experiment of the tenant (draft unless told otherwise); arms are added separately."""
    if "tags" in fields:
        fields["tags"] = tags_normalise(fields["tags"])
    unknown = set(fields) - set(EXPERIMENT_EDITABLE)
    if unknown:
        raise ApplicationError(
            f"{sorted(unknown)[0]}: not a field of an experiment", code="invalid"
        )
    experiment = Experiment(tenant=tenant, name=name, cost_model=cost_model, **fields)
    _same_tenant(experiment)
    experiment.full_clean()
    experiment.save()
    return experiment


@transaction.atomic
def experiment_update(*, experiment: Experiment, **fields) -> Experiment:
    experiment = Experiment.objects.select_for_update().get(pk=experiment.pk)
    if "tags" in fields:
        fields["tags"] = tags_normalise(fields["tags"])
    for name, value in fields.items():
        if name not in EXPERIMENT_EDITABLE:
            raise ApplicationError(f"{name}: cannot be changed", code="invalid")
        setattr(experiment, name, value)
    _same_tenant(experiment)
    experiment.full_clean()
    experiment.save()
    return experiment


@transaction.atomic
def experiment_delete(*, experiment: Experiment) -> None:
    """Delete an experiment with its arms, runs and telemetry; refused while runs are active."""
    active = Run.objects.filter(experiment=experiment, status__in=Run.ACTIVE_STATUSES).count()
    if active:
        raise ApplicationError(
            f"experiment '{experiment.name}' has {active} queued or running runs; "
            "cancel them before deleting it",
            {"active_runs": active},
            code="experiment_busy",
            status=409,
        )
    Run.objects.filter(experiment=experiment).delete()  # runs protect their arm: remove them first
    experiment.delete()


@transaction.atomic
def arm_create(
    *,
    experiment: Experiment,
    name: str,
    strategy_yaml: str,
    weight: Decimal = Decimal("1"),
    is_control: bool = False,
) -> Arm:
    """Add an arm; its strategy is validated by gpu_runtime's schema first, errors naming the
    key."""
    strategy_yaml = strategy_normalise(strategy_yaml)
    strategy_validate(strategy_yaml)
    if is_control and experiment.arms.filter(is_control=True).exists():
        raise ApplicationError(
            f"is_control: experiment '{experiment.name}' already has a control arm",
            {"fields": {"is_control": ["a control arm exists"]}},
            code="invalid",
            status=409,
        )
    if experiment.arms.filter(name=name).exists():
        raise ApplicationError(
            f"name: experiment '{experiment.name}' already has an arm named '{name}'",
            {"fields": {"name": ["already exists"]}},
            code="invalid",
            status=409,
        )
    arm = Arm(
        experiment=experiment,
        name=name,
        strategy_yaml=strategy_yaml,
        weight=weight,
        is_control=is_control,
    )
    arm.strategy_sha256 = strategy_sha256(strategy_yaml)
    arm.full_clean()
    arm.save()
    return arm


@transaction.atomic
def arm_delete(*, arm: Arm) -> None:
    """Delete an arm that never ran; an arm with runs keeps its history
    (freeze it or set weight 0)."""
    runs = arm.runs.count()
    if runs:
        raise ApplicationError(
            f"arm '{arm.name}' has {runs} runs; their costs need it. Set its weight to 0 instead",
            {"runs": runs},
            code="arm_has_runs",
            status=409,
        )
    arm.delete()


# ------------------------------------------------------------------------------
# External runs: trained elsewhere, telemetry over HTTP, finished by the client
# ------------------------------------------------------------------------------
def run_external_running(run: Run, action: str) -> Run:
    """The external run, locked; refused (naming why) unless it is external and running."""
    run = Run.objects.select_for_update(of=("self",)).select_related("experiment").get(pk=run.pk)
    return run_external_check(run, action)


def run_external_check(run: Run, action: str) -> Run:
    """A run read under its row lock, refused (naming why) unless it is external and running."""
    if run.kind != Run.Kind.EXTERNAL:
        raise ApplicationError(
            f"kind: run {run.pk} is trained by a costlab worker; only external runs can {action}",
            code="not_external",
            status=409,
        )
    if run.status != Run.Status.RUNNING:
        raise ApplicationError(
            f"status: run {run.pk} is {run.status}; only a running external run can {action}",
            code="run_finished",
            status=409,
        )
    return run


@transaction.atomic
def run_external_finish(*, run: Run, status: str, error: str = "", dataset_sha256: str = "") -> Run:
    """Close an external run: price everything it sent and record how it ended."""
    if status not in (Run.Status.SUCCEEDED, Run.Status.FAILED):
        raise ApplicationError(
            f"status: must be 'succeeded' or 'failed', not '{status}'",
            {"fields": {"status": ["succeeded or failed"]}},
            code="invalid",
        )
    run = run_external_running(run, "finish")
    run.dataset_sha256 = dataset_sha256 or run.dataset_sha256
    run_end(run, status, error)
    return run
