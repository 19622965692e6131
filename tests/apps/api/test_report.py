"""Report (per-arm attribution and a verdict), and staff freezing and unfreezing arms."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest

from apps.attribution.decide.verdict import Minimums, arm_verdict
from apps.attribution.models import FreezeEvent
from apps.experiments.models import Arm
from tests.apps.api.conftest import error
from tests.factories import RunFactory, arm_report

pytestmark = pytest.mark.django_db


def priced_run(arm, usd: str, tokens: int = 1_000_000, **extra):
    extra.setdefault("device_seconds", 60.0)
    return RunFactory(
        arm=arm,
        status="succeeded",
        priced_seq=10,
        last_seq=10,
        tokens=tokens,
        steps=100,
        cost_usd=Decimal(usd),
        **extra,
    )


def test_the_report_compares_each_arm_with_the_control(
    api, experiment, django_assert_max_num_queries
):
    control, candidate = experiment.arms.get(name="control"), experiment.arms.get(name="candidate")
    priced_run(control, "1.00")
    priced_run(control, "1.00")
    priced_run(candidate, "1.10")
    with django_assert_max_num_queries(12):
        body = api.get(f"/api/v1/experiments/{experiment.pk}/report/").json()
    assert body["threshold"] == 0.05 and body["window_end"] is None
    arms = {a["name"]: a for a in body["arms"]}
    assert arms["control"]["verdict"] == "control" and arms["control"][
        "usd_per_mtok"
    ] == pytest.approx(1.0)
    assert arms["candidate"]["usd_per_mtok"] == pytest.approx(1.1)
    assert arms["candidate"]["deviation"] == pytest.approx(0.10)
    assert arms["candidate"]["verdict"] == "inconclusive"  # no confidence bounds yet
    assert arms["candidate"]["runs"] == 1 and arms["control"]["runs"] == 2


def test_an_arm_without_priced_runs_has_no_data(api, experiment):
    priced_run(experiment.arms.get(name="control"), "1.00")
    arms = {
        a["name"]: a for a in api.get(f"/api/v1/experiments/{experiment.pk}/report/").json()["arms"]
    }
    assert arms["candidate"]["verdict"] == "no_data" and arms["candidate"]["deviation"] is None


BASE = arm_report(evidence_runs=10, evidence_samples=300)
CONTROL = arm_report(
    arm_id=9, name="control", is_control=True, evidence_runs=10, evidence_samples=300
)
MINIMUMS = Minimums(runs=3, samples=30, cs_runs=10)


@pytest.mark.parametrize(
    ("changes", "verdict"),
    [
        ({"is_control": True}, "control"),
        ({"state": "frozen"}, "frozen"),
        ({"deviation": None}, "no_data"),
        ({"deviation": 0.09, "deviation_low": 0.06, "deviation_high": 0.12}, "costlier"),
        ({"deviation": 0.09, "deviation_low": 0.01, "deviation_high": 0.17}, "inconclusive"),
        ({"deviation": -0.09, "deviation_low": -0.12, "deviation_high": -0.06}, "cheaper"),
        ({"deviation": 0.03, "deviation_low": -0.01, "deviation_high": 0.05}, "within_threshold"),
        # a point estimate inside the threshold is not equivalence: the bound must show it
        ({"deviation": 0.03, "deviation_low": -0.01, "deviation_high": 0.07}, "inconclusive"),
        ({"deviation": 0.03, "deviation_low": None, "deviation_high": None}, "inconclusive"),
        # the bound beyond the threshold, a minimum short: the freeze rule could not act
        (
            {"deviation": 0.25, "deviation_low": 0.19, "deviation_high": 0.31, "evidence_runs": 9},
            "inconclusive",
        ),
        (
            {
                "deviation": 0.25,
                "deviation_low": 0.19,
                "deviation_high": 0.31,
                "evidence_samples": 29,
            },
            "inconclusive",
        ),
        (
            {"deviation": -0.3, "deviation_low": -0.4, "deviation_high": -0.2, "evidence_runs": 2},
            "inconclusive",
        ),
    ],
)
def test_verdicts(changes, verdict):
    assert (
        arm_verdict(replace(BASE, **changes), control=CONTROL, threshold=0.05, minimums=MINIMUMS)
        == verdict
    )


def test_a_control_short_of_the_minimums_makes_every_verdict_inconclusive():
    dearer = replace(BASE, deviation=0.25, deviation_low=0.19, deviation_high=0.31)
    thin = replace(CONTROL, evidence_runs=4)
    assert arm_verdict(dearer, control=CONTROL, threshold=0.05, minimums=MINIMUMS) == "costlier"
    assert arm_verdict(dearer, control=thin, threshold=0.05, minimums=MINIMUMS) == "inconclusive"


def test_the_report_says_the_minimums_the_evidence_and_why_nothing_froze(api, experiment):
    from apps.attribution.services import attribution_tick

    control, candidate = experiment.arms.get(name="control"), experiment.arms.get(name="candidate")
    for i in range(3):
        priced_run(control, f"{1.00 + i * 0.001:.3f}")
        priced_run(candidate, f"{1.25 + i * 0.001:.3f}")
    attribution_tick()
    body = api.get(f"/api/v1/experiments/{experiment.pk}/report/").json()
    assert (body["min_runs_per_arm"], body["min_samples_per_arm"], body["min_cs_runs_per_arm"]) == (
        experiment.min_runs_per_arm,
        experiment.min_samples_per_arm,
        10,
    )
    arms = {a["name"]: a for a in body["arms"]}
    dearer = arms["candidate"]
    assert dearer["runs"] == 3 and dearer["evidence_runs"] == 3
    assert dearer["deviation_low"] > 0.05, "a bound past the threshold, on 3 runs"
    assert dearer["verdict"] == "inconclusive", "the freeze rule consults it from 10 runs"
    assert "'candidate' has 3 of 10 runs" in dearer["not_frozen"]
    assert arms["control"]["not_frozen"] == []


def test_staff_freeze_and_unfreeze_with_a_reason(staff, experiment):
    arm = experiment.arms.get(name="candidate")
    frozen = staff.post(
        f"/api/v1/arms/{arm.pk}/freeze/", {"reason": "OOM on every run"}, format="json"
    )
    assert frozen.status_code == 200, frozen.json()
    assert frozen.json()["action"] == "freeze" and frozen.json()["arm_state"] == "frozen"
    assert frozen.json()["evidence"]["by"] == "sam"
    arm.refresh_from_db()
    assert arm.state == "frozen" and arm.weight == 0
    again = staff.post(f"/api/v1/arms/{arm.pk}/freeze/", {"reason": "twice"}, format="json")
    assert again.status_code == 409 and error(again)["code"] == "already_frozen"
    no_reason = staff.post(f"/api/v1/arms/{arm.pk}/unfreeze/", {"reason": ""}, format="json")
    assert no_reason.status_code == 400 and "reason" in error(no_reason)["fields"]
    thawed = staff.post(
        f"/api/v1/arms/{arm.pk}/unfreeze/",
        {"reason": "fixed the loader", "weight": "0.5"},
        format="json",
    )
    assert thawed.status_code == 200 and thawed.json()["actor"] == "sam"
    arm.refresh_from_db()
    assert arm.state == "active" and arm.weight == Decimal("0.5")
    assert list(
        FreezeEvent.objects.filter(arm=arm).values_list("action", flat=True).order_by("pk")
    ) == ["freeze", "unfreeze"]


def test_members_and_tokens_cannot_freeze(api, session, experiment):
    arm = experiment.arms.get(name="candidate")
    for client in (api, session):
        response = client.post(f"/api/v1/arms/{arm.pk}/freeze/", {"reason": "nope"}, format="json")
        assert response.status_code == 403 and "staff" in error(response)["message"]
    Arm.objects.filter(pk=arm.pk).update(state="frozen", weight=0)
    assert (
        api.post(f"/api/v1/arms/{arm.pk}/unfreeze/", {"reason": "x"}, format="json").status_code
        == 403
    )
    assert not FreezeEvent.objects.exists()


def test_the_report_compares_arms_at_one_table_across_a_price_edit(api, experiment):
    """Identical runs either side of a price doubling: bills differ, the comparison does not."""
    from datetime import UTC, datetime, timedelta

    from apps.attribution.services import attribution_tick
    from tests.factories import GpuPriceFactory, GpuSkuFactory, PricingTableFactory

    t0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    sku = GpuSkuFactory()
    old = PricingTableFactory(tenant=experiment.tenant, valid_from=t0 - timedelta(days=1))
    GpuPriceFactory(pricing_table=old, sku=sku, hourly_usd=Decimal("3.00"))
    gpu_hour = {
        "gpu_sku": sku,
        "gpu_count": 1,
        "device_seconds": 3600.0,
    }  # one GPU-hour each, no energy
    for _ in range(2):
        priced_run(experiment.arms.get(name="control"), "3.00", **gpu_hour)
    assert attribution_tick(now=t0).windows == 1
    new = PricingTableFactory(tenant=experiment.tenant, valid_from=t0 + timedelta(minutes=1))
    GpuPriceFactory(pricing_table=new, sku=sku, hourly_usd=Decimal("6.00"))
    for _ in range(2):
        priced_run(experiment.arms.get(name="candidate"), "6.00", **gpu_hour)
    assert attribution_tick(now=t0 + timedelta(minutes=2)).windows == 1

    body = api.get(f"/api/v1/experiments/{experiment.pk}/report/").json()
    arms = {a["name"]: a for a in body["arms"]}
    assert body["pricing_table"]["id"] == new.pk
    assert arms["control"]["total_usd"] == pytest.approx(6.0) and arms["candidate"][
        "total_usd"
    ] == pytest.approx(12.0)
    assert (
        arms["control"]["compared_usd"] == pytest.approx(12.0) == arms["candidate"]["compared_usd"]
    )
    assert (
        arms["candidate"]["usd_per_mtok"]
        == pytest.approx(arms["control"]["usd_per_mtok"])
        == pytest.approx(6.0)
    )
    assert arms["candidate"]["deviation"] == pytest.approx(0.0, abs=1e-9)
    assert arms["candidate"]["deviation_low"] <= 0 <= arms["candidate"]["deviation_high"]


def test_every_manual_action_records_its_user_in_the_audit_row(staff, experiment):
    """Issue 24: a manual freeze recorded no actor (only evidence.by held the name), and a weight
    set by hand left no audit row at all."""
    from apps.attribution.models import FreezeEvent, WeightChange

    arm = experiment.arms.get(name="candidate")
    assert staff.patch(f"/api/v1/arms/{arm.pk}/", {"weight": "2"}, format="json").status_code == 200
    manual = WeightChange.objects.get(arm=arm, kind="manual")
    assert (manual.actor.username, manual.old_weight, manual.new_weight) == ("sam", 1, 2)
    assert (
        staff.post(f"/api/v1/arms/{arm.pk}/freeze/", {"reason": "r"}, format="json").status_code
        == 200
    )
    assert FreezeEvent.objects.get(arm=arm, action="freeze").actor.username == "sam"
    assert WeightChange.objects.get(arm=arm, kind="freeze").actor.username == "sam"
    thawed = staff.post(f"/api/v1/arms/{arm.pk}/unfreeze/", {"reason": "fixed"}, format="json")
    assert thawed.status_code == 200
    assert WeightChange.objects.get(arm=arm, kind="unfreeze").actor.username == "sam"


def test_carbon_stands_beside_the_dollars_per_arm_and_compares_with_metric_gco2e(api, experiment):
    """Issue 24, item 7: every arm shows gCO2e beside USD with its method and band, compared at
    one version's grid intensity, and ?metric=gco2e makes the comparison on carbon."""
    from datetime import UTC, datetime, timedelta

    from apps.attribution.services import attribution_tick
    from tests.factories import GpuPriceFactory, GpuSkuFactory, PricingTableFactory

    experiment.min_cs_runs_per_arm = 5
    experiment.save(update_fields=["min_cs_runs_per_arm"])
    t0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    sku = GpuSkuFactory()
    dirty = PricingTableFactory(
        tenant=experiment.tenant, valid_from=t0 - timedelta(days=1), carbon_g_per_kwh=400
    )
    GpuPriceFactory(pricing_table=dirty, sku=sku, hourly_usd=Decimal("3.00"))
    gpu = {"gpu_sku": sku, "gpu_count": 1, "device_seconds": 3600.0}

    def runs(arm: str, kwh: float, g_per_kwh: int) -> None:
        for i in range(6):  # the same dollars, energy 1 % apart run to run
            energy = kwh * 3.6e6 * (1 + 0.01 * (i - 2.5))
            carbon = energy / 3.6e6 * 1.2 * g_per_kwh
            priced_run(
                experiment.arms.get(name=arm),
                "3.00",
                energy_j=energy,
                cost_breakdown={"carbon_g": carbon, "carbon_unpriced_s": 0.0},
                **gpu,
            )

    runs("control", 1.0, 400)  # 1 kWh per 1M tokens, billed at 400 g/kWh
    assert attribution_tick(now=t0).windows == 1
    clean = PricingTableFactory(
        tenant=experiment.tenant, valid_from=t0 + timedelta(minutes=1), carbon_g_per_kwh=200
    )
    GpuPriceFactory(pricing_table=clean, sku=sku, hourly_usd=Decimal("3.00"))
    runs("candidate", 0.5, 200)  # half the energy, billed at a cleaner grid
    assert attribution_tick(now=t0 + timedelta(minutes=2)).windows == 1

    url = f"/api/v1/experiments/{experiment.pk}/report/"
    body = api.get(url).json()
    assert body["compared_on"] == "usd" and body["pricing_table"]["id"] == clean.pk
    arms = {a["name"]: a for a in body["arms"]}
    control, candidate = arms["control"], arms["candidate"]
    # As billed: 6 kWh x 1.2 x 400 g and 3 kWh x 1.2 x 200 g, measured by NVML (+-5 %).
    assert control["carbon"]["g_co2e"] == pytest.approx(2880.0)
    assert candidate["carbon"]["g_co2e"] == pytest.approx(720.0)
    assert (control["carbon"]["method"], control["carbon"]["band"]) == ("nvml", 0.05)
    assert control["carbon"]["low"] == pytest.approx(2880 * 0.95)
    # Compared at the one version (200 g/kWh): the energy halves, so does the carbon (not -75 %).
    assert control["compared_g_co2e"] == pytest.approx(1440.0)
    assert candidate["gco2e_per_mtok"] == pytest.approx(120.0)
    assert candidate["carbon_deviation"] == pytest.approx(-0.5)
    assert candidate["carbon_deviation_high"] < -0.05
    # Compared on usage priced at the one table (the fixture's bills leave energy out; the
    # comparison prices it): 1 GPU-hour at 3 USD plus 1 or 0.5 kWh x 1.2 x 0.15 USD a run.
    assert candidate["deviation"] == pytest.approx((3 + 0.09) / (3 + 0.18) - 1)
    assert candidate["verdict"] != "cheaper"

    on_carbon = api.get(url, {"metric": "gco2e"}).json()
    assert on_carbon["compared_on"] == "gco2e"
    arms = {a["name"]: a for a in on_carbon["arms"]}
    assert arms["candidate"]["metric"] == "gco2e_per_mtok"
    assert arms["control"]["metric_value"] == pytest.approx(240.0)
    assert arms["candidate"]["deviation"] == pytest.approx(-0.5)
    assert arms["candidate"]["verdict"] == "cheaper"  # the bounds exclude the threshold

    bad = api.get(url, {"metric": "kwh"})
    assert bad.status_code == 400 and "metric" in str(bad.json())
