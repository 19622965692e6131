"""A run's life: enqueue, claim, heartbeat, revision, finish, release, requeue, sweep and reconcile.

The row is the truth; the broker message only wakes a worker. The lease's mechanics (claim,
heartbeat, the sweep of expired leases, the resend of unclaimed runs) are apps.core.leases', shared
with a sweep's probes; what they mean for a run (attempts, requeue or fail, gangs) is here.
- Enqueue is durable: a queued run whose message never left (broker down at submit) or was lost
  (broker restarted without persistence) is sent again by the reconciler; the lease makes a
  duplicate message harmless (a second claim is refused).
- A worker claims a queued run under a lease that its heartbeat keeps fresh, and each claim is a
  RunAttempt with its own record. A worker that dies stops renewing; the sweeper marks the attempt
  lost and requeues the run, up to max_attempts failed attempts, then fails it.
  Never a requeue loop.
- A graceful stop (SIGTERM, Ctrl-C, a deploy) hands the run back without using an attempt.
- Finishing is idempotent for its owner, and a run whose training completed is never trained
  again: when the finish could not be recorded in time, the sweeper sees the completed steps in
  the stored telemetry and ends the run as succeeded; a finish that arrives after the sweeper
  requeued the run, before anyone else took it, still counts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.dispatch import Signal
from django.utils import timezone

from apps.core import leases
from apps.core.queues import TaskName, task_send
from apps.experiments.models import Arm, Run, RunAttempt
from apps.pricing.models import GpuSku

logger = logging.getLogger(__name__)

RUN_TASK = TaskName.RUN_TRAIN
Outcome = RunAttempt.Outcome

# Sent inside run_end's transaction, before the outcome is saved: the run's bill is closed by its
# receiver (apps.billing's run_totals_close prices every stored sample). Billing depends on runs,
# not the reverse.
run_ending = Signal()  # sender=Run, run=<Run>


# A worker run's lease: a deadline the worker renews (it may ask a longer one); a run never sent
# waits 5 s at most before it is sent again (its own send, after commit, is in flight).
RUN_LEASE = leases.LeasedJob(
    name="run",
    model=Run,
    queued=Run.Status.QUEUED,
    running=Run.Status.RUNNING,
    owner_field="lease_owner",
    heartbeat_field="heartbeat_at",
    expires_field="lease_expires_at",
    lost_after_setting="COSTLAB_RUN_LEASE_S",
    resend_after_setting="COSTLAB_RUN_RESEND_AFTER_S",
    sends_field="sends",
    unsent_since_field="updated_at",
    unsent_grace_s=5.0,
    touched_field="updated_at",
    scope=Q(kind=Run.Kind.WORKER),
)


def lease_seconds() -> float:
    return RUN_LEASE.lost_after_s()


# ------------------------------------------------------------------------------
# Enqueue: the message is sent after commit; the reconciler sends what never arrived
# ------------------------------------------------------------------------------
def run_enqueue(*, run: Run) -> None:
    """Send the run id to its queue once the surrounding transaction commits, at its queue level
    (queue_level_set).

    A broker that is down does not fail the caller (robust on_commit, no long publish retries):
    the run stays queued with no send recorded, and the reconciler sends it when the broker is back.
    """
    queue_level_set(run)
    run_id, queue, nodes, level = run.pk, run.queue, run.nnodes, run.queue_level
    transaction.on_commit(
        lambda: run_send(run_id=run_id, queue=queue, nodes=nodes, level=level), robust=True
    )


def queue_level_set(run: Run) -> None:
    """Its Celery priority: its priority's level, sunk by one for 1-3 and by two for 4 or more of
    its tenant's runs of that priority already waiting on its queue (a tenant's first runs go
    before another tenant's flood; the levels stay within the priority's three)."""
    ahead = (
        Run.objects.filter(
            tenant_id=run.tenant_id,
            queue=run.queue,
            priority=run.priority,
            status=Run.Status.QUEUED,
            kind=Run.Kind.WORKER,
            cancel_requested=False,
        )
        .exclude(pk=run.pk)
        .count()
    )
    base = Run.PRIORITY_LEVEL[Run.Priority(run.priority)]
    run.queue_level = base + sum(ahead >= n for n in Run.FAIR_SHARE_AHEAD)
    Run.objects.filter(pk=run.pk).update(queue_level=run.queue_level)


def run_send(*, run_id: int, queue: str, nodes: int = 1, level: int = 3) -> bool:
    """Publish the run's wake-ups (one per node: a run across nodes is a gang of tasks) at its
    queue level (Celery's Redis priority), and record it; False (logged) when the broker is
    unreachable."""
    if not all(
        task_send(RUN_TASK, args=[run_id], queue=queue, priority=level) for _ in range(nodes)
    ):
        return False
    leases.lease_sent(RUN_LEASE, pk=run_id)
    return True


def runs_reconcile_queued(*, now=None) -> list[int]:
    """Send again the queued runs that no worker claimed and nobody cancelled: never sent, or sent
    long enough ago (each send waits twice as long as the one before: leases_resend_unclaimed)."""
    return leases.leases_resend_unclaimed(
        RUN_LEASE,
        send=lambda row: run_send(
            run_id=row["pk"], queue=row["queue"], nodes=row["nnodes"], level=row["queue_level"]
        ),
        fields=("queue", "nnodes", "queue_level"),
        where=Q(cancel_requested=False),
        now=now,
    )


# ------------------------------------------------------------------------------
# A run across nodes: the claiming node hosts the rendezvous, the others join it
# ------------------------------------------------------------------------------
def run_rendezvous_record(
    *, run_id: int, owner: str, endpoint: str, rdzv_id: str, seq_base: int
) -> bool:
    """The claiming node (node 0) records where the gang meets; the other nodes read it to join."""
    return bool(
        leases.lease_held(RUN_LEASE, pk=run_id, owner=owner).update(
            rdzv_endpoint=endpoint, rdzv_id=rdzv_id, rdzv_seq_base=seq_base, nodes_joined=1
        )
    )


@dataclass(frozen=True)
class NodeSeat:
    node: int  # 1 .. nnodes - 1 (node 0 claimed the run)
    endpoint: str
    rdzv_id: str
    attempt: int
    seq_base: int
    nnodes: int
    config_yaml: str


@transaction.atomic
def run_node_join(*, run_id: int) -> NodeSeat | None:
    """A seat in a running gang whose rendezvous is recorded and not yet full; None otherwise."""
    run = Run.objects.select_for_update().filter(pk=run_id).first()
    if (
        run is None
        or run.status != Run.Status.RUNNING
        or run.nnodes < 2
        or not run.rdzv_id
        or run.nodes_joined >= run.nnodes
    ):
        return None
    run.nodes_joined += 1
    run.save(update_fields=["nodes_joined", "updated_at"])
    return NodeSeat(
        node=run.nodes_joined - 1,
        endpoint=run.rdzv_endpoint,
        rdzv_id=run.rdzv_id,
        attempt=run.attempts,
        seq_base=run.rdzv_seq_base,
        nnodes=run.nnodes,
        config_yaml=run.config_yaml,
    )


@transaction.atomic
def run_gang_timeout(*, run_id: int, owner: str, reason: str) -> bool:
    """Not every node joined in time: back to the queue once (the attempt recorded with the reason,
    not counted as failed), then the run fails. False when the run is no longer ours."""
    run = leases.lease_held_locked(RUN_LEASE, pk=run_id, owner=owner)
    if run is None:
        return False
    run.rdzv_endpoint, run.rdzv_id, run.nodes_joined = "", "", 0
    run.save(update_fields=["rdzv_endpoint", "rdzv_id", "nodes_joined", "updated_at"])
    if run.gang_requeues >= 1:
        run_end(run, Run.Status.FAILED, f"{reason} (again after one requeue)")
        return True
    run.gang_requeues += 1
    run.save(update_fields=["gang_requeues", "updated_at"])
    _requeue_or_fail(run, Outcome.STOPPED, reason)
    return True


# ------------------------------------------------------------------------------
# On the worker: claim, record the device, heartbeat, take revisions
# ------------------------------------------------------------------------------
@dataclass(frozen=True)
class LeaseState:
    held: bool  # False: the lease was taken from us (swept); stop work now
    cancel: bool
    revision: int


def run_claim(
    *, run_id: int, owner: str, host: str = "", lease_s: float | None = None
) -> Run | None:
    """Take a queued run for this worker; None when it is gone, taken, cancelled or out of attempts.

    Repeating a claim that committed (its answer lost with the connection) returns the same run.
    """

    def attempt_open(run: Run, now) -> list[str]:
        run.attempts += 1
        run.started_at = run.started_at or now
        RunAttempt.objects.create(
            run=run, number=run.attempts, worker=owner, host=host[:255], started_at=now
        )
        return ["attempts", "started_at"]

    return leases.lease_claim(
        RUN_LEASE,
        pk=run_id,
        owner=owner,
        lease_s=lease_s,
        admit=_claim_admits,
        opened=attempt_open,
    )


def _claim_admits(run: Run) -> bool:
    """A cancelled run, or one out of attempts, ends here instead of being trained."""
    if run.cancel_requested:
        run_end(run, Run.Status.CANCELLED)
        return False
    failed = _failed_attempts(run)
    if failed >= run.max_attempts:
        run_end(run, Run.Status.FAILED, f"gave up after {failed} failed attempts")
        return False
    return True


def run_device_record(
    *,
    run_id: int,
    owner: str,
    host: str,
    device: str,
    gpu_name: str | None,
    gpu_count: int,
    vcpus: int,
    memory_gb: float,
    measurement=None,
    compute_dtype: str = "",
    resolved: dict | None = None,
    resource_id: str = "",
) -> None:
    """What the run actually holds, so it is priced for that (the SKU matched by device name);
    the device profile it trains on (`measurement`, an apps.devices DeviceMeasurement), its
    device class, its compute dtype and what its strategy's `auto` keys became there
    (`resolved`: {key: {requested, resolved, why}}); the cloud resource it runs on
    (`resource_id`, checked by the caller: apps.experiments.resources)."""
    sku = None
    if gpu_name:
        sku = next((s for s in GpuSku.objects.all() if _same_gpu(s.name, gpu_name)), None)
    runs = Run.objects.filter(pk=run_id, lease_owner=owner)
    runs.update(
        host=host,
        device=device[:120],
        gpu_count=gpu_count,
        vcpus=vcpus,
        memory_gb=memory_gb,
        device_measurement=measurement,
        device_class="" if measurement is None else measurement.device_class,
        compute_dtype=compute_dtype,
        resolved=resolved or {},
        resource_id=resource_id,
    )
    if sku is not None:
        runs.filter(gpu_sku__isnull=True).update(gpu_sku=sku)  # a SKU chosen at submission wins


def _same_gpu(sku_name: str, device_name: str) -> bool:
    # "NVIDIA H200" (what CUDA reports) matches the SKU "NVIDIA H200 SXM 141GB".
    words = device_name.lower().split()
    return bool(words) and all(w in sku_name.lower().split() for w in words)


def run_heartbeat(*, run_id: int, owner: str, lease_s: float | None = None) -> LeaseState:
    """Renew the lease; say whether we still hold it and whether a cancel was asked."""
    renewed = leases.lease_renew(RUN_LEASE, pk=run_id, owner=owner, lease_s=lease_s)
    row = Run.objects.filter(pk=run_id).values("cancel_requested", "arm__revision").first()
    if not renewed or row is None:
        return LeaseState(held=False, cancel=True, revision=0)
    return LeaseState(held=True, cancel=row["cancel_requested"], revision=row["arm__revision"])


def run_revision_applied(
    *, run_id: int, owner: str, revision: int, live: dict, not_applied: list[str], applied_at
) -> None:
    """Record that a running run took an arm revision's live keys at a step boundary."""
    with transaction.atomic():
        run = leases.lease_held_locked(RUN_LEASE, pk=run_id, owner=owner)
        if run is None or revision <= run.config_revision:
            return
        run.config_revision = revision
        run.config_history = [
            *run.config_history,
            {
                "revision": revision,
                "applied_at": applied_at.isoformat(),
                "live": live,
                "not_applied": not_applied,
            },
        ]
        run.save(update_fields=["config_revision", "config_history", "updated_at"])


def arm_strategy(*, arm_id: int) -> tuple[int, str]:
    return Arm.objects.filter(pk=arm_id).values_list("revision", "strategy_yaml").get()


# ------------------------------------------------------------------------------
# How an attempt ends: finish, release (graceful stop), lost (sweeper)
# ------------------------------------------------------------------------------
def run_artifacts_dir(run_id: int) -> Path:
    """Where a run's saved files live (finetune.save): one directory per run under VAR_DIR."""
    return Path(settings.VAR_DIR) / "artifacts" / "runs" / str(int(run_id))


ARTIFACT_HASHES = ("sha256", "config_sha256", "dataset_sha256")


def run_artifacts_listed(run: Run) -> list[dict]:
    """The run's artifacts with every documented key (a missing hash empty, bytes None) and
    `name`, the file name its download goes by."""
    rows = []
    for artifact in run.artifacts or []:
        if not isinstance(artifact, dict):
            continue
        path = str(artifact.get("path") or "")
        rows.append(
            {
                "kind": str(artifact.get("kind") or ""),
                "path": path,
                "name": PurePosixPath(path).name,
                "bytes": artifact.get("bytes"),
                **{key: str(artifact.get(key) or "") for key in ARTIFACT_HASHES},
            }
        )
    return rows


def run_artifact_file(run: Run, name: str) -> tuple[dict, Path] | None:
    """The run's artifact called `name` (its file name; run_artifacts_listed) and the file, or
    None: a name that is not one of run.artifacts, that has a slash, a NUL or '..', or whose file
    is missing or lies outside the run's artifacts directory."""
    if not name or name == "." or ".." in name or any(c in name for c in "/\\\x00"):
        return None
    base = run_artifacts_dir(run.pk).resolve()
    artifact = next((a for a in run_artifacts_listed(run) if a["name"] == name), None)
    if artifact is None:
        return None
    path = (base / artifact["path"]).resolve()
    if path == base or not path.is_relative_to(base) or not path.is_file():
        return None
    return artifact, path


@transaction.atomic
def run_finish(
    *,
    run_id: int,
    owner: str,
    status: str,
    error: str = "",
    dataset_sha256: str = "",
    params_total: int | None = None,
    params_trainable: int | None = None,
    artifacts: list[dict] | None = None,
    resolved: dict | None = None,
) -> bool:
    """Record how the run ended and close its totals; False when the run is no longer ours.

    The model's parameter counts and the files it saved (RunResult.params_total,
    params_trainable, artifacts) are recorded when given; None keeps what the run has.
    ``resolved``: keys decided while training (kernels.compile's payback rule), merged over what
    was resolved at the start.
    Idempotent: a finish repeated after its commit (the answer lost with the connection) is True.
    """
    run = Run.objects.select_for_update().select_related("experiment").filter(pk=run_id).first()
    if run is None:
        return False
    attempt = RunAttempt.objects.filter(run=run, worker=owner).order_by("-number").first()
    if run.status == Run.Status.RUNNING and run.lease_owner == owner:
        pass
    elif attempt is not None and attempt.outcome == status and run.status == status:
        # already recorded: by our own earlier try, or by the sweeper seeing training complete
        return True
    elif (
        attempt is not None
        and status == Run.Status.SUCCEEDED
        and run.status == Run.Status.QUEUED
        and run.attempts == attempt.number
        and attempt.outcome == Outcome.LOST
    ):
        # Swept while we could not reach the database, and nobody took it since: training completed.
        logger.warning(
            "run %s: finish recorded after the lease expired; nobody took the run since", run_id
        )
        attempt.reason = f"{attempt.reason}; then finished (recorded late)".lstrip("; ")
        attempt.save(update_fields=["reason"])
    else:
        logger.warning("run %s: finish(%s) ignored, lease not held by %s", run_id, status, owner)
        return False
    run.dataset_sha256 = dataset_sha256 or run.dataset_sha256
    model = {
        "params_total": params_total,
        "params_trainable": params_trainable,
        "artifacts": None if artifacts is None else [dict(a) for a in artifacts],
    }
    model = {key: value for key, value in model.items() if value is not None}
    if resolved:
        model["resolved"] = {**(run.resolved or {}), **resolved}
    if model:
        for key, value in model.items():
            setattr(run, key, value)
        run.save(update_fields=[*model, "updated_at"])
    run_end(run, status, error, attempt_number=attempt.number if attempt else run.attempts)
    return True


@transaction.atomic
def run_release(*, run_id: int, owner: str, reason: str) -> bool:
    """Give a running run back to the queue (the worker is shutting down); no attempt is used."""
    run = leases.lease_held_locked(RUN_LEASE, pk=run_id, owner=owner)
    if run is None:
        return False
    _requeue_or_fail(run, Outcome.STOPPED, reason)
    return True


def runs_sweep_lost(*, now=None) -> list[int]:
    """Mark runs whose lease expired lost; requeue them while attempts remain, else fail them.

    A run whose stored telemetry shows every step trained is not trained again: it ends succeeded.
    """
    return leases.leases_sweep_expired(RUN_LEASE, lost=_run_lost, now=now)


def _run_lost(run: Run) -> None:
    """What an expired lease means for a run (its row locked by the sweep)."""
    reason = f"worker {run.lease_owner or '?'} lost (lease expired {run.lease_expires_at:%H:%M:%S})"
    if _training_completed(run):
        run_end(
            run,
            Run.Status.SUCCEEDED,
            f"attempt {run.attempts}: {reason} after training every step; not trained again",
        )
    else:
        _requeue_or_fail(run, Outcome.LOST, reason)


def _training_completed(run: Run) -> bool:
    """Whether the current attempt's stored telemetry reached the configured number of steps."""
    from gpu_runtime import StrategyError, load_strategy

    try:
        steps = load_strategy(run.config_yaml).train.steps
    except StrategyError:
        return False
    reached = run.samples.filter(attempt=run.attempts).aggregate(m=Max("step"))["m"]
    return reached is not None and reached >= steps


def _failed_attempts(run: Run) -> int:
    return RunAttempt.objects.filter(run=run, outcome__in=RunAttempt.COUNTED).count()


def _note(run: Run, line: str) -> None:
    """Add a line to the run's error log: earlier attempts' lines are kept, never overwritten."""
    if line:
        run.error = f"{run.error}\n{line}".strip()[-4000:]


def _attempt_close(run: Run, outcome: str, reason: str, number: int | None = None) -> None:
    RunAttempt.objects.filter(run=run, number=number or run.attempts).filter(
        Q(outcome=Outcome.RUNNING) | Q(outcome=Outcome.LOST, run__status=Run.Status.QUEUED)
    ).update(outcome=outcome, ended_at=timezone.now(), reason=reason[:4000])


def run_end(run: Run, status: str, error: str = "", *, attempt_number: int | None = None) -> None:
    """The one way a run ends (worker, sweeper, cancel, external finish): close its totals, record
    the outcome on the run and on its current attempt; earlier attempts' notes are kept."""
    run_ending.send(sender=Run, run=run)
    if run.attempts:
        _attempt_close(
            run,
            status,
            error.strip().splitlines()[-1][:4000] if error.strip() else "",
            number=attempt_number,
        )
    _note(run, error)
    # A historical upload ended when it declared, not when its upload finished.
    run.status, run.finished_at = status, run.declared_ended_at or timezone.now()
    run.lease_owner, run.lease_expires_at = "", None
    run.save(
        update_fields=[
            "status",
            "finished_at",
            "error",
            "dataset_sha256",
            "lease_owner",
            "lease_expires_at",
            "updated_at",
        ]
    )


def _requeue_or_fail(run: Run, outcome: str, reason: str) -> None:
    """Close the current attempt with outcome, then queue the run again, or end it."""
    _attempt_close(run, outcome, reason)
    _note(run, f"attempt {run.attempts}: {reason}")
    failed = _failed_attempts(run)
    if run.cancel_requested:
        run_end(run, Run.Status.CANCELLED)
    elif failed >= run.max_attempts:
        run_end(run, Run.Status.FAILED, f"no attempts left ({failed}/{run.max_attempts})")
    else:
        run.status, run.lease_owner, run.lease_expires_at, run.sent_at = (
            Run.Status.QUEUED,
            "",
            None,
            None,
        )
        run.save(
            update_fields=[
                "status",
                "error",
                "lease_owner",
                "lease_expires_at",
                "sent_at",
                "updated_at",
            ]
        )
        run_enqueue(run=run)
