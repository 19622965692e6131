"""The attribution tick: evidence-gated freezes, determinism, watermarks, faults, query count."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.attribution.models import (
    AttributionSnapshot,
    AttributionWindow,
    FreezeEvent,
    RunCursor,
    RunWindow,
    WeightChange,
)
from apps.attribution.say.snapshots import COMPARED_FIELDS, window_recompute
from apps.attribution.selectors import snapshot_series
from apps.attribution.services import attribution_tick
from apps.core.exceptions import ApplicationError
from apps.experiments.models import Arm, Run
from apps.experiments.services import run_submit
from tests.apps.attribution.lab import T0, Lab, priced_tenant
from tests.factories import CostModelFactory, GpuSkuFactory, PricingTableFactory, RunFactory

pytestmark = pytest.mark.django_db


def ticks_until_frozen(lab, arm="b", limit=100):
    for n in range(1, limit + 1):
        lab.step()
        if lab.tick().frozen:
            return n
    return None


def latest_snapshot(arm):
    return AttributionSnapshot.objects.filter(arm=arm).order_by("-window_end").first()


def test_a_true_six_percent_is_frozen_with_the_evidence_it_was_frozen_on():
    lab = Lab({"control": 1.0, "b": 1.06}, seed=3)
    assert ticks_until_frozen(lab) is not None
    b = lab.arm("b")
    assert (b.state, b.weight) == (Arm.State.FROZEN, Decimal(0))
    event = FreezeEvent.objects.get(arm=b)
    assert event.action == FreezeEvent.Action.FREEZE and event.window is not None
    assert event.deviation > 0.05 and event.deviation_low > 0.05 and event.threshold == 0.05
    ev = event.evidence
    assert ev["decision"] == "freeze" and ev["blocked_by"] == []
    assert ev["runs"] >= 3 and ev["samples"] >= 30 and ev["control"]["runs"] >= 3
    assert ev["deviation"]["low"] == pytest.approx(event.deviation_low, abs=1e-8)
    assert 0.02 < ev["deviation"]["estimate"] < 0.10
    change = WeightChange.objects.get(arm=b, kind=WeightChange.Kind.FREEZE)
    assert change.new_weight == 0 and change.old_weight > 0
    # The snapshot of that window carries the same numbers; later windows never freeze it twice.
    snap = AttributionSnapshot.objects.get(window=event.window, arm=b)
    assert snap.deviation_low == event.deviation_low and snap.evidence["decision"] == "freeze"
    lab.run_ticks(5)
    assert FreezeEvent.objects.filter(arm=b).count() == 1
    assert latest_snapshot(b).state == Arm.State.FROZEN


def test_four_percent_is_measured_but_never_frozen():
    lab = Lab({"control": 1.0, "b": 1.04}, seed=3)
    assert ticks_until_frozen(lab, limit=100) is None
    snap = latest_snapshot(lab.arm("b"))
    assert snap.deviation == pytest.approx(0.04, abs=0.01)
    assert snap.deviation_low < 0.05
    assert any(
        r.startswith("bound:") or r.startswith("deviation:") for r in snap.evidence["blocked_by"]
    )
    assert not FreezeEvent.objects.exists()


def test_twenty_percent_with_too_few_runs_waits_for_the_minimum():
    lab = Lab({"control": 1.0, "b": 1.20}, runs_per_arm=9, seed=4)
    assert ticks_until_frozen(lab, limit=15) is None
    blocked = latest_snapshot(lab.arm("b")).evidence["blocked_by"]
    assert (
        "runs: arm has 9 < 10 runs, the least the confidence sequence is consulted on "
        "(min_cs_runs_per_arm)"
    ) in blocked
    assert any(r.startswith("runs: control has 9 < 10 runs") for r in blocked)
    assert (
        latest_snapshot(lab.arm("b")).deviation_low > 0.05
    )  # the bound alone would have frozen it
    for arm in ("control", "b"):
        lab.add_run(lab.arms[arm])
    assert ticks_until_frozen(lab, limit=3) is not None  # the missing evidence was the only reason


def test_twenty_percent_on_thin_noisy_evidence_is_not_frozen():
    lab = Lab({"control": 1.0, "b": 1.20}, noise=0.25, seed=5)
    lab.run_ticks(3)
    snap = latest_snapshot(lab.arm("b"))
    assert snap.deviation > 0.05 and snap.deviation_low <= 0.05
    assert any(r.startswith("bound:") for r in snap.evidence["blocked_by"])
    assert lab.arm("b").state == Arm.State.ACTIVE


@pytest.mark.slow
def test_a_a_experiments_over_200_ticks_are_not_frozen_beyond_alpha():
    # Threshold at its minimum: only the always-valid bound stands between noise and a freeze.
    labs = [
        Lab(
            {"control": 1.0, "same": 1.0},
            seed=100 + i,
            freeze_threshold=Decimal("0.0001"),
            dynamic_weights=False,
        )
        for i in range(6)
    ]
    now = T0
    for _ in range(200):
        for lab in labs:
            lab.step()
        now += timedelta(seconds=30)
        attribution_tick(now=now)
    assert AttributionWindow.objects.count() == 6 * 200
    frozen = FreezeEvent.objects.filter(action=FreezeEvent.Action.FREEZE).count()
    assert frozen / len(labs) <= 0.05


def test_the_same_window_attributed_twice_gives_identical_snapshots():
    lab = Lab({"control": 1.0, "b": 1.02, "c": 0.97}, seed=6)
    lab.run_ticks(4)
    window = AttributionWindow.objects.get(experiment=lab.experiment, number=3)
    stored = {s.arm_id: s for s in window.snapshots.all()}

    def same(recomputed):
        for snap in recomputed:
            for name in COMPARED_FIELDS:
                assert getattr(snap, name) == getattr(stored[snap.arm_id], name), name
        return True

    assert same(window_recompute(window=window))
    lab.run_ticks(3)  # later data and windows change nothing about window 3
    assert same(window_recompute(window=window))
    # A tick at a window's own end again (a redelivered beat message) attributes nothing twice.
    result = attribution_tick(now=lab.now)
    assert (
        result.windows == 0
        and AttributionWindow.objects.filter(experiment=lab.experiment).count() == 7
    )


def test_deleting_runs_and_experiments_takes_their_derived_rows_with_them():
    """Run windows, cursors and snapshots keep no foreign key in the database: Django's cascade
    alone must leave no row naming a run, arm, window or experiment that is gone."""
    lab = Lab({"control": 1.0, "b": 1.02}, seed=9)
    other = Lab({"control": 1.0, "b": 1.0}, seed=10)
    lab.run_ticks(3)
    other.run_ticks(3)
    run = lab.runs[0]
    assert RunWindow.objects.filter(run=run).count() == 3 and RunCursor.objects.filter(run=run)
    run.delete()
    assert not RunWindow.objects.filter(run_id=run.pk) and not RunCursor.objects.filter(
        run_id=run.pk
    )

    kept = (
        RunWindow.objects.count(),
        RunCursor.objects.count(),
        AttributionSnapshot.objects.count(),
    )
    experiment = lab.experiment
    Run.objects.filter(experiment=experiment).delete()  # runs protect their arms: they go first
    experiment.delete()
    for model in (RunWindow, AttributionSnapshot):
        assert not model.objects.filter(arm__experiment_id=experiment.pk).exists(), model
    assert not AttributionSnapshot.objects.filter(experiment_id=experiment.pk).exists()
    assert not AttributionWindow.objects.filter(experiment_id=experiment.pk).exists()
    with connection.cursor() as cursor:  # no row names a parent that is gone
        for table, column, parent in (
            (RunWindow, "run_id", Run),
            (RunWindow, "arm_id", Arm),
            (RunWindow, "window_id", AttributionWindow),
            (RunCursor, "run_id", Run),
            (RunCursor, "window_id", AttributionWindow),
            (AttributionSnapshot, "arm_id", Arm),
            (AttributionSnapshot, "window_id", AttributionWindow),
        ):
            cursor.execute(
                f"SELECT COUNT(*) FROM {table._meta.db_table} t WHERE t.{column} IS NOT NULL "
                f"AND NOT EXISTS (SELECT 1 FROM {parent._meta.db_table} p WHERE p.id = t.{column})"
            )
            assert cursor.fetchone()[0] == 0, (table.__name__, column)
    # The other experiment's rows are all still there.
    assert RunWindow.objects.count() == kept[0] - 3 * (len(lab.runs) - 1)
    assert RunCursor.objects.count() == kept[1] - (len(lab.runs) - 1)
    assert AttributionSnapshot.objects.filter(experiment=other.experiment).count() == 3 * 2


def test_a_beat_gap_is_covered_exactly_once():
    lab = Lab({"control": 1.0, "b": 1.0}, seed=7)
    lab.run_ticks(2)
    for _ in range(10):  # five minutes of training while beat is down
        lab.step()
    lab.now += timedelta(minutes=5)
    result = attribution_tick(now=lab.now)
    assert result.windows == 1 and result.observations == len(lab.runs)
    gap = AttributionWindow.objects.get(experiment=lab.experiment, number=3)
    assert gap.window_start == T0 + timedelta(seconds=60) and gap.window_end == lab.now
    for run in Run.objects.filter(pk__in=[r.pk for r in lab.runs]):
        observed = RunWindow.objects.filter(run=run)
        assert sum(o.tokens for o in observed) == run.tokens
        assert sum(o.cost_usd for o in observed) == run.cost_usd
        assert sum(o.samples for o in observed) == run.priced_seq + 1
        assert observed.get(window=gap).samples == 300
        assert RunCursor.objects.get(run=run).priced_seq == run.priced_seq
    # Nothing new: nothing attributed, no empty window.
    assert attribution_tick(now=lab.now + timedelta(seconds=30)).windows == 0


def test_an_experiment_is_attributed_on_its_own_interval():
    lab = Lab({"control": 1.0, "b": 1.0}, interval_s=60)
    lab.step()
    assert attribution_tick(now=T0).windows == 1
    lab.step()
    assert attribution_tick(now=T0 + timedelta(seconds=30)).windows == 0  # not due yet
    assert (
        attribution_tick(now=T0 + timedelta(seconds=59.5)).windows == 1
    )  # due, within beat jitter


def test_faults_skip_their_experiment_with_a_reason_and_the_tick_goes_on():
    healthy = Lab({"control": 1.0, "b": 1.10}, seed=8)
    no_control = Lab({"x": 1.0, "y": 1.2}, seed=9)
    Arm.objects.filter(experiment=no_control.experiment).update(is_control=False)
    zero_control = Lab({"control": 0.0, "b": 1.0}, seed=10)
    unpriced = Lab({"control": 1.0, "b": 1.0}, seed=11)
    unpriced_run = unpriced.add_run(unpriced.arms["b"])
    Run.objects.filter(pk=unpriced_run.pk).update(gpu_sku=GpuSkuFactory(name="Mystery GPU"))
    unknown_device = Lab({"control": 1.0, "b": 1.0}, seed=12)
    odd = unknown_device.add_run(unknown_device.arms["b"])
    Run.objects.filter(pk=odd.pk).update(gpu_sku=None, device="cuda:0 Prototype X1")
    no_table = Lab({"control": 1.0, "b": 1.0}, seed=13)
    no_table.price.pricing_table.delete()
    labs = [healthy, no_control, zero_control, unpriced, unknown_device, no_table]

    now, frozen = T0, []
    for _ in range(12):
        for lab in labs:
            lab.step()
        now += timedelta(seconds=30)
        result = attribution_tick(now=now)
        frozen += result.frozen
    assert frozen == [healthy.arms["b"].pk]  # the healthy experiment was attributed all along
    reasons = {
        lab: AttributionWindow.objects.filter(experiment=lab.experiment).latest("number")
        for lab in labs
    }
    assert reasons[healthy].status == AttributionWindow.Status.ATTRIBUTED
    assert reasons[no_control].skip_reason.startswith("arms: the experiment has no control arm")
    assert reasons[zero_control].skip_reason.startswith("control: arm 'control' has zero cost")
    assert "has no price for GPU SKU 'Mystery GPU'" in reasons[unpriced].skip_reason
    assert (
        f"device: run {odd.pk} ran on 'cuda:0 Prototype X1', which matches no GPU SKU"
        in reasons[unknown_device].skip_reason
    )
    assert reasons[no_table].skip_reason.startswith("pricing_table: tenant")
    for lab in labs[1:]:
        assert reasons[lab].status == AttributionWindow.Status.SKIPPED
        assert not FreezeEvent.objects.filter(experiment=lab.experiment).exists()
    # The unpriced run's observations stay out of the sums, so they cannot skew a later decision.
    assert RunWindow.objects.filter(run=unpriced_run, omitted=False).count() == 0
    assert latest_snapshot(unpriced.arms["b"]).runs == 10


def test_the_tick_costs_the_same_queries_for_one_experiment_or_many():
    def queries(n_experiments):
        labs = [
            Lab({"control": 1.0, "b": 1.01, "c": 0.99, "d": 1.0}, runs_per_arm=3, seed=i)
            for i in range(n_experiments)
        ]
        for lab in labs:
            lab.step()
        with CaptureQueriesContext(connection) as ctx:
            result = attribution_tick(now=labs[0].now + timedelta(seconds=30))
        assert result.windows == n_experiments
        Run.objects.all().delete()
        return len(ctx.captured_queries)

    one, six = queries(1), queries(6)
    # 23 on Postgres; the run-level moments of the freeze rule and the comparison table are two,
    # the quality sums and the price versions (whether usage must be priced at one) one each
    assert one <= 23
    # Five more experiments cost fewer than five more queries: nothing runs per experiment
    # (Postgres: none at all; SQLite splits big bulk inserts into a few statements).
    assert six - one < 5


def test_a_frozen_arm_receives_no_new_runs():
    lab = Lab({"control": 1.0, "b": 1.25, "c": 1.0}, seed=14)
    lab.experiment.tenant.max_concurrent_runs = 1000
    lab.experiment.tenant.save()
    assert ticks_until_frozen(lab, limit=30) is not None
    b = lab.arm("b")
    runs = [run_submit(experiment=lab.experiment, run_key=f"key-{i}") for i in range(60)]
    assert {r.arm.name for r in runs} == {"control", "c"}
    with pytest.raises(ApplicationError, match="arm: 'b' is frozen"):
        run_submit(experiment=lab.experiment, arm=b)


@pytest.mark.parametrize("policy", ["cancel", "let_finish"])
def test_running_runs_of_a_frozen_arm_follow_the_experiment_policy(policy):
    lab = Lab({"control": 1.0, "b": 1.25}, seed=15, freeze_policy=policy)
    external = RunFactory(arm=lab.arms["b"], kind=Run.Kind.EXTERNAL, status=Run.Status.RUNNING)
    assert ticks_until_frozen(lab, limit=30) is not None
    runs = Run.objects.filter(arm=lab.arms["b"])
    event = FreezeEvent.objects.get(arm=lab.arms["b"])
    if policy == "cancel":
        assert all(r.cancel_requested for r in runs)  # workers stop at their next step boundary
        assert Run.objects.get(pk=external.pk).status == Run.Status.CANCELLED
        assert sorted(event.evidence["cancelled_runs"]) == sorted(r.pk for r in runs)
    else:
        assert not any(r.cancel_requested for r in runs) and event.evidence["cancelled_runs"] == []


def test_a_pricing_table_pinned_by_the_experiment_is_the_one_checked():
    lab = Lab({"control": 1.0, "b": 1.0}, seed=16)
    pinned = PricingTableFactory(tenant=lab.experiment.tenant)  # prices no GPU
    lab.experiment.pricing_table = pinned
    lab.experiment.save()
    lab.step()
    result = lab.tick()
    assert "has no price for GPU SKU" in result.skipped[lab.experiment.pk]


def test_a_tiered_per_step_cost_model_compares_usd_per_step():
    price = priced_tenant()
    tiered = CostModelFactory(
        tenant=price.pricing_table.tenant,
        kind="tiered_per_call",
        unit="step",
        tiers=[{"up_to": None, "usd_per_unit": "0.001"}],
    )
    lab = Lab({"control": 1.0, "b": 1.0}, price=price, cost_model=tiered)
    lab.run_ticks(2)
    snap = latest_snapshot(lab.arms["b"])
    assert snap.metric == "usd_per_step" and snap.evidence["metric"] == "usd_per_step"
    assert snap.metric_value == pytest.approx(float(snap.cost_usd) / snap.steps)
    assert snap.metric_ci_low < snap.metric_value < snap.metric_ci_high
    assert snap.usd_per_mtok == pytest.approx(float(snap.cost_usd) / snap.tokens * 1e6)
    assert snap.usd_per_mtok_ci_low is None  # the interval is on what is compared


def test_the_series_is_in_window_order():
    lab = Lab({"control": 1.0, "b": 1.0}, seed=17)
    lab.run_ticks(3)
    series = list(snapshot_series(experiment=lab.experiment))
    assert [s.window.number for s in series] == [1, 1, 2, 2, 3, 3]
    assert [s.arm.name for s in series[:2]] == ["control", "b"]


def test_the_variance_comes_from_runs_not_windows():
    lab = Lab({"control": 1.0, "b": 1.05}, seed=12)
    lab.run_ticks(4)
    for arm in lab.arms.values():
        snap = latest_snapshot(arm)
        per_run: dict[int, list] = {}
        for o in RunWindow.objects.filter(arm=arm, omitted=False):
            c, t = per_run.get(o.run_id, (Decimal(0), 0))
            per_run[o.run_id] = (c + o.cost_usd, t + o.tokens)
        assert snap.runs == len(per_run) == 10 and snap.observations == 40
        # Sum over runs of (cumulative cost)^2 and cost x tokens: one term per run, not per window.
        assert snap.cost_sq == sum(c * c for c, _ in per_run.values())
        assert snap.cost_tokens == sum(c * t for c, t in per_run.values())
        assert snap.tokens_sq == sum(t * t for _, t in per_run.values())
