"""Writes of attribution: the tick, freezes and unfreezes, traffic weights."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.attribution import selectors
from apps.attribution.decide.decisions import (
    ArmInput,
    ArmSums,
    ArmVerdict,
    ExperimentVerdict,
    experiment_decide,
)
from apps.attribution.decide.quality import QualitySums
from apps.attribution.evidence.comparison import Comparison
from apps.attribution.evidence.device_classes import ClassSplit, class_splits
from apps.attribution.evidence.moments import run_moments, window_sums
from apps.attribution.evidence.rollup import (
    cursors_advance,
    observations_record,
    windows_observations_count,
)
from apps.attribution.locks import lock_try
from apps.attribution.models import (
    AttributionSnapshot,
    AttributionWindow,
    FreezeEvent,
    RunWindow,
    WeightChange,
)
from apps.attribution.say.freeze_alerts import alerts_queue
from apps.attribution.say.snapshots import full_evidence, policy_for, snapshot_build
from apps.core.db import copy_instances, is_postgres
from apps.core.exceptions import ApplicationError
from apps.experiments.models import Arm, Experiment, Run
from apps.experiments.selectors import runs_outliers
from apps.experiments.services import run_cancel

logger = logging.getLogger("costlab.attribution")

TICK_LOCK = "attribution-tick"


@dataclass
class TickResult:
    ran: bool  # False: another tick held the lock, this one did nothing
    windows: int = 0
    observations: int = 0
    skipped: dict[int, str] = field(default_factory=dict)  # experiment id -> reason
    frozen: list[int] = field(default_factory=list)  # arm ids
    weight_changes: int = 0
    note: str = ""


@dataclass(frozen=True)
class _Freeze:
    arm_id: int
    window: AttributionWindow
    snapshot: AttributionSnapshot
    reason: str
    threshold: float
    evidence: dict


def attribution_tick(*, now: datetime | None = None) -> TickResult:
    """Attribute every due experiment: one window each, from the watermark to now,
    in one transaction.

    Single-flight: a tick that finds another running returns at once, and the next one finds
    nothing due that the first has covered. A fault in one experiment skips it with a reason.
    A fixed number of queries whatever the number of experiments, plus one savepoint per freeze.
    """
    now = now or timezone.now()
    with transaction.atomic():
        if not lock_try(TICK_LOCK):
            return TickResult(ran=False, note="another attribution tick holds the lock")
        due = selectors.experiments_due(now=now)
        # An experiment with no new data has nothing to attribute: no window, and the next one
        # still starts from its last watermark.
        moved = selectors.runs_moved(experiment_ids=due)
        experiments = selectors.experiments_load(ids=[pk for pk in due if pk in moved])
        if not experiments:
            return TickResult(ran=True, note="no experiment due with new data")
        comparisons = selectors.comparisons_at(experiments=experiments, at=now)
        windows = _windows_open(experiments, comparisons, now=now)
        window_ids = [w.pk for w in windows]
        previous = selectors.snapshot_sums(
            window_ids=[e.last_window_id for e in experiments if e.last_window_id]
        )
        arms_of = _arms_of(experiments)
        epochs, restarted = _epochs(experiments, arms_of, previous)

        recorded = observations_record(
            window_ids=window_ids,
            run_ids=sorted(run_id for e in experiments for run_id in moved[e.pk]),
            restarted_arm_ids=sorted(restarted),
        )
        result = TickResult(ran=True, windows=len(windows), observations=recorded)
        faults, splits = _runs_omit(experiments, window_ids, now=now)
        deltas, excluded, from_usage, moments, quality = _evidence_advance(
            experiments, windows, arms_of, epochs=epochs, comparisons=comparisons
        )
        snapshots, freezes, moves = [], [], []
        for experiment, window in zip(experiments, windows, strict=True):
            inputs = _arm_inputs(
                arms_of[experiment.pk],
                restarted=restarted,
                previous=previous,
                deltas=deltas,
                moments=moments,
                excluded=excluded,
                quality=quality,
            )
            s, f, m = _attribute(
                experiment,
                window,
                inputs,
                epochs,
                faults.get(experiment.pk, ("", []))[0],
                comparisons[experiment.pk],
                excluded=excluded,
                split=splits.get(experiment.pk),
                from_usage=experiment.pk in from_usage,
            )
            snapshots += s
            freezes += f
            moves += m
            if window.skip_reason:
                result.skipped[experiment.pk] = window.skip_reason

        _tick_save(result, windows, snapshots=snapshots, freezes=freezes, moves=moves)
    return result


def _windows_open(
    experiments: list[Experiment], comparisons: dict, *, now: datetime
) -> list[AttributionWindow]:
    """Each experiment's next window, from its last watermark to now (one bulk insert)."""
    return AttributionWindow.objects.bulk_create(
        [
            AttributionWindow(
                experiment=e,
                number=(e.last_number or 0) + 1,
                window_start=e.last_end,
                window_end=now,
                pricing_table_id=comparisons[e.pk].table_id,
            )
            for e in experiments
        ]
    )


def _arms_of(experiments: list[Experiment]) -> dict[int, list[Arm]]:
    """Experiment id -> its arms in primary-key order (one query)."""
    arms_of: dict[int, list[Arm]] = defaultdict(list)
    for arm in Arm.objects.filter(experiment_id__in=[e.pk for e in experiments]).order_by("pk"):
        arms_of[arm.experiment_id].append(arm)
    return arms_of


def _runs_omit(
    experiments: list[Experiment], window_ids: list[int], *, now: datetime
) -> tuple[dict, dict[int, ClassSplit]]:
    """Mark the windows' runs left out of comparison; return the pricing faults and class splits."""
    faults = selectors.pricing_faults(experiments=experiments, window_ids=window_ids, now=now)
    omitted = [run_id for _, run_ids in faults.values() for run_id in run_ids]
    # Runs on another device class than the reference's are counted, not compared.
    splits = class_splits(experiment_ids=[e.pk for e in experiments])
    omitted += [run_id for split in splits.values() for run_id in split.omitted_runs()]
    if omitted:
        RunWindow.objects.filter(window_id__in=window_ids, run_id__in=omitted).update(omitted=True)
    return faults, splits


def _evidence_advance(
    experiments: list[Experiment],
    windows: list[AttributionWindow],
    arms_of: dict,
    *,
    epochs: dict,
    comparisons: dict,
) -> tuple[dict, dict, set, dict, dict]:
    """Advance each arm's cursor to this window; read its sums, outliers, moments and quality."""
    window_ids = [w.pk for w in windows]
    upto_number = {
        arm.pk: w.number for e, w in zip(experiments, windows, strict=True) for arm in arms_of[e.pk]
    }
    cursors_advance(window_ids=window_ids, epochs=epochs, upto_number=upto_number)
    deltas = window_sums(window_ids=window_ids)
    excluded = _outliers_excluded(experiments)
    from_usage = selectors.experiments_priced_from_usage(
        experiments=experiments, comparisons=comparisons
    )
    moments = run_moments(
        epochs=epochs,
        from_cursors=True,
        exclude_runs={o.run_id for e in excluded.values() for o in e},
        upto_number=upto_number,
        comparisons={arm.pk: comparisons[e.pk] for e in experiments for arm in arms_of[e.pk]},
        repriced={arm.pk for e in experiments if e.pk in from_usage for arm in arms_of[e.pk]},
    )
    quality = selectors.quality_sums(experiment_ids=[e.pk for e in experiments])
    return deltas, excluded, from_usage, moments, quality


def _arm_inputs(
    arms: list[Arm],
    *,
    restarted: set[int],
    previous: dict,
    deltas: dict,
    moments: dict,
    excluded: dict,
    quality: dict,
) -> list[ArmInput]:
    """One experiment's arms as the decision reads them: the sums so far plus this window's."""
    return [
        ArmInput(
            arm_id=arm.pk,
            name=arm.name,
            is_control=arm.is_control,
            active=arm.state == Arm.State.ACTIVE,
            weight=arm.weight,
            sums=(
                (ArmSums() if arm.pk in restarted else previous.get(arm.pk, (ArmSums(), 0))[0])
                + deltas.get(arm.pk, ArmSums())
            ).with_moments(moments.get(arm.pk), runs_excluded=arm.pk in excluded),
            quality=quality.get(arm.pk, QualitySums()),
        )
        for arm in arms
    ]


def _tick_save(
    result: TickResult,
    windows: list[AttributionWindow],
    *,
    snapshots: list,
    freezes: list[_Freeze],
    moves: list,
) -> None:
    """Apply the tick's freezes, then write its snapshots, window counts, skips and weights."""
    result.frozen = [f.arm_id for f in freezes if _freeze_in_savepoint(f) is not None]
    copy_instances(AttributionSnapshot, snapshots)  # thousands of wide rows a tick
    windows_observations_count(window_ids=[w.pk for w in windows])
    skipped = [w for w in windows if w.status == AttributionWindow.Status.SKIPPED]
    if skipped:
        AttributionWindow.objects.bulk_update(skipped, ["status", "skip_reason"])
    result.weight_changes = weights_shift(moves=moves)


def _outliers_excluded(experiments: list[Experiment]) -> dict[int, list]:
    """Arm id -> its outlier runs to leave out, when COSTLAB_ATTRIBUTION_EXCLUDE_OUTLIERS is on
    (one query)."""
    if not settings.COSTLAB_ATTRIBUTION_EXCLUDE_OUTLIERS or not experiments:
        return {}
    by_arm: dict[int, list] = defaultdict(list)
    for outlier in runs_outliers(experiment_ids=[e.pk for e in experiments]).values():
        by_arm[outlier.arm_id].append(outlier)
    return {arm_id: sorted(found, key=lambda o: o.run_id) for arm_id, found in by_arm.items()}


def _epochs(
    experiments: list[Experiment], arms_of: dict, previous: dict
) -> tuple[dict[int, int], set[int]]:
    """Per arm, the window number its evidence counts after;
    and the arms unfrozen since the last window."""
    unfrozen_after = selectors.unfreeze_epochs(experiment_ids=[e.pk for e in experiments])
    epochs, restarted = {}, set()
    for experiment in experiments:
        for arm in arms_of[experiment.pk]:
            epochs[arm.pk] = previous.get(arm.pk, (None, 0))[1]
            if (
                unfrozen_after.get(arm.pk, 0) > epochs[arm.pk]
            ):  # its evidence starts over with this window
                epochs[arm.pk] = experiment.last_number or 0
                restarted.add(arm.pk)
    return epochs, restarted


def _attribute(
    experiment: Experiment,
    window: AttributionWindow,
    inputs: list[ArmInput],
    epochs: dict,
    fault: str,
    comparison: Comparison,
    excluded: dict | None = None,
    split: ClassSplit | None = None,
    from_usage: bool = False,
) -> tuple[list, list, list]:
    """One experiment's window: its snapshots, the freezes and weight moves it decides (unsaved).

    `excluded`: arm id -> outlier runs left out of its statistics, recorded in its evidence.
    `split`: the device class compared (its evidence names it) and the other classes' runs.
    """
    policy = policy_for(experiment)
    verdict = _decide(experiment, inputs, policy)
    for arm_id, outliers in (excluded or {}).items():
        if arm_id in verdict.arms:
            verdict.arms[arm_id].evidence["excluded_runs"] = [o.as_dict() for o in outliers]
    if split is not None:
        for arm_id, arm_verdict in verdict.arms.items():
            arm_verdict.evidence.update(split.evidence(arm_id))
    if from_usage:  # compared on usage priced at the window's table (a recompute does the same)
        for arm_verdict in verdict.arms.values():
            arm_verdict.evidence["priced_from_usage"] = True
    reason = fault or verdict.skip_reason
    if reason:
        window.status, window.skip_reason = AttributionWindow.Status.SKIPPED, reason
    snapshots, freezes = [], []
    for arm in inputs:
        arm_verdict = verdict.arms.get(arm.arm_id, ArmVerdict())
        snapshot = snapshot_build(
            window=window,
            arm=arm,
            verdict=arm_verdict,
            policy=policy,
            epoch_start=epochs[arm.arm_id],
            skip_reason=reason,
            comparison=comparison,
        )
        snapshots.append(snapshot)
        if arm_verdict.freeze and not reason:
            freezes.append(
                _Freeze(
                    arm.arm_id,
                    window,
                    snapshot,
                    _freeze_reason(arm, arm_verdict),
                    policy.threshold,
                    full_evidence(arm_verdict, window, epochs[arm.arm_id], comparison),
                )
            )
    moves = _weight_moves(inputs, verdict, window) if not reason and verdict.weights else []
    return snapshots, freezes, moves


def _decide(experiment: Experiment, inputs: list[ArmInput], policy) -> ExperimentVerdict:
    try:
        return experiment_decide(inputs, policy)
    except Exception as exc:  # one experiment's bad data must not stop the others
        logger.exception("attribution of experiment %s failed", experiment.pk)
        return ExperimentVerdict(skip_reason=f"error: {type(exc).__name__}: {exc}"[:1000])


def _freeze_reason(arm: ArmInput, verdict: ArmVerdict) -> str:
    dev, control = verdict.deviation, verdict.evidence.get("control", {})
    if verdict.evidence.get("frozen_for") == "quality":
        q = verdict.quality
        what = "held-out loss" if q.metric == "eval_loss" else q.metric
        return (
            f"quality: {what} {q.change:+.2%} worse than control '{control.get('name')}' "
            f"(always-valid lower bound {q.change_low:+.2%}) beyond the quality margin "
            f"{q.margin:.2%}, over {q.runs} and {q.control_runs} evaluated runs"
        )
    return (
        f"cost deviation {dev.estimate:+.2%} vs control '{control.get('name')}' "
        f"(always-valid lower bound {dev.low:+.2%}) "
        f"above the threshold {verdict.evidence['threshold']:.2%}, "
        f"over {arm.sums.runs} runs and {arm.sums.samples} samples"
        + (
            f" on {verdict.evidence['device_class_label']}"
            if verdict.evidence.get("device_class")
            else ""
        )
    )


def _freeze_in_savepoint(f: _Freeze) -> FreezeEvent | None:
    try:
        with transaction.atomic():
            return arm_freeze(
                arm_id=f.arm_id,
                window=f.window,
                reason=f.reason,
                threshold=f.threshold,
                deviation=f.snapshot.deviation,
                deviation_low=f.snapshot.deviation_low,
                evidence=f.evidence,
            )
    except Exception as exc:
        logger.exception("freezing arm %s failed", f.arm_id)
        f.snapshot.evidence.update(
            decision="freeze_failed", error=f"{type(exc).__name__}: {exc}"[:500]
        )
        return None


def arm_freeze(
    *,
    arm_id: int,
    reason: str,
    evidence: dict,
    window: AttributionWindow | None = None,
    deviation: float | None = None,
    deviation_low: float | None = None,
    threshold: float | None = None,
    actor=None,
) -> FreezeEvent | None:
    """Freeze an arm: no new runs, weight 0 (recorded), running runs cancelled if the policy says
    so, the evidence stored, alerts queued for after the commit. None when it was frozen already.
    `actor`: the user of a manual freeze, kept on the event and the weight change (None: the
    attribution tick's own)."""
    with transaction.atomic():
        arm = (
            Arm.objects.select_for_update()
            .select_related("experiment__tenant")
            .filter(pk=arm_id)
            .first()
        )
        if arm is None or arm.state == Arm.State.FROZEN:
            return None
        experiment, old_weight = arm.experiment, arm.weight
        arm.state, arm.weight = Arm.State.FROZEN, Decimal(0)
        arm.save(update_fields=["state", "weight", "updated_at"])
        WeightChange.objects.create(
            arm=arm,
            kind=WeightChange.Kind.FREEZE,
            window=window,
            old_weight=old_weight,
            new_weight=Decimal(0),
            reason=f"freeze: {reason}"[:255],
            actor=actor,
        )
        cancelled = []
        if experiment.freeze_policy == Experiment.FreezePolicy.CANCEL:
            for run in Run.objects.filter(arm=arm, status__in=Run.ACTIVE_STATUSES).order_by("pk"):
                try:
                    run_cancel(run=run)
                    cancelled.append(run.pk)
                except ApplicationError:  # it ended meanwhile: nothing to cancel
                    continue
        event = FreezeEvent.objects.create(
            experiment=experiment,
            arm=arm,
            action=FreezeEvent.Action.FREEZE,
            reason=reason,
            actor=actor,
            window=window,
            deviation=deviation,
            deviation_low=deviation_low,
            threshold=threshold,
            evidence={
                **evidence,
                "cancelled_runs": cancelled,
                "freeze_policy": experiment.freeze_policy,
                "weight_before": str(old_weight),
            },
        )
        alerts_queue(event=event)
    return event


def weight_change_record(sender, *, arm: Arm, old: Decimal, new: Decimal, actor, **kwargs) -> None:
    """Receiver of apps.experiments.services.arm_weight_changed: a weight set by hand (API,
    admin, editor) is audited with who set it, like the tick's own changes."""
    WeightChange.objects.create(
        arm=arm,
        kind=WeightChange.Kind.MANUAL,
        actor=actor if getattr(actor, "pk", None) else None,
        old_weight=old,
        new_weight=new,
        reason=f"set by {actor.get_username()}" if getattr(actor, "pk", None) else "set by hand",
    )


@transaction.atomic
def arm_unfreeze(*, arm: Arm, actor, reason: str, weight: Decimal | None = None) -> FreezeEvent:
    """Staff give a frozen arm traffic again, saying why; audited, alerted,
    and its evidence starts over."""
    reason = (reason or "").strip()
    if not reason:
        raise ApplicationError(
            "reason: say why the arm is unfrozen; the reason is kept for audit",
            {"fields": {"reason": ["This field is required."]}},
            code="invalid",
        )
    if actor is None or not getattr(actor, "is_staff", False):
        raise ApplicationError("actor: only staff can unfreeze an arm", code="permission_denied")
    arm = Arm.objects.select_for_update().select_related("experiment__tenant").get(pk=arm.pk)
    if arm.state != Arm.State.FROZEN:
        raise ApplicationError(f"state: arm '{arm.name}' is not frozen", code="not_frozen")
    if weight is None:
        frozen_at = (
            WeightChange.objects.filter(arm=arm, kind=WeightChange.Kind.FREEZE)
            .order_by("-pk")
            .first()
        )
        weight = frozen_at.old_weight if frozen_at and frozen_at.old_weight > 0 else Decimal(1)
    elif weight < 0:
        raise ApplicationError(
            "weight: must be >= 0", {"fields": {"weight": ["Must be >= 0."]}}, code="invalid"
        )
    latest = (
        AttributionWindow.objects.filter(experiment_id=arm.experiment_id)
        .order_by("-number")
        .first()
    )
    arm.state, arm.weight = Arm.State.ACTIVE, weight
    arm.save(update_fields=["state", "weight", "updated_at"])
    WeightChange.objects.create(
        arm=arm,
        kind=WeightChange.Kind.UNFREEZE,
        actor=actor,
        window=latest,
        old_weight=Decimal(0),
        new_weight=weight,
        reason=f"unfreeze: {reason}"[:255],
    )
    event = FreezeEvent.objects.create(
        experiment=arm.experiment,
        arm=arm,
        action=FreezeEvent.Action.UNFREEZE,
        reason=reason,
        actor=actor,
        window=latest,
        evidence={
            "weight_restored": str(weight),
            "evidence_restarts_after_window": latest.number if latest else 0,
        },
    )
    alerts_queue(event=event)
    return event


@dataclass(frozen=True)
class WeightMove:
    arm_id: int
    old: Decimal
    new: Decimal
    window: AttributionWindow
    reason: str


def _weight_moves(
    inputs: list[ArmInput], verdict: ExperimentVerdict, window: AttributionWindow
) -> list[WeightMove]:
    return [
        WeightMove(
            a.arm_id,
            a.weight,
            verdict.weights[a.arm_id][0],
            window,
            f"{verdict.weights[a.arm_id][1]} (window {window.number})",
        )
        for a in inputs
        if a.arm_id in verdict.weights
    ]


def weights_shift(*, moves: list[WeightMove]) -> int:
    """Apply dynamic weight moves; an arm frozen or re-weighted since the tick read it
    is left alone."""
    if not moves:
        return 0
    locked = dict(
        Arm.objects.select_for_update()
        .filter(pk__in=[m.arm_id for m in moves], state=Arm.State.ACTIVE)
        .order_by("pk")
        .values_list("pk", "weight")
    )
    applied = [m for m in moves if locked.get(m.arm_id) == m.old]
    now = timezone.now()
    table = Arm._meta.db_table
    with connection.cursor() as cursor:
        if is_postgres():  # one statement for every arm (bulk_update's CASE costs more to build)
            cursor.execute(
                f"UPDATE {table} SET weight = v.weight, updated_at = %s "
                "FROM unnest(%s::bigint[], %s::numeric[]) AS v(id, weight) "
                f"WHERE {table}.id = v.id",
                [now, [m.arm_id for m in applied], [m.new for m in applied]],
            )
        else:  # one statement per arm, in one round trip
            cursor.executemany(
                f"UPDATE {table} SET weight = %s, updated_at = %s WHERE id = %s",
                [(m.new, now, m.arm_id) for m in applied],
            )
    copy_instances(
        WeightChange,
        [
            WeightChange(
                arm_id=m.arm_id,
                kind=WeightChange.Kind.DYNAMIC,
                window=m.window,
                old_weight=m.old,
                new_weight=m.new,
                reason=m.reason[:255],
            )
            for m in applied
        ],
    )
    return len(applied)
