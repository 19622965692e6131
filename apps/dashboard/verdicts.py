"""The answer at a glance: each arm's verdict against the control, in words, on the experiment page
and in the experiments list.

The verdict itself is attribution's (apps.attribution.verdict.arm_verdict, the API's and the CLI's
too); this module only says it: per unit of work (USD per 1M tokens, or per step), bounds clipped to
what a cost can be (never below -100 %), what evidence is missing, when an arm was frozen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from apps.attribution.models import AttributionSnapshot, AttributionWindow, FreezeEvent
from apps.attribution.report import ExperimentReport
from apps.attribution.verdict import arm_verdict
from apps.dashboard.templatetags.dashboard_format import significant
from apps.experiments.models import Arm, Experiment

# A cost is never negative: an arm is at most 100 % cheaper than the control.
DEVIATION_FLOOR = -1.0
PER_UNIT = {"usd_per_mtok": "per 1M tokens", "usd_per_step": "per step"}
STATUS = {
    "cheaper": "conclusive",
    "costlier": "conclusive",
    "within_threshold": "within the threshold",
    "inconclusive": "inconclusive",
    "frozen": "frozen",
    "no_data": "no verdict yet",
}


@dataclass(frozen=True)
class Verdict:
    """One arm against the control, ready to be said."""

    arm_id: int
    arm: str
    control: str
    verdict: str  # apps.attribution.verdict.VERDICTS
    status: str  # conclusive | inconclusive | within the threshold | frozen | no verdict yet
    amount: str  # "31 % cheaper", "12 % dearer" ("" without a deviation)
    per: str  # "per 1M tokens"
    bound: str  # "always-valid bound 24–38 %" ("" without bounds)
    low: float | None  # the bounds, clipped to the possible range
    high: float | None
    detail: str  # what is missing, or why it was frozen
    runs_needed: int | None  # inconclusive: about this many more runs per arm
    frozen_at: datetime | None

    @property
    def conclusive(self) -> bool:
        return self.status == "conclusive"


def clip_low(low: float | None) -> float | None:
    return None if low is None else max(low, DEVIATION_FLOOR)


def _pct(fraction: float) -> str:
    return f"{significant(abs(fraction) * 100, 2)} %"


def _amount(deviation: float | None) -> str:
    if deviation is None:
        return ""
    if abs(deviation) < 0.0005:
        return "as costly"
    return f"{_pct(deviation)} {'cheaper' if deviation < 0 else 'dearer'}"


def _signed(fraction: float) -> str:
    text = _pct(fraction)
    return f"+{text}" if fraction > 0 else f"−{text}" if fraction < 0 else text


def _bound(verdict: str, low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return ""
    if verdict in ("cheaper", "costlier"):  # one side of zero: magnitudes, as the amount reads
        a, b = sorted((abs(low), abs(high)))
        return f"always-valid bound {significant(a * 100, 2)}–{significant(b * 100, 2)} %"
    return f"always-valid bound {_signed(low)} to {_signed(high)}"


def runs_needed(
    *,
    deviation: float | None,
    low: float | None,
    high: float | None,
    runs: int,
    threshold: float,
    min_runs: int,
) -> int:
    """About how many more runs per arm until the bound clears the threshold, if the spread between
    runs stays as it is (the bound narrows about as 1/sqrt(runs)); at least what the minimums still
    ask."""
    need = max(0, min_runs - runs)
    if deviation is not None and low is not None and high is not None and runs > 0:
        half, margin = (high - low) / 2, abs(deviation) - threshold
        if margin > 0 and half > 0:
            need = max(need, math.ceil(runs * (half / margin) ** 2) - runs)
    return max(need, 1)


def _when(at: datetime, now: datetime) -> str:
    local = timezone.localtime(at)
    return (
        f"{local:%H:%M}"
        if local.date() == timezone.localtime(now).date()
        else f"{local:%Y-%m-%d %H:%M}"
    )


def _latest_freezes(experiment_ids: list[int]) -> dict[int, FreezeEvent]:
    """Per arm, its latest freeze event (of these experiments). One query."""
    events = FreezeEvent.objects.filter(
        experiment_id__in=experiment_ids, action=FreezeEvent.Action.FREEZE
    ).order_by("created_at", "pk")
    return {e.arm_id: e for e in events}  # the latest of each arm wins


def _say(
    *,
    arm,
    control_name: str,
    threshold: float,
    metric: str,
    runs: int | None,
    control_runs: int | None,
    min_runs: int,
    freeze: FreezeEvent | None,
    now: datetime,
) -> Verdict:
    verdict = arm_verdict(arm, threshold=threshold)
    low, high = clip_low(arm.deviation_low), arm.deviation_high
    deviation, detail, needed, frozen_at = arm.deviation, "", None, None
    threshold_text = f"±{significant(threshold * 100, 2)} %"
    if verdict == "frozen":
        if freeze is not None:
            frozen_at, deviation = (
                freeze.created_at,
                freeze.deviation if freeze.deviation is not None else deviation,
            )
            detail = freeze.reason
        status = f"frozen at {_when(frozen_at, now)}" if frozen_at else "frozen"
    elif verdict == "no_data":
        status = STATUS[verdict]
        detail = "needs priced runs of this arm and of the control"
    elif verdict == "inconclusive":
        status = STATUS[verdict]
        if runs is not None and control_runs is not None:
            needed = runs_needed(
                deviation=arm.deviation,
                low=arm.deviation_low,
                high=arm.deviation_high,
                runs=min(runs, control_runs),
                threshold=threshold,
                min_runs=min_runs,
            )
            detail = (
                f"needs about {needed} more run{'s' if needed != 1 else ''} per arm, if the "
                f"spread between runs stays as it is (evidence so far: {runs} "
                f"run{'s' if runs != 1 else ''} of {arm.name}, {control_runs} of {control_name})"
            )
        if low is None:
            detail = (detail + "; " if detail else "") + "bounds after the next attribution"
    elif verdict == "within_threshold":
        status = f"within the {threshold_text} threshold"
        if low is not None and high is not None and (low < -threshold or high > threshold):
            detail = f"the bound still reaches beyond {threshold_text}: more runs would settle it"
    else:
        status = STATUS[verdict]
    return Verdict(
        arm_id=arm.arm_id,
        arm=arm.name,
        control=control_name,
        verdict=verdict,
        status=status,
        amount=_amount(deviation),
        per=PER_UNIT.get(metric, ""),
        bound=_bound(verdict, low, high),
        low=low,
        high=high,
        detail=detail,
        runs_needed=needed,
        frozen_at=frozen_at,
    )


def _min_runs(experiment: Experiment) -> int:
    """Runs per arm before a freeze may be decided: the experiment's minimum, and the confidence
    sequence's."""
    return max(experiment.min_runs_per_arm, settings.COSTLAB_CS_MIN_RUNS)


def experiment_verdicts(
    *, experiment: Experiment, report: ExperimentReport, now: datetime | None = None
) -> list[Verdict]:
    """Each non-control arm of the report against its control. One query (the freezes)."""
    now = now or timezone.now()
    control = next((a for a in report.arms if a.is_control), None)
    if control is None:
        return []
    freezes = (
        _latest_freezes([experiment.pk])
        if any(a.state == Arm.State.FROZEN for a in report.arms)
        else {}
    )
    out = []
    for arm in report.arms:
        if arm.is_control:
            continue
        out.append(
            _say(
                arm=arm,
                control_name=control.name,
                threshold=float(experiment.freeze_threshold),
                metric=arm.metric,
                runs=arm.runs,
                control_runs=control.runs,
                min_runs=_min_runs(experiment),
                freeze=freezes.get(arm.arm_id),
                now=now,
            )
        )
    return out


@dataclass(frozen=True)
class _Compared:
    arm_id: int
    name: str
    is_control: bool
    state: str
    deviation: float | None
    deviation_low: float | None
    deviation_high: float | None


def experiments_verdicts(
    *, experiments: list[Experiment], now: datetime | None = None
) -> dict[int, list[Verdict]]:
    """Per experiment, each non-control arm's verdict at its latest attribution window (the list's
    column; the experiment page adds what was measured since). Two queries, whatever the number."""
    now = now or timezone.now()
    ids = [e.pk for e in experiments]
    latest = (
        AttributionWindow.objects.filter(experiment=OuterRef("experiment"))
        .order_by("-number")
        .values("pk")[:1]
    )
    snapshots = (
        AttributionSnapshot.objects.filter(experiment_id__in=ids, window_id=Subquery(latest))
        .select_related("arm")
        .order_by("experiment_id", "-arm__is_control", "arm__name")
    )
    by_experiment: dict[int, list[AttributionSnapshot]] = {}
    for s in snapshots:
        by_experiment.setdefault(s.experiment_id, []).append(s)
    freezes = _latest_freezes(ids)
    out = {}
    for e in experiments:
        rows = by_experiment.get(e.pk, [])
        control = next((s for s in rows if s.arm.is_control), None)
        if control is None:
            out[e.pk] = []
            continue
        out[e.pk] = [
            _say(
                arm=_Compared(
                    s.arm_id,
                    s.arm.name,
                    False,
                    s.arm.state,
                    s.deviation,
                    s.deviation_low,
                    s.deviation_high,
                ),
                control_name=control.arm.name,
                threshold=float(e.freeze_threshold),
                metric=s.metric,
                runs=s.runs,
                control_runs=control.runs,
                min_runs=_min_runs(e),
                freeze=freezes.get(s.arm_id),
                now=now,
            )
            for s in rows
            if not s.arm.is_control
        ]
    return out
