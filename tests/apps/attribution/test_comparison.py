"""Arms are compared on usage priced at one table,
so a price edit never favours the arm that ran first."""

from datetime import timedelta
from decimal import Decimal

import pytest

from apps.attribution.models import AttributionSnapshot
from apps.attribution.say.snapshots import COMPARED_FIELDS, window_recompute
from apps.billing.cost_engine import Usage, resource_weighted_cost
from apps.experiments.models import Run
from apps.pricing.prices import Prices
from tests.apps.attribution.lab import MICRO, Lab
from tests.factories import GpuPriceFactory, PricingTableFactory

pytestmark = pytest.mark.django_db

TOKENS, SECONDS, POWER_W = 300_000, 30.0, 600.0


def train(lab: Lab, runs: list[Run], prices: Prices) -> None:
    """Identical runs train one window more, billed as ingest bills them:
    their usage at `prices`."""
    usage = Usage(
        wall_s=SECONDS,
        device_seconds=SECONDS,
        busy_device_seconds=SECONDS,
        energy_j=POWER_W * SECONDS,
    )
    cost = Decimal(repr(resource_weighted_cost(usage, prices).total_usd))
    for run in runs:
        run.refresh_from_db()
        Run.objects.filter(pk=run.pk).update(
            tokens=run.tokens + TOKENS,
            steps=run.steps + 30,
            priced_seq=run.priced_seq + 30,
            last_seq=run.priced_seq + 30,
            device_seconds=run.device_seconds + SECONDS,
            energy_j=run.energy_j + POWER_W * SECONDS,
            cost_usd=(run.cost_usd + cost).quantize(MICRO),
        )


def straddling_lab(**experiment):
    """Control's runs train under the first table; the candidate's, identical,
    after a price doubling."""
    lab = Lab({"control": 1.0, "b": 1.0}, runs_per_arm=5, **experiment)
    old = lab.price.pricing_table
    control = [r for r in lab.runs if r.arm_id == lab.arms["control"].pk]
    b = [r for r in lab.runs if r.arm_id == lab.arms["b"].pk]
    for _ in range(6):
        train(lab, control, Prices.from_table(old, lab.price.hourly_usd))
        lab.tick()
    new = PricingTableFactory(
        tenant=old.tenant,
        name="doubled",
        valid_from=lab.now + timedelta(seconds=1),
        electricity_usd_per_kwh=old.electricity_usd_per_kwh * 2,
        vcpu_hour_usd=old.vcpu_hour_usd * 2,
        memory_gb_hour_usd=old.memory_gb_hour_usd * 2,
    )
    GpuPriceFactory(pricing_table=new, sku=lab.price.sku, hourly_usd=lab.price.hourly_usd * 2)
    for _ in range(6):
        train(lab, b, Prices.from_table(new, lab.price.hourly_usd * 2))
        lab.tick()
    return lab, old, new, control, b


def test_identical_arms_either_side_of_a_price_doubling_compare_equal_while_bills_keep_tables():
    lab, old, new, control, b = straddling_lab()
    # Each run's bill follows the table in force when it ran:
    # the candidate's cost twice the control's.
    bill_control = Run.objects.get(pk=control[0].pk).cost_usd
    bill_b = Run.objects.get(pk=b[0].pk).cost_usd
    assert float(bill_b) == pytest.approx(2 * float(bill_control), rel=1e-6)
    snap = AttributionSnapshot.objects.filter(arm=lab.arms["b"]).order_by("-window_end").first()
    control_snap = AttributionSnapshot.objects.get(window=snap.window, arm=lab.arms["control"])
    # The comparison prices both arms' usage at the table in force at the window's end.
    assert snap.deviation == pytest.approx(0.0, abs=1e-6)
    assert snap.usd_per_mtok == pytest.approx(control_snap.usd_per_mtok, rel=1e-6)
    assert float(snap.cost_usd) == pytest.approx(
        2 * float(control_snap.cost_usd), rel=1e-6
    )  # the bills, as billed
    assert float(control_snap.compared_usd) == pytest.approx(float(snap.compared_usd), rel=1e-6)
    assert (snap.pricing_table_id, snap.pricing_valid_from) == (new.pk, new.valid_from)
    assert snap.evidence["decision"] != "freeze"
    assert lab.arm("b").state == "active"
    # A window recomputed from the rollup reproduces the comparison, table included.
    rebuilt = {s.arm_id: s for s in window_recompute(window=snap.window)}
    assert {f: getattr(rebuilt[snap.arm_id], f) for f in COMPARED_FIELDS} == {
        f: getattr(snap, f) for f in COMPARED_FIELDS
    }


def test_windows_before_the_edit_record_the_table_they_compared_at():
    lab, old, new, *_ = straddling_lab()
    tables = list(
        AttributionSnapshot.objects.filter(arm=lab.arms["control"])
        .order_by("window_end")
        .values_list("pricing_table_id", flat=True)
    )
    assert tables == [old.pk] * 6 + [new.pk] * 6


def test_a_pinned_table_is_the_one_compared_at():
    lab = Lab({"control": 1.0, "b": 1.0}, runs_per_arm=3)
    in_force = lab.price.pricing_table
    # Older than the table in force: only the pin makes it the comparison's.
    pinned = PricingTableFactory(
        tenant=in_force.tenant, name="pinned", valid_from=in_force.valid_from - timedelta(days=30)
    )
    GpuPriceFactory(pricing_table=pinned, sku=lab.price.sku, hourly_usd=Decimal("1.00"))
    lab.experiment.pricing_table = pinned
    lab.experiment.save()
    lab.run_ticks(3)
    snap = AttributionSnapshot.objects.filter(arm=lab.arms["b"]).order_by("-window_end").first()
    assert (snap.pricing_table_id, snap.pricing_valid_from) == (pinned.pk, pinned.valid_from)
