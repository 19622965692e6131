"""Quality beside cost: is an arm's model as good as the control's? Pure functions, no Django.

The unit is the run, as for cost (apps.attribution.decide.stats): each finished run's last held-out
evaluation of the experiment's metric (eval_loss unless it names another) is one observation.
An arm's quality is their mean; its relative change from the control's mean, signed so that a
positive change is worse (a higher loss, a lower accuracy), gets the same always-valid bound as
cost, from the delta method on the two means:

    worse         the bound's lower end is above +margin: worse beyond the margin, proven
    better        the bound's upper end is below -margin
    non_inferior  the upper end is at most +margin: at most `margin` worse, proven
    inconclusive  anything else, or fewer runs than the experiment's minimums
    not_measured  the arm or the control has no evaluated run: said, never taken as equal

tests/apps/attribution/test_quality.py holds false `worse` verdicts of A/A arms to alpha.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from apps.attribution.decide import stats

QUALITY_VERDICTS = ("not_measured", "non_inferior", "better", "worse", "inconclusive")


@dataclass(frozen=True)
class QualitySums:
    """Sufficient statistics of an arm's runs' final values of the metric."""

    runs: int = 0
    total: float = 0.0
    total_sq: float = 0.0

    @classmethod
    def of(cls, values) -> QualitySums:
        values = [float(v) for v in values]
        return cls(len(values), math.fsum(values), math.fsum(v * v for v in values))

    @classmethod
    def from_json(cls, data: dict | None) -> QualitySums:
        if not data:
            return cls()
        return cls(int(data["runs"]), float(data["total"]), float(data["total_sq"]))

    def as_json(self) -> dict:
        return asdict(self)

    @property
    def mean(self) -> float | None:
        return self.total / self.runs if self.runs else None

    def estimate(self) -> stats.RatioEstimate | None:
        """The mean and the variance of the mean (None without 2 runs)."""
        if self.runs < 2:
            return None
        mean = self.total / self.runs
        ss = max(self.total_sq - self.runs * mean * mean, 0.0)
        return stats.RatioEstimate(mean, ss / (self.runs - 1) / self.runs, self.runs)


@dataclass(frozen=True)
class QualityRule:
    metric: str = "eval_loss"
    higher_is_better: bool = False
    margin: float = 0.01
    alpha: float = 0.05
    r2: float = 1.0
    min_runs: int = 2  # per side, before anything but not_measured / inconclusive is said

    @property
    def direction(self) -> str:
        return "higher" if self.higher_is_better else "lower"


@dataclass(frozen=True)
class QualityVerdict:
    verdict: str  # one of QUALITY_VERDICTS
    metric: str
    direction: str  # "lower" or "higher" is better
    margin: float
    value: float | None  # the arm's mean final value
    control_value: float | None
    change: float | None  # relative, positive = worse (0.049: 4.9 % worse)
    change_low: float | None  # its always-valid bounds
    change_high: float | None
    runs: int  # evaluated runs counted, the arm's and the control's
    control_runs: int
    note: str = ""

    def as_json(self) -> dict:
        return asdict(self)


def quality_verdict(
    arm: QualitySums, control: QualitySums, rule: QualityRule, *, is_control: bool = False
) -> QualityVerdict:
    """The arm's quality against the control's (see the module's docstring)."""

    def said(verdict: str, note: str = "", change=None, low=None, high=None) -> QualityVerdict:
        return QualityVerdict(
            verdict,
            rule.metric,
            rule.direction,
            rule.margin,
            arm.mean,
            control.mean,
            change,
            low,
            high,
            arm.runs,
            control.runs,
            note,
        )

    if is_control:
        return said("not_measured" if not control.runs else "non_inferior", "the control")
    if not arm.runs or not control.runs:
        missing = [
            side for side, n in (("the arm", arm.runs), ("the control", control.runs)) if not n
        ]
        return said(
            "not_measured", f"no finished run of {' or '.join(missing)} evaluated {rule.metric}"
        )
    if not control.mean or control.mean <= 0:
        return said("inconclusive", f"the control's mean {rule.metric} is not positive")
    change = arm.mean / control.mean - 1.0
    if rule.higher_is_better:
        change = -change
    short = [
        f"{side} has {n} of {rule.min_runs} evaluated runs"
        for side, n in (("the arm", arm.runs), ("the control", control.runs))
        if n < rule.min_runs
    ]
    est, ref = arm.estimate(), control.estimate()
    if short or est is None or ref is None:
        return said("inconclusive", "; ".join(short) or "each side needs 2 evaluated runs", change)
    iv = stats.relative_deviation(est, ref, alpha=rule.alpha, r2=rule.r2)
    low, high = (-iv.high, -iv.low) if rule.higher_is_better else (iv.low, iv.high)
    if low > rule.margin:
        return said("worse", "", change, low, high)
    if high < -rule.margin:
        return said("better", "", change, low, high)
    if high <= rule.margin:
        return said("non_inferior", "", change, low, high)
    return said("inconclusive", "the always-valid bound still spans the margin", change, low, high)


def reached(value: float, target: float, *, higher_is_better: bool) -> bool:
    return value >= target if higher_is_better else value <= target


def cost_to_target(
    points: list[tuple[float, float]], target: float, *, higher_is_better: bool = False
) -> float | None:
    """USD a run took to reach `target`: its evaluations as (cumulative USD, value) in the order
    taken, interpolated linearly between the two that straddle it; the first evaluation's cost
    where that one already reaches it; None where none does ("not reached")."""
    previous = None
    for cost, value in points:
        if reached(value, target, higher_is_better=higher_is_better):
            if previous is None or previous[1] == value:
                return cost
            c0, v0 = previous
            return c0 + (cost - c0) * (target - v0) / (value - v0)
        previous = (cost, value)
    return None
