"""Reads of experiments, arms and runs, always scoped to one tenant."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.db.models import (
    Count,
    F,
    Prefetch,
    Q,
    QuerySet,
    Sum,
    Window,
)
from django.db.models.functions import RowNumber
from django.utils import timezone

from apps.experiments.models import Arm, Experiment, Run
from apps.tenants.models import Tenant

RECENT_RUN_DAYS = 7  # a pricing table must price the SKUs of runs this recent


def gpu_skus_in_use(*, tenant: Tenant) -> dict[int, tuple[str, int]]:
    """{SKU id: (name, runs)} of the tenant's GPU runs that are queued, running, or finished in the
    last RECENT_RUN_DAYS days: what a new pricing table must price (one grouped query)."""
    since = timezone.now() - timedelta(days=RECENT_RUN_DAYS)
    rows = (
        Run.objects.filter(tenant=tenant, gpu_sku__isnull=False)
        .filter(Q(status__in=Run.ACTIVE_STATUSES) | Q(finished_at__gte=since))
        .values("gpu_sku_id", "gpu_sku__name")
        .annotate(runs=Count("id"))
    )
    return {r["gpu_sku_id"]: (r["gpu_sku__name"], r["runs"]) for r in rows}


def month_start(now=None):
    return (now or timezone.now()).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def tenant_month_spend(*, tenant_id: int) -> Decimal:
    """USD the tenant's runs queued this calendar month have cost so far (one indexed sum)."""
    spent = Run.objects.filter(tenant_id=tenant_id, queued_at__gte=month_start()).aggregate(
        s=Sum("cost_usd")
    )["s"]
    return spent or Decimal(0)


def experiment_list(*, tenant: Tenant) -> QuerySet[Experiment]:
    arms = Arm.objects.order_by("-is_control", "name")
    return (
        Experiment.objects.filter(tenant=tenant)
        .select_related("cost_model", "pricing_table")
        .prefetch_related(Prefetch("arms", queryset=arms))
        .order_by("-created_at", "-pk")
    )


def arm_list(*, tenant: Tenant) -> QuerySet[Arm]:
    return (
        Arm.objects.filter(experiment__tenant=tenant)
        .select_related("experiment")
        .order_by("experiment", "pk")
    )


def run_list(*, tenant: Tenant) -> QuerySet[Run]:
    return (
        Run.objects.filter(tenant=tenant)
        .select_related("arm", "gpu_sku")
        .order_by("-created_at", "-pk")
    )


# A run's device time per token beyond this many MADs from its arm's median is an outlier. The MAD
# is scaled by 1.4826 (MAD_SCALE) so that it estimates a standard deviation (the usual robust
# z-score):
# a raw 3 x MAD is only ~2 sigma and would flag one normal run in twenty.
OUTLIER_MADS = 3.0
MAD_SCALE = 1.4826
# The MAD is floored at this share of the median: runs alike to rounding are not outliers of each
# other.
OUTLIER_MAD_FLOOR = 0.01
OUTLIER_MIN_RUNS = 3  # fewer runs in an arm: no median to stand out from


@dataclass(frozen=True)
class RunOutlier:
    """A run whose device seconds per token lie beyond OUTLIER_MADS x MAD from its arm's median."""

    run_id: int
    experiment_id: int
    arm_id: int
    device_s_per_token: float
    arm_median: float
    # the arm's runs' median absolute deviation x MAD_SCALE (at least OUTLIER_MAD_FLOOR x median)
    mad: float
    distance_mads: float  # |value - median| / mad

    def as_dict(self) -> dict:
        return {
            "run": self.run_id,
            "arm": self.arm_id,
            "device_s_per_token": self.device_s_per_token,
            "arm_median": self.arm_median,
            "mad": self.mad,
            "distance_mads": self.distance_mads,
            "reason": f"device time per token {self.distance_mads:.1f} MADs from its arm's median "
            f"(limit {OUTLIER_MADS:g})",
        }


def mad_outliers(
    values: dict[int, float], *, k: float = OUTLIER_MADS
) -> dict[int, tuple[float, float, float]]:
    """Keys whose value lies beyond k x MAD from the median: key -> (median, MAD, distance in
    MADs)."""
    if len(values) < OUTLIER_MIN_RUNS:
        return {}
    median = statistics.median(values.values())
    mad = max(
        MAD_SCALE * statistics.median(abs(v - median) for v in values.values()),
        OUTLIER_MAD_FLOOR * abs(median),
    )
    if mad <= 0:
        return {}
    out = {}
    for key, value in values.items():
        distance = abs(value - median) / mad
        if distance > k:
            out[key] = (median, mad, distance)
    return out


def run_outliers(*, experiment_id: int) -> dict[int, RunOutlier]:
    """The experiment's outlier runs by device time per token, each judged against its own arm's
    runs."""
    return runs_outliers(experiment_ids=[experiment_id])


def runs_outliers(*, experiment_ids: list[int]) -> dict[int, RunOutlier]:
    """The outlier runs of these experiments (run id -> RunOutlier), in one query.

    Every run that trained (tokens and device time recorded) counts, finished or not.
    """
    per_arm: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
    rows = Run.objects.filter(
        experiment_id__in=experiment_ids, tokens__gt=0, device_seconds__gt=0
    ).values_list("pk", "experiment_id", "arm_id", "device_seconds", "tokens")
    for pk, experiment_id, arm_id, seconds, tokens in rows:
        per_arm[experiment_id, arm_id][pk] = seconds / tokens
    found = {}
    for (experiment_id, arm_id), values in per_arm.items():
        for pk, (median, mad, distance) in mad_outliers(values).items():
            found[pk] = RunOutlier(pk, experiment_id, arm_id, values[pk], median, mad, distance)
    return found


@dataclass(frozen=True)
class QueuePlace:
    """Where a queued run stands: 1 = taken next on its queue. eta_s is an estimate (flagged so
    wherever it is shown): the runs ahead of it, at the mean time of its queue's recent runs,
    over the runs its queue trains at once now (at least one)."""

    position: int
    eta_s: float | None


ETA_RECENT_RUNS = 20


def queue_places(*, queues: set[str] | None = None) -> dict[int, QueuePlace]:
    """Every queued worker run's place in its queue, in the order workers take them (by queue
    level: ci, then normal, then batch, each tenant's first runs before its later ones; oldest
    first within a level): one query for the places and one per queue for its recent run time
    and its running count."""
    queued = Run.objects.filter(
        status=Run.Status.QUEUED, kind=Run.Kind.WORKER, cancel_requested=False
    )
    if queues is not None:
        queued = queued.filter(queue__in=queues)
    rows = list(
        queued.annotate(
            place=Window(
                RowNumber(),
                partition_by=[F("queue")],
                order_by=[F("queue_level"), F("queued_at"), F("pk")],
            )
        ).values_list("pk", "queue", "place")
    )
    pace = {}
    for queue in {q for _, q, _ in rows}:
        recent = list(
            Run.objects.filter(
                queue=queue,
                kind=Run.Kind.WORKER,
                status=Run.Status.SUCCEEDED,
                started_at__isnull=False,
                finished_at__isnull=False,
            )
            .order_by("-finished_at")
            .values_list("started_at", "finished_at")[:ETA_RECENT_RUNS]
        )
        running = Run.objects.filter(queue=queue, status=Run.Status.RUNNING).count()
        mean = statistics.fmean((f - s).total_seconds() for s, f in recent) if recent else None
        pace[queue] = (mean, max(running, 1))
    out = {}
    for pk, queue, place in rows:
        mean, slots = pace[queue]
        # The runs ahead, and the one running now, finish first; then this one starts.
        out[pk] = QueuePlace(
            position=place, eta_s=None if mean is None else round(place * mean / slots, 1)
        )
    return out
