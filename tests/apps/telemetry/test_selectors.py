"""samples_downsampled: min/max per bucket in one SQL query, per run and per field."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from apps.core.exceptions import ApplicationError
from apps.telemetry.selectors import samples_downsampled
from tests.factories import RunFactory, TelemetrySampleFactory

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def fill(run, values, field="power_w", **extra):
    for seq, value in enumerate(values):
        TelemetrySampleFactory(
            run=run, seq=seq, ts=T0 + timedelta(seconds=seq), **{field: value}, **extra
        )


def test_a_series_that_fits_comes_back_whole_in_order():
    run = RunFactory()
    fill(run, [5.0, 1.0, 3.0])
    down = samples_downsampled(run_ids=[run.pk], fields=["power_w"], budget=10)
    assert [v for _, v in down.series[run.pk]["power_w"]] == [5.0, 1.0, 3.0]
    assert down.series[run.pk]["power_w"][0][0] == T0 and down.samples[run.pk] == 3


def test_each_bucket_keeps_its_extremes_within_the_budget(django_assert_num_queries):
    rng = random.Random(7)
    first, second = RunFactory(), RunFactory()
    values = [rng.uniform(100, 200) for _ in range(500)]
    values[123], values[400] = 999.0, 1.0
    fill(first, values)
    fill(second, [float(i) for i in range(300)])
    with django_assert_num_queries(1):  # all runs and fields in one query
        down = samples_downsampled(runs=[first, second], fields=["power_w", "step"], budget=40)
    points = down.series[first.pk]["power_w"]
    assert 20 <= len(points) <= 40
    assert max(v for _, v in points) == 999.0 and min(v for _, v in points) == 1.0
    assert [t for t, _ in points] == sorted(t for t, _ in points)
    ramp = [v for _, v in down.series[second.pk]["power_w"]]
    assert (
        ramp[0] == 0.0 and ramp[-1] == 299.0 and len(ramp) <= 40
    )  # first and last of a ramp are extremes
    assert len(down.series[first.pk]["step"]) <= 40


def test_nulls_are_skipped_and_unknown_runs_or_fields_are_empty_or_refused():
    run = RunFactory()
    fill(run, [None, 2.0, None, 4.0])
    down = samples_downsampled(run_ids=[run.pk, 999_999], fields=["power_w", "loss"], budget=10)
    assert [v for _, v in down.series[run.pk]["power_w"]] == [2.0, 4.0]
    assert down.series[run.pk]["loss"] == [] and down.series[999_999] == {"power_w": [], "loss": []}
    with pytest.raises(ApplicationError, match="fields: 'power_w; drop table'"):
        samples_downsampled(run_ids=[run.pk], fields=["power_w; drop table"], budget=10)
    with pytest.raises(ApplicationError, match="budget"):
        samples_downsampled(run_ids=[run.pk], fields=["power_w"], budget=1)


def test_a_time_window_bounds_the_series():
    run = RunFactory()
    fill(run, [float(i) for i in range(20)])
    down = samples_downsampled(
        run_ids=[run.pk],
        fields=["power_w"],
        budget=100,
        since=T0 + timedelta(seconds=5),
        until=T0 + timedelta(seconds=8),
    )
    assert [v for _, v in down.series[run.pk]["power_w"]] == [5.0, 6.0, 7.0]
