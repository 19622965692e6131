"""The tick reads each run's sums over its arm's epoch from the run's cursor, one row a run, not
every observation since the epoch began (which grows with every window). Those sums must equal the
observations summed again, window after window: with omitted observations (runs on another device
class), an unfreeze that restarts an arm's epoch, runs that stop moving, and cursors written before
the sums existed."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from apps.attribution.evidence.moments import run_moments
from apps.attribution.models import AttributionWindow, RunCursor, RunWindow
from apps.attribution.services import arm_unfreeze
from apps.experiments.models import Experiment, Run
from tests.apps.attribution.lab import Lab
from tests.apps.attribution.test_device_classes import AMX, AVX2
from tests.factories import UserFactory

pytestmark = [pytest.mark.django_db, pytest.mark.services]  # the cursors' sums: Postgres


def both_ways(lab: Lab) -> tuple[dict, dict]:
    """The moments of the experiment's newest window, from the observations and from the cursors,
    at the epochs the tick used (its snapshots')."""
    window = AttributionWindow.objects.filter(experiment=lab.experiment).latest("number")
    epochs = {s.arm_id: s.epoch_start for s in window.snapshots.all()}
    upto = {arm_id: window.number for arm_id in epochs}
    return (
        run_moments(epochs=epochs, upto_number=upto),
        run_moments(epochs=epochs, upto_number=upto, from_cursors=True),
    )


def assert_same(lab: Lab) -> dict:
    scanned, cursors = both_ways(lab)
    assert scanned and cursors == scanned
    return scanned


def test_omitted_observations_are_left_out_of_the_cursors_sums():
    lab = Lab({"control": 1.0, "candidate": 1.0}, runs_per_arm=0, seed=3)
    for arm in lab.arms.values():
        for _ in range(4):
            lab.add_run(arm, device_class=AMX)
            lab.add_run(arm, device_class=AVX2, factor=3.0)  # another class: omitted
    amx = [r for r in lab.runs if r.device_class == AMX]
    for n in range(5):
        # From the third window on, half the reference runs stop moving: their sums stay.
        lab.step(runs=lab.runs if n < 2 else lab.runs[::2])
        lab.tick()
        moments = assert_same(lab)
        assert {m.runs for m in moments.values()} == {4}, "the AVX2 runs count nowhere"
    assert RunWindow.objects.filter(omitted=True).exists()
    assert RunWindow.objects.filter(run__in=amx, omitted=False).count() > 0


def test_an_unfreeze_restarts_the_sums_of_every_run_of_the_arm():
    lab = Lab({"control": 1.0, "b": 1.25}, seed=30, dynamic_weights=False, min_samples_per_arm=600)
    for _ in range(30):
        lab.step()
        if lab.tick().frozen:
            break
    else:
        raise AssertionError("b was never frozen")
    assert_same(lab)
    arm_unfreeze(arm=lab.arms["b"], actor=UserFactory(is_staff=True), reason="checked by hand")
    b_runs = [r for r in lab.runs if r.arm_id == lab.arms["b"].pk]
    for n in range(4):
        # The first window after the unfreeze leaves two of b's runs out: their old sums must not
        # count in the new epoch, and they count again once they move.
        lab.step(runs=[r for r in lab.runs if n > 0 or r not in b_runs[:2]])
        lab.tick()
        moments = assert_same(lab)
        assert moments[lab.arms["b"].pk].runs == (8 if n == 0 else 10)


def test_cursors_from_before_the_sums_are_summed_again_on_the_next_tick():
    lab = Lab({"control": 1.0, "b": 1.02}, seed=5)
    lab.run_ticks(3)
    expected = assert_same(lab)
    # As the migration leaves them: no epoch known, no sums.
    RunCursor.objects.update(
        epoch_after=-1, epoch_observations=0, epoch_cost_usd=0, epoch_tokens=0, epoch_steps=0
    )
    lab.step(runs=lab.runs[:3])  # most runs do not move in the next window
    lab.tick()
    moments = assert_same(lab)
    assert all(moments[a].runs == expected[a].runs for a in expected)
    assert not RunCursor.objects.filter(epoch_after=-1).exists()


def test_unknown_cursors_of_arms_not_attributed_cost_the_tick_nothing():
    """After the migration, the cursors of experiments that are over stay unknown for good: a tick
    over other experiments must not go looking for them (one UPDATE over the cursors each tick)."""
    over = Lab({"control": 1.0, "b": 1.0}, seed=11)
    over.run_ticks(2)
    RunCursor.objects.filter(run__experiment=over.experiment).update(epoch_after=-1)
    over.experiment.status = Experiment.Status.COMPLETED
    over.experiment.save(update_fields=["status"])
    lab = Lab({"control": 1.0, "b": 1.02}, seed=12)
    lab.run_ticks(2)
    lab.step()
    with CaptureQueriesContext(connection) as ctx:
        lab.tick()
    refreshes = [q for q in ctx.captured_queries if "SET epoch_after = s.after_n" in q["sql"]]
    assert refreshes == [], "the tick summed cursors again with none of its own unknown"
    assert_same(lab)


def test_a_run_repriced_down_by_a_late_sample_moves_its_sums_down():
    """A late sample re-prices a run below its priced_seq: its cost moves (here down), its seq does
    not; the next observation is a negative delta, and the cursor's sums follow it."""
    lab = Lab({"control": 1.0, "b": 1.0}, seed=13)
    lab.run_ticks(2)
    run = lab.runs[0]
    Run.objects.filter(pk=run.pk).update(cost_usd=F("cost_usd") - Decimal("0.000100"))
    lab.tick()
    assert_same(lab)
    run.refresh_from_db()
    assert RunCursor.objects.get(run=run).epoch_cost_usd == run.cost_usd
