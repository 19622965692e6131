"""One evidence rule: the verdict is conclusive exactly when the freeze rule could act, and every
minimum it weighs is a field of the experiment (issue 25, item 2)."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from apps.attribution.decide.decisions import (
    ArmInput,
    ArmSums,
    Policy,
    RunMoments,
    experiment_decide,
)
from apps.attribution.decide.verdict import Minimums, arm_verdict, freeze_holds
from apps.attribution.models import AttributionSnapshot
from apps.attribution.say.report import experiment_report
from apps.attribution.say.snapshots import policy_for
from apps.experiments.models import Arm
from tests.apps.attribution.lab import Lab
from tests.factories import ExperimentFactory


def _policy(**changes) -> Policy:
    values = {
        "threshold": 0.05,
        "alpha": 0.05,
        "min_runs": 3,
        "min_samples": 30,
        "min_cs_runs": 10,
        "unit": "token",
        "r2": 0.02,
        "dynamic_weights": False,
        "min_share": 0.05,
        "max_step": 0.5,
    }
    return Policy(**{**values, **changes})


def _arm(arm_id: int, *, control: bool, runs: int, samples: int, factor: float, rng) -> ArmInput:
    per_run = []
    for _ in range(runs):
        tokens = 1_000_000
        per_run.append((factor * (1 + rng.gauss(0, 0.05)), tokens, 100))
    moments = RunMoments.of(per_run)
    sums = ArmSums(
        observations=runs,
        samples=samples,
        cost=moments.cost,
        tokens=runs * 1_000_000,
        steps=runs * 100,
    ).with_moments(moments)
    return ArmInput(arm_id, f"arm{arm_id}", control, True, Decimal(1), sums)


class _Compared:
    """What the report says of an arm at the window the decision was taken on."""

    def __init__(self, arm: ArmInput, deviation):
        self.is_control, self.state = arm.is_control, "active"
        self.deviation = deviation.estimate if deviation else None
        self.deviation_low = deviation.low if deviation else None
        self.deviation_high = deviation.high if deviation else None
        self.evidence_runs, self.evidence_samples = arm.sums.runs, arm.sums.samples


def test_costlier_exactly_when_the_freeze_rule_freezes():
    """Over many random windows (runs and samples around every minimum, deviations around the
    threshold), the verdict says `costlier` if and only if the freeze rule freezes."""
    rng = random.Random(25)
    seen = {True: 0, False: 0}
    for _ in range(600):
        policy = _policy(min_runs=rng.choice([2, 3, 6]), min_cs_runs=rng.choice([3, 5, 10]))
        control = _arm(
            1,
            control=True,
            runs=rng.randint(2, 12),
            samples=rng.choice([10, 30, 200]),
            factor=1.0,
            rng=rng,
        )
        arm = _arm(
            2,
            control=False,
            runs=rng.randint(2, 12),
            samples=rng.choice([10, 30, 200]),
            factor=rng.choice([0.8, 1.0, 1.04, 1.08, 1.2, 1.4]),
            rng=rng,
        )
        decided = experiment_decide([control, arm], policy)
        dev = decided.arms[2].deviation
        said = arm_verdict(
            _Compared(arm, dev),
            control=_Compared(control, decided.arms[1].deviation),
            threshold=policy.threshold,
            minimums=policy.minimums,
        )
        assert (said == "costlier") == decided.arms[2].freeze, (said, decided.arms[2].evidence)
        seen[decided.arms[2].freeze] += 1
        if said == "costlier":
            assert not freeze_holds(
                _Compared(arm, dev),
                control=_Compared(control, None),
                threshold=policy.threshold,
                minimums=policy.minimums,
            )
    assert seen[True] >= 20 and seen[False] >= 20, seen  # both sides of the rule were exercised


@pytest.mark.django_db
def test_the_confidence_sequence_minimum_is_the_experiments(settings):
    settings.COSTLAB_CS_MIN_RUNS = 7
    assert ExperimentFactory().min_cs_runs_per_arm == 7, "a new experiment takes the default"
    experiment = ExperimentFactory(min_cs_runs_per_arm=4)
    assert policy_for(experiment).min_cs_runs == 4
    assert Minimums.of(experiment) == Minimums(
        runs=experiment.min_runs_per_arm, samples=experiment.min_samples_per_arm, cs_runs=4
    )


@pytest.mark.django_db
def test_a_lower_minimum_of_the_experiment_freezes_on_fewer_runs():
    """4 runs per arm, 25 % dearer: the default minimum (10) holds it; the experiment's own (4)
    lets the rule act, and the report's verdict follows the same rule."""
    held = Lab({"control": 1.0, "b": 1.25}, runs_per_arm=4, seed=31, dynamic_weights=False)
    held.run_ticks(4)
    assert held.arm("b").state == Arm.State.ACTIVE
    snap = AttributionSnapshot.objects.filter(arm=held.arms["b"]).order_by("-window_end").first()
    assert snap.deviation_low > 0.05, "the bound alone would have frozen it"
    assert any("min_cs_runs_per_arm" in r for r in snap.evidence["blocked_by"])
    assert snap.evidence["min_cs_runs"] == 10
    report = experiment_report(experiment=held.experiment)
    control, b = report.arms
    minimums = Minimums.of(held.experiment)
    assert arm_verdict(b, control=control, threshold=0.05, minimums=minimums) == "inconclusive"
    assert freeze_holds(
        b, control=control, threshold=0.05, minimums=minimums, arm_name="b", control_name="control"
    ) == ["b has 4 of 10 runs", "control has 4 of 10 runs"]

    acts = Lab(
        {"control": 1.0, "b": 1.25},
        runs_per_arm=4,
        seed=31,
        dynamic_weights=False,
        min_cs_runs_per_arm=4,
    )
    acts.run_ticks(4)
    assert acts.arm("b").state == Arm.State.FROZEN
