"""Experiments and arms through the API: CRUD, strategy validation naming the key, filters,
pages."""

from __future__ import annotations

import pytest

from apps.experiments.models import Arm, Experiment
from tests.apps.api.conftest import GOOD, OTHER, error
from tests.factories import (
    ArmFactory,
    CostModelFactory,
    ExperimentFactory,
    PricingTableFactory,
    RunFactory,
)

pytestmark = pytest.mark.django_db


def test_create_read_update_delete_an_experiment(api, tenant):
    cost_model = CostModelFactory(tenant=tenant)
    table = PricingTableFactory(tenant=tenant)
    created = api.post(
        "/api/v1/experiments/",
        {
            "name": "offload",
            "cost_model": cost_model.pk,
            "pricing_table": table.pk,
            "freeze_threshold": "0.03",
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["status"] == "draft" and body["freeze_threshold"] == "0.0300" and body["arms"] == []
    assert Experiment.objects.get(pk=body["id"]).tenant == tenant

    url = f"/api/v1/experiments/{body['id']}/"
    assert api.get(url).json()["name"] == "offload"
    patched = api.patch(url, {"status": "active", "description": "CPU embedding"}, format="json")
    assert patched.status_code == 200 and patched.json()["status"] == "active"
    assert api.delete(url).status_code == 204
    assert api.get(url).status_code == 404


def test_experiment_errors_name_the_field(api, tenant, experiment):
    cost_model = experiment.cost_model
    duplicate = api.post(
        "/api/v1/experiments/", {"name": "batching", "cost_model": cost_model.pk}, format="json"
    )
    assert duplicate.status_code == 409 and error(duplicate)["message"].startswith("name: ")
    assert error(duplicate)["fields"] == {"name": ["already exists"]}
    bad = api.post(
        "/api/v1/experiments/",
        {"name": "x", "cost_model": cost_model.pk, "alpha": "0.9"},
        format="json",
    )
    assert bad.status_code == 400
    assert error(bad)["message"].startswith("alpha:") and "alpha" in error(bad)["fields"]
    missing = api.post("/api/v1/experiments/", {"name": "x"}, format="json")
    assert missing.status_code == 400 and error(missing)["fields"]["cost_model"]


def test_every_evidence_minimum_is_a_field_of_the_experiment(api, tenant, settings):
    settings.COSTLAB_CS_MIN_RUNS = 12  # the deployment's default for new experiments
    created = api.post(
        "/api/v1/experiments/",
        {"name": "minimums", "cost_model": CostModelFactory(tenant=tenant).pk},
        format="json",
    ).json()
    assert (
        created["min_runs_per_arm"],
        created["min_samples_per_arm"],
        created["min_cs_runs_per_arm"],
    ) == (3, 30, 12)
    url = f"/api/v1/experiments/{created['id']}/"
    patched = api.patch(url, {"min_cs_runs_per_arm": 20}, format="json")
    assert patched.status_code == 200 and patched.json()["min_cs_runs_per_arm"] == 20
    assert Experiment.objects.get(pk=created["id"]).min_cs_runs_per_arm == 20
    bad = api.patch(url, {"min_cs_runs_per_arm": 1}, format="json")
    assert bad.status_code == 400
    assert error(bad)["message"].startswith("min_cs_runs_per_arm:")
    assert "min_cs_runs_per_arm" in error(bad)["fields"]


def test_an_experiment_with_active_runs_is_not_deleted(api, experiment):
    RunFactory(arm=experiment.arms.first(), status="running")
    response = api.delete(f"/api/v1/experiments/{experiment.pk}/")
    assert response.status_code == 409 and error(response)["code"] == "experiment_busy"
    assert Experiment.objects.filter(pk=experiment.pk).exists()


def test_an_experiment_with_finished_runs_is_deleted_with_them(api, experiment):
    RunFactory(arm=experiment.arms.first(), status="succeeded")
    assert api.delete(f"/api/v1/experiments/{experiment.pk}/").status_code == 204
    assert not Experiment.objects.filter(pk=experiment.pk).exists()


def test_list_is_paginated_with_a_cap_and_filters(
    api, tenant, settings, django_assert_max_num_queries
):
    settings.COSTLAB_API_MAX_PAGE_SIZE = 5
    cost_model = CostModelFactory(tenant=tenant)
    for i in range(7):
        exp = ExperimentFactory(
            tenant=tenant,
            cost_model=cost_model,
            name=f"exp {i}",
            status="active" if i % 2 else "draft",
        )
        ArmFactory(experiment=exp, name="control", is_control=True)
        ArmFactory(experiment=exp, name="b")
    with django_assert_max_num_queries(
        6
    ):  # auth, count, page, arms prefetch: not one per experiment
        page = api.get("/api/v1/experiments/?page_size=1000").json()
    assert page["count"] == 7 and len(page["results"]) == 5 and page["next"]
    assert [a["name"] for a in page["results"][0]["arms"]] == ["control", "b"]
    active = api.get("/api/v1/experiments/?status=active").json()
    assert active["count"] == 3 and {e["status"] for e in active["results"]} == {"active"}
    assert api.get("/api/v1/experiments/?name=exp 6").json()["count"] == 1
    bad = api.get("/api/v1/experiments/?status=exploded")
    assert bad.status_code == 400 and "status" in error(bad)["fields"]
    beyond = api.get("/api/v1/experiments/?page=99")
    assert beyond.status_code == 404 and error(beyond)["code"] == "not_found"


def test_arm_create_validates_the_strategy_and_names_the_key(api, experiment):
    response = api.post(
        "/api/v1/arms/",
        {
            "experiment": experiment.pk,
            "name": "broken",
            "strategy_yaml": (
                "model: {preset: tiny}\ndata: {source: synthetic}\ntrain: {global_batch: -3}\n"
            ),
        },
        format="json",
    )
    assert response.status_code == 400
    body = error(response)
    assert body["code"] == "invalid_strategy" and "train.global_batch" in body["message"]
    assert any("train.global_batch" in m for m in body["fields"]["strategy_yaml"])
    unknown = api.post(
        "/api/v1/arms/",
        {
            "experiment": experiment.pk,
            "name": "typo",
            "strategy_yaml": GOOD + "precison: {compute_dtype: bf16}\n",
        },
        format="json",
    )
    assert unknown.status_code == 400 and "precison" in error(unknown)["message"]
    assert not Arm.objects.filter(name__in=["broken", "typo"]).exists()


def test_arm_create_update_delete(api, experiment):
    created = api.post(
        "/api/v1/arms/",
        {"experiment": experiment.pk, "name": "ckpt", "strategy_yaml": GOOD, "weight": "0"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    arm = created.json()
    assert arm["revision"] == 1 and len(arm["strategy_sha256"]) == 64 and arm["weight"] == "0.0000"
    url = f"/api/v1/arms/{arm['id']}/"
    patched = api.patch(url, {"strategy_yaml": OTHER, "weight": "2"}, format="json").json()
    assert patched["revision"] == 2 and patched["weight"] == "2.0000"
    assert patched["new_runs_only"] == ["train.steps"] and patched["live_keys"] == {}
    live = api.patch(
        url, {"strategy_yaml": OTHER + "telemetry: {interval_s: 2.0}\n"}, format="json"
    ).json()
    assert live["live_keys"] == {"telemetry": {"interval_s": 2.0}} and live["revision"] == 3
    assert api.delete(url).status_code == 204


def test_an_arm_with_runs_is_kept(api, experiment):
    arm = experiment.arms.get(name="candidate")
    RunFactory(arm=arm, status="succeeded")
    response = api.delete(f"/api/v1/arms/{arm.pk}/")
    assert response.status_code == 409 and "weight" in error(response)["message"]


def test_a_second_control_or_a_duplicate_name_is_refused(api, experiment):
    control = api.post(
        "/api/v1/arms/",
        {"experiment": experiment.pk, "name": "c2", "strategy_yaml": GOOD, "is_control": True},
        format="json",
    )
    assert control.status_code == 409 and error(control)["message"].startswith("is_control:")
    same = api.post(
        "/api/v1/arms/",
        {"experiment": experiment.pk, "name": "control", "strategy_yaml": GOOD},
        format="json",
    )
    assert same.status_code == 409 and error(same)["message"].startswith("name:")


def test_arms_filter_by_experiment_and_strategy_hash(
    api, experiment, django_assert_max_num_queries
):
    control = experiment.arms.get(name="control")
    with django_assert_max_num_queries(4):
        found = api.get(
            f"/api/v1/arms/?experiment={experiment.pk}&strategy_sha256={control.strategy_sha256}"
        )
    assert [a["name"] for a in found.json()["results"]] == ["control"]


def test_weight_of_a_frozen_arm_stays_zero(api, experiment):
    arm = experiment.arms.get(name="candidate")
    Arm.objects.filter(pk=arm.pk).update(state="frozen", weight=0)
    response = api.patch(f"/api/v1/arms/{arm.pk}/", {"weight": "1"}, format="json")
    assert response.status_code == 400 and error(response)["code"] == "arm_frozen"


def test_validate_a_strategy_without_storing_it(api):
    ok = api.post("/api/v1/arms/validate/", {"strategy_yaml": GOOD}, format="json")
    assert ok.status_code == 200 and ok.json()["valid"] is True
    bad = api.post("/api/v1/arms/validate/", {"strategy_yaml": "model: [1"}, format="json")
    assert bad.status_code == 400 and error(bad)["code"] == "invalid_strategy"


def test_the_strategy_schema_is_served(api):
    schema = api.get("/api/v1/strategy-schema/").json()
    assert "model" in schema["properties"]
