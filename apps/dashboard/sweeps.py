"""The sweep pages' reads: the user's sweeps, and one sweep's probes as chart and table data."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.experiments.models import Arm, Experiment
from apps.sweeps.models import OBJECTIVES, Sweep
from apps.sweeps.selectors import run_sizing_report, sweep_frontier
from apps.tenants.models import Membership

SWEEP_POLL_MS = 2000


def sweeps_visible(*, user) -> QuerySet[Sweep]:
    """Sweeps of the user's tenants; anything else is a 404 to them."""
    return (
        Sweep.objects.filter(tenant__in=Membership.objects.filter(user=user).values("tenant_id"))
        .select_related("tenant")
        .order_by("-created_at", "-pk")
    )


def _strategy(params: dict) -> str:
    return ", ".join(f"{key}={value}" for key, value in params.items())


def sweep_data(*, sweep: Sweep) -> dict:
    """Every probe with its objectives and frontier flag: what the scatter and the live poll
    draw."""
    probes = sweep_frontier(sweep=sweep)
    axes = (
        list(sweep.objectives) if len(sweep.objectives) > 1 else [*sweep.objectives, "step_time_s"]
    )
    return {
        "status": sweep.status,
        "axes": [{"key": key, "label": OBJECTIVES[key]} for key in axes[:2]],
        "probes": [
            {
                "number": p.number,
                "status": p.status,
                "on_frontier": p.on_frontier,
                "strategy": _strategy(p.params),
                "reason": p.reason.splitlines()[0][:200] if p.reason else "",
                "x": getattr(p, axes[0]),
                "y": getattr(p, axes[1]),
            }
            for p in probes
        ],
        "poll_ms": SWEEP_POLL_MS if sweep.status == Sweep.Status.RUNNING else None,
    }


def sweep_page(*, sweep: Sweep) -> dict:
    """The sweep page: its probes (numbered by their API ids), the frontier, where each promoted
    probe went, and the tenant's experiments a frontier point can be promoted to."""
    probes = sweep_frontier(sweep=sweep)
    keys = list(dict.fromkeys(k for p in probes for k in p.params))
    promoted = {
        a.pk: a
        for a in Arm.objects.filter(
            pk__in=[p.promoted_to_id for p in probes if p.promoted_to_id]
        ).select_related("experiment")
    }
    rows = [
        {
            "probe": p,
            "values": [p.params.get(k, "—") for k in keys],
            "promoted": promoted.get(p.promoted_to_id),
        }
        for p in probes
    ]
    return {
        "experiments": list(
            Experiment.objects.filter(tenant_id=sweep.tenant_id)
            .exclude(status=Experiment.Status.COMPLETED)
            .order_by("name")
            .only("pk", "name")
        ),
        "sweep": sweep,
        "keys": [k.split(".")[-1] for k in keys],
        "full_keys": keys,
        "rows": rows,
        "objectives": [OBJECTIVES[o] for o in sweep.objectives],
        "chart": sweep_data(sweep=sweep),
        "frontier_count": sum(1 for p in probes if p.on_frontier),
    }


def run_sizing(*, run) -> dict | None:
    """The run page's vCPU right-sizing section: only for a finished run with telemetry or a sizing
    sweep."""
    if run.status != run.Status.SUCCEEDED:
        return None
    report = run_sizing_report(run=run)
    # Measured: the vCPUs the run kept busy on average (its CPU utilisation of its own vCPUs), to
    # set beside the design document's rule of thumb, which scales utilisation to 8 vCPUs.
    cpu_util, vcpus = report["profile"]["cpu_util"], report["actual_vcpus"]
    report["used_vcpus"] = cpu_util * vcpus if cpu_util is not None and vcpus else None
    return report
