"""The answer at a glance: each arm's verdict against the control, in words, on the experiment page
and in the experiments list.

The verdict itself is attribution's (apps.attribution.decide.verdict, the API's, the CLI's and the
freeze rule's); this module only says it: per unit of work (USD per 1M tokens, or per step), in the
one convention of dashboard_format.difference ("28 % cheaper, 95 % sure it is 9.6–47 % cheaper"),
bounds clipped to what a cost can be (never more than 100 % cheaper), what evidence is missing,
why a deviation beyond the threshold froze nothing, when an arm was frozen, the arm's held-out
quality beside its cost (apps.dashboard.quality: "18 % cheaper per 1M tokens, but its held-out
loss is 4.9 % worse"; "not measured" said, never left out), its carbon, and the outlier runs it
counted with the verdict without them. The page and the list say the verdict of the latest
attribution window, from one function (experiments_verdicts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from django.db.models import OuterRef, Subquery
from django.utils import timezone

from apps.attribution.models import AttributionSnapshot, AttributionWindow, FreezeEvent
from apps.attribution.reads import Minimums, Said, arms_verdicts
from apps.dashboard.quality import QualitySaid, quality_said
from apps.dashboard.templatetags.dashboard_format import (
    confidence,
    difference,
    percent,
    significant,
)
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
    "unpriced": "not compared: usage billed with no price",
    "cheaper_but_worse": "cheaper but worse",
    "worse": "worse",
}
# Verdicts whose quality is part of the sentence ("..., but its held-out loss is 4.9 % worse").
QUALITY_IN_SENTENCE = ("cheaper_but_worse", "worse")


@dataclass(frozen=True)
class Verdict:
    """One arm against the control, ready to be said."""

    arm_id: int
    arm: str
    control: str
    verdict: str  # apps.attribution.decide.verdict.VERDICTS
    status: str  # conclusive | inconclusive | within the threshold | frozen | no verdict yet
    amount: str  # "31 % cheaper", "12 % dearer" ("" without a deviation)
    per: str  # "per 1M tokens"
    bound: str  # "95 % sure it is 24–38 % cheaper" ("" without bounds)
    bound_compact: str  # "24–38 %": the amount's word said once (the list's cell)
    low: float | None  # the bounds, clipped to the possible range
    high: float | None
    detail: str  # what is missing, or why it was frozen
    not_frozen: str  # beyond the threshold yet active: why, in one line ("" otherwise)
    runs_needed: int | None  # inconclusive: about this many more runs per arm
    frozen_at: datetime | None
    quality: QualitySaid | None = None  # held-out quality against the control's
    quality_joint: str = ""  # "but" / "and": the quality is said in the sentence (else a line)
    outliers: str = ""  # the outlier runs it weighed, and the verdict without them
    outliers_left_out: bool = False  # the window left outlier runs of the arm or the control out

    @property
    def conclusive(self) -> bool:
        return self.status == "conclusive"

    @property
    def than(self) -> str:
        """'28 % cheaper … than the control', 'as costly … as the control'."""
        return "as" if self.amount.startswith("as ") else "than"


def clip_low(low: float | None) -> float | None:
    return None if low is None else max(low, DEVIATION_FLOOR)


def sure_it_is(sure: str, interval: str) -> str:
    """An interval as a reader weighs it: '95 % sure it is 9.6–47 % cheaper'."""
    return f"{sure} sure it is {interval}" if interval else ""


def _held_back(sure: str):
    """The freeze rule's bound (apps.attribution.decide.freeze_rule, handed over by freeze_holds)
    in the card's words: what a freeze needs of the interval (said on the line above)."""

    def words(low: float | None, high: float | None, threshold: float) -> str:
        if low is None or high is None:
            return f"no {sure} interval yet (each arm needs 2 priced runs in a window)"
        return f"a freeze needs all of the {sure} interval beyond {percent(threshold)} dearer"

    return words


def runs_needed(
    *,
    deviation: float | None,
    low: float | None,
    high: float | None,
    runs: int,
    threshold: float,
    min_runs: int,
) -> int:
    """About how many more runs per arm until the bound clears the threshold (or, for a deviation
    inside it, until the bound lies inside it), if the spread between runs stays as it is (the
    bound narrows about as 1/sqrt(runs)); at least what the minimums still ask."""
    need = max(0, min_runs - runs)
    if deviation is not None and low is not None and high is not None and runs > 0:
        half, margin = (high - low) / 2, abs(abs(deviation) - threshold)
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


@dataclass(frozen=True)
class Freeze:
    """An arm's latest freeze, as the card says it (a FreezeEvent, or these fields of one)."""

    created_at: datetime
    reason: str
    deviation: float | None


def _latest_freeze(field: str) -> Subquery:
    """The arm's latest freeze event's `field`, annotated on its snapshot (no query of its own)."""
    return Subquery(
        FreezeEvent.objects.filter(arm=OuterRef("arm"), action=FreezeEvent.Action.FREEZE)
        .order_by("-created_at", "-pk")
        .values(field)[:1]
    )


def _no_data(arm, control) -> str:
    """What a verdict with no deviation waits for, from what the latest window counted."""
    missing = [
        name for a, name in ((arm, "this arm"), (control, "the control")) if not a.evidence_runs
    ]
    if missing:
        return (
            f"needs a priced run of {' and of '.join(missing)} in an attribution window: "
            "no cost is compared yet"
        )
    return (
        f"no cost per unit of work to compare yet: the runs counted ({arm.evidence_runs} of "
        f"{arm.name}, {control.evidence_runs} of {control.name}) report no priced tokens"
    )


def _say(
    *,
    arm,
    said: Said,
    control,
    threshold: float,
    minimums: Minimums,
    metric: str,
    freeze: Freeze | FreezeEvent | None,
    skipped: str,
    now: datetime,
    sure: str,
) -> Verdict:
    verdict = said.verdict
    low, high = clip_low(arm.deviation_low), arm.deviation_high
    deviation, detail, needed, frozen_at = arm.deviation, "", None, None
    threshold_text = f"±{significant(threshold * 100, 2)} %"
    frozen = verdict == "frozen" or (verdict == "cheaper_but_worse" and arm.state == "frozen")
    if frozen and freeze is not None:
        frozen_at, deviation = (
            freeze.created_at,
            freeze.deviation if freeze.deviation is not None else deviation,
        )
        detail = freeze.reason
    if verdict == "frozen":
        status = f"frozen at {_when(frozen_at, now)}" if frozen_at else "frozen"
    elif verdict in QUALITY_IN_SENTENCE:
        # never given more traffic (apps.attribution.decide.decisions)
        if frozen:
            at = f" at {_when(frozen_at, now)}" if frozen_at else ""
            status = f"{STATUS[verdict]}, frozen{at} (it gets no traffic)"
        else:
            status = f"{STATUS[verdict]} (it gets no more traffic)"
    elif verdict == "no_data":
        status = STATUS[verdict]
        detail = _no_data(arm, control)
    elif verdict == "inconclusive":
        status = STATUS[verdict]
        runs, control_runs = arm.evidence_runs, control.evidence_runs
        needed = runs_needed(
            deviation=arm.deviation,
            low=arm.deviation_low,
            high=arm.deviation_high,
            runs=min(runs, control_runs),
            threshold=threshold,
            min_runs=minimums.runs_needed,
        )
        detail = (
            f"needs about {needed} more run{'s' if needed != 1 else ''} per arm, if the "
            f"spread between runs stays as it is (evidence so far: {runs} "
            f"run{'s' if runs != 1 else ''} of {arm.name}, {control_runs} of {control.name})"
        )
        if low is None:
            detail += f"; a {sure} interval needs 2 priced runs of each arm in a window"
    elif verdict == "within_threshold":
        status = f"within the {threshold_text} threshold"
    else:
        status = STATUS[verdict]
    not_frozen = ""
    if frozen or verdict in QUALITY_IN_SENTENCE:  # its status says where its traffic stands
        pass
    elif skipped and deviation is not None and abs(deviation) > threshold:
        not_frozen = f"not frozen: the latest attribution window was skipped ({skipped})"
    elif said.not_frozen:
        not_frozen = "not frozen: " + "; ".join(said.not_frozen)
    elif verdict == "costlier":  # the rule would freeze it: the window that decides is next
        not_frozen = "not frozen yet: the next attribution window (on new data) decides"
    said_cost = difference(deviation, low, high)
    return Verdict(
        arm_id=arm.arm_id,
        arm=arm.name,
        control=control.name,
        verdict=verdict,
        status=status,
        amount=said_cost.amount,
        per=PER_UNIT.get(metric, ""),
        bound=sure_it_is(sure, said_cost.interval),
        bound_compact=said_cost.compact,
        low=low,
        high=high,
        detail=detail,
        not_frozen=not_frozen,
        runs_needed=needed,
        frozen_at=frozen_at,
        quality=quality_said(getattr(arm, "quality", None), sure=sure),
        quality_joint=(
            ""
            if verdict not in QUALITY_IN_SENTENCE
            else "but"
            if deviation is not None and deviation < 0
            else "and"
        ),
    )


@dataclass(frozen=True)
class WindowArm:
    """One arm at the latest attribution window, as the verdict weighs it
    (apps.attribution.decide.verdict.Compared), with its name and metric."""

    arm_id: int
    name: str
    is_control: bool
    state: str
    deviation: float | None
    deviation_low: float | None
    deviation_high: float | None
    evidence_runs: int
    evidence_samples: int
    metric: str = "usd_per_mtok"
    quality: dict | None = None  # the window's quality verdict (apps.attribution.decide.quality)


def arms_said(
    *,
    experiment: Experiment,
    arms: list,
    freezes: dict[int, Freeze | FreezeEvent] | None = None,
    skipped: str = "",
    now: datetime | None = None,
) -> list[Verdict]:
    """Each non-control arm against the control (arms: WindowArm or ArmReport rows, the control
    among them), in words: the one function behind the experiment page and the list."""
    now = now or timezone.now()
    control = next((a for a in arms if a.is_control), None)
    if control is None:
        return []
    threshold, minimums = float(experiment.freeze_threshold), Minimums.of(experiment)
    sure = confidence(experiment.alpha)
    said = arms_verdicts(arms, threshold=threshold, minimums=minimums, bound_words=_held_back(sure))
    return [
        _say(
            arm=a,
            said=said[a.arm_id],
            control=control,
            threshold=threshold,
            minimums=minimums,
            metric=a.metric,
            freeze=(freezes or {}).get(a.arm_id),
            skipped=skipped,
            now=now,
            sure=sure,
        )
        for a in arms
        if not a.is_control
    ]


def _compared(rows: list[AttributionSnapshot]) -> list[WindowArm]:
    """The window's snapshots as the verdict weighs them. A window with under 2 runs per arm has
    no deviation estimate of its own: the point deviation is then its figures' ratio, so a verdict
    has an amount as soon as both arms have a priced run."""
    control = next((s for s in rows if s.arm.is_control), None)
    base = control.metric_value if control is not None else None
    out = []
    for s in rows:
        deviation = s.deviation
        if s.arm.is_control:
            deviation = 0.0 if base else None
        elif deviation is None and s.metric_value is not None and base:
            deviation = s.metric_value / base - 1.0
        out.append(
            WindowArm(
                arm_id=s.arm_id,
                name=s.arm.name,
                is_control=s.arm.is_control,
                state=s.arm.state,
                deviation=deviation,
                deviation_low=s.deviation_low,
                deviation_high=s.deviation_high,
                evidence_runs=s.runs,
                evidence_samples=s.samples,
                metric=s.metric,
                quality=_quality_of(s),
            )
        )
    return out


def _quality_of(snapshot: AttributionSnapshot) -> dict | None:
    """The quality verdict the window recorded (its sufficient statistics left out)."""
    q = (snapshot.evidence or {}).get("quality")
    return {k: v for k, v in q.items() if k != "sums"} if q else None


def latest_snapshots(
    *, experiments: list[Experiment]
) -> tuple[dict[int, list[AttributionSnapshot]], dict[int, Freeze]]:
    """Per experiment, the snapshots of its latest attribution window (with their arms and the
    window, the control first), and the frozen arms' latest freezes. One query."""
    ids = [e.pk for e in experiments]
    latest = (
        AttributionWindow.objects.filter(experiment=OuterRef("experiment"))
        .order_by("-number")
        .values("pk")[:1]
    )
    snapshots = (
        AttributionSnapshot.objects.filter(experiment_id__in=ids, window_id=Subquery(latest))
        .select_related("arm", "window")
        .annotate(
            freeze_at=_latest_freeze("created_at"),
            freeze_reason=_latest_freeze("reason"),
            freeze_deviation=_latest_freeze("deviation"),
        )
        .order_by("experiment_id", "-arm__is_control", "arm__name")
    )
    by_experiment: dict[int, list[AttributionSnapshot]] = {}
    for s in snapshots:
        by_experiment.setdefault(s.experiment_id, []).append(s)
    freezes = {
        s.arm_id: Freeze(s.freeze_at, s.freeze_reason, s.freeze_deviation)
        for s in snapshots
        if s.arm.state == Arm.State.FROZEN and s.freeze_at is not None
    }
    return by_experiment, freezes


def snapshots_said(
    *,
    experiment: Experiment,
    rows: list[AttributionSnapshot],
    freezes: dict[int, Freeze] | None = None,
    now: datetime | None = None,
) -> list[Verdict]:
    """The verdicts of one window's snapshots (latest_snapshots' rows, or rebuilt ones)."""
    window = rows[0].window if rows else None
    skipped = (
        window.skip_reason
        if window is not None and window.status == AttributionWindow.Status.SKIPPED
        else ""
    )
    return arms_said(
        experiment=experiment, arms=_compared(rows), freezes=freezes, skipped=skipped, now=now
    )


def experiments_verdicts(
    *, experiments: list[Experiment], now: datetime | None = None
) -> dict[int, list[Verdict]]:
    """Per experiment, each non-control arm's verdict at its latest attribution window: the list's
    column and the experiment page's card alike. One query, whatever the number."""
    now = now or timezone.now()
    by_experiment, freezes = latest_snapshots(experiments=experiments)
    return {
        e.pk: snapshots_said(
            experiment=e, rows=by_experiment.get(e.pk, []), freezes=freezes, now=now
        )
        for e in experiments
    }


def experiment_verdicts(*, experiment: Experiment, now: datetime | None = None) -> list[Verdict]:
    """The experiment page's verdict card: the list's verdicts of this one experiment (the card
    adds its outlier and carbon lines: apps.dashboard.verdict_card)."""
    return experiments_verdicts(experiments=[experiment], now=now)[experiment.pk]
