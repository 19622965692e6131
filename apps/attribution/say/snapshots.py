"""From sums and a verdict to a snapshot's fields; the same path recomputes a past window."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings

from apps.attribution.decide import stats
from apps.attribution.decide.decisions import (
    ArmInput,
    ArmSums,
    ArmVerdict,
    Policy,
    experiment_decide,
)
from apps.attribution.decide.quality import QualityRule, QualitySums
from apps.attribution.evidence.comparison import Comparison
from apps.attribution.evidence.moments import observations_sums, run_moments
from apps.attribution.models import AttributionSnapshot, AttributionWindow
from apps.billing.interface import JOULES_PER_KWH, SECONDS_PER_HOUR
from apps.experiments.models import Arm, Experiment
from apps.pricing.models import CostModel

# The fields a recompute must reproduce exactly (everything but the row's identity and clock).
COMPARED_FIELDS = [
    f.name for f in AttributionSnapshot._meta.concrete_fields if f.name not in ("id", "computed_at")
]


SNAPSHOT_EVIDENCE = (
    "metric",
    "decision",
    "frozen_for",
    "quality",
    "priced_from_usage",
    "blocked_by",
    "threshold",
    "alpha",
    "min_runs",
    "min_samples",
    "min_cs_runs",
    "excluded_runs",
    "device_class",
    "device_class_label",
    "other_device_classes",
)
CLASS_EVIDENCE = ("device_class", "device_class_label", "other_device_classes")


def full_evidence(
    verdict: ArmVerdict, window: AttributionWindow, epoch_start: int, comparison: Comparison
) -> dict:
    """Everything a decision was made on (what a FreezeEvent keeps): figures, bounds, rule, window,
    table."""
    return {
        **verdict.evidence,
        "window": {
            "number": window.number,
            "end": window.window_end.isoformat(),
            "since": epoch_start,
        },
        "pricing_table": _table_json(comparison),
    }


def _table_json(comparison: Comparison) -> dict:
    valid_from = comparison.valid_from.isoformat() if comparison.valid_from else None
    return {"id": comparison.table_id, "valid_from": valid_from}


def policy_for(experiment: Experiment) -> Policy:
    cost_model = experiment.cost_model
    tiered_steps = (
        cost_model.kind == CostModel.Kind.TIERED_PER_CALL and cost_model.unit == CostModel.Unit.STEP
    )
    alpha = float(experiment.alpha)
    return Policy(
        threshold=float(experiment.freeze_threshold),
        alpha=alpha,
        min_runs=experiment.min_runs_per_arm,
        min_samples=experiment.min_samples_per_arm,
        min_cs_runs=experiment.min_cs_runs_per_arm,
        unit="step" if tiered_steps else "token",
        r2=stats.tuning_r2(alpha=alpha, expected_n=settings.COSTLAB_CS_EXPECTED_RUNS),
        dynamic_weights=experiment.dynamic_weights,
        min_share=settings.COSTLAB_WEIGHT_MIN_SHARE,
        max_step=settings.COSTLAB_WEIGHT_MAX_STEP,
        quality=QualityRule(
            metric=experiment.quality_metric,
            higher_is_better=experiment.quality_direction == "higher",
            margin=float(experiment.quality_margin),
            alpha=alpha,
            r2=stats.tuning_r2(alpha=alpha, expected_n=settings.COSTLAB_CS_EXPECTED_RUNS),
            min_runs=max(experiment.min_runs_per_arm, experiment.min_cs_runs_per_arm, 2),
        ),
    )


def snapshot_build(
    *,
    window: AttributionWindow,
    arm: ArmInput,
    verdict: ArmVerdict,
    policy: Policy,
    epoch_start: int,
    skip_reason: str,
    comparison: Comparison,
) -> AttributionSnapshot:
    """An unsaved snapshot: the arm's sums, the figures derived from them, and the decision."""
    s: ArmSums = arm.sums
    metric, dev = verdict.metric, verdict.deviation
    mtok = metric if policy.unit == "token" else None
    # The figures are columns of the row; its evidence keeps only what the columns do not say.
    evidence = {k: v for k, v in verdict.evidence.items() if k in SNAPSHOT_EVIDENCE}
    evidence["window"] = {
        "number": window.number,
        "end": window.window_end.isoformat(),
        "since": epoch_start,
    }
    if skip_reason:
        evidence.update(decision="skipped", skip_reason=skip_reason)
    return AttributionSnapshot(
        experiment_id=window.experiment_id,
        arm_id=arm.arm_id,
        window=window,
        epoch_start=epoch_start,
        computed_at=window.window_end,
        window_end=window.window_end,
        runs=s.runs,
        samples=s.samples,
        observations=s.observations,
        tokens=s.tokens,
        steps=s.steps,
        gpu_hours=float(s.gpu_seconds) / SECONDS_PER_HOUR,
        energy_kwh=float(s.energy_j) / JOULES_PER_KWH,
        energy_estimated=s.estimated,
        cost_usd=s.cost,
        compared_usd=s.compared,
        pricing_table_id=comparison.table_id,
        pricing_valid_from=comparison.valid_from,
        gpu_seconds=s.gpu_seconds,
        wall_s=s.wall_s,
        energy_j=s.energy_j,
        cost_sq=s.cost_sq,
        cost_tokens=s.cost_tokens,
        tokens_sq=s.tokens_sq,
        cost_steps=s.cost_steps,
        steps_sq=s.steps_sq,
        metric=policy.metric,
        metric_value=verdict.metric_value,
        metric_ci_low=metric.low * policy.scale if metric else None,
        metric_ci_high=metric.high * policy.scale if metric else None,
        usd_per_mtok=verdict.usd_per_mtok,
        usd_per_mtok_ci_low=mtok.low * 1e6 if mtok else None,
        usd_per_mtok_ci_high=mtok.high * 1e6 if mtok else None,
        throughput_tok_s=verdict.throughput_tok_s,
        deviation=dev.estimate if dev else None,
        deviation_low=dev.low if dev else None,
        deviation_high=dev.high if dev else None,
        weight=arm.weight,
        state=Arm.State.ACTIVE if arm.active else Arm.State.FROZEN,
        evidence=evidence,
    )


def window_recompute(*, window: AttributionWindow) -> list[AttributionSnapshot]:
    """The window's snapshots rebuilt from its observations alone (unsaved), arm by arm.

    Sums come from every counted observation in the window and the earlier windows of each
    arm's epoch, not from the previous snapshot; arm states and weights are the ones the
    window saw. Under the experiment's current policy, the result equals what the tick stored.
    """
    stored = {s.arm_id: s for s in window.snapshots.select_related("arm")}
    if not stored:
        return []
    experiment = Experiment.objects.select_related("cost_model").get(pk=window.experiment_id)
    # The table the window compared at, as it recorded it.
    table = window.pricing_table
    comparison = Comparison.of(
        table_id=table.pk if table else None,
        valid_from=table.valid_from if table else None,
        cost_model=experiment.cost_model,
    )
    return _rebuild(window, stored, experiment, comparison)


def window_without(
    *,
    window: AttributionWindow,
    snapshots: list[AttributionSnapshot],
    experiment: Experiment,
    leave_out: dict[int, set[int]],
) -> list[AttributionSnapshot]:
    """The window's snapshots (as stored, with their arms) rebuilt with more runs left out
    (`leave_out`: arm id -> run ids), unsaved: what the window would have said without them (the
    dashboard's verdict without outlier runs). The tick's path: the window's sums as it stored
    them, the run-level moments without those runs. One query (more where the window priced
    usage at its table)."""
    if not snapshots:
        return []
    first = snapshots[0]  # every snapshot of a window records the one table it compared at
    comparison = Comparison.of(
        table_id=first.pricing_table_id,
        valid_from=first.pricing_valid_from,
        cost_model=experiment.cost_model,
    )
    return _rebuild(
        window,
        {s.arm_id: s for s in snapshots},
        experiment,
        comparison,
        leave_out=leave_out,
        sums={s.arm_id: snapshot_sums(s) for s in snapshots},
    )


def snapshot_sums(snapshot: AttributionSnapshot) -> ArmSums:
    """The sums a snapshot was built from (snapshot_build's columns)."""
    return ArmSums(
        observations=snapshot.observations,
        runs=snapshot.runs,
        samples=snapshot.samples,
        cost=snapshot.cost_usd,
        tokens=snapshot.tokens,
        steps=snapshot.steps,
        gpu_seconds=snapshot.gpu_seconds,
        wall_s=snapshot.wall_s,
        energy_j=snapshot.energy_j,
        estimated=snapshot.energy_estimated,
        cost_sq=snapshot.cost_sq,
        cost_tokens=snapshot.cost_tokens,
        tokens_sq=snapshot.tokens_sq,
        cost_steps=snapshot.cost_steps,
        steps_sq=snapshot.steps_sq,
        compared=snapshot.compared_usd,
    )


def _rebuild(
    window: AttributionWindow,
    stored: dict[int, AttributionSnapshot],
    experiment: Experiment,
    comparison: Comparison,
    leave_out: dict[int, set[int]] | None = None,
    sums: dict[int, ArmSums] | None = None,
) -> list[AttributionSnapshot]:
    """The window's snapshots from its observations (or from `sums`), `leave_out`'s runs left out
    beside those the tick left out."""
    policy = policy_for(experiment)
    epochs = {pk: s.epoch_start for pk, s in stored.items()}
    if sums is None:
        sums = observations_sums(
            experiment_id=experiment.pk, upto_number=window.number, after_number=epochs
        )
    # the outlier runs the tick left out, as its snapshots recorded them
    excluded = {
        pk: s.evidence["excluded_runs"]
        for pk, s in stored.items()
        if (s.evidence or {}).get("excluded_runs")
    }
    left_out = {r["run"] for runs in excluded.values() for r in runs}
    left_out |= {run for runs in (leave_out or {}).values() for run in runs}
    moments = run_moments(
        epochs=epochs,
        upto_number={pk: window.number for pk in stored},
        comparisons=dict.fromkeys(stored, comparison),
        repriced={pk for pk, s in stored.items() if (s.evidence or {}).get("priced_from_usage")},
        exclude_runs=left_out,
    )
    inputs = [
        ArmInput(
            arm_id=pk,
            name=s.arm.name,
            is_control=s.arm.is_control,
            active=s.state == Arm.State.ACTIVE,
            weight=Decimal(s.weight),
            sums=sums.get(pk, ArmSums()).with_moments(
                moments.get(pk), runs_excluded=pk in excluded or bool((leave_out or {}).get(pk))
            ),
            # the quality the tick weighed, as its snapshot recorded it
            quality=QualitySums.from_json(((s.evidence or {}).get("quality") or {}).get("sums")),
        )
        for pk, s in sorted(stored.items())
    ]
    verdict = experiment_decide(inputs, policy)
    for pk, runs in excluded.items():
        verdict.arms[pk].evidence["excluded_runs"] = runs
    for pk, s in stored.items():
        if (s.evidence or {}).get("priced_from_usage"):
            verdict.arms[pk].evidence["priced_from_usage"] = True
    for pk, s in stored.items():  # the device class compared, as the tick recorded it
        verdict.arms[pk].evidence.update(
            {k: s.evidence[k] for k in CLASS_EVIDENCE if k in (s.evidence or {})}
        )
    reason = window.skip_reason or verdict.skip_reason
    return [
        snapshot_build(
            window=window,
            arm=a,
            verdict=verdict.arms[a.arm_id],
            policy=policy,
            epoch_start=stored[a.arm_id].epoch_start,
            skip_reason=reason,
            comparison=comparison,
        )
        for a in inputs
    ]
