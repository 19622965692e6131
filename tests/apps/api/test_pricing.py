"""Pricing tables and cost models: members and tokens read, staff (in a session) write."""

from __future__ import annotations

import pytest

from apps.pricing.models import CostModel, PricingTable
from tests.apps.api.conftest import error
from tests.factories import GpuPriceFactory, GpuSkuFactory, PricingTableFactory

pytestmark = pytest.mark.django_db

TABLE = {
    "name": "2026 list prices",
    "valid_from": "2026-04-01T00:00:00Z",
    "electricity_usd_per_kwh": "0.12",
    "pue": "1.3",
    "gpu_prices": [{"sku": "H100 SXM", "hourly_usd": "2.50"}],
}


def test_members_and_tokens_read_prices_with_gpu_rates(
    api, session, tenant, django_assert_max_num_queries
):
    for _ in range(3):
        GpuPriceFactory(pricing_table=PricingTableFactory(tenant=tenant))
    with django_assert_max_num_queries(
        6
    ):  # token, last_used_at, count, page, prices, SKUs: not one per table
        body = api.get("/api/v1/pricing-tables/").json()
    assert body["count"] == 3 and body["results"][0]["gpu_prices"][0]["hourly_usd"] == "3.000000"
    assert session.get("/api/v1/pricing-tables/").status_code == 200
    assert api.get("/api/v1/gpu-skus/").json()["count"] == 3


def test_members_and_tokens_cannot_write_prices(api, session, tenant):
    GpuSkuFactory(name="H100 SXM")
    for client in (api, session):
        response = client.post("/api/v1/pricing-tables/", TABLE, format="json")
        assert response.status_code == 403 and "staff" in error(response)["message"]
        assert client.post("/api/v1/cost-models/", {"name": "x"}, format="json").status_code == 403
    table = PricingTableFactory(tenant=tenant)
    assert (
        api.patch(f"/api/v1/pricing-tables/{table.pk}/", {"pue": "2"}, format="json").status_code
        == 403
    )
    assert api.delete(f"/api/v1/pricing-tables/{table.pk}/").status_code == 403
    assert PricingTable.objects.count() == 1


def test_staff_write_a_pricing_table_with_its_gpu_prices(staff, tenant):
    GpuSkuFactory(name="H100 SXM")
    created = staff.post("/api/v1/pricing-tables/", TABLE, format="json")
    assert created.status_code == 201, created.json()
    table = PricingTable.objects.get(pk=created.json()["id"])
    assert table.tenant == tenant and table.gpu_prices.get().hourly_usd == 2.5
    again = staff.post("/api/v1/pricing-tables/", TABLE, format="json")
    assert again.status_code == 409 and error(again)["message"].startswith("valid_from: ")
    url = f"/api/v1/pricing-tables/{table.pk}/"
    bad = staff.patch(url, {"pue": "0.5"}, format="json")
    assert bad.status_code == 400 and error(bad)["message"].startswith("pue:")
    # In force since April: a price edit is a new version; the table keeps its prices.
    patched = staff.patch(url, {"pue": "1.1", "gpu_prices": []}, format="json")
    assert patched.status_code == 201 and patched.json()["gpu_prices"] == []
    assert patched.json()["supersedes"] == table.pk and patched.json()["pue"] == "1.10"
    assert staff.get(url).json()["pue"] == "1.30"
    refused = staff.delete(url)
    assert refused.status_code == 409 and "superseded by version" in error(refused)["message"]
    assert staff.delete(f"/api/v1/pricing-tables/{patched.json()['id']}/").status_code == 204
    assert staff.delete(url).status_code == 204


def test_a_used_cost_model_is_not_deleted(staff, experiment):
    response = staff.delete(f"/api/v1/cost-models/{experiment.cost_model_id}/")
    assert response.status_code == 409 and error(response)["code"] == "in_use"


def test_staff_write_cost_models_and_tiers_are_checked(staff):
    tiered = {
        "name": "per token",
        "kind": "tiered_per_call",
        "tiers": [
            {"up_to": 1000, "usd_per_unit": "0.01"},
            {"up_to": None, "usd_per_unit": "0.005"},
        ],
    }
    created = staff.post("/api/v1/cost-models/", tiered, format="json")
    assert created.status_code == 201, created.json()
    bad = staff.post(
        "/api/v1/cost-models/",
        {
            **tiered,
            "name": "bad",
            "tiers": [{"up_to": None, "usd_per_unit": "1"}, {"up_to": 5, "usd_per_unit": "1"}],
        },
        format="json",
    )
    assert bad.status_code == 400 and "only the last tier may be open" in error(bad)["message"]
    assert CostModel.objects.filter(name="bad").count() == 0
    same = staff.post("/api/v1/cost-models/", tiered, format="json")
    assert same.status_code == 409 and error(same)["message"].startswith("name: ")
    url = f"/api/v1/cost-models/{created.json()['id']}/"
    assert staff.patch(url, {"gpu_weight": "2"}, format="json").json()["gpu_weight"] == "2.0000"
    assert staff.delete(url).status_code == 204


def test_pricing_tables_filter_by_the_instant_they_were_in_force(api, tenant):
    from datetime import UTC, datetime

    early = PricingTableFactory(tenant=tenant, valid_from=datetime(2026, 1, 1, tzinfo=UTC))
    PricingTableFactory(tenant=tenant, valid_from=datetime(2026, 6, 1, tzinfo=UTC))
    found = api.get("/api/v1/pricing-tables/", {"valid_at": "2026-03-01T00:00:00Z"}).json()[
        "results"
    ]
    assert [t["id"] for t in found] == [early.pk]


def test_a_nested_error_names_its_path(staff):
    response = staff.post(
        "/api/v1/pricing-tables/",
        {**TABLE, "gpu_prices": [{"sku": "No Such GPU", "hourly_usd": "1"}]},
        format="json",
    )
    assert response.status_code == 400
    assert error(response)["message"].startswith(
        "gpu_prices[0].sku: Object with name=No Such GPU does not exist"
    )


def test_a_gpu_price_of_zero_needs_a_confirmation(staff):
    GpuSkuFactory(name="H100 SXM")
    free = {**TABLE, "gpu_prices": [{"sku": "H100 SXM", "hourly_usd": "0"}]}
    refused = staff.post("/api/v1/pricing-tables/", free, format="json")
    assert refused.status_code == 400
    assert error(refused)["message"].startswith("gpu_prices[0].hourly_usd: 0 makes H100 SXM free")
    assert not PricingTable.objects.exists()
    saved = staff.post("/api/v1/pricing-tables/", {**free, "confirm_free": True}, format="json")
    assert saved.status_code == 201, saved.content
    assert saved.json()["gpu_prices"][0]["hourly_usd"] == "0.000000"
