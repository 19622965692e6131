"""Outlier runs can be left out of attribution (COSTLAB_ATTRIBUTION_EXCLUDE_OUTLIERS, off by
default), and every exclusion is recorded in the window's evidence and reproduced by a recompute."""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.attribution.models import AttributionWindow
from apps.attribution.say.snapshots import COMPARED_FIELDS, window_recompute
from apps.experiments.models import Run
from tests.apps.attribution.lab import Lab

pytestmark = pytest.mark.django_db


def make_outlier(run: Run, factor: float = 20.0) -> None:
    """The run took `factor` times the device time (and bill) for its tokens: a contended host.
    (The lab moves totals from its own copies of the runs: this one changes too.)"""
    run.device_seconds *= factor
    run.cost_usd = (Decimal(run.cost_usd) * Decimal(factor)).quantize(Decimal("0.000001"))
    Run.objects.filter(pk=run.pk).update(device_seconds=run.device_seconds, cost_usd=run.cost_usd)


def snapshot(lab, arm, number):
    return AttributionWindow.objects.get(experiment=lab.experiment, number=number).snapshots.get(
        arm=lab.arms[arm]
    )


def test_outliers_count_by_default_and_are_left_out_and_recorded_when_asked(settings):
    lab = Lab({"control": 1.0, "b": 0.9}, runs_per_arm=6, seed=3)
    lab.step()
    slow = [r for r in lab.runs if r.arm_id == lab.arms["control"].pk][0]
    make_outlier(slow)
    assert settings.COSTLAB_ATTRIBUTION_EXCLUDE_OUTLIERS is False
    lab.tick()
    counted = snapshot(lab, "control", 1)
    assert counted.runs == 6 and "excluded_runs" not in counted.evidence

    settings.COSTLAB_ATTRIBUTION_EXCLUDE_OUTLIERS = True
    lab.run_ticks(1)
    kept = snapshot(lab, "control", 2)
    assert kept.runs == 5
    [excluded] = kept.evidence["excluded_runs"]
    assert (
        excluded["run"] == slow.pk and excluded["distance_mads"] > 3 and "MAD" in excluded["reason"]
    )
    assert (
        "excluded_runs" not in snapshot(lab, "b", 2).evidence
    )  # b's runs are alike: nothing left out
    # without the 20x run the control costs what its runs cost: b is ~10 % cheaper, not ~80 %
    b = snapshot(lab, "b", 2)
    assert b.deviation == pytest.approx(-0.1, abs=0.03)
    assert kept.usd_per_mtok < counted.usd_per_mtok / 2

    # the exclusion is part of the record: recomputing the window reproduces it, and window 1's
    # inclusion
    for number in (1, 2):
        window = AttributionWindow.objects.get(experiment=lab.experiment, number=number)
        stored = {s.arm_id: s for s in window.snapshots.all()}
        for snap in window_recompute(window=window):
            for name in COMPARED_FIELDS:
                assert getattr(snap, name) == getattr(stored[snap.arm_id], name), (number, name)
