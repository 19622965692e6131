"""Outlier runs: device time per token beyond 3 x MAD from the arm's median, flagged in the API."""

from __future__ import annotations

import pytest

from apps.experiments.selectors import OUTLIER_MADS, mad_outliers, run_outliers
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db


def test_mad_flags_only_what_lies_beyond_three_mads():
    values = {
        1: 1.00,
        2: 1.10,
        3: 0.90,
        4: 1.05,
        5: 0.95,
        6: 1.0,
    }  # with a 7th: median 1.0, MAD 0.05
    sigma = 1.4826 * 0.05  # the MAD as a standard deviation: 0.074
    assert mad_outliers(values) == {}
    assert set(mad_outliers({**values, 9: 1.0 + 3.1 * sigma})) == {9}
    assert mad_outliers({**values, 9: 1.0 + 2.9 * sigma}) == {}
    median, mad, distance = mad_outliers({**values, 7: 20.0})[
        7
    ]  # the 4.3 s against 85 s, in spirit
    assert median == pytest.approx(1.0) and mad == pytest.approx(sigma) and distance > 100
    assert set(mad_outliers({**values, 7: 1.0 - 3.1 * sigma})) == {7}  # too fast is flagged too
    assert mad_outliers({1: 1.0, 2: 50.0}) == {}  # two runs: no median to stand out from
    # identical runs: the MAD floor (1 % of the median) keeps rounding from being an outlier
    assert mad_outliers({1: 1.0, 2: 1.0, 3: 1.0, 4: 1.025}) == {}
    assert set(mad_outliers({1: 1.0, 2: 1.0, 3: 1.0, 4: 1.2})) == {4}


def runs(arm, per_token):
    return [
        RunFactory(arm=arm, tokens=1000, device_seconds=s * 1000, status="succeeded")
        for s in per_token
    ]


def test_each_run_is_judged_against_its_own_arm_and_shown_in_the_api(api, experiment):
    control, candidate = experiment.arms.order_by("-is_control")
    slow = runs(control, [0.010, 0.011, 0.0105, 0.0095, 0.20])  # one 20x slower run
    fast = runs(candidate, [0.005, 0.0052, 0.0049, 0.0051])  # cheaper, but each like the others
    RunFactory(arm=candidate, tokens=0, device_seconds=0.0)  # queued: no figures, not judged
    found = run_outliers(experiment_id=experiment.pk)
    assert set(found) == {slow[-1].pk}
    flagged = found[slow[-1].pk]
    assert flagged.arm_id == control.pk and flagged.distance_mads > OUTLIER_MADS
    assert flagged.arm_median == pytest.approx(0.0105)

    body = api.get(f"/api/v1/runs/{slow[-1].pk}/").json()
    assert (
        body["outlier"]["distance_mads"] > 3
        and "MADs from its arm's median" in body["outlier"]["reason"]
    )
    assert api.get(f"/api/v1/runs/{fast[0].pk}/").json()["outlier"] is None
    listed = {
        r["id"]: r["outlier"]
        for r in api.get("/api/v1/runs/", {"experiment": experiment.pk}).json()["results"]
    }
    assert listed[slow[-1].pk] is not None and listed[slow[0].pk] is None
    outliers = api.get(f"/api/v1/experiments/{experiment.pk}/").json()["outlier_runs"]
    assert [o["run"] for o in outliers] == [slow[-1].pk]
    assert outliers[0]["arm"] == control.pk and outliers[0]["device_s_per_token"] == pytest.approx(
        0.2
    )
