"""Cheaper for the same model: quality gets its own always-valid verdict against the control, a
cheaper arm proven worse reads cheaper_but_worse and is frozen, and traffic follows evidence."""

from __future__ import annotations

import random
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.attribution.decide import stats
from apps.attribution.decide.quality import (
    QualityRule,
    QualitySums,
    cost_to_target,
    quality_verdict,
)
from apps.attribution.models import FreezeEvent, WeightChange
from apps.attribution.services import attribution_tick
from apps.experiments.models import Arm, Run
from tests.apps.attribution.lab import Lab
from tests.factories import final_evaluation

RULE = QualityRule(
    margin=0.01, alpha=0.05, r2=stats.tuning_r2(alpha=0.05, expected_n=50), min_runs=5
)


def verdict(arm, control, rule=RULE):
    return quality_verdict(QualitySums.of(arm), QualitySums.of(control), rule).verdict


def test_the_quality_verdicts():
    rng = random.Random(1)
    base = [3.0 + rng.gauss(0, 0.003) for _ in range(10)]
    assert verdict([v * 1.05 for v in base], base) == "worse"
    assert verdict([v * 0.95 for v in base], base) == "better"
    assert verdict([3.0 + rng.gauss(0, 0.003) for _ in range(10)], base) == "non_inferior"
    assert verdict([v * 1.05 for v in base[:4]], base) == "inconclusive"  # 4 of 5 runs
    assert verdict([], base) == "not_measured"
    assert verdict(base, []) == "not_measured"
    noisy = [3.0 + rng.gauss(0, 0.3) for _ in range(6)]
    assert verdict(noisy, base) == "inconclusive"  # the bound spans the margin
    # higher is better: a lower accuracy is worse
    acc = QualityRule(**{**RULE.__dict__, "metric": "accuracy", "higher_is_better": True})
    q = quality_verdict(QualitySums.of([0.80] * 6), QualitySums.of([0.90] * 6), acc)
    assert q.verdict == "worse" and q.change == pytest.approx(1 / 9)
    assert verdict([0.95] * 6, [0.90] * 6, acc) == "better"


def test_an_a_a_simulation_gives_no_more_false_worse_than_alpha():
    """Two arms of one quality, looked at after every new pair of runs, up to 40 runs each: the
    share of experiments ever called worse stays at or below alpha, even with no margin."""
    rng = random.Random(7)
    rule = QualityRule(**{**RULE.__dict__, "margin": 1e-9})
    experiments, false = 1500, 0
    for _ in range(experiments):
        scale = rng.choice((0.002, 0.02, 0.1))
        a, c = [], []
        for _ in range(40):
            a.append(3.0 * (1 + scale * rng.gauss(0, 1)))
            c.append(3.0 * (1 + scale * rng.gauss(0, 1)))
            if len(a) >= rule.min_runs and verdict(a, c, rule) == "worse":
                false += 1
                break
    assert false / experiments <= rule.alpha, false / experiments


def test_cost_to_a_target_is_interpolated_on_cumulative_cost():
    curve = [(1.0, 4.0), (2.0, 3.5), (4.0, 3.0)]
    assert cost_to_target(curve, 3.25) == pytest.approx(3.0)
    assert cost_to_target(curve, 4.5) == 1.0  # the first evaluation already reaches it
    assert cost_to_target(curve, 2.9) is None  # never reached
    assert cost_to_target([(1.0, 0.5), (3.0, 0.9)], 0.8, higher_is_better=True) == pytest.approx(
        2.5
    )


def finish(lab: Lab, losses: dict[str, float], *, noise: float = 0.001) -> None:
    """Every run succeeds with a final held-out evaluation at its arm's loss (give or take)."""
    now = timezone.now()
    for run in lab.runs:
        name = next(n for n, a in lab.arms.items() if a.pk == run.arm_id)
        final_evaluation(run, losses[name] * (1 + noise * lab.rng.gauss(0, 1)), at=now)
    Run.objects.filter(pk__in=[r.pk for r in lab.runs]).update(
        status=Run.Status.SUCCEEDED, finished_at=now
    )


@pytest.mark.django_db
@pytest.mark.parametrize("loss, expected", [(3.15, "cheaper_but_worse"), (3.0, "cheaper")])
def test_a_cheaper_arm_with_a_worse_model_is_frozen_and_said_so(loss, expected):
    from apps.attribution.decide.verdict import Minimums, arms_verdicts
    from apps.attribution.say.report import experiment_report

    lab = Lab(
        {"control": 1.0, "candidate": 0.7},
        runs_per_arm=6,
        seed=3,
        min_cs_runs_per_arm=5,
    )
    lab.run_ticks(2)
    gained = list(WeightChange.objects.filter(arm=lab.arms["candidate"]))
    assert all("quality not measured" in c.reason for c in gained)  # said, not taken as equal
    finish(lab, {"control": 3.0, "candidate": loss})
    lab.step(runs=[])  # nothing new: the evaluations alone move nothing
    Run.objects.filter(pk=lab.runs[0].pk).update(priced_seq=lab.runs[0].priced_seq + 1)
    lab.tick()
    candidate = lab.arm("candidate")
    report = experiment_report(experiment=lab.experiment)
    said = arms_verdicts(report.arms, threshold=0.05, minimums=Minimums.of(lab.experiment))
    arm = next(a for a in report.arms if a.name == "candidate")
    assert said[candidate.pk].verdict == expected, arm
    if expected == "cheaper_but_worse":
        assert candidate.state == Arm.State.FROZEN
        event = FreezeEvent.objects.get(arm=candidate)
        assert event.reason.startswith("quality: held-out loss +5.")
        assert arm.quality["verdict"] == "worse" and arm.quality["change"] == pytest.approx(
            0.05, abs=0.003
        )
        assert arm.runs_reached_target == 0 and arm.usd_to_target is None
    else:
        assert candidate.state == Arm.State.ACTIVE and arm.quality["verdict"] == "non_inferior"
        assert report.quality_target == pytest.approx(3.0, abs=0.005)
    later = WeightChange.objects.filter(arm=candidate).exclude(pk__in=[c.pk for c in gained])
    assert not later.filter(new_weight__gt=candidate.weight).exists()


@pytest.mark.django_db
def test_a_noisy_a_a_moves_no_weight_while_nothing_is_conclusive(settings):
    """Noisy runs of two identical arms (one run slowed by other work now and then): no weight
    moves unless the cost bound excludes zero; every weight stays at its floor or above."""
    settings.COSTLAB_WEIGHT_MIN_SHARE = 0.1
    lab = Lab({"control": 1.0, "twin": 1.0}, runs_per_arm=6, noise=0.25, seed=11)
    lab.experiment.min_cs_runs_per_arm = 3
    lab.experiment.save(update_fields=["min_cs_runs_per_arm"])
    for run in lab.runs[::4]:
        lab.run_factor[run.pk] = 1.6  # slowed by a neighbour
    for _ in range(12):
        lab.step()
        lab.tick()
        latest = lab.experiment.snapshots.order_by("-window__number", "arm_id").first()
        twin = lab.experiment.snapshots.filter(arm=lab.arms["twin"]).order_by("-window__number")[0]
        conclusive = twin.deviation_low is not None and (
            twin.deviation_low > 0 or twin.deviation_high < 0
        )
        if not conclusive:
            assert not WeightChange.objects.exists(), latest.evidence
        for arm in Arm.objects.filter(experiment=lab.experiment):
            assert arm.weight >= Decimal("0.2") - Decimal("0.0001")  # 0.1 of a total of 2
    assert attribution_tick(now=lab.now + timedelta(seconds=1)).ran
