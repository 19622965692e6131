"""A run's life on a worker: claim, heartbeat, finish; and the sweeper for lost leases.

The row is the truth. A worker claims a queued run (attempts + 1) under a lease that its
heartbeat keeps fresh; a worker that dies stops renewing, and the sweeper marks the run
lost and requeues it, up to max_attempts, then fails it. Never a requeue loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.experiments.models import Arm, Run
from apps.experiments.services import run_enqueue
from apps.pricing.models import GpuSku
from apps.telemetry.services import run_totals_advance

logger = logging.getLogger(__name__)



def lease_seconds() -> float:
    return float(settings.COSTLAB_RUN_LEASE_S)


@dataclass(frozen=True)
class LeaseState:
    held: bool  # False: the lease was taken from us (swept); stop work now
    cancel: bool
    revision: int


@transaction.atomic
def run_claim(*, run_id: int, owner: str, lease_s: float | None = None) -> Run | None:
    """Take a queued run for this worker; None when it is gone, taken, cancelled or out of attempts."""
    run = Run.objects.select_for_update().filter(pk=run_id).first()
    if run is None or run.status != Run.Status.QUEUED:
        return None
    now = timezone.now()
    if run.cancel_requested:
        run.status, run.finished_at = Run.Status.CANCELLED, now
        run.save(update_fields=["status", "finished_at", "updated_at"])
        return None
    if run.attempts >= run.max_attempts:
        _fail(run, f"gave up after {run.attempts} attempts")
        return None
    run.status = Run.Status.RUNNING
    run.attempts += 1
    expires = now + timedelta(seconds=lease_s or lease_seconds())
    run.lease_owner, run.heartbeat_at, run.lease_expires_at = owner, now, expires
    run.started_at = run.started_at or now
    run.save(update_fields=["status", "attempts", "lease_owner", "heartbeat_at", "lease_expires_at",
                            "started_at", "updated_at"])
    return run


def run_device_record(*, run_id: int, owner: str, host: str, device: str, gpu_name: str | None,
                      gpu_count: int, vcpus: int, memory_gb: float) -> None:
    """What the run actually holds, so it is priced for that (the SKU matched by device name)."""
    sku = None
    if gpu_name:
        sku = next((s for s in GpuSku.objects.all() if _same_gpu(s.name, gpu_name)), None)
    runs = Run.objects.filter(pk=run_id, lease_owner=owner)
    runs.update(host=host, device=device[:120], gpu_count=gpu_count, vcpus=vcpus, memory_gb=memory_gb)
    if sku is not None:
        runs.filter(gpu_sku__isnull=True).update(gpu_sku=sku)  # a SKU chosen at submission wins


def _same_gpu(sku_name: str, device_name: str) -> bool:
    # "NVIDIA H200" (what CUDA reports) matches the SKU "NVIDIA H200 SXM 141GB".
    words = device_name.lower().split()
    return bool(words) and all(w in sku_name.lower().split() for w in words)


def run_heartbeat(*, run_id: int, owner: str, lease_s: float | None = None) -> LeaseState:
    """Renew the lease; say whether we still hold it and whether a cancel was asked."""
    now = timezone.now()
    renewed = Run.objects.filter(pk=run_id, lease_owner=owner, status=Run.Status.RUNNING).update(
        heartbeat_at=now, lease_expires_at=now + timedelta(seconds=lease_s or lease_seconds())
    )
    row = Run.objects.filter(pk=run_id).values("cancel_requested", "arm__revision").first()
    if not renewed or row is None:
        return LeaseState(held=False, cancel=True, revision=0)
    return LeaseState(held=True, cancel=row["cancel_requested"], revision=row["arm__revision"])


def run_revision_applied(*, run_id: int, owner: str, revision: int, live: dict, not_applied: list[str],
                         applied_at) -> None:
    """Record that a running run took an arm revision's live keys at a step boundary."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id, lease_owner=owner).first()
        if run is None or revision <= run.config_revision:
            return
        run.config_revision = revision
        run.config_history = [*run.config_history, {
            "revision": revision, "applied_at": applied_at.isoformat(), "live": live, "not_applied": not_applied,
        }]
        run.save(update_fields=["config_revision", "config_history", "updated_at"])


def arm_strategy(*, arm_id: int) -> tuple[int, str]:
    return Arm.objects.filter(pk=arm_id).values_list("revision", "strategy_yaml").get()


@transaction.atomic
def run_finish(*, run_id: int, owner: str, status: str, error: str = "", dataset_sha256: str = "") -> bool:
    """Record how the run ended and close its totals; False when the lease was no longer ours."""
    run = Run.objects.select_for_update().select_related("experiment").filter(pk=run_id).first()
    if run is None or run.status != Run.Status.RUNNING or run.lease_owner != owner:
        logger.warning("run %s: finish(%s) ignored, lease not held by %s", run_id, status, owner)
        return False
    run_totals_advance(run=run, final=True)
    run.status, run.error, run.finished_at = status, error[:4000], timezone.now()
    run.dataset_sha256 = dataset_sha256 or run.dataset_sha256
    run.lease_owner, run.lease_expires_at = "", None
    run.save(update_fields=["status", "error", "finished_at", "dataset_sha256", "lease_owner",
                            "lease_expires_at", "updated_at"])
    return True


@transaction.atomic
def run_release(*, run_id: int, owner: str, reason: str) -> bool:
    """Give a running run back to the queue (worker shutting down); counts as an attempt."""
    run = Run.objects.select_for_update().filter(pk=run_id, lease_owner=owner, status=Run.Status.RUNNING).first()
    if run is None:
        return False
    _requeue_or_fail(run, reason)
    return True


def _end(run: Run, status: str, error: str) -> None:
    """Close the run's totals and record how it ended; the lease is released."""
    run_totals_advance(run=run, final=True)
    run.status, run.finished_at, run.error = status, timezone.now(), error[:4000]
    run.lease_owner, run.lease_expires_at = "", None
    run.save(update_fields=["status", "finished_at", "error", "lease_owner", "lease_expires_at", "updated_at"])


def _fail(run: Run, error: str) -> None:
    _end(run, Run.Status.FAILED, error)


def _requeue_or_fail(run: Run, reason: str) -> None:
    run.error = f"{run.error}\nattempt {run.attempts}: {reason}".strip()[:4000]
    if run.cancel_requested:
        _end(run, Run.Status.CANCELLED, run.error)
    elif run.attempts >= run.max_attempts:
        _fail(run, f"{run.error}\nno attempts left ({run.attempts}/{run.max_attempts})")
    else:
        run.status, run.lease_owner, run.lease_expires_at = Run.Status.QUEUED, "", None
        run.save(update_fields=["status", "error", "lease_owner", "lease_expires_at", "updated_at"])
        run_enqueue(run=run)


def runs_sweep_lost(*, now=None) -> list[int]:
    """Mark runs whose lease expired lost; requeue them while attempts remain, else fail them."""
    now = now or timezone.now()
    swept = []
    with transaction.atomic():
        expired = (
            Run.objects.select_for_update(skip_locked=True)
            .filter(status=Run.Status.RUNNING, kind=Run.Kind.WORKER, lease_expires_at__lt=now)
            .order_by("pk")
        )
        for run in expired:
            logger.warning("run %s lost: lease held by %s expired at %s", run.pk, run.lease_owner,
                           run.lease_expires_at.isoformat())
            _requeue_or_fail(run, f"worker {run.lease_owner or '?'} lost (lease expired {run.lease_expires_at:%H:%M:%S})")
            swept.append(run.pk)
    return swept

