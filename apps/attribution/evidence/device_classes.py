"""Arms compare within one device class: an A/B verdict over runs on different hardware is
confounded (bf16 is 4x faster than fp32 on one CPU and 40x slower on the next).

A run's class is its device profile's (CPU model and the flags that decide dtype speed, or the
GPU's name; apps.devices), "" when no profile was recorded. An experiment's **reference class**
is the class of its control's first run: the tick (freezes, weights) counts only the runs of
that class, and records the others' observations as omitted, counted and said in the evidence.
The report adds one verdict per class, each from that class's runs alone; a class where the
control has no runs is counted and said, never compared.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from apps.attribution.decide import stats
from apps.attribution.decide.freeze_rule import Minimums
from apps.attribution.decide.verdict import arm_verdict
from apps.devices.selectors import device_class_label
from apps.experiments.models import Run


@dataclass(frozen=True)
class ClassSplit:
    reference: str
    # arm id -> {other class -> its runs' ids}: what the tick leaves out of the comparison
    others: dict[int, dict[str, list[int]]] = field(default_factory=dict)

    def omitted_runs(self) -> list[int]:
        return sorted(r for by in self.others.values() for ids in by.values() for r in ids)

    def evidence(self, arm_id: int) -> dict:
        """What an arm's snapshot says of the classes: the one compared, the others counted."""
        return {
            "device_class": self.reference,
            "device_class_label": device_class_label(self.reference),
            "other_device_classes": [
                {"device_class": c, "label": device_class_label(c), "runs": len(ids)}
                for c, ids in sorted(self.others.get(arm_id, {}).items())
            ],
        }


def _runs(experiment_ids: list[int]):
    return (
        Run.objects.filter(experiment_id__in=experiment_ids, priced_seq__gte=0)
        .order_by("pk")
        .values_list("experiment_id", "arm_id", "arm__is_control", "device_class", "pk")
    )


def class_splits(*, experiment_ids: list[int]) -> dict[int, ClassSplit]:
    """Per experiment: its reference class and the runs of other classes, arm by arm (one
    query). The control's first priced run fixes the class (else the first run's), so a
    verdict's evidence never changes class under it."""
    reference: dict[int, str] = {}
    first_any: dict[int, str] = {}
    rows = list(_runs(experiment_ids))
    for exp_id, _arm, is_control, device_class, _pk in rows:
        first_any.setdefault(exp_id, device_class)
        if is_control:
            reference.setdefault(exp_id, device_class)
    others: dict[int, dict[int, dict[str, list[int]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    for exp_id, arm_id, _c, device_class, pk in rows:
        ref = reference.get(exp_id, first_any[exp_id])
        if device_class != ref:
            others[exp_id][arm_id][device_class].append(pk)
    return {
        exp_id: ClassSplit(
            reference=reference.get(exp_id, first),
            others={a: dict(by) for a, by in others.get(exp_id, {}).items()},
        )
        for exp_id, first in first_any.items()
    }


@dataclass(frozen=True)
class ClassArm:
    arm_id: int
    name: str
    is_control: bool
    runs: int
    metric_value: float | None  # USD per 1M tokens (or per step) over this class's runs, billed
    deviation: float | None
    deviation_low: float | None
    deviation_high: float | None
    verdict: str


@dataclass(frozen=True)
class ClassVerdict:
    device_class: str
    label: str
    reference: bool  # the class the tick freezes on
    runs: int
    control_runs: int
    arms: list[ClassArm]
    note: str  # e.g. why this class is counted but not compared


def class_verdicts(*, experiment, policy, arms: list, reference_report: dict) -> list[ClassVerdict]:
    """One verdict per device class of the experiment's priced runs, each from that class's runs
    alone (billed cost per unit; the always-valid bounds once each side has the runs the
    sequence is consulted on). The reference class's row repeats the main verdict
    (`reference_report`: arm id -> ArmReport), which the tick's bounds stand behind."""
    rows = (
        Run.objects.filter(experiment=experiment, priced_seq__gte=0)
        .values_list("arm_id", "device_class", "cost_usd", "tokens", "steps")
        .order_by("pk")
    )
    control = next((a for a in arms if a.is_control), None)
    by_class: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    first, reference = None, None  # as class_splits fixes it: the control's first priced run's
    for arm_id, device_class, cost, tokens, steps in rows:
        units = steps if policy.unit == "step" else tokens
        by_class[device_class][arm_id].append((cost, units))
        first = device_class if first is None else first
        if reference is None and control is not None and arm_id == control.pk:
            reference = device_class
    if not by_class:
        return []
    reference = first if reference is None else reference
    # Other classes count runs, not samples: their bounds are consulted from the run minimums.
    per_class = Minimums(runs=policy.min_runs, samples=0, cs_runs=policy.min_cs_runs)
    out = []
    for device_class in sorted(by_class, key=lambda c: (c != reference, c)):
        runs = by_class[device_class]
        control_runs = len(runs.get(control.pk, [])) if control else 0
        estimates = {
            a.pk: stats.ratio_estimate(stats.RatioSums.of(runs[a.pk])) if runs.get(a.pk) else None
            for a in arms
        }
        base = estimates.get(control.pk) if control else None
        class_arms = []
        for arm in arms:
            pairs = runs.get(arm.pk, [])
            cost = sum(float(c) for c, _ in pairs)
            units = sum(float(u) for _, u in pairs)
            value = cost / units * policy.scale if units else None
            dev = low = high = None
            est = estimates.get(arm.pk)
            if arm.is_control:
                dev = 0.0 if pairs else None
            elif est is not None and base is not None and base.value > 0:
                interval = stats.relative_deviation(est, base, alpha=policy.alpha, r2=policy.r2)
                if interval is not None:
                    dev = interval.estimate
                    if min(len(pairs), control_runs) >= policy.min_cs_runs:
                        low, high = interval.low, interval.high
            row = _Row(arm.is_control, arm.state, dev, low, high, len(pairs))
            control_row = _Row(True, "active", 0.0, None, None, control_runs)
            minimums = per_class
            if device_class == reference and arm.pk in reference_report:
                r = reference_report[arm.pk]  # the tick's bounds, over this class's runs alone
                low, high = r.deviation_low, r.deviation_high
                if len(by_class) == 1:
                    dev = r.deviation  # one class: exactly the main verdict (re-pricing included)
                # the main verdict's evidence: what the tick counted, against every minimum
                row = _Row(
                    arm.is_control, arm.state, dev, low, high, r.evidence_runs, r.evidence_samples
                )
                control_row = reference_report.get(control.pk) if control else None
                minimums = policy.minimums
            verdict = arm_verdict(
                row, control=control_row, threshold=policy.threshold, minimums=minimums
            )
            class_arms.append(
                ClassArm(
                    arm.pk, arm.name, arm.is_control, len(pairs), value, dev, low, high, verdict
                )
            )
        total = sum(len(v) for v in runs.values())
        note = ""
        if device_class != reference:
            note = (
                f"the control has no runs on this device class: its {total} run(s) are counted, "
                "not compared"
                if not control_runs
                else "compared within this class only; freezes and traffic follow the "
                f"reference class ({device_class_label(reference)})"
            )
        out.append(
            ClassVerdict(
                device_class=device_class,
                label=device_class_label(device_class),
                reference=device_class == reference,
                runs=total,
                control_runs=control_runs,
                arms=class_arms,
                note=note,
            )
        )
    return out


@dataclass(frozen=True)
class _Row:
    is_control: bool
    state: str
    deviation: float | None
    deviation_low: float | None
    deviation_high: float | None
    evidence_runs: int = 0
    evidence_samples: int = 0
