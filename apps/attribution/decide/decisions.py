"""What a tick decides for one experiment, from its arms' cumulative sums. Pure: no ORM, no clock.

Same sums and policy in, same verdict out: this is what makes a window attributed twice
give identical snapshots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from decimal import ROUND_HALF_EVEN, Decimal

from apps.attribution.decide import stats
from apps.attribution.decide.freeze_rule import (
    DEVIATION,
    EVIDENCE,
    STATE,
    Block,
    Minimums,
    freeze_blocks,
)
from apps.attribution.decide.quality import (
    QualityRule,
    QualitySums,
    QualityVerdict,
    quality_verdict,
)
from apps.attribution.decide.weights import rebalance

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
    cumulative cost C_r in the epoch, and so on (apps.attribution.evidence.moments.run_moments);
    `runs` counts them. The inference's unit is the run (apps.attribution.decide.stats).
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
    quality: QualityRule = QualityRule()

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
    quality: QualitySums = QualitySums()  # its finished runs' final values of the metric


@dataclass
class ArmVerdict:
    metric: stats.Interval | None = None
    metric_value: float | None = None
    usd_per_mtok: float | None = None
    throughput_tok_s: float | None = None
    deviation: stats.Interval | None = None
    freeze: bool = False
    quality: QualityVerdict | None = None
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


def _blocked_by(block: Block) -> str:
    """One block of the freeze rule, as the snapshot's evidence records it."""
    if block.kind == STATE:
        return "state: arm is already frozen"
    if block.kind == EVIDENCE:
        short = block.shortfall
        if short.field == "min_cs_runs_per_arm":
            return (
                f"runs: {short.side} has {short.has} < {short.needs} runs, the least the "
                "confidence sequence is consulted on (min_cs_runs_per_arm)"
            )
        return f"{short.what}: {short.side} has {short.has} < {short.field} {short.needs}"
    if block.kind == DEVIATION:
        if block.value is None:
            return "deviation: not estimable yet (each arm needs 2 runs with units)"
        return f"deviation: {block.value:.4f} <= threshold {block.threshold:.4f}"
    if block.value is None:
        return f"bound: no lower confidence bound yet (threshold {block.threshold:.4f})"
    return f"bound: lower confidence bound {block.value:.4f} <= threshold {block.threshold:.4f}"


def _freeze_rule(
    arm: ArmInput, control: ArmInput, dev: stats.Interval | None, policy: Policy
) -> list[str]:
    """What stands between this arm and a freeze (empty: freeze)."""
    blocks = freeze_blocks(
        active=arm.active,
        arm_runs=arm.sums.runs,
        arm_samples=arm.sums.samples,
        control_runs=control.sums.runs,
        control_samples=control.sums.samples,
        estimate=dev.estimate if dev is not None else None,
        low=dev.low if dev is not None else None,
        threshold=policy.threshold,
        minimums=policy.minimums,
    )
    return [_blocked_by(b) for b in blocks]


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
        verdict.quality = quality_verdict(
            arm.quality, control.quality, policy.quality, is_control=arm.is_control
        )
        verdict.evidence["quality"] = {
            **verdict.quality.as_json(),
            "sums": arm.quality.as_json(),
            "alpha": policy.alpha,
        }
        if arm.is_control:
            verdict.deviation = stats.Interval(0.0, 0.0, 0.0, 0.0, 0.0, arm.sums.observations)
            continue
        est = estimates[arm.arm_id]
        dev = None
        if est is not None and control_est is not None:
            dev = stats.relative_deviation(est, control_est, alpha=policy.alpha, r2=policy.r2)
        blocked = _freeze_rule(arm, control, dev, policy)
        # An arm proven worse beyond the quality margin is frozen like a dearer one.
        worse = arm.active and verdict.quality.verdict == "worse"
        verdict.deviation, verdict.freeze = dev, not blocked or worse
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
                "frozen_for": ("cost" if not blocked else "quality") if verdict.freeze else "",
                "blocked_by": blocked,
            }
        )

    if policy.dynamic_weights and not any(v.freeze for v in out.arms.values()):
        out.weights, out.weights_note = _next_weights(arms, out, policy)
    return out


def _quality_holds_back(q: QualityVerdict) -> bool:
    """Whether an arm's quality keeps it from gaining traffic: proven worse, still undecided, or
    not measured while the control is (an experiment where no run evaluates anything compares
    cost alone, and its weights say so)."""
    if q.verdict in ("worse", "inconclusive"):
        return True
    return q.verdict == "not_measured" and q.control_runs > 0


def _next_weights(arms: list[ArmInput], out: ExperimentVerdict, policy: Policy) -> tuple[dict, str]:
    """Traffic follows evidence, never a point estimate (docs/attribution.md, "Traffic").

    An arm's cost counts as different from the control's only where the always-valid bound of
    its deviation excludes 0; otherwise it is taken as the control's. An arm whose quality is
    proven worse is treated as dearer than any (its share goes to the floor) and is never given
    more traffic. With no arm different by evidence, no weight moves. Every arm, the control
    included, keeps at least min_share, so the comparison stays decidable."""
    live = [a for a in arms if a.active]
    if len(live) < 2:
        return {}, "weights: fewer than two active arms"
    control = next((a for a in live if a.is_control), None)
    if control is None:
        return {}, "weights: the control is not active; weights unchanged"
    for a in live:
        metric = out.arms[a.arm_id].metric
        if metric is None or policy.minimums.shortfalls(
            a.name, runs=a.sums.runs, samples=a.sums.samples
        ):
            return {}, f"weights: arm '{a.name}' lacks the evidence minimums; weights unchanged"
        if metric.estimate <= 0:
            return {}, f"weights: arm '{a.name}' has no cost yet; weights unchanged"
    base = out.arms[control.arm_id].metric.estimate
    costs, why, evidence, no_gain = {}, {}, False, set()
    for a in live:
        v = out.arms[a.arm_id]
        dev, q = v.deviation, v.quality
        if not a.is_control and q is not None and _quality_holds_back(q):
            no_gain.add(a.arm_id)
        if not a.is_control and q is not None and q.verdict == "worse":
            costs[a.arm_id], why[a.arm_id] = base * (1 + 20 * policy.threshold), "quality worse"
            evidence = True
        elif not a.is_control and dev is not None and (dev.high < 0 or dev.low > 0):
            costs[a.arm_id] = base * (1.0 + dev.estimate)
            why[a.arm_id] = (
                f"deviation {dev.estimate:+.1%} (bound {dev.low:+.1%} to {dev.high:+.1%})"
            )
            evidence = True
        else:
            costs[a.arm_id] = base
            why[a.arm_id] = "control" if a.is_control else "not different from the control"
    if not evidence:
        return {}, (
            "weights: no arm's cost differs from the control's by evidence yet (every "
            "always-valid bound includes 0); weights unchanged"
        )
    total = sum((a.weight for a in live), Decimal(0))
    if total <= 0:
        return {}, "weights: active arms have no traffic weight to shift"
    current = {a.arm_id: float(a.weight / total) for a in live}
    shares = rebalance(
        {a.arm_id: float(a.weight) for a in live},
        costs,
        tau=policy.threshold,
        min_share=policy.min_share,
        max_step=policy.max_step,
    )
    # An arm whose quality is worse, or not shown as good, never gains: what it would gain goes
    # to the others in proportion.
    capped = {k: min(v, current[k]) if k in no_gain else v for k, v in shares.items()}
    if capped != shares:
        spare = sum(shares.values()) - sum(capped.values())
        others = [k for k in capped if k not in no_gain]
        mass = sum(capped[k] for k in others)
        for k in others:
            capped[k] += spare * (capped[k] / mass if mass > 0 else 1.0 / len(others))
        shares = capped
    if max(abs(shares[a.arm_id] - current[a.arm_id]) for a in live) < MIN_SHARE_CHANGE:
        return {}, "weights: at target"
    changed = {}
    for a in live:
        new = (Decimal(repr(shares[a.arm_id])) * total).quantize(
            WEIGHT_QUANTUM, rounding=ROUND_HALF_EVEN
        )
        if new != a.weight:
            q = out.arms[a.arm_id].quality
            said = (
                "; quality not shown as good: no gain"
                if a.arm_id in no_gain
                else "; quality not measured"
                if q is not None and q.verdict == "not_measured"
                else ""
            )
            changed[a.arm_id] = (
                new,
                f"dynamic, by evidence: {why[a.arm_id]}{said}; share {shares[a.arm_id]:.3f}"[:255],
            )
    return changed, "weights: shifted by evidence" if changed else "weights: at target"
