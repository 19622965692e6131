"""/api/v1/sweeps/: create, 400s that name the field and queue nothing, tenant scope, cancel,
frontier and promote (probes trained in-process here; on a real worker in tests/workers)."""

import pytest

from apps.sweeps.models import Probe, Sweep
from tests.apps.api.conftest import GOOD
from tests.factories import CostModelFactory, PricingTableFactory
from workers.sweeps import probe_execute

pytestmark = pytest.mark.django_db

URL = "/api/v1/sweeps/"


def body(**overrides):
    data = {
        "name": "find cheaper",
        "base_strategy_yaml": GOOD,
        "probe_count": 2,
        "probe_steps": 3,
        "space": {"model.seq_len": [16, 32]},
    }
    data.update(overrides)
    return data


def test_create_list_retrieve_and_cancel(api, other_api, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as sent:
        created = api.post(URL, body(), format="json")
    assert created.status_code == 201, created.json()
    sweep = created.json()
    assert sweep["status"] == "running" and sweep["sampler"] == "grid" and sweep["queue"] == "cpu"
    assert sweep["objectives"] == ["usd_per_mtok", "peak_mem_mb"] and len(sent) == 2
    assert sweep["warnings"] == [
        "queue: no worker consumes queue 'cpu' now; the probes wait until one starts"
    ]
    assert [s["id"] for s in api.get(URL).json()["results"]] == [sweep["id"]]
    assert other_api.get(f"{URL}{sweep['id']}/").status_code == 404
    assert other_api.post(f"{URL}{sweep['id']}/cancel/").status_code == 404
    cancelled = api.post(f"{URL}{sweep['id']}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert api.post(f"{URL}{sweep['id']}/cancel/").status_code == 409
    assert {p["status"] for p in api.get(f"{URL}{sweep['id']}/frontier/").json()} == {"cancelled"}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"space": {"model.seq_len": []}}, "space.model.seq_len"),
        ({"space": {"model.seq_len": {"low": 64, "high": 8}}}, "space.model.seq_len"),
        ({"space": {"model.nope": [1]}}, "space.model.nope"),
        ({"space": {"model.seq_len": [16, 32, 64]}, "sampler": "grid"}, "space"),
        ({"colour": "blue"}, "colour"),
        ({"probe_count": 0}, "probe_count"),
        ({"parallelism": 101}, "parallelism"),  # the tenant's max_concurrent_runs is 100
        ({"base_strategy_yaml": "model: {preset: tiny, seqlen: 3}\n"}, "base_strategy_yaml"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_nothing_is_queued(
    api, overrides, field, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as sent:
        response = api.post(URL, body(**overrides), format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"], response.json()
    assert not sent and not Sweep.objects.exists()


@pytest.mark.slow
def test_frontier_and_promote(api, tenant):
    PricingTableFactory(tenant=tenant)
    CostModelFactory(tenant=tenant)
    sweep = api.post(URL, body(parallelism=1), format="json").json()
    while Probe.objects.filter(sweep_id=sweep["id"], status="queued").exists():
        probe_execute(Probe.objects.get(sweep_id=sweep["id"], status="queued").pk)
    assert api.get(f"{URL}{sweep['id']}/").json()["status"] == "completed"
    probes = api.get(f"{URL}{sweep['id']}/frontier/").json()
    assert len(probes) == 2 and all(
        p["status"] == "succeeded" and p["usd_per_mtok"] > 0 for p in probes
    )
    front = [p for p in probes if p["on_frontier"]]
    assert front
    promoted = api.post(
        f"{URL}{sweep['id']}/promote/",
        {"probe": front[0]["id"], "weight": "0.25", "experiment_name": "confirm the sweep"},
        format="json",
    )
    assert promoted.status_code == 201, promoted.json()
    arm = promoted.json()
    assert (
        arm["weight"] == "0.2500"
        and f"seq_len: {front[0]['params']['model.seq_len']}" in arm["strategy_yaml"]
    )
    missing = api.post(
        f"{URL}{sweep['id']}/promote/", {"probe": 10**9, "experiment_name": "x"}, format="json"
    )
    assert missing.status_code == 400 and "probe" in missing.json()["error"]["fields"]
