"""Dynamic weights: traffic shifts toward cheaper arms within bounds, every change recorded."""

from decimal import Decimal

import pytest
from django.test import override_settings

from apps.attribution import selectors
from apps.attribution.models import WeightChange
from apps.experiments.models import Arm
from tests.apps.attribution.lab import Lab

pytestmark = pytest.mark.django_db


def weights(lab):
    return {a.name: a.weight for a in Arm.objects.filter(experiment=lab.experiment)}


@pytest.mark.slow
@override_settings(COSTLAB_WEIGHT_MIN_SHARE=0.1, COSTLAB_WEIGHT_MAX_STEP=0.05)
def test_traffic_shifts_toward_the_cheaper_arm_in_bounded_recorded_steps():
    lab = Lab({"control": 1.0, "cheap": 0.80, "pricey": 1.03}, seed=20)
    total = sum(weights(lab).values())
    history = [weights(lab)]
    for _ in range(40):
        lab.step()
        lab.tick()
        history.append(weights(lab))
    final = history[-1]
    assert final["cheap"] > final["control"] and final["cheap"] > final["pricey"]
    for before, after in zip(history, history[1:], strict=False):
        assert sum(after.values()) == pytest.approx(
            total, abs=Decimal("0.0003")
        )  # shares move, total stays
        for name in after:
            assert abs(after[name] - before[name]) <= Decimal("0.05") * total + Decimal("0.0001")
            assert after[name] >= Decimal("0.1") * total - Decimal("0.0001")
    # Every change is on record, and the record ends at the arm's weight.
    for name, arm in lab.arms.items():
        changes = list(WeightChange.objects.filter(arm=arm).order_by("pk"))
        assert changes and all(c.kind == WeightChange.Kind.DYNAMIC for c in changes)
        assert changes[-1].new_weight == final[name]
        assert all(b.old_weight == a.new_weight for a, b in zip(changes, changes[1:], strict=False))
        assert changes[0].reason.startswith("dynamic, by evidence: ")


def test_weights_stay_put_when_the_experiment_turns_them_off():
    lab = Lab({"control": 1.0, "cheap": 0.80}, seed=21, dynamic_weights=False)
    lab.run_ticks(10)
    assert weights(lab) == {"control": Decimal("1.0000"), "cheap": Decimal("1.0000")}
    assert not WeightChange.objects.exists()


def test_weights_wait_for_the_evidence_minimums():
    lab = Lab({"control": 1.0, "cheap": 0.80}, runs_per_arm=2, seed=22)  # min_runs_per_arm is 3
    lab.run_ticks(5)
    assert not WeightChange.objects.exists()


def test_a_weight_a_person_changed_meanwhile_is_not_overwritten(monkeypatch):
    lab = Lab({"control": 1.0, "cheap": 0.80}, runs_per_arm=9, seed=23)
    lab.run_ticks(3)  # 9 runs per arm: below the minimum, so nothing moved yet
    assert not WeightChange.objects.exists()
    for arm in lab.arms.values():
        lab.add_run(arm)
    lab.step()
    read_arms_then = selectors.unfreeze_epochs  # called after the tick has read the arms

    def person_edits_the_weight(**kwargs):
        Arm.objects.filter(pk=lab.arms["control"].pk).update(weight=Decimal("3"))
        return read_arms_then(**kwargs)

    monkeypatch.setattr(selectors, "unfreeze_epochs", person_edits_the_weight)
    lab.tick()
    assert weights(lab) == {
        "control": Decimal("3"),
        "cheap": Decimal("1.1000"),
    }  # cheap still moved
    assert not WeightChange.objects.filter(arm=lab.arms["control"]).exists()
