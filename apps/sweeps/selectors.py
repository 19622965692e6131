"""Reads of sweeps: the tenant's sweeps, and a sweep's probes with the frontier marked."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.sweeps.frontier import Point, pareto_front
from apps.sweeps.models import Probe, Sweep
from apps.tenants.models import Tenant


def sweep_list(*, tenant: Tenant) -> QuerySet[Sweep]:
    return Sweep.objects.filter(tenant=tenant).select_related("gpu_sku", "cost_model").order_by("-created_at", "-pk")


def sweep_frontier(*, sweep: Sweep) -> list[Probe]:
    """Every probe of the sweep, in proposal order, each with ``on_frontier`` set (see apps.sweeps.frontier)."""
    probes = list(Probe.objects.filter(sweep=sweep).order_by("number"))
    points = [Point(key=p.pk, values=p.objective_values(sweep.objectives), spread=p.step_time_spread or 0.0,
                    feasible=p.status == Probe.Status.SUCCEEDED) for p in probes]
    front = set(pareto_front(points, base=float(sweep.tie_tolerance)))
    for probe in probes:
        probe.on_frontier = probe.pk in front
    return probes


def queue_warnings(*, queue: str, timeout_s: float = 0.5) -> list[str]:
    """A warning when no worker answers for the queue now (probes then wait); none when unsure."""
    from config.celery_app import app

    try:
        replies = app.control.inspect(timeout=timeout_s).active_queues() or {}
    except Exception:  # a transport without broadcast (the embedded one), or the broker away: no claim either way
        return []
    if any(q.get("name") == queue for queues in replies.values() for q in queues or []):
        return []
    return [f"queue: no worker consumes queue '{queue}' now; the probes wait until one starts"]
