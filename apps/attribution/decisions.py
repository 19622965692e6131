"""What a tick decides for one experiment, from its arms' cumulative sums. Pure: no ORM, no clock.

Same sums and policy in, same verdict out: this is what makes a window attributed twice
give identical snapshots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from decimal import ROUND_HALF_EVEN, Decimal

from apps.attribution import stats
from apps.attribution.verdict import Minimums, evidence_shortfalls
from apps.attribution.weights import rebalance

WEIGHT_QUANTUM = Decimal("0.0001")
# A move of less than this share of traffic is noise, not news: it is not made (nor recorded).
MIN_SHARE_CHANGE = 0.005


@dataclass(frozen=True)
class RunMoments:
    """Over an arm's runs in its epoch, each run's cumulative cost C, tokens T, steps S: how many,
    and sum C^2, C T, T^2, C S, S^2."""

    runs: int = 0
    cost_sq: Decimal = Decimal(0)
    cost_tokens: Decimal = Decimal(0)
    tokens_sq: Decimal = Decimal(0)
    cost_steps: Decimal = Decimal(0)
    steps_sq: Decimal = Decimal(0)
    cost: Decimal | None = None  # sum C: the compared cost (None: the billed sums' cost stands)
    tokens: int | None = None  # sum T and sum S over these runs (None: not summed)
    steps: int | None = None

    @classmethod
    def of(cls, runs) -> RunMoments:
        """From (cost, tokens, steps) per run; C is the run's compared cost."""
        runs = [(stats.as_decimal(c), stats.as_decimal(t), stats.as_decimal(s)) for c, t, s in runs]
        return cls(
            runs=len(runs),
            cost=sum((c for c, _, _ in runs), Decimal(0)),
            cost_sq=sum((c * c for c, _, _ in runs), Decimal(0)),
            cost_tokens=sum((c * t for c, t, _ in runs), Decimal(0)),
            tokens_sq=sum((t * t for _, t, _ in runs), Decimal(0)),
            cost_steps=sum((c * s for c, _, s in runs), Decimal(0)),
            steps_sq=sum((s * s for _, _, s in runs), Decimal(0)),
        )


@dataclass(frozen=True)
class ArmSums:
    """An arm's observations summed (cumulative over its current epoch).

    The second moments (cost_sq ... steps_sq) are over runs: sum of C_r^2 for each run's
    cumulative cost C_r in the epoch, and so on (apps.attribution.moments.run_moments);
    `runs` counts them. The inference's unit is the run (apps.attribution.stats).
    """

    observations: int = 0
    runs: int = 0
    samples: int = 0
    cost: Decimal = Decimal(0)
    tokens: int = 0
    steps: int = 0
    gpu_seconds: Decimal = Decimal(0)
    wall_s: Decimal = Decimal(0)
    energy_j: Decimal = Decimal(0)
    estimated: bool = False
    cost_sq: Decimal = Decimal(0)
    cost_tokens: Decimal = Decimal(0)
    tokens_sq: Decimal = Decimal(0)
    cost_steps: Decimal = Decimal(0)
    steps_sq: Decimal = Decimal(0)
    compared: Decimal = Decimal(0)  # `cost` with every arm's usage priced at the comparison table

    def with_moments(self, moments: RunMoments | None, *, runs_excluded: bool = False) -> ArmSums:
        """These sums with the run-level count, second moments and compared cost (the window sums'
        would be per window, and billed). `runs_excluded`: the moments leave some runs out
        (outliers), so the tokens and steps are the kept runs' too, and the ratio compares like
        with like."""
        m = moments or RunMoments()
        out = replace(
            self,
            runs=m.runs,
            cost_sq=m.cost_sq,
            cost_tokens=m.cost_tokens,
            tokens_sq=m.tokens_sq,
            cost_steps=m.cost_steps,
            steps_sq=m.steps_sq,
            compared=self.cost if m.cost is None else m.cost,
        )
        return (
            replace(out, tokens=int(m.tokens or 0), steps=int(m.steps or 0))
            if runs_excluded
            else out
        )

    def __add__(self, other: ArmSums) -> ArmSums:
        values = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            values[f.name] = (a or b) if f.name == "estimated" else a + b
        return ArmSums(**values)

    @classmethod
    def from_row(cls, row: dict) -> ArmSums:
        """From a database row (Decimal on Postgres, float on SQLite); missing keys are 0."""
        values = {}
        for f in fields(cls):
            v = row.get(f.name)
            if f.name == "estimated":
                values[f.name] = bool(v)
            elif f.name in ("observations", "runs", "samples", "tokens", "steps"):
                values[f.name] = int(v or 0)
            else:
                values[f.name] = stats.as_decimal(v)
        return cls(**values)

    def ratio(self, unit: str) -> stats.RatioSums:
        """Run-level sufficient statistics at the comparison table: n counts runs,
        not run-windows."""
        if unit == "step":
            return stats.RatioSums(
                self.runs,
                self.compared,
                Decimal(self.steps),
                self.cost_sq,
                self.cost_steps,
                self.steps_sq,
            )
        return stats.RatioSums(
            self.runs,
            self.compared,
            Decimal(self.tokens),
            self.cost_sq,
            self.cost_tokens,
            self.tokens_sq,
        )


@dataclass(frozen=True)
class Policy:
    threshold: float
    alpha: float
    min_runs: int
    min_samples: int
    min_cs_runs: (
        int  # per arm: the sequence is asymptotic, so it is not consulted on a handful of runs
    )
    unit: str  # "token" (USD per 1M tokens) or "step" (USD per step: tiered per step)
    r2: float
    dynamic_weights: bool
    min_share: float
    max_step: float

    @property
    def minimums(self) -> Minimums:
        return Minimums(runs=self.min_runs, samples=self.min_samples, cs_runs=self.min_cs_runs)

    @property
    def metric(self) -> str:
        return "usd_per_step" if self.unit == "step" else "usd_per_mtok"

    @property
    def scale(self) -> float:
        return 1.0 if self.unit == "step" else 1_000_000.0


@dataclass(frozen=True)
class ArmInput:
    arm_id: int
    name: str
    is_control: bool
    active: bool
    weight: Decimal
    sums: ArmSums


@dataclass
class ArmVerdict:
    metric: stats.Interval | None = None
    metric_value: float | None = None
    usd_per_mtok: float | None = None
    throughput_tok_s: float | None = None
    deviation: stats.Interval | None = None
    freeze: bool = False
    evidence: dict = field(default_factory=dict)


@dataclass
class ExperimentVerdict:
    skip_reason: str = ""
    arms: dict[int, ArmVerdict] = field(default_factory=dict)
    weights: dict[int, tuple[Decimal, str]] = field(
        default_factory=dict
    )  # arm id -> (new weight, why)
    weights_note: str = ""


def _num(x: float | None, digits: int = 9) -> float | None:
    """A JSON-safe float (no NaN/inf), rounded so evidence reads well."""
    if x is None or not math.isfinite(x):
        return None
    return round(x, digits)


def _interval_json(iv: stats.Interval | None, scale: float = 1.0) -> dict | None:
    if iv is None:
        return None
    return {
        "estimate": _num(iv.estimate * scale),
        "low": _num(iv.low * scale),
        "high": _num(iv.high * scale),
        "halfwidth": _num(iv.halfwidth * scale),
        "sd": _num(iv.sd * scale),
        "t": iv.t,
    }


def _arm_figures(arm: ArmInput, policy: Policy) -> tuple[ArmVerdict, stats.RatioEstimate | None]:
    s = arm.sums
    est = stats.ratio_estimate(s.ratio(policy.unit))
    verdict = ArmVerdict()
    if est is not None:
        verdict.metric = stats.ratio_interval(est, alpha=policy.alpha, r2=policy.r2)
    units = s.steps if policy.unit == "step" else s.tokens
    # Figures that compare arms use the compared cost; the bill (cost_usd) is kept beside it.
    verdict.metric_value = float(s.compared) / units * policy.scale if units > 0 else None
    verdict.usd_per_mtok = float(s.compared) / s.tokens * 1e6 if s.tokens > 0 else None
    verdict.throughput_tok_s = s.tokens / float(s.wall_s) if s.wall_s > 0 else None
    verdict.evidence = {
        "metric": policy.metric,
        "value": _num(verdict.metric_value),
        "interval": _interval_json(verdict.metric, policy.scale),
        "observations": s.observations,
        "runs": s.runs,
        "samples": s.samples,
        "cost_usd": f"{s.cost:.6f}",
        "compared_usd": f"{s.compared:.6f}",
        "units": units,
    }
    return verdict, est


def _freeze_rule(
    arm: ArmInput, control: ArmInput, dev: stats.Interval | None, policy: Policy
) -> list[str]:
    """What stands between this arm and a freeze (empty: freeze)."""
    blocked = []
    if not arm.active:
        blocked.append("state: arm is already frozen")
    for short in evidence_shortfalls(
        arm_runs=arm.sums.runs,
        arm_samples=arm.sums.samples,
        control_runs=control.sums.runs,
        control_samples=control.sums.samples,
        minimums=policy.minimums,
    ):
        if short.field == "min_cs_runs_per_arm":
            blocked.append(
                f"runs: {short.side} has {short.has} < {short.needs} runs, the least the "
                "confidence sequence is consulted on (min_cs_runs_per_arm)"
            )
        else:
            blocked.append(
                f"{short.what}: {short.side} has {short.has} < {short.field} {short.needs}"
            )
    if dev is None:
        blocked.append("deviation: not estimable yet (each arm needs 2 runs with units)")
    else:
        if dev.estimate <= policy.threshold:
            blocked.append(f"deviation: {dev.estimate:.4f} <= threshold {policy.threshold:.4f}")
        elif dev.low <= policy.threshold:
            blocked.append(
                f"bound: lower confidence bound {dev.low:.4f} <= threshold {policy.threshold:.4f}"
            )
    return blocked


def experiment_decide(arms: list[ArmInput], policy: Policy) -> ExperimentVerdict:
    """Figures for every arm; deviation vs the control; which arms freeze; the next weights."""
    out = ExperimentVerdict()
    estimates = {}
    for arm in arms:
        out.arms[arm.arm_id], estimates[arm.arm_id] = _arm_figures(arm, policy)

    controls = [a for a in arms if a.is_control]
    if not controls:
        out.skip_reason = "arms: the experiment has no control arm (mark one arm is_control)"
        return out
    control = controls[0]
    if control.sums.compared <= 0 and (control.sums.tokens > 0 or control.sums.steps > 0):
        out.skip_reason = (
            f"control: arm '{control.name}' has zero cost over {control.sums.tokens} tokens; "
            "deviation is undefined (does the pricing table price its device?)"
        )
        return out

    control_est = estimates[control.arm_id]
    for arm in arms:
        verdict = out.arms[arm.arm_id]
        if arm.is_control:
            verdict.deviation = stats.Interval(0.0, 0.0, 0.0, 0.0, 0.0, arm.sums.observations)
            continue
        est = estimates[arm.arm_id]
        dev = None
        if est is not None and control_est is not None:
            dev = stats.relative_deviation(est, control_est, alpha=policy.alpha, r2=policy.r2)
        blocked = _freeze_rule(arm, control, dev, policy)
        verdict.deviation, verdict.freeze = dev, not blocked
        verdict.evidence.update(
            {
                "deviation": _interval_json(dev),
                "threshold": policy.threshold,
                "alpha": policy.alpha,
                "r2": _num(policy.r2, 12),
                "min_runs": policy.min_runs,
                "min_samples": policy.min_samples,
                "min_cs_runs": policy.min_cs_runs,
                "control": {
                    "arm_id": control.arm_id,
                    "name": control.name,
                    "value": out.arms[control.arm_id].metric_value,
                    "observations": control.sums.observations,
                    "runs": control.sums.runs,
                    "samples": control.sums.samples,
                },
                "decision": "freeze" if verdict.freeze else "hold",
                "blocked_by": blocked,
            }
        )

    if policy.dynamic_weights and not any(v.freeze for v in out.arms.values()):
        out.weights, out.weights_note = _next_weights(arms, out, policy)
    return out


def _next_weights(arms: list[ArmInput], out: ExperimentVerdict, policy: Policy) -> tuple[dict, str]:
    live = [a for a in arms if a.active]
    if len(live) < 2:
        return {}, "weights: fewer than two active arms"
    costs = {}
    for a in live:
        metric = out.arms[a.arm_id].metric
        if (
            metric is None
            or a.sums.runs < policy.min_runs
            or a.sums.samples < policy.min_samples
            or a.sums.runs < policy.min_cs_runs
        ):
            return {}, f"weights: arm '{a.name}' lacks the evidence minimums; weights unchanged"
        if metric.estimate <= 0:
            return {}, f"weights: arm '{a.name}' has no cost yet; weights unchanged"
        # Optimism under uncertainty (a lower confidence bound, as bandits do): an arm with
        # little evidence is not starved on a noisy first estimate, and arms that only
        # differ by noise keep similar shares. Floored at half the estimate while very uncertain.
        costs[a.arm_id] = max(metric.low, metric.estimate / 2)
    total = sum((a.weight for a in live), Decimal(0))
    if total <= 0:
        return {}, "weights: active arms have no traffic weight to shift"
    shares = rebalance(
        {a.arm_id: float(a.weight) for a in live},
        costs,
        tau=policy.threshold,
        min_share=policy.min_share,
        max_step=policy.max_step,
    )
    cheapest = min(costs.values()) * policy.scale
    if max(abs(shares[a.arm_id] - float(a.weight / total)) for a in live) < MIN_SHARE_CHANGE:
        return {}, "weights: at target"
    changed = {}
    for a in live:
        new = (Decimal(repr(shares[a.arm_id])) * total).quantize(
            WEIGHT_QUANTUM, rounding=ROUND_HALF_EVEN
        )
        if new != a.weight:
            changed[a.arm_id] = (
                new,
                f"dynamic: {policy.metric} lower bound {costs[a.arm_id] * policy.scale:.6g} "
                f"vs cheapest {cheapest:.6g}; share {shares[a.arm_id]:.3f}",
            )
    return changed, "weights: shifted toward cheaper arms" if changed else "weights: at target"
