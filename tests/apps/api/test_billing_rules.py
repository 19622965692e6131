"""The billing rules through POST /api/v1/runs/{id}/telemetry/,
one test per row of issue 13's table.

Figures are worked by hand from the README's rules: one GPU at 3.00 USD/h, electricity at
0.15 USD/kWh with PUE 1.2; 400 samples one second apart drawing 300 W (energy counter
300 J/s) bill 399 s of GPU time (billed time starts at the first sample) and 119.7 kJ:
399 / 3600 x 3.00 + 0.1197 MJ / 3.6 x 1.2 x 0.15 = 0.3325 + 0.005985 = 0.338485 USD.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
import time
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.alerts.models import AlertChannel, AlertDelivery, BudgetEvent
from apps.experiments.models import Run
from apps.pricing.models import PricingTable
from apps.telemetry.models import TelemetrySample
from apps.tenants.models import Tenant
from tests.apps.api.conftest import error
from tests.factories import GpuPriceFactory, GpuSkuFactory, PricingTableFactory, RunFactory

pytestmark = pytest.mark.django_db

T0 = timezone.now().replace(microsecond=0) - timedelta(days=1)
CLEAN_USD = Decimal("0.338485")


@pytest.fixture
def sku(experiment):
    sku = GpuSkuFactory(tdp_w=700)
    GpuPriceFactory(
        sku=sku,
        hourly_usd=Decimal("3.00"),
        pricing_table=PricingTableFactory(
            tenant=experiment.tenant, valid_from=T0 - timedelta(days=30)
        ),
    )
    return sku


def external_run(arm, sku=None, **fields):
    """A running external run created a minute before T0 (its samples' time window)."""
    fields = {"created": T0 - timedelta(minutes=1), **fields}
    return RunFactory(
        arm=arm, kind="external", status="running", gpu_sku=sku, gpu_count=1 if sku else 0, **fields
    )


@pytest.fixture
def gpu_run(experiment, sku):
    return external_run(experiment.arms.first(), sku)


def sample(s: int, t: float | None = None, **fields) -> dict:
    t = s if t is None else t
    return {
        "seq": s,
        "ts": (T0 + timedelta(seconds=t)).isoformat(),
        "step": s,
        "tokens": 100 * s,
        "power_w": 300.0,
        "energy_j": 300.0 * t,
        "util_pct": 100.0,
        **fields,
    }


def post(api, run, samples):
    return api.post(f"/api/v1/runs/{run.pk}/telemetry/", {"samples": samples}, format="json")


def totals(api, run) -> dict:
    return api.get(f"/api/v1/runs/{run.pk}/").json()


def chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


CLEAN = [sample(s) for s in range(400)]
DELIVERIES = {
    "newest first, batches of 10": chunks(CLEAN[::-1], 10),
    "batches of 100 in reverse order": chunks(CLEAN, 100)[::-1],
    "the first batch of 200 arrives last": chunks(CLEAN, 200)[::-1],
    "all shuffled, batches of 25": chunks(random.Random(7).sample(CLEAN, 400), 25),
    "every batch twice, in order": [b for b in chunks(CLEAN, 50) for _ in (0, 1)],
}


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_any_delivery_bills_what_in_order_delivery_bills(api, gpu_run, delivery):
    for batch in DELIVERIES[delivery]:
        assert post(api, gpu_run, batch).status_code == 200
    run = totals(api, gpu_run)
    assert Decimal(run["cost_usd"]) == CLEAN_USD
    assert run["device_seconds"] == pytest.approx(399.0)
    assert run["energy_j"] == pytest.approx(119_700.0)
    assert run["tokens"] == 39_900
    finished = api.post(
        f"/api/v1/runs/{gpu_run.pk}/finish/", {"status": "succeeded"}, format="json"
    ).json()
    assert Decimal(finished["cost_usd"]) == CLEAN_USD


def test_a_timestamp_behind_its_neighbours_is_pulled_up_and_every_sample_stored(api, gpu_run):
    """Issue 45: a stamp out of line with its neighbours no longer refuses its batch (the SDK
    drops a refused batch: data lost); order within a run is by seq, the stamp moves."""
    assert post(api, gpu_run, CLEAN[:200]).status_code == 200
    late = [dict(s) for s in CLEAN[200:]]
    late[50] = sample(250, t=250 - 60, energy_j=300.0 * 250)  # 60 s behind seq 249 and 251
    assert post(api, gpu_run, late).status_code == 200
    assert TelemetrySample.objects.filter(run=gpu_run).count() == 400
    stamp = TelemetrySample.objects.get(run=gpu_run, seq=250).ts
    assert stamp == TelemetrySample.objects.get(run=gpu_run, seq=249).ts  # pulled up to it
    assert Decimal(totals(api, gpu_run)["cost_usd"]) == CLEAN_USD
    # A straggler timed before the sample stored below it: a duplicate seq, stored once.
    assert post(api, gpu_run, [sample(200, t=150, energy_j=300.0 * 200)]).status_code == 200
    assert Decimal(totals(api, gpu_run)["cost_usd"]) == CLEAN_USD


def test_time_is_split_at_a_price_table_starting_inside_a_gap(api, experiment, sku, gpu_run):
    # 10 samples (t = 0..9), a 3601 s gap, 10 more (t = 3610..3619); 6.00 USD/h from t = 1809.
    GpuPriceFactory(
        sku=sku,
        hourly_usd=Decimal("6.00"),
        pricing_table=PricingTableFactory(
            tenant=experiment.tenant, valid_from=T0 + timedelta(seconds=1809)
        ),
    )
    samples = [sample(s) for s in range(10)] + [sample(s, t=3600 + s) for s in range(10, 20)]
    assert post(api, gpu_run, samples[::-1]).status_code == 200
    # 1809 s at 3.00 USD/h + 1810 s at 6.00 USD/h + 3619 s x 300 W x 1.2 x 0.15 USD/kWh
    expected = 1809 / 3600 * 3.0 + 1810 / 3600 * 6.0 + 3619 * 300 / 3.6e6 * 1.2 * 0.15
    assert (
        Decimal(totals(api, gpu_run)["cost_usd"])
        == Decimal("4.578452")
        == round(Decimal(expected), 6)
    )


def test_a_gpu_run_without_power_has_its_energy_modelled_and_flagged(api, gpu_run):
    samples = [
        {"seq": s, "ts": (T0 + timedelta(seconds=s)).isoformat(), "util_pct": 50.0}
        for s in range(101)
    ]
    assert post(api, gpu_run, samples).status_code == 200
    run = totals(api, gpu_run)
    # 700 W board power x 50 % busy x 100 s = 35 kJ; 100 s x 3.00 USD/h + 35 kJ x 1.2 x 0.15
    # USD/kWh.
    assert run["energy_j"] == pytest.approx(35_000.0) and run["energy_estimated"] is True
    assert Decimal(run["cost_usd"]) == round(
        Decimal(100 / 3600 * 3.0 + 35_000 / 3.6e6 * 1.2 * 0.15), 6
    )


@pytest.mark.parametrize(
    "bad, where",
    [
        ({"micro_batch": 2147483648}, "samples[1].micro_batch"),
        ({"tokens": 9223372036854775808}, "samples[1].tokens"),
        ({"device": "cuda:0\x00"}, "samples[1].device"),
        ({"power_w": 1e308}, "samples[1].power_w"),
        ({"power_w": 5e-324}, "samples[1].power_w"),
        ({"power": 300.0}, "samples[1].power"),
        ({"seq": True}, "samples[1].seq"),
        ({"step": 2.5}, "samples[1].step"),
    ],
)
def test_a_bad_sample_is_refused_naming_index_and_field(api, gpu_run, bad, where):
    samples = [sample(0), {**sample(1), **bad}, sample(2)]
    response = post(api, gpu_run, samples)
    assert response.status_code == 400, response.content
    assert error(response)["message"].startswith(f"{where}:")
    assert not TelemetrySample.objects.filter(run=gpu_run).exists()
    assert Run.objects.get(pk=gpu_run.pk).cost_usd == 0


@pytest.mark.parametrize(
    ("ts", "side"),
    [("2100-01-01T00:00:00Z", "ahead of the server's clock"), ("-3d", "before the run started")],
)
def test_a_sample_outside_the_time_window_is_refused_alone(api, gpu_run, ts, side):
    stamp = (T0 - timedelta(days=3)).isoformat() if ts == "-3d" else ts
    response = post(api, gpu_run, [sample(0), {**sample(1), "ts": stamp}, sample(2)])
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["received"], body["inserted"], body["duplicates"]) == (3, 2, 0)
    [refused] = body["refused"]
    assert (refused["index"], refused["seq"], refused["field"]) == (1, 1, "samples[1].ts")
    assert side in refused["reason"]
    assert sorted(TelemetrySample.objects.filter(run=gpu_run).values_list("seq", flat=True)) == [
        0,
        2,
    ]


def test_one_forward_stamped_sample_does_not_hold_the_run_hostage(api, experiment, sku):
    """Issue 24: seq 100 stamped now + 250 s made every later batch a 400 until the clock caught
    up, and the bill counted 450 s for about 199 s of training."""
    run = RunFactory(
        arm=experiment.arms.first(), kind="external", status="running", gpu_sku=sku, gpu_count=1
    )
    base = timezone.now() - timedelta(seconds=250)
    real = [{**sample(s), "ts": (base + timedelta(seconds=s)).isoformat()} for s in range(200)]
    assert post(api, run, real[:100]).status_code == 200
    glitch = {**real[100], "ts": (timezone.now() + timedelta(seconds=250)).isoformat()}
    answer = post(api, run, [glitch])
    assert answer.status_code == 200 and answer.json()["refused"][0]["seq"] == 100
    later = post(api, run, real[101:])
    assert later.status_code == 200 and later.json()["inserted"] == 99, later.content
    assert post(api, run, [real[100]]).status_code == 200  # resent with its true stamp
    billed = totals(api, run)
    assert billed["device_seconds"] == pytest.approx(199.0)
    assert billed["tokens"] == 19_900 and billed["unpriced"] == {}


def test_an_external_run_declares_when_it_started_for_a_historical_upload(api, experiment, sku):
    week_ago = timezone.now() - timedelta(days=7)
    body = {"experiment": experiment.pk, "kind": "external", "gpu_sku": sku.name}
    future = api.post(
        "/api/v1/runs/",
        {**body, "started_at": (timezone.now() + timedelta(hours=1)).isoformat()},
        format="json",
    )
    assert future.status_code == 400 and error(future)["message"].startswith("started_at:")
    ancient = api.post(
        "/api/v1/runs/", {**body, "started_at": "2001-01-01T00:00:00Z"}, format="json"
    )
    assert ancient.status_code == 400 and "before any price" in error(ancient)["message"]
    created = api.post("/api/v1/runs/", {**body, "started_at": week_ago.isoformat()}, format="json")
    assert created.status_code == 201, created.content
    run = Run.objects.get(pk=created.json()["id"])
    old = [{**sample(s), "ts": (week_ago + timedelta(seconds=s)).isoformat()} for s in range(50)]
    answer = post(api, run, old)
    assert answer.status_code == 200 and answer.json()["inserted"] == 50, answer.content
    assert totals(api, run)["device_seconds"] == pytest.approx(49.0)
    worker = api.post(
        "/api/v1/runs/",
        {"experiment": experiment.pk, "started_at": week_ago.isoformat()},
        format="json",
    )
    assert worker.status_code == 400 and error(worker)["message"].startswith("started_at:")


def test_a_realistic_batch_up_to_the_ingest_cap_is_accepted(api, gpu_run, settings):
    # 10,000 samples with every field: over Django's default 2.5 MiB, under the 8 MiB cap.
    samples = [
        sample(
            s,
            t=s * 0.1,
            device="cuda:0 NVIDIA H200 141GB HBM3e",
            mem_used_mb=70_000.5,
            mem_total_mb=143_771.0,
            step_time_s=0.1,
            tokens_per_s=40_960.0,
            micro_batch=8,
            loss=2.5,
            overlap_ratio=0.8,
            mfu=0.41,
            sm_clock_mhz=1980.0,
            temperature_c=61.0,
            estimated=False,
        )
        for s in range(10_000)
    ]
    body = json.dumps({"samples": samples})
    assert 2.5 * 1024 * 1024 < len(body) < settings.COSTLAB_API_MAX_INGEST_BODY_BYTES
    response = api.post(
        f"/api/v1/runs/{gpu_run.pk}/telemetry/", body, content_type="application/json"
    )
    assert response.status_code == 200 and response.json()["inserted"] == 10_000


def test_an_external_run_declares_vcpus_and_memory_and_completes_in_its_telemetry_span(
    api, experiment, sku
):
    submitted = api.post(
        "/api/v1/runs/",
        {
            "experiment": experiment.pk,
            "arm": experiment.arms.first().pk,
            "kind": "external",
            "vcpus": 8,
            "memory_gb": 32.0,
        },
        format="json",
    )
    assert submitted.status_code == 201, submitted.content
    run = Run.objects.get(pk=submitted.json()["id"])
    assert (submitted.json()["vcpus"], submitted.json()["memory_gb"]) == (8, 32.0)
    Run.objects.filter(pk=run.pk).update(created_at=T0 - timedelta(minutes=1))
    samples = [
        {"seq": s, "ts": (T0 + timedelta(seconds=s * 0.5)).isoformat()} for s in range(3799)
    ]  # 1899 s
    for batch in chunks(samples, 1000)[::-1]:
        assert post(api, run, batch).status_code == 200
    finished = api.post(
        f"/api/v1/runs/{run.pk}/finish/", {"status": "succeeded"}, format="json"
    ).json()
    # 1899 s x (8 vCPU x 0.04 USD/h + 32 GB x 0.005 USD/h) = 1899 / 3600 x 0.48
    assert (
        Decimal(finished["cost_usd"]) == round(Decimal(1899 * 0.48 / 3600), 6) == Decimal("0.2532")
    )
    report = api.get(f"/api/v1/experiments/{experiment.pk}/report/").json()
    arm = next(a for a in report["arms"] if a["name"] == "control")
    assert arm["completion_s"] == pytest.approx(1899.0)  # not the seconds between submit and finish


def test_only_an_external_run_declares_its_vcpus(api, experiment):
    refused = api.post("/api/v1/runs/", {"experiment": experiment.pk, "vcpus": 8}, format="json")
    assert refused.status_code == 400 and error(refused)["message"].startswith("vcpus:")


def test_every_projected_figure_is_marked_estimated(api, experiment, sku, gpu_run):
    experiment.target_steps = 1000
    experiment.save(update_fields=["target_steps"])
    assert post(api, gpu_run, CLEAN[:100]).status_code == 200
    api.post(f"/api/v1/runs/{gpu_run.pk}/finish/", {"status": "succeeded"}, format="json")
    arm = next(
        a
        for a in api.get(f"/api/v1/experiments/{experiment.pk}/report/").json()["arms"]
        if a["is_control"]
    )
    assert arm["projected"]["estimated"] is True and arm["projected"]["target_steps"] == 1000
    # 99 steps measured over 99 s: 1000 steps take 1000 s.
    assert arm["projected"]["completion_s"] == pytest.approx(1000.0)


def test_a_price_edit_of_a_table_in_force_starts_a_new_version_and_history_stands(
    api, staff, sku, gpu_run
):
    table = PricingTable.objects.get(gpu_prices__sku=sku)
    assert post(api, gpu_run, CLEAN[:200]).status_code == 200  # a day ago, at 3.00 USD/h
    before = Run.objects.get(pk=gpu_run.pk).cost_usd
    renamed = staff.patch(
        f"/api/v1/pricing-tables/{table.pk}/", {"name": "list prices"}, format="json"
    ).json()
    assert (
        renamed["id"] == table.pk and PricingTable.objects.count() == 1
    )  # no price moved: edited in place
    edited = staff.patch(
        f"/api/v1/pricing-tables/{table.pk}/",
        {"gpu_prices": [{"sku": sku.name, "hourly_usd": "6.00"}]},
        format="json",
    )
    # A new version answers, from now; the table patched keeps its prices and its start, so
    # whatever was priced with it (this bill, attribution's windows) stays as it was.
    assert edited.status_code == 201, edited.content
    version = edited.json()
    assert version["id"] != table.pk and version["supersedes"] == table.pk
    assert edited["Location"].endswith(f"/api/v1/pricing-tables/{version['id']}/")
    assert timezone.now() - timedelta(minutes=1) < datetime.fromisoformat(version["valid_from"])
    assert version["gpu_prices"] == [{"sku": sku.name, "hourly_usd": "6.000000"}]
    table.refresh_from_db()
    assert table.gpu_prices.get().hourly_usd == Decimal("3.00") and table.name == "list prices"
    assert staff.get(f"/api/v1/pricing-tables/{table.pk}/").json()["supersedes"] is None
    again = staff.patch(f"/api/v1/pricing-tables/{table.pk}/", {"pue": "1.5"}, format="json")
    assert again.status_code == 409 and error(again)["message"].startswith(
        f"pricing table {table.pk}: superseded by version {version['id']}"
    )
    finished = api.post(
        f"/api/v1/runs/{gpu_run.pk}/finish/", {"status": "succeeded"}, format="json"
    ).json()
    # 199 s at 3.00 USD/h + 59.7 kJ x 1.2 x 0.15 USD/kWh, as billed before the edit.
    assert (
        Decimal(finished["cost_usd"])
        == before
        == round(Decimal(199 / 3600 * 3.0 + 59_700 / 3.6e6 * 0.18), 6)
    )
    moved = staff.patch(
        f"/api/v1/pricing-tables/{table.pk}/", {"valid_from": "2020-01-01T00:00:00Z"}, format="json"
    )
    assert moved.status_code == 409 and error(moved)["message"].startswith("valid_from:")


def test_a_finished_run_is_re_priced_only_deliberately_and_the_act_is_audited(
    api, staff, experiment, sku, gpu_run
):
    assert post(api, gpu_run, CLEAN[:200]).status_code == 200
    url = f"/api/v1/runs/{gpu_run.pk}/reprice/"
    assert (
        staff.post(url, {"reason": "new list"}, format="json").status_code == 409
    )  # still running
    api.post(f"/api/v1/runs/{gpu_run.pk}/finish/", {"status": "succeeded"}, format="json")
    before = Run.objects.get(pk=gpu_run.pk).cost_usd
    newer = PricingTableFactory(
        tenant=experiment.tenant,
        valid_from=timezone.now() + timedelta(days=1),
        electricity_usd_per_kwh=Decimal("0.15"),
    )
    GpuPriceFactory(pricing_table=newer, sku=sku, hourly_usd=Decimal("6.00"))
    assert api.post(url, {"reason": "x"}, format="json").status_code == 403  # tokens cannot
    assert error(staff.post(url, {"reason": " "}, format="json"))["message"].startswith("reason:")
    done = staff.post(url, {"reason": "2027 list prices", "pricing_table": newer.pk}, format="json")
    assert done.status_code == 201, done.content
    # 199 s at 6.00 USD/h + 59.7 kJ x 1.2 x 0.15 USD/kWh
    after = round(Decimal(199 / 3600 * 6.0 + 59_700 / 3.6e6 * 0.18), 6)
    body = done.json()
    assert (Decimal(body["cost_before_usd"]), Decimal(body["cost_after_usd"])) == (before, after)
    assert body["actor"] == "sam" and body["reason"] == "2027 list prices"
    assert Run.objects.get(pk=gpu_run.pk).cost_usd == after
    again = staff.post(url, {"reason": "back to the prices it ran under"}, format="json").json()
    assert Decimal(again["cost_after_usd"]) == before


def test_a_retroactive_table_prices_an_open_run_only_from_its_posting(api, staff, experiment, sku):
    """Issue 24: 40 samples, then a table valid from 50 s ago at 10x the GPU price, then 20 more
    read $38.24, and $80.00 after finish: the open run's past was re-billed silently. It now
    prices the open run from the moment it was posted; its valid_from reaches the run's past only
    through an explicit re-price, audited."""
    start = timezone.now().replace(microsecond=0) - timedelta(seconds=45)
    run = external_run(experiment.arms.first(), sku, created=start - timedelta(seconds=5))
    finished = external_run(experiment.arms.first(), sku, created=start - timedelta(seconds=5))

    def at(s: int, t: datetime) -> dict:
        return {**sample(s), "ts": t.isoformat(), "energy_j": 300.0 * s}

    first = [at(s, start + timedelta(seconds=s)) for s in range(40)]
    assert post(api, run, first).status_code == 200
    assert post(api, finished, first).status_code == 200
    api.post(f"/api/v1/runs/{finished.pk}/finish/", {"status": "succeeded"}, format="json")
    finished_bill = Run.objects.get(pk=finished.pk).cost_usd
    valid_from = start + timedelta(seconds=5)
    answer = staff.post(
        "/api/v1/pricing-tables/",
        {
            "name": "10x, backdated",
            "valid_from": valid_from.isoformat(),
            "electricity_usd_per_kwh": "0.15",
            "pue": "1.20",
            "gpu_prices": [{"sku": sku.name, "hourly_usd": "30.00"}],
        },
        format="json",
    )
    assert answer.status_code == 201, answer.content
    assert answer.json()["retroactive"] is True  # the answer says so
    posted = datetime.fromisoformat(answer.json()["created_at"])
    later = [at(s, posted + timedelta(seconds=0.5 * (s - 39))) for s in range(40, 60)]
    assert post(api, run, later).status_code == 200
    last = posted + timedelta(seconds=10)

    def gpu_usd(cheap_until: datetime) -> float:
        # 3.00 USD/h from the first sample until cheap_until, 30.00 USD/h from then to the last
        return (cheap_until - start).total_seconds() / 3600 * 3.0 + (
            last - cheap_until
        ).total_seconds() / 3600 * 30.0

    def billed() -> float:
        return Run.objects.get(pk=run.pk).cost_breakdown["gpu_usd"]

    assert billed() == pytest.approx(gpu_usd(posted), rel=1e-6)  # 10x only from its posting
    api.post(f"/api/v1/runs/{run.pk}/finish/", {"status": "succeeded"}, format="json")
    assert billed() == pytest.approx(gpu_usd(posted), rel=1e-6)  # finish moves nothing
    assert Run.objects.get(pk=finished.pk).cost_usd == finished_bill  # nor a finished run
    # The explicit re-price applies it from its valid_from, and is kept with its actor.
    for done in (finished, run):
        redo = staff.post(
            f"/api/v1/runs/{done.pk}/reprice/", {"reason": "backdated list"}, format="json"
        )
        assert redo.status_code == 201, redo.content
        assert redo.json()["actor"] == "sam"
        assert Decimal(redo.json()["cost_after_usd"]) > Decimal(redo.json()["cost_before_usd"])
    assert billed() == pytest.approx(gpu_usd(valid_from), rel=1e-6)
    assert Run.objects.get(pk=finished.pk).cost_breakdown["gpu_usd"] == pytest.approx(
        5 / 3600 * 3.0 + 34 / 3600 * 30.0, rel=1e-6
    )


def test_identical_runs_either_side_of_a_patch_of_the_table_in_force_compare_equal(
    api, staff, experiment, sku
):
    """Issue 24: the H100 price of the table in force doubled with PATCH between two arms'
    identical runs read +99.8 % "costlier" (the edit moved the table's id to the new prices
    under the control's windows)."""
    from apps.attribution.services import attribution_tick

    table = PricingTable.objects.get(gpu_prices__sku=sku)
    arms = {arm.name: arm for arm in experiment.arms.all()}

    def trained(arm, start) -> Run:
        """200 samples 10 ms apart from `start` (2 s of training at 300 W), then finished."""
        run = RunFactory(
            arm=arm, kind="external", status="running", gpu_sku=sku, gpu_count=1, created=start
        )
        batch = [
            {**sample(s, t=s * 0.01), "ts": (start + timedelta(seconds=s * 0.01)).isoformat()}
            for s in range(200)
        ]
        assert post(api, run, batch).status_code == 200
        api.post(f"/api/v1/runs/{run.pk}/finish/", {"status": "succeeded"}, format="json")
        return run

    control = [trained(arms["control"], T0) for _ in range(3)]
    assert attribution_tick(now=timezone.now()).windows == 1
    doubled = staff.patch(
        f"/api/v1/pricing-tables/{table.pk}/",
        {
            "gpu_prices": [{"sku": sku.name, "hourly_usd": "6.00"}],
            "electricity_usd_per_kwh": str(table.electricity_usd_per_kwh * 2),
        },
        format="json",
    )
    assert doubled.status_code == 201, doubled.content
    edited_at = datetime.fromisoformat(doubled.json()["valid_from"])
    time.sleep(max(0.0, (edited_at + timedelta(seconds=2.1) - timezone.now()).total_seconds()))
    candidate = [trained(arms["candidate"], edited_at) for _ in range(3)]  # under the new prices
    assert attribution_tick(now=timezone.now() + timedelta(minutes=5)).windows == 1
    report = api.get(f"/api/v1/experiments/{experiment.pk}/report/").json()
    by_name = {arm["name"]: arm for arm in report["arms"]}
    assert by_name["candidate"]["deviation"] == pytest.approx(0.0, abs=0.005), by_name
    assert by_name["candidate"]["verdict"] != "costlier"
    # Each bill is still priced by the version in force when it ran: the candidate's doubled.
    [control_bill] = {Run.objects.get(pk=r.pk).cost_usd for r in control}
    [candidate_bill] = {Run.objects.get(pk=r.pk).cost_usd for r in candidate}
    assert control_bill == round(Decimal(1.99 / 3600 * 3.0 + 597 / 3.6e6 * 0.18), 6)
    assert candidate_bill == 2 * control_bill


def test_a_table_without_the_runs_sku_never_bills_its_gpu_time_as_zero(api, staff, sku, gpu_run):
    """Issue 24: a table posted with no gpu_prices and a past valid_from billed an H100 run's
    0.833 GPU-h as gpu_usd 0.0, unflagged."""
    table = {
        "name": "no GPUs",
        "valid_from": (T0 - timedelta(hours=1)).isoformat(),
        "electricity_usd_per_kwh": "0.15",
        "pue": "1.20",
    }
    refused = staff.post("/api/v1/pricing-tables/", table, format="json")
    assert refused.status_code == 409, refused.content
    assert error(refused)["message"].startswith(
        f"gpu_prices: no price for {sku.name} (1 running or recent runs)"
    )
    assert not PricingTable.objects.filter(name="no GPUs").exists()  # nothing saved
    confirmed = staff.post(
        "/api/v1/pricing-tables/", {**table, "confirm_unpriced": True}, format="json"
    )
    assert confirmed.status_code == 201, confirmed.content
    # The table is retroactive for gpu_run, open since before it was posted: it prices that
    # run's past not at all (issue 24, item 3), so its GPU time keeps the old price.
    assert post(api, gpu_run, CLEAN[:200]).status_code == 200
    assert totals(api, gpu_run)["unpriced"] == {}
    # Runs opened after it (historical uploads declaring when they started) are priced by it.
    fresh = external_run(
        gpu_run.arm, sku, created=timezone.now(), started_at=T0 - timedelta(minutes=1)
    )
    assert post(api, fresh, CLEAN[:200]).status_code == 200
    run = totals(api, fresh)
    assert run["unpriced"] == {"gpu": pytest.approx(199.0)}
    assert run["cost_breakdown"]["gpu_usd"] is None  # unpriced, not $0
    assert run["cost_breakdown"]["energy_usd"] > 0  # the table prices energy
    # Order does not matter: the same samples in reverse arrive at the same figures.
    again = external_run(
        gpu_run.arm, sku, created=timezone.now(), started_at=T0 - timedelta(minutes=1)
    )
    for batch in reversed(chunks(CLEAN[:200], 50)):
        answer = post(api, again, batch)
        assert answer.status_code == 200, answer.content
    assert totals(api, again)["unpriced"] == run["unpriced"]
    assert Decimal(totals(api, again)["cost_usd"]) == Decimal(run["cost_usd"])


def test_before_the_first_table_every_component_is_unpriced(api, experiment):
    cpu_run = external_run(experiment.arms.first(), vcpus=4, memory_gb=8)
    assert post(api, cpu_run, CLEAN[:20]).status_code == 200  # the tenant has no table at all
    run = totals(api, cpu_run)
    assert set(run["unpriced"]) == {"energy", "vcpu", "memory"}  # a CPU run uses no GPU time
    assert run["cost_breakdown"]["cpu_usd"] is None and run["cost_breakdown"]["energy_usd"] is None


def test_a_counter_that_decreases_within_an_attempt_is_refused_unless_reset(api, gpu_run):
    """Issue 24: tokens 240 then 140 in one attempt were silently taken as a reset."""
    first = post(api, gpu_run, [sample(0), sample(1), sample(2, tokens=240)])
    assert first.status_code == 200
    dropped = post(api, gpu_run, [sample(3, tokens=140), sample(4, tokens=400)])
    assert dropped.status_code == 200, dropped.content
    [refused] = dropped.json()["refused"]
    assert refused["seq"] == 3 and refused["field"] == "samples[0].tokens"
    assert "never decreases" in refused["reason"] and "counter_reset" in refused["reason"]
    # Inside one batch too, and a sample that says its counters restarted is taken.
    within = post(
        api,
        gpu_run,
        [sample(5, tokens=500), sample(6, tokens=10), sample(7, tokens=20, counter_reset=True)],
    )
    assert [r["seq"] for r in within.json()["refused"]] == [6]
    stored = TelemetrySample.objects.filter(run=gpu_run).values_list("seq", flat=True)
    assert sorted(stored) == [0, 1, 2, 4, 5, 7]


def test_the_budget_acts_as_the_bill_moves(
    api, experiment, sku, gpu_run, django_capture_on_commit_callbacks
):
    """Issue 24: with a $1 budget an external run streamed on to $1.113 and nothing stopped or
    warned; the budget was checked only at submit."""
    Tenant.objects.filter(pk=experiment.tenant_id).update(monthly_budget_usd=Decimal("1.00"))
    stream = [sample(s) for s in range(1300)]  # 0.000848 USD a second
    with django_capture_on_commit_callbacks(execute=True):
        assert post(api, gpu_run, stream[:1000]).status_code == 200  # 999 s: 0.85 USD
    tenant = Tenant.objects.get(pk=experiment.tenant_id)
    assert tenant.budget_state == "warned"
    run = totals(api, gpu_run)
    assert (
        "80 % of the monthly budget is reached" in run["notes"]
        and "0.85 of 1.00 USD" in run["notes"]
    )
    with django_capture_on_commit_callbacks(execute=True):
        assert post(api, gpu_run, stream[1000:1100]).status_code == 200  # still 0.93: no repeat
    assert totals(api, gpu_run)["notes"].count("80 %") == 1
    with django_capture_on_commit_callbacks(execute=True):
        assert post(api, gpu_run, stream[1100:]).status_code == 200  # 1299 s: 1.10 USD
    assert Tenant.objects.get(pk=experiment.tenant_id).budget_state == "exceeded"
    assert "the budget is spent; stop this run" in totals(api, gpu_run)["notes"]  # flagged
    refused = api.post(
        "/api/v1/runs/", {"experiment": experiment.pk, "kind": "external"}, format="json"
    )
    assert refused.status_code == 400 and error(refused)["code"] == "budget_exceeded"
    # A tenant without alert channels: both steps are recorded, nothing is delivered.
    assert sorted(BudgetEvent.objects.values_list("state", flat=True)) == ["exceeded", "warned"]
    assert not AlertDelivery.objects.exists()


def _month_sums(queries) -> int:
    return sum('SUM("experiments_run"."cost_usd")' in q["sql"] for q in queries)


@pytest.mark.parametrize("redis", ["up", "unreachable"])
def test_the_budget_check_sums_the_tenants_runs_only_near_a_step(
    api, experiment, gpu_run, django_capture_on_commit_callbacks, settings, redis
):
    """Summing every run of the tenant after every priced batch took most of Postgres at fleet
    scale (bench/fleet.py). A batch moves a shared estimate; the sum runs where the estimate could
    mean another budget state, where there is none yet, or where Redis cannot be reached."""
    if redis == "unreachable":
        settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens there
    Tenant.objects.filter(pk=experiment.tenant_id).update(monthly_budget_usd=Decimal("1.00"))
    stream = [sample(s) for s in range(1000)]  # 0.000848 USD a second: 0.85 USD in all
    sums, tenant_reads = [], []
    for lo, hi in ((0, 100), (100, 300), (300, 500), (500, 700), (700, 1000)):
        with (
            CaptureQueriesContext(connection) as queries,
            django_capture_on_commit_callbacks(execute=True),
        ):
            assert post(api, gpu_run, stream[lo:hi]).status_code == 200
        sums.append(_month_sums(queries.captured_queries))
        tenant_reads.append(
            sum('FROM "tenants_tenant"' in q["sql"] for q in queries.captured_queries)
        )
    if redis == "up":
        assert sums == [1, 0, 0, 0, 1], "the first batch seeds the estimate; the last nears 80 %"
        # Away from a step the check reads no tenant row: its budget came with the run's read.
        assert tenant_reads[1:4] == [0, 0, 0], tenant_reads
    else:
        assert sums == [1, 1, 1, 1, 1]
    assert Tenant.objects.get(pk=experiment.tenant_id).budget_state == "warned"
    assert BudgetEvent.objects.get().state == "warned"


def test_the_budget_steps_are_alerted_to_the_tenant_wide_channels(
    api,
    experiment,
    sku,
    gpu_run,
    other_tenant,
    receiver,
    eager_delivery,
    django_capture_on_commit_callbacks,
):
    """Issue 24: "At 80 %, warn: an alert, and a note on the run"; the stop at 100 % alerts too.
    Once per step: the batches in between send nothing."""
    tenant = experiment.tenant
    Tenant.objects.filter(pk=tenant.pk).update(monthly_budget_usd=Decimal("1.00"))
    AlertChannel.objects.create(
        tenant=tenant, name="finance", webhook_url=receiver.url, webhook_secret="s3cret"
    )
    # An experiment's channel gets its freezes, not the tenant's budget; nor does another tenant's.
    AlertChannel.objects.create(
        tenant=tenant, experiment=experiment, name="ml", email_recipients="ml@example.com"
    )
    AlertChannel.objects.create(tenant=other_tenant, name="globex", webhook_url=receiver.url)
    worker = RunFactory(arm=gpu_run.arm, kind="worker", status="running")
    stream = [sample(s) for s in range(1300)]

    def batch(samples) -> Decimal:
        with django_capture_on_commit_callbacks(execute=True):
            assert post(api, gpu_run, samples).status_code == 200
        return Decimal(totals(api, gpu_run)["cost_usd"])  # the month's spend: the only cost

    warned_at = batch(stream[:1000])  # 0.85 USD
    assert [r["body"]["event"] for r in receiver.requests] == ["budget_warned"]
    batch(stream[1000:1100])  # 0.93: still warned
    assert len(receiver.requests) == 1
    exceeded_at = batch(stream[1100:])  # 1.10 USD
    batch([sample(1300)])  # and on: still exceeded
    assert [r["status"] for r in receiver.requests] == [200, 200]
    warned, exceeded = (r["body"] for r in receiver.requests)
    month = f"{timezone.now():%Y-%m}"
    for body, state, spend, runs in (
        (
            warned,
            "warned",
            warned_at,
            {"noted": [gpu_run.pk, worker.pk], "cancelled": [], "flagged": []},
        ),
        (
            exceeded,
            "exceeded",
            exceeded_at,
            {"noted": [], "cancelled": [worker.pk], "flagged": [gpu_run.pk]},
        ),
    ):
        event = BudgetEvent.objects.get(tenant=tenant, state=state)
        assert body["kind"] == "budget" and body["event"] == f"budget_{state}"
        assert (body["event_id"], body["tenant"], body["state"], body["month"]) == (
            event.pk,
            "acme",
            state,
            month,
        )
        assert Decimal(body["spend_usd"]) == spend and body["budget_usd"] == "1.00"
        assert body["share"] == round(float(spend), 4)
        assert body["runs"] == runs and f"{spend:.2f} of 1.00 USD" in body["reason"]
    assert "80 % of the monthly budget" in warned["reason"]
    assert "runs stop at their next step" in exceeded["reason"]
    for request in receiver.requests:  # signed with the channel's secret
        signed = json.dumps(request["body"], sort_keys=True).encode()
        expected = "sha256=" + hmac.new(b"s3cret", signed, hashlib.sha256).hexdigest()
        assert request["headers"]["X-Costlab-Signature"] == expected
    deliveries = AlertDelivery.objects.order_by("pk")
    assert [(d.budget_event.state, d.kind, d.status) for d in deliveries] == [
        ("warned", "webhook", "sent"),
        ("exceeded", "webhook", "sent"),
    ]
    assert mail.outbox == [] and not BudgetEvent.objects.filter(tenant=other_tenant).exists()


def test_carbon_stands_beside_the_dollars_with_its_method_and_band(api, staff, sku, gpu_run):
    table = PricingTable.objects.get(gpu_prices__sku=sku)
    assert post(api, gpu_run, CLEAN[:200]).status_code == 200
    unknown = totals(api, gpu_run)["carbon"]
    assert unknown["unpriced"] is True and unknown["g_co2e"] is None  # no intensity: not 0
    assert totals(api, gpu_run)["unpriced"] == {}  # carbon is not money: the bill is complete
    # The grid intensity is versioned like a price: setting it makes a new version from now.
    PricingTable.objects.filter(pk=table.pk).update(carbon_g_per_kwh=Decimal("400"))
    other = external_run(gpu_run.arm, sku)
    assert post(api, other, CLEAN[:200]).status_code == 200
    carbon = totals(api, other)["carbon"]
    # 59.7 kJ = 0.016583 kWh, x PUE 1.2 x 400 g: 7.96 gCO2e, measured by the energy counter.
    assert carbon["g_co2e"] == pytest.approx(59_700 / 3.6e6 * 1.2 * 400, rel=1e-6)
    assert (carbon["method"], carbon["band"], carbon["unpriced"]) == ("nvml", 0.05, False)
    assert carbon["low"] == pytest.approx(carbon["g_co2e"] * 0.95, rel=1e-3)
    edit = staff.patch(
        f"/api/v1/pricing-tables/{table.pk}/", {"carbon_g_per_kwh": "250"}, format="json"
    )
    assert edit.status_code == 201 and edit.json()["supersedes"] == table.pk
