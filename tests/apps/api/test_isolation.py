"""Tenant isolation over every route: another tenant's object is 404 for every method, lists never
show it, and creating with a reference to it fails as if it did not exist. Routes are enumerated
from the URL conf, so a new route that is not covered here fails this test."""

from __future__ import annotations

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from apps.api.services import api_token_create
from apps.experiments.models import Arm, Experiment, Run
from apps.sweeps.models import Sweep
from tests.apps.api.conftest import GOOD
from tests.factories import (
    ArmFactory,
    CostModelFactory,
    ExperimentFactory,
    GpuPriceFactory,
    PricingTableFactory,
    RunFactory,
)

pytestmark = pytest.mark.django_db
SHARED = {"gpu-sku", "device"}  # accelerator models and workers' devices serve every tenant


def api_routes() -> list[tuple[str, object, set[str]]]:
    """(route name, view, URL parameters) of every /api/v1/ route."""
    found = []

    def walk(patterns, prefix):
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern))
            elif (
                isinstance(p, URLPattern)
                and (prefix + str(p.pattern)).startswith("api/v1/")
                and p.name
            ):
                found.append((p.name, p.callback, set(p.pattern.regex.groupindex)))

    walk(get_resolver().url_patterns, "")
    return found


def objects_of(tenant) -> dict[str, int]:
    """One object per resource of `tenant`, by route basename."""
    experiment = ExperimentFactory(tenant=tenant, cost_model=CostModelFactory(tenant=tenant))
    arm = ArmFactory(experiment=experiment, strategy_yaml=GOOD, is_control=True)
    run = RunFactory(arm=arm, kind="external", status="running")
    table = PricingTableFactory(tenant=tenant)
    GpuPriceFactory(pricing_table=table)
    token, _ = api_token_create(tenant=tenant, name="theirs")
    sweep = Sweep.objects.create(
        tenant=tenant,
        name="theirs",
        base_strategy_yaml=GOOD,
        space={"model.seq_len": [16]},
        sampler="grid",
        probe_count=1,
        probe_steps=2,
    )
    return {
        "experiment": experiment.pk,
        "arm": arm.pk,
        "run": run.pk,
        "pricing-table": table.pk,
        "cost-model": experiment.cost_model_id,
        "token": token.pk,
        "sweep": sweep.pk,
    }


@pytest.fixture
def theirs(other_tenant):
    return objects_of(other_tenant)


@pytest.fixture
def mine(tenant):
    return objects_of(tenant)


def methods(view) -> list[str]:
    actions = getattr(view, "actions", None) or {"get": "get"}
    return [m for m in actions if m in ("get", "post", "patch", "delete")]


def test_every_detail_route_answers_404_for_another_tenants_object(api, staff, theirs, mine):
    """Their object answers exactly as a missing one does: 404 for staff, who may do anything in
    their own tenant; for a token, 404 too, except where a token may not act at all
    (403 for any id)."""
    checked = set()
    for name, view, params in api_routes():
        basename, _, suffix = name.rpartition("-")
        if not basename or basename in SHARED or "pk" not in params:
            continue
        url, missing = (
            reverse(f"api:{name}", kwargs={"pk": pk}) for pk in (theirs[basename], 10**9)
        )
        for method in methods(view):
            for who, client in (("token", api), ("staff", staff)):
                response = getattr(client, method)(url, {}, format="json")
                absent = getattr(client, method)(missing, {}, format="json")
                assert (response.status_code, response.json()) == (
                    absent.status_code,
                    absent.json(),
                ), (who, method, url)
                expected = 404 if who == "staff" else (404, 403)
                assert response.status_code in (
                    expected if isinstance(expected, tuple) else (expected,)
                ), (who, method, url, response.status_code)
            checked.add((basename, suffix, method))
    assert {b for b, _, _ in checked} == {
        "experiment",
        "arm",
        "run",
        "pricing-table",
        "cost-model",
        "token",
        "sweep",
    }
    assert ("run", "telemetry", "post") in checked and ("run", "finish", "post") in checked
    assert ("experiment", "detail", "delete") in checked and ("arm", "detail", "patch") in checked
    assert {
        ("arm", "freeze", "post"),
        ("arm", "unfreeze", "post"),
        ("experiment", "report", "get"),
    } <= checked
    # Nothing of theirs changed.
    assert Run.objects.get(pk=theirs["run"]).status == "running"
    assert (
        Experiment.objects.filter(pk=theirs["experiment"]).exists()
        and Arm.objects.filter(pk=theirs["arm"]).exists()
    )


def test_lists_never_show_another_tenants_objects(api, staff, theirs, mine):
    listed = set()
    for name, _view, _params in api_routes():
        basename, _, suffix = name.rpartition("-")
        if suffix != "list" or basename in SHARED:
            continue
        for who, client in (("token", api), ("staff", staff)):
            response = client.get(reverse(f"api:{name}"), {"page_size": 200})
            if basename == "token" and who == "token":
                continue
            ids = {item["id"] for item in response.json()["results"]}
            assert theirs[basename] not in ids, (who, name)
            assert mine[basename] in ids, (who, name)
        listed.add(basename)
    assert listed == {"experiment", "arm", "run", "pricing-table", "cost-model", "token", "sweep"}


def test_creating_with_another_tenants_reference_fails_as_if_it_did_not_exist(
    api, tenant, theirs, mine
):
    own_cost_model = mine["cost-model"]
    attempts = [
        ("/api/v1/experiments/", {"name": "x", "cost_model": theirs["cost-model"]}, "cost_model"),
        (
            "/api/v1/experiments/",
            {"name": "y", "cost_model": own_cost_model, "pricing_table": theirs["pricing-table"]},
            "pricing_table",
        ),
        (
            "/api/v1/arms/",
            {"experiment": theirs["experiment"], "name": "z", "strategy_yaml": GOOD},
            "experiment",
        ),
        ("/api/v1/runs/", {"experiment": theirs["experiment"]}, "experiment"),
        ("/api/v1/runs/", {"experiment": mine["experiment"], "arm": theirs["arm"]}, "arm"),
    ]
    before = (Experiment.objects.count(), Arm.objects.count(), Run.objects.count())
    for url, body, field in attempts:
        response = api.post(url, body, format="json")
        assert response.status_code == 400, (url, body)
        assert "does not exist" in response.json()["error"]["fields"][field][0], response.json()
    patched = api.patch(
        f"/api/v1/experiments/{mine['experiment']}/",
        {"cost_model": theirs["cost-model"]},
        format="json",
    )
    assert patched.status_code == 400
    assert (Experiment.objects.count(), Arm.objects.count(), Run.objects.count()) == before


def test_a_token_ignores_a_tenant_header(api, other_tenant):
    assert (
        api.get("/api/v1/me/", HTTP_X_COSTLAB_TENANT=other_tenant.slug).json()["tenant"]["slug"]
        == "acme"
    )


def test_no_list_makes_a_query_per_row(staff, tenant):
    """Every list route: the same number of queries for one row of each resource as for four."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries() -> dict[str, int]:
        counts = {}
        for name, _view, _params in api_routes():
            if name.endswith("-list"):
                with CaptureQueriesContext(connection) as ctx:
                    assert staff.get(reverse(f"api:{name}")).status_code == 200
                counts[name] = len(ctx)
        return counts

    objects_of(tenant)
    one = queries()
    for _ in range(3):
        objects_of(tenant)
    assert queries() == one
    assert len(one) >= 7
