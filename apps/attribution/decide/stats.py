"""Always-valid inference on cost per unit of work. Pure functions, no Django.

The unit of observation is the run. A run's windows share its host, data order and luck (a
run on a slow host stays slow), so they are not independent: counted as independent, the
variance is underestimated and A/A arms freeze at 3-7x alpha. An observation is therefore
one run's cumulative (cost, units) so far in the arm's epoch, a run still in progress
included, and t counts runs. An arm's cost per unit is the ratio of sums
R = sum(cost) / sum(units), so longer runs weigh more; its variance comes from the delta
method on the run residuals cost - R * units (the cluster-robust variance of a ratio). The
relative deviation of an arm from the control, D = R_arm / R_control - 1, gets its variance
from the delta method too (as GrowthBook computes relative effects).

Because the decision is re-taken every tick, a fixed-n confidence interval would be looked at
hundreds of times and its error rate would inflate. The asymptotic confidence sequence of
Waudby-Smith et al. ("Time-uniform central limit theory", eq. of the asymptotic CS; the
sequential intervals GrowthBook uses) stays valid at every look at once:

    halfwidth(t) = s * sqrt(2 (t r2 + 1) / (t^2 r2) * log(sqrt(t r2 + 1) / alpha))

with t observations (runs) of standard deviation s, and r2 tuned so it is tightest near an
expected number of runs t*: r2 = (-2 log alpha + log(-2 log alpha + 1)) / t*. Being
asymptotic, it is not consulted before each arm has the experiment's min_cs_runs_per_arm runs.
tests/apps/attribution/test_freeze_simulation.py holds the rule to alpha in A/A simulations
with run effects of 2-20 %, 10-100 windows per run, outliers and unequal arms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, localcontext

# Exact sums can carry ~40 significant digits; compute residuals with room to spare.
_PRECISION = 80


def as_decimal(value) -> Decimal:
    """Database sums arrive as Decimal (Postgres) or float/int (SQLite); floats convert exactly."""
    if isinstance(value, Decimal):
        return value
    return Decimal(value or 0)


@dataclass(frozen=True)
class RatioSums:
    """Sufficient statistics of n (cost, units) observations: one per run
    (its cumulative figures)."""

    n: int
    cost: Decimal
    units: Decimal
    cost_sq: Decimal
    cost_units: Decimal
    units_sq: Decimal

    @classmethod
    def of(cls, pairs) -> RatioSums:
        """From (cost, units) pairs; for tests and simulations."""
        pairs = [(as_decimal(c), as_decimal(u)) for c, u in pairs]
        return cls(
            n=len(pairs),
            cost=sum((c for c, _ in pairs), Decimal(0)),
            units=sum((u for _, u in pairs), Decimal(0)),
            cost_sq=sum((c * c for c, _ in pairs), Decimal(0)),
            cost_units=sum((c * u for c, u in pairs), Decimal(0)),
            units_sq=sum((u * u for _, u in pairs), Decimal(0)),
        )


@dataclass(frozen=True)
class RatioEstimate:
    value: float  # cost per unit
    variance: float  # of the estimate
    n: int


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    halfwidth: float
    sd: float  # per-observation standard deviation s of the sequence
    t: int  # observations in the sequence


def ratio_estimate(sums: RatioSums) -> RatioEstimate | None:
    """R = sum(cost) / sum(units) and its delta-method variance;
    None without 2 observations or units."""
    if sums.n < 2 or as_decimal(sums.units) <= 0:
        return None
    with localcontext() as ctx:
        ctx.prec = _PRECISION
        cost, units = as_decimal(sums.cost), as_decimal(sums.units)
        r = cost / units
        # sum((c - r u)^2), exact up to the division: no cancellation between large sums.
        cost_sq, cost_units = as_decimal(sums.cost_sq), as_decimal(sums.cost_units)
        rss = cost_sq - 2 * r * cost_units + r * r * as_decimal(sums.units_sq)
        rss = max(rss, Decimal(0))
        variance = rss * sums.n / ((sums.n - 1) * units * units)
    return RatioEstimate(value=float(r), variance=float(variance), n=sums.n)


def tuning_r2(*, alpha: float, expected_n: float) -> float:
    """GrowthBook's choice of r2: the sequence is tightest near expected_n observations."""
    if not 0 < alpha < 1 or expected_n <= 0:
        raise ValueError("alpha must be in (0, 1) and expected_n > 0")
    la = -2.0 * math.log(alpha)
    return (la + math.log(la + 1.0)) / expected_n


def cs_halfwidth(*, sd: float, t: int, alpha: float, r2: float) -> float:
    """Half-width of the asymptotic confidence sequence after t observations of std dev sd."""
    if t <= 0:
        return math.inf
    tr = t * r2
    return sd * math.sqrt(2.0 * (tr + 1.0) / (t * t * r2) * math.log(math.sqrt(tr + 1.0) / alpha))


def ratio_interval(est: RatioEstimate, *, alpha: float, r2: float) -> Interval:
    """Always-valid interval for one arm's cost per unit."""
    sd = math.sqrt(max(est.variance, 0.0) * est.n)
    hw = cs_halfwidth(sd=sd, t=est.n, alpha=alpha, r2=r2)
    return Interval(est.value, est.value - hw, est.value + hw, hw, sd, est.n)


def relative_deviation(
    arm: RatioEstimate, control: RatioEstimate, *, alpha: float, r2: float
) -> Interval | None:
    """Always-valid interval for arm / control - 1; None when the control costs nothing."""
    if control.value <= 0:
        return None
    c2 = control.value * control.value
    # Delta method on a / c: var(a)/c^2 + a^2 var(c)/c^4 (arms are independent samples).
    variance = arm.variance / c2 + arm.value * arm.value * control.variance / (c2 * c2)
    t = arm.n + control.n
    sd = math.sqrt(max(variance, 0.0) * t)
    hw = cs_halfwidth(sd=sd, t=t, alpha=alpha, r2=r2)
    d = arm.value / control.value - 1.0
    return Interval(d, d - hw, d + hw, hw, sd, t)


def fixed_n_deviation(
    arm: RatioEstimate, control: RatioEstimate, *, z: float = 1.96
) -> Interval | None:
    """The naive fixed-sample interval, valid for one look only:
    kept to show what repeated looks do to it."""
    if control.value <= 0:
        return None
    c2 = control.value * control.value
    variance = arm.variance / c2 + arm.value * arm.value * control.variance / (c2 * c2)
    hw = z * math.sqrt(max(variance, 0.0))
    d = arm.value / control.value - 1.0
    return Interval(d, d - hw, d + hw, hw, math.sqrt(max(variance, 0.0)), arm.n + control.n)
