"""POST /api/v1/experiments/{id}/assign/: the arm a run trained elsewhere uses, sticky by run key,
split by the arms' weights, never a frozen arm; refused for an inactive experiment, at the quota
and for another tenant's experiment."""

from __future__ import annotations

import threading
from collections import Counter
from decimal import Decimal

import pytest
from django.db import connection

from apps.experiments.assignment import arm_assign
from apps.experiments.models import Arm, ArmAssignment
from apps.experiments.services import arm_update
from gpu_runtime import load_strategy
from tests.apps.api.conftest import GOOD, OTHER, error
from tests.factories import ArmFactory, CostModelFactory, ExperimentFactory, RunFactory

pytestmark = pytest.mark.django_db


def assign(api, experiment, run_key):
    return api.post(
        f"/api/v1/experiments/{experiment.pk}/assign/", {"run_key": run_key}, format="json"
    )


def test_a_run_key_gets_one_arm_for_good(api, experiment):
    first = assign(api, experiment, "job-7")
    assert first.status_code == 200, first.content
    body = first.json()
    arm = Arm.objects.get(pk=body["arm"]["id"])
    assert body == {
        "experiment": experiment.pk,
        "run_key": "job-7",
        "arm": {"id": arm.pk, "name": arm.name, "is_control": arm.is_control},
        "strategy_yaml": arm.strategy_yaml,
        "strategy": load_strategy(arm.strategy_yaml).model_dump(mode="json"),
        # only what the YAML sets: a trainer elsewhere applies these, not the schema's defaults
        "declared": load_strategy(arm.strategy_yaml).model_dump(mode="json", exclude_unset=True),
        "sticky": False,
    }
    assert body["strategy"]["train"]["steps"] in (5, 7)  # parsed, defaults filled in
    assert "lr" in body["strategy"]["train"] and "lr" not in body["declared"]["train"]
    again = assign(api, experiment, "job-7").json()
    assert (again["arm"]["id"], again["sticky"]) == (arm.pk, True)
    # New weights move new keys, never a key already assigned.
    for other in experiment.arms.exclude(pk=arm.pk):
        arm_update(arm=other, weight=Decimal("100"))
    arm_update(arm=arm, weight=Decimal("0"))
    later = assign(api, experiment, "job-7").json()
    assert (later["arm"]["id"], later["sticky"]) == (arm.pk, True)
    assert ArmAssignment.objects.filter(experiment=experiment, run_key="job-7").count() == 1
    fresh = assign(api, experiment, "job-8").json()
    assert fresh["arm"]["id"] != arm.pk and fresh["sticky"] is False


def test_a_key_that_already_ran_gets_the_arm_it_ran_on(api, experiment):
    control, candidate = experiment.arms.order_by("-is_control")
    RunFactory(arm=candidate, kind="external", status="succeeded", run_key="ran-before")
    arm_update(arm=candidate, weight=Decimal("0"))  # the split alone would never pick it now
    body = assign(api, experiment, "ran-before").json()
    assert (body["arm"]["name"], body["sticky"]) == ("candidate", True)
    # An assignment that disagrees with what really ran follows the run.
    ArmAssignment.objects.create(experiment=experiment, run_key="moved", arm=control)
    RunFactory(arm=candidate, kind="external", status="running", run_key="moved")
    assert assign(api, experiment, "moved").json()["arm"]["name"] == "candidate"
    assert ArmAssignment.objects.get(run_key="moved").arm == candidate


def test_new_keys_follow_the_weights_and_never_a_frozen_arm(api, experiment):
    control, candidate = experiment.arms.order_by("-is_control")
    arm_update(arm=control, weight=Decimal("3"))
    frozen = ArmFactory(
        experiment=experiment,
        name="frozen",
        strategy_yaml=GOOD + "# frozen\n",
        state=Arm.State.FROZEN,
        weight=Decimal("0"),
    )
    got = Counter(assign(api, experiment, f"key-{i}").json()["arm"]["name"] for i in range(200))
    # Stratified: every prefix follows 3:1 as closely as whole keys allow, so 200 keys are
    # exactly 150 and 50 (deterministic, it cannot flake), and the frozen arm gets none.
    assert got == {"control": 150, "candidate": 50}
    assert not ArmAssignment.objects.filter(arm=frozen).exists()


def test_every_candidate_frozen_leaves_the_control(api, experiment):
    control, candidate = experiment.arms.order_by("-is_control")
    Arm.objects.filter(pk=candidate.pk).update(state=Arm.State.FROZEN, weight=0)
    Arm.objects.filter(pk=control.pk).update(weight=0)  # even at weight 0, the control
    names = {assign(api, experiment, f"k{i}").json()["arm"]["name"] for i in range(5)}
    assert names == {"control"}
    Arm.objects.filter(pk=control.pk).update(state=Arm.State.FROZEN)
    refused = assign(api, experiment, "nowhere")
    assert refused.status_code == 409 and error(refused)["code"] == "no_active_arm"
    assert error(refused)["message"].startswith("experiment:")


def test_at_the_concurrent_runs_quota_a_new_key_is_refused_with_429(api, experiment, tenant):
    known = assign(api, experiment, "known").json()["arm"]["id"]
    RunFactory(arm=experiment.arms.first(), kind="external", status="running", run_key="busy")
    tenant.max_concurrent_runs = 1
    tenant.save()
    refused = assign(api, experiment, "one-too-many")
    assert refused.status_code == 429, refused.content
    assert error(refused)["code"] == "quota_exceeded"
    assert error(refused)["message"].startswith("max_concurrent_runs:")
    assert "(limit 1)" in error(refused)["message"] and error(refused)["limit"] == 1
    assert not ArmAssignment.objects.filter(run_key="one-too-many").exists()
    assert assign(api, experiment, "known").status_code == 429  # it would start a run too
    # A key whose run exists already is that run: no new run, no quota.
    assert assign(api, experiment, "busy").status_code == 200
    tenant.max_concurrent_runs = 2
    tenant.save()
    assert assign(api, experiment, "known").json()["arm"]["id"] == known


@pytest.mark.parametrize("status", ["draft", "completed"])
def test_an_experiment_that_is_not_active_assigns_nothing(api, experiment, status):
    experiment.status = status
    experiment.save()
    refused = assign(api, experiment, "job")
    assert refused.status_code == 409, refused.content
    body = error(refused)
    assert body["code"] == "experiment_not_active" and body["experiment_status"] == status
    assert body["message"].startswith(f"experiment: '{experiment.name}' is {status}")
    assert not ArmAssignment.objects.exists()


def test_another_tenants_experiment_is_not_found(api, other_tenant):
    theirs = ExperimentFactory(
        tenant=other_tenant, status="active", cost_model=CostModelFactory(tenant=other_tenant)
    )
    ArmFactory(experiment=theirs, name="control", is_control=True, strategy_yaml=GOOD)
    response = assign(api, theirs, "job")
    missing = api.post("/api/v1/experiments/999999999/assign/", {"run_key": "job"}, format="json")
    assert response.status_code == 404 and response.json() == missing.json()
    assert not ArmAssignment.objects.exists()


@pytest.mark.parametrize(
    "body, reason",
    [({}, "required"), ({"run_key": ""}, "blank"), ({"run_key": "k" * 201}, "200 characters")],
)
def test_the_run_key_is_checked(api, experiment, body, reason):
    response = api.post(f"/api/v1/experiments/{experiment.pk}/assign/", body, format="json")
    assert response.status_code == 400
    assert error(response)["message"].startswith("run_key:") and reason in str(
        error(response)["fields"]["run_key"]
    )


def test_a_run_key_of_200_characters_is_a_run_key_too(api, experiment):
    key = "k" * 200
    arm = assign(api, experiment, key).json()["arm"]["id"]
    created = api.post(
        "/api/v1/runs/",
        {"experiment": experiment.pk, "arm": arm, "run_key": key, "kind": "external"},
        format="json",
    )
    assert created.status_code == 201, created.content
    assert created.json()["run_key"] == key and created.json()["last_seq"] == -1


def asked_at_once(experiment, key: str, threads: int) -> list:
    """`threads` threads ask for one key at the same moment, each on its own connection."""
    answers, failures, start = [], [], threading.Barrier(threads)

    def ask():
        try:
            start.wait(timeout=10)
            answers.append(arm_assign(experiment=experiment, run_key=key))
        except Exception as exc:  # reported below, with the thread's answer missing
            failures.append(exc)
        finally:
            connection.close()

    workers = [threading.Thread(target=ask) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=30)
    assert not failures and len(answers) == threads, failures
    return answers


@pytest.mark.django_db(transaction=True)
def test_concurrent_asks_of_one_key_get_one_arm_and_one_row(tenant):
    if connection.vendor != "postgresql":
        pytest.skip("row locks need Postgres")
    experiment = ExperimentFactory(
        tenant=tenant, status="active", cost_model=CostModelFactory(tenant=tenant)
    )
    ArmFactory(experiment=experiment, name="control", is_control=True, strategy_yaml=GOOD)
    ArmFactory(experiment=experiment, name="candidate", strategy_yaml=OTHER)
    for round_ in range(5):
        answers = asked_at_once(experiment, f"race-{round_}", threads=6)
        assert len({a.arm.pk for a in answers}) == 1
        assert sorted(a.sticky for a in answers) == [False] + [True] * 5
        assert ArmAssignment.objects.filter(run_key=f"race-{round_}").count() == 1
