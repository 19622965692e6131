"""What the dashboard's charts draw, as JSON-ready dicts: telemetry per run, the deviation timeline
with its threshold and freeze markers, traffic weights over time, held-out quality against cost,
and a run's cost breakdown."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Max, OuterRef, Subquery
from django.utils import timezone

from apps.attribution.models import AttributionSnapshot, FreezeEvent, WeightChange
from apps.attribution.reads import quality_curves, snapshot_series
from apps.billing.interface import breakdown_shown
from apps.core.db import EpochMs
from apps.dashboard.quality import EVAL_LOSS, metric_words
from apps.dashboard.series import RunSeries, epoch_ms, series_meta
from apps.dashboard.verdicts import clip_low
from apps.experiments.models import Arm, Experiment, Run

# Telemetry charts of the experiment page (a run's page adds throughput and the NVML GPM kernel
# counters). Memory and GPM are charted only where they were sent: a chart that is always empty (a
# CPU run, a GPU before Hopper) says nothing. Each chart can be drawn against time, steps or tokens.
GPM_FIELDS = ("tensor_active_pct", "dram_bw_pct", "sm_occupancy_pct")
EXPERIMENT_FIELDS = ("util_pct", "power_w", "step_time_s", "micro_batch", "loss", "mem_used_mb")
RUN_FIELDS = (*EXPERIMENT_FIELDS[:4], "tokens_per_s", "loss", "mem_used_mb", *GPM_FIELDS)
CHARTED_WHEN_SENT = ("mem_used_mb", *GPM_FIELDS)
# Points per chart across all its runs; each run gets a share, within these bounds.
CHART_POINTS = 2400
RUN_BUDGET_MIN, RUN_BUDGET_MAX = 60, 600
# Attribution windows drawn per arm; a longer timeline keeps every k-th window and the last.
TIMELINE_POINTS = 1500
ARM_COLORS = (
    "#1f6fb4",
    "#d1495b",
    "#2a9d5c",
    "#8e6cc0",
    "#e08a1e",
    "#1aa3b8",
    "#6d6d6d",
    "#b5651d",
)
LIVE_POLL_MS = 1000


def budget_per_run(runs: int) -> int:
    return max(RUN_BUDGET_MIN, min(RUN_BUDGET_MAX, CHART_POINTS // max(runs, 1)))


def arm_color(index: int) -> str:
    return ARM_COLORS[index % len(ARM_COLORS)]


def arm_color_indices(*, experiment_ids) -> dict[int, int]:
    """Each arm's colour index within its experiment, in the order every page uses: the control
    first, then by name (the experiment page's table, its charts, spend, a run's page). One
    query."""
    out: dict[int, int] = {}
    seen: dict[int, int] = {}
    for experiment_id, arm_id in (
        Arm.objects.filter(experiment_id__in=list(experiment_ids))
        .order_by("experiment_id", "-is_control", "name")
        .values_list("experiment_id", "pk")
    ):
        out[arm_id] = seen.get(experiment_id, 0) % len(ARM_COLORS)
        seen[experiment_id] = seen.get(experiment_id, 0) + 1
    return out


def run_label(run: Run, arm_name: str) -> str:
    return f"run {run.pk} · {arm_name}"


def runs_json(runs: list[Run], arm_names: dict[int, str], series: RunSeries) -> dict:
    return {
        str(r.pk): {
            "arm": r.arm_id,
            "label": run_label(r, arm_names.get(r.arm_id, "?")),
            "status": r.status,
            "estimated": r.pk in series.estimated,
        }
        for r in runs
    }


def device_label(runs: list[Run]) -> str:
    """What "utilization" measures on these runs: a CPU run reports CPU utilization, not a GPU's."""
    kinds = {"GPU" if r.gpu_count else "CPU" for r in runs}
    return (
        f"{kinds.pop()} utilization"
        if len(kinds) == 1
        else "Device utilization (GPU or CPU)"
        if kinds
        else "Utilization"
    )


def telemetry_json(
    *, runs: list[Run], arm_names: dict[int, str], series: RunSeries, fields: tuple[str, ...]
) -> dict:
    data = series.as_json(fields)
    fields = tuple(f for f in fields if f not in CHARTED_WHEN_SENT or data.get(f))
    meta = series_meta(fields)
    if "util_pct" in meta:
        meta["util_pct"] = {**meta["util_pct"], "label": device_label(runs)}
    return {
        "fields": meta,
        "runs": runs_json(runs, arm_names, series),
        "series": {f: data[f] for f in fields},
        "progress": series.progress_json(),
    }


def _thin(rows: list, limit: int) -> list:
    if len(rows) <= limit:
        return rows
    step = -(-len(rows) // limit)
    return rows[::step] + ([rows[-1]] if (len(rows) - 1) % step else [])


def attribution_version(*, experiment: Experiment) -> str:
    """Changes whenever the deviation timeline, the freezes or the weights would draw
    differently."""
    row = (
        Experiment.objects.filter(pk=experiment.pk)
        .annotate(
            s=Subquery(
                AttributionSnapshot.objects.filter(experiment=OuterRef("pk"))
                .order_by()
                .values("experiment")
                .annotate(m=Max("pk"))
                .values("m")
            ),
            f=Subquery(
                FreezeEvent.objects.filter(experiment=OuterRef("pk"))
                .order_by()
                .values("experiment")
                .annotate(m=Max("pk"))
                .values("m")
            ),
            w=Subquery(
                WeightChange.objects.filter(arm__experiment=OuterRef("pk"))
                .order_by()
                .values("arm__experiment")
                .annotate(m=Max("pk"))
                .values("m")
            ),
            a=Subquery(
                Arm.objects.filter(experiment=OuterRef("pk"))
                .order_by()
                .values("experiment")
                .annotate(m=Max("updated_at"))
                .values("m")
            ),
        )
        .values_list("s", "f", "w", "a")
        .first()
    )
    s, f, w, a = row or (None, None, None, None)
    return f"{s or 0}.{f or 0}.{w or 0}.{epoch_ms(a) if a else 0}"


def attribution_json(
    *,
    experiment: Experiment,
    arms: list[Arm],
    now: datetime | None = None,
    version: str | None = None,
) -> dict:
    """The deviation timeline (percent vs control, with its always-valid bounds), freeze and
    unfreeze markers, and each arm's traffic weight as a step line up to now. Three queries."""
    now = now or timezone.now()
    snapshots = list(
        snapshot_series(experiment=experiment)
        .annotate(t=EpochMs("window_end"))
        .values_list("arm_id", "t", "deviation", "deviation_low", "deviation_high", "weight")
    )
    by_arm: dict[int, list] = {}
    for row in snapshots:
        by_arm.setdefault(row[0], []).append(row)
    controls = {a.pk for a in arms if a.is_control}
    deviation, weights = {}, {}
    for arm in arms:
        rows = _thin(by_arm.get(arm.pk, []), TIMELINE_POINTS)
        if arm.pk not in controls:
            points = [r for r in rows if r[2] is not None]
            deviation[str(arm.pk)] = {
                "x": [int(r[1]) for r in points],
                "y": [_pct(r[2]) for r in points],
                "lo": [_pct(clip_low(r[3])) for r in points],
                "hi": [_pct(r[4]) for r in points],
            }
        weights[arm.pk] = [(r[1], float(r[5])) for r in rows]

    changes = (
        WeightChange.objects.filter(arm__experiment=experiment)
        .order_by("created_at", "pk")
        .annotate(t=EpochMs("created_at"))
        .values_list("arm_id", "t", "old_weight", "new_weight")
    )
    first_old: dict[int, float] = {}
    for arm_id, at, old, new in changes:
        first_old.setdefault(arm_id, float(old))
        weights.setdefault(arm_id, []).append((at, float(new)))
    weights_json = {}
    for arm in arms:
        points = sorted(weights.get(arm.pk, []), key=lambda p: p[0])
        start = first_old.get(arm.pk, points[0][1] if points else float(arm.weight))
        created = epoch_ms(experiment.created_at)
        points = [(created, start), *points, (max(epoch_ms(now), created), float(arm.weight))]
        weights_json[str(arm.pk)] = {"x": [int(t) for t, _ in points], "y": [w for _, w in points]}

    last_dev = {
        arm_id: rows[-1][2] for arm_id, rows in by_arm.items() if rows and rows[-1][2] is not None
    }
    threshold = float(experiment.freeze_threshold)
    freezes = [
        {
            "arm": arm_id,
            "action": action,
            "x": int(at),
            "reason": reason,
            "y": _pct(dev if dev is not None else last_dev.get(arm_id, threshold)),
        }
        for arm_id, action, at, dev, reason in FreezeEvent.objects.filter(experiment=experiment)
        .order_by("created_at", "pk")
        .annotate(t=EpochMs("created_at"))
        .values_list("arm_id", "action", "t", "deviation", "reason")
    ]
    return {
        "attributed": bool(snapshots),  # windows exist, even when no deviation is estimable yet
        "threshold_pct": _pct(threshold),
        "deviation": deviation,
        "freezes": freezes,
        "weights": weights_json,
        "arms": {str(a.pk): {"state": a.state, "weight": float(a.weight)} for a in arms},
        "version": version or attribution_version(experiment=experiment),
    }


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else round(fraction * 100, 3)


# Runs drawn on the quality chart: the newest that evaluated the metric (points: CHART_POINTS).
QUALITY_RUNS = 100


def quality_json(
    *,
    experiment: Experiment,
    target: float | None,
    colors: dict[int, str],
    arm_names: dict[int, str],
    arm_order: list[int],
) -> dict:
    """Held-out quality against cumulative cost: per run that evaluated the experiment's metric,
    its evaluations as (USD so far, value), ordered by USD (estimated: the run's bill pro rata of
    its wall time, apps.attribution.selectors.quality_curves), in its arm's colour, the control's
    first; and the control's final value (the report's quality_target) as the reference."""
    metric = experiment.quality_metric
    curves = quality_curves(experiment=experiment)[-QUALITY_RUNS:]  # by run id
    order = {arm_id: i for i, arm_id in enumerate(arm_order)}
    curves.sort(key=lambda c: (order.get(c.arm_id, len(order)), c.run_id))
    budget = budget_per_run(len(curves))
    runs = []
    for c in curves:
        points = _thin(sorted(c.points, key=lambda p: (p[0], p[2])), budget)
        runs.append(
            {
                "run": c.run_id,
                "arm": c.arm_id,
                "label": f"run {c.run_id} · {arm_names.get(c.arm_id, '?')}",
                "finished": c.finished,
                "color": colors.get(c.arm_id, ARM_COLORS[-2]),
                "x": [float(f"{usd:.6g}") for usd, _, _ in points],
                "y": [value for _, value, _ in points],
                "tokens": [tokens for _, _, tokens in points],
            }
        )
    what = metric_words(metric)
    return {
        "metric": metric,
        "title": f"{what[0].upper()}{what[1:]} against cost",
        "y_title": (
            "eval_loss (per token)"  # mean cross-entropy over the held-out tokens
            if metric == EVAL_LOSS
            else f"{what} ({experiment.quality_direction} is better)"
        ),
        "x_title": "USD (estimated, pro rata)",
        "direction": experiment.quality_direction,
        "target": target,
        "runs": runs,
    }


def cost_breakdown_json(run: Run) -> dict:
    """A run's cost two ways: device time used vs idle, and by resource (energy vs device-hours
    ...)."""
    b = breakdown_shown(run.cost_breakdown)  # an unpriced component reads None, not 0
    return {
        "used_idle": {"used": b.get("used_usd", 0.0), "idle": b.get("idle_usd", 0.0)},
        "resources": {
            ("device-hours (GPU)" if run.gpu_count else "device-hours (CPU)"): b.get(
                "gpu_usd", 0.0
            ),
            "energy": b.get("energy_usd", 0.0),
            "vCPU": b.get("cpu_usd", 0.0),
            "memory": b.get("memory_usd", 0.0),
        },
        "energy_estimated": run.energy_estimated,
        "unpriced_s": b.get("unpriced_s") or {},
    }
