"""Reads of sweeps: the tenant's sweeps, and a sweep's probes with the frontier marked."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from apps.sweeps.frontier import Point, pareto_front
from apps.sweeps.models import Probe, Sweep
from apps.sweeps.quality import CONSTRAINT_REASON
from apps.tenants.models import Tenant


def sweep_list(*, tenant: Tenant) -> QuerySet[Sweep]:
    """The tenant's sweeps, each with ``probes_landed`` (probes no longer queued or running)
    counted in SQL."""
    landed = Count("probes", filter=~Q(probes__status__in=Probe.PENDING))
    return (
        Sweep.objects.filter(tenant=tenant)
        .select_related("gpu_sku", "cost_model")
        .annotate(probes_landed=landed)
        .order_by("-created_at", "-pk")
    )


def _feasible(probe: Probe, *, waive_quality: bool) -> bool:
    if probe.status == Probe.Status.SUCCEEDED:
        return True
    # measured, and infeasible only by the sweep's quality constraint
    return (
        waive_quality
        and probe.status == Probe.Status.INFEASIBLE
        and probe.reason.startswith(CONSTRAINT_REASON)
    )


def sweep_frontier(*, sweep: Sweep, waive_quality: bool = False) -> list[Probe]:
    """Every probe of the sweep, in proposal order, each with ``on_frontier`` set
    (see apps.sweeps.frontier). ``waive_quality``: the frontier as if the quality constraint were
    off (what a forced promote may take)."""
    probes = list(Probe.objects.filter(sweep=sweep).order_by("number"))
    points = [
        Point(
            key=p.pk,
            values=p.objective_values(sweep.objectives),
            spread=p.step_time_spread or 0.0,
            feasible=_feasible(p, waive_quality=waive_quality),
        )
        for p in probes
    ]
    front = set(pareto_front(points, base=float(sweep.tie_tolerance)))
    for probe in probes:
        probe.on_frontier = probe.pk in front
    return probes


def queue_warnings(*, queue: str, timeout_s: float = 0.5) -> list[str]:
    """A warning when no worker answers for the queue now (probes then wait); none when unsure."""
    from celery import current_app as app

    try:
        replies = app.control.inspect(timeout=timeout_s).active_queues() or {}
    except (
        Exception
    ):  # a transport without broadcast (the embedded one), or the broker away: no claim either way
        return []
    if any(q.get("name") == queue for queues in replies.values() for q in queues or []):
        return []
    return [f"queue: no worker consumes queue '{queue}' now; the probes wait until one starts"]


def run_profile(*, run) -> dict:
    """The design document's workload profile from a run's telemetry: cpu_util and io_wait as 0..1,
    mem_usage_gb. CPU utilisation is only measured on a CPU run (a GPU run's util_pct is the GPU's);
    I/O wait is not sampled by the runtime: None, counted as 0 in the estimate and said so."""
    from django.db.models import Avg, Max

    from apps.telemetry.compaction import rehydrated
    from apps.telemetry.models import TelemetrySample

    with rehydrated([run]):  # a packed run's samples read as raw ones
        agg = TelemetrySample.objects.of_run(run).aggregate(
            util=Avg("util_pct"), mem=Max("mem_used_mb")
        )
    cpu = run.gpu_count == 0 and agg["util"] is not None
    return {
        "cpu_util": agg["util"] / 100 if cpu else None,
        "io_wait": None,
        "mem_usage_gb": agg["mem"] / 1024 if agg["mem"] is not None else None,
    }


def run_sizing_report(*, run) -> dict:
    """The estimate beside the measurement (latest sizing sweep of the run),
    with their difference."""
    from apps.sweeps.sizing import SizePoint, estimate_vcpus, recommend

    profile = run_profile(run=run)
    estimate = None
    if profile["cpu_util"] is not None or profile["mem_usage_gb"] is not None:
        estimate = estimate_vcpus(
            cpu_util=profile["cpu_util"] or 0.0,
            io_wait=profile["io_wait"] or 0.0,
            mem_usage_gb=profile["mem_usage_gb"] or 0.0,
        )
    sweep = run.sizing_sweeps.order_by("-created_at", "-pk").first()
    probes = (
        []
        if sweep is None
        else sorted(sweep.probes.all(), key=lambda p: p.params["resources.threads"])
    )
    points = [
        SizePoint(
            threads=p.params["resources.threads"],
            usd_per_mtok=p.usd_per_mtok,
            tokens_per_s=p.tokens_per_s,
        )
        for p in probes
        if p.status == Probe.Status.SUCCEEDED and p.usd_per_mtok and p.tokens_per_s
    ]
    measured = (
        recommend(points, actual=run.vcpus or None)
        if sweep and sweep.status == Sweep.Status.COMPLETED
        else None
    )
    return {
        "profile": profile,
        "estimate_vcpus": estimate,
        "actual_vcpus": run.vcpus,
        "sweep": None if sweep is None else {"id": sweep.pk, "status": sweep.status},
        "sizes": [
            {
                "threads": p.params["resources.threads"],
                "status": p.status,
                "usd_per_mtok": p.usd_per_mtok,
                "tokens_per_s": p.tokens_per_s,
                "reason": p.reason,
            }
            for p in probes
        ],
        "recommended_vcpus": None if measured is None else measured.recommended,
        "cheapest_vcpus": None if measured is None else measured.cheapest,
        "compliance_recommended": None if measured is None else measured.compliance_recommended,
        "compliance_actual": None if measured is None else measured.compliance_actual,
        "difference_vcpus": None
        if measured is None or estimate is None
        else estimate - measured.recommended,
    }
