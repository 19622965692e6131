"""Runs through the API: submit (201 + chosen arm, idempotent by run_key), status, cancel,
external finish."""

from __future__ import annotations

import pytest

from apps.experiments.models import Arm, Run
from tests.apps.api.conftest import error
from tests.factories import GpuSkuFactory, RunFactory

pytestmark = pytest.mark.django_db


def test_submit_answers_201_with_the_run_and_the_arm_chosen(api, experiment):
    response = api.post(
        "/api/v1/runs/", {"experiment": experiment.pk, "git_sha": "a1b2c3"}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "queued" and body["git_sha"] == "a1b2c3" and body["kind"] == "worker"
    assert body["arm"]["name"] in {"control", "candidate"}
    run = Run.objects.get(pk=body["id"])
    assert run.tenant == experiment.tenant and run.arm_id == body["arm"]["id"]


def test_a_retried_submission_returns_the_same_run(api, experiment):
    first = api.post(
        "/api/v1/runs/",
        {"experiment": experiment.pk, "run_key": "gh-77-1", "git_sha": ""},
        format="json",
    )
    again = api.post(
        "/api/v1/runs/", {"experiment": experiment.pk, "run_key": "gh-77-1"}, format="json"
    )
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"] and Run.objects.count() == 1


def test_submit_to_a_named_arm_on_a_gpu(api, experiment):
    sku = GpuSkuFactory(name="H100 SXM")
    arm = experiment.arms.get(name="candidate")
    body = api.post(
        "/api/v1/runs/",
        {"experiment": experiment.pk, "arm": arm.pk, "gpu_sku": "H100 SXM"},
        format="json",
    ).json()
    assert body["arm"]["id"] == arm.pk and body["queue"] == "gpu" and body["gpu_sku"] == sku.name
    assert body["gpu_count"] == 1


def test_submit_refusals_name_the_reason(api, experiment, tenant):
    arm = experiment.arms.get(name="candidate")
    Arm.objects.filter(pk=arm.pk).update(state="frozen", weight=0)
    frozen = api.post("/api/v1/runs/", {"experiment": experiment.pk, "arm": arm.pk}, format="json")
    assert frozen.status_code == 400 and error(frozen)["code"] == "arm_frozen"
    bad_sha = api.post(
        "/api/v1/runs/", {"experiment": experiment.pk, "git_sha": "not hex!"}, format="json"
    )
    assert bad_sha.status_code == 400 and "git_sha" in error(bad_sha)["fields"]
    tenant.max_concurrent_runs = 0
    tenant.save()
    quota = api.post("/api/v1/runs/", {"experiment": experiment.pk}, format="json")
    assert quota.status_code == 400 and error(quota)["code"] == "quota_exceeded"
    assert "max_concurrent_runs" in error(quota)["message"] and error(quota)["limit"] == 0
    assert Run.objects.count() == 0


def test_status_and_cancel(api, experiment):
    resolved = {"kernels.attention": {"requested": "auto", "resolved": "math", "why": "a CPU"}}
    run = RunFactory(arm=experiment.arms.first(), status="queued", git_sha="abc", resolved=resolved)
    detail = api.get(f"/api/v1/runs/{run.pk}/").json()
    assert detail["status"] == "queued" and detail["config_yaml"] == run.config_yaml
    assert detail["resolved"] == resolved  # what each auto key became on its device, and why
    cancelled = api.post(f"/api/v1/runs/{run.pk}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = api.post(f"/api/v1/runs/{run.pk}/cancel/")
    assert again.status_code == 400 and error(again)["code"] == "not_cancellable"


def test_run_list_filters_without_a_query_per_run(api, experiment, django_assert_max_num_queries):
    control, candidate = experiment.arms.get(name="control"), experiment.arms.get(name="candidate")
    for i in range(6):
        RunFactory(
            arm=control if i % 2 else candidate,
            status="succeeded" if i < 4 else "failed",
            git_sha=f"{i:x}" * 4,
            gpu_sku=GpuSkuFactory(),
        )
    with django_assert_max_num_queries(5):  # ... and the page's outlier runs: one query
        everything = api.get("/api/v1/runs/").json()
    assert everything["count"] == 6 and everything["results"][0]["arm"]["name"]
    assert api.get(f"/api/v1/runs/?arm={control.pk}").json()["count"] == 3
    assert api.get("/api/v1/runs/?status=failed").json()["count"] == 2
    assert api.get("/api/v1/runs/?git_sha=3333").json()["count"] == 1
    ordered = api.get("/api/v1/runs/?ordering=created_at").json()["results"]
    assert [r["id"] for r in ordered] == sorted(r["id"] for r in ordered)


def test_an_external_run_is_finished_by_its_client(api, experiment):
    submitted = api.post(
        "/api/v1/runs/", {"experiment": experiment.pk, "kind": "external"}, format="json"
    ).json()
    assert submitted["status"] == "running"
    url = f"/api/v1/runs/{submitted['id']}/finish/"
    bad = api.post(url, {"status": "lost"}, format="json")
    assert bad.status_code == 400 and "status" in error(bad)["fields"]
    done = api.post(url, {"status": "succeeded", "dataset_sha256": "ab" * 32}, format="json")
    assert (
        done.status_code == 200
        and done.json()["status"] == "succeeded"
        and done.json()["finished_at"]
    )
    twice = api.post(url, {"status": "failed"}, format="json")
    assert twice.status_code == 409 and error(twice)["code"] == "run_finished"


def test_a_worker_run_cannot_be_finished_over_http(api, experiment):
    run = RunFactory(arm=experiment.arms.first(), status="running")
    response = api.post(f"/api/v1/runs/{run.pk}/finish/", {"status": "succeeded"}, format="json")
    assert response.status_code == 409 and error(response)["code"] == "not_external"


def test_a_run_shows_every_attempt_with_its_outcome(api, experiment):
    from apps.experiments import runs

    run = RunFactory(
        experiment=experiment,
        tenant=experiment.tenant,
        arm=experiment.arms.first(),
        status="queued",
    )
    runs.run_claim(run_id=run.pk, owner="host-a:1:x", host="host-a")
    runs.run_release(
        run_id=run.pk, owner="host-a:1:x", reason="worker stopped before the run finished"
    )
    runs.run_claim(run_id=run.pk, owner="host-b:2:y", host="host-b")
    runs.run_finish(run_id=run.pk, owner="host-b:2:y", status="succeeded")
    body = api.get(f"/api/v1/runs/{run.pk}/").json()
    assert [(a["number"], a["host"], a["outcome"]) for a in body["attempt_log"]] == [
        (1, "host-a", "stopped"),
        (2, "host-b", "succeeded"),
    ]
    assert body["attempt_log"][0]["reason"] == "worker stopped before the run finished"
    assert all(a["started_at"] and a["ended_at"] for a in body["attempt_log"])


def test_submit_refuses_distributed_keys_the_queue_cannot_give_naming_the_key(api, experiment):
    GpuSkuFactory(name="H100 SXM")
    arm = experiment.arms.get(name="candidate")

    def submit(distributed: str, **extra):
        arm.strategy_yaml = (
            "model: {preset: tiny}\ntrain: {global_batch: 8}\n" + f"distributed: {distributed}\n"
        )
        arm.save()
        return api.post(
            "/api/v1/runs/", {"experiment": experiment.pk, "arm": arm.pk, **extra}, format="json"
        )

    nccl = submit("{nproc_per_node: 2, backend: nccl}")  # no gpu_sku: the cpu queue
    assert nccl.status_code == 400 and error(nccl)["code"] == "invalid_strategy"
    assert "distributed.backend" in error(nccl)["message"] and "cpu queue" in error(nccl)["message"]
    crowded = submit("{nproc_per_node: 4}", gpu_sku="H100 SXM", gpu_count=2)
    assert crowded.status_code == 400 and "distributed.nproc_per_node" in error(crowded)["message"]
    assert any("distributed.nproc_per_node" in m for m in error(crowded)["fields"]["strategy_yaml"])
    assert Run.objects.count() == 0
    two = submit("{nproc_per_node: 2}", gpu_sku="H100 SXM")
    assert two.status_code == 201 and two.json()["gpu_count"] == 2  # one GPU per process
    assert Run.objects.get(pk=two.json()["id"]).world_size == 2
    on_cpu = submit("{nproc_per_node: 2}")
    assert on_cpu.status_code == 201 and Run.objects.get(pk=on_cpu.json()["id"]).world_size == 2
    gang = Run.objects.get(pk=submit("{nproc_per_node: 2, nnodes: 2}").json()["id"])
    assert (gang.world_size, gang.nnodes) == (4, 2)


def test_a_queued_run_says_its_priority_position_and_an_estimated_start(api, experiment):
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    arm = experiment.arms.first()
    for minutes in (10, 20):  # two recent runs of 10 and 20 min on the cpu queue
        RunFactory(
            arm=arm,
            status="succeeded",
            started_at=now - timedelta(minutes=minutes + 5),
            finished_at=now - timedelta(minutes=5),
        )
    RunFactory(arm=arm, status="running")
    batch = [
        api.post(
            "/api/v1/runs/",
            {"experiment": experiment.pk, "priority": "batch"},
            format="json",
        ).json()
        for _ in range(2)
    ]
    ci = api.post("/api/v1/runs/", {"experiment": experiment.pk, "priority": "ci"}, format="json")
    assert ci.status_code == 201 and ci.json()["priority"] == "ci"
    # The ci run is taken first; one run trains at once, recent runs took 15 min on average.
    assert ci.json()["queue_position"] == {"position": 1, "eta_s": 900.0, "eta_estimated": True}
    listed = {r["id"]: r for r in api.get("/api/v1/runs/", {"status": "queued"}).json()["results"]}
    assert [listed[r["id"]]["queue_position"]["position"] for r in batch] == [2, 3]
    assert listed[batch[1]["id"]]["queue_position"]["eta_s"] == 2700.0
    assert api.get(f"/api/v1/runs/{ci.json()['id']}/").json()["priority"] == "ci"
    bad = api.post("/api/v1/runs/", {"experiment": experiment.pk, "priority": "now"}, format="json")
    assert bad.status_code == 400 and "priority" in str(bad.json())
    running = api.get("/api/v1/runs/", {"status": "running"}).json()["results"]
    assert running[0]["queue_position"] is None


def test_bulk_cancel_ends_an_experiments_or_an_arms_active_runs(api, experiment):
    control, candidate = experiment.arms.get(name="control"), experiment.arms.get(name="candidate")
    queued = [RunFactory(arm=control), RunFactory(arm=candidate)]
    running = RunFactory(arm=candidate, status="running")
    done = RunFactory(arm=control, status="succeeded")
    url = f"/api/v1/experiments/{experiment.pk}/cancel-runs/"
    only_candidate = api.post(url, {"arm": candidate.pk}, format="json")
    assert only_candidate.status_code == 200, only_candidate.content
    assert only_candidate.json() == {"ended": [queued[1].pk], "stopping": [running.pk]}
    assert Run.objects.get(pk=queued[0].pk).status == "queued"  # the control's run stays
    everything = api.post(url, {}, format="json").json()
    assert everything == {"ended": [queued[0].pk], "stopping": [running.pk]}
    statuses = dict(Run.objects.values_list("pk", "status"))
    assert statuses[queued[0].pk] == statuses[queued[1].pk] == "cancelled"
    assert statuses[done.pk] == "succeeded"
    assert Run.objects.get(pk=running.pk).cancel_requested  # it stops at its next step
    bad = api.post(url, {"arm": 999999}, format="json")
    assert bad.status_code == 400 and error(bad)["message"].startswith("arm:")


def test_tags_and_notes_set_at_submit_and_later_and_one_search_finds_runs(api, experiment):
    """Issue 25: tags and notes on runs and experiments, and a run search by name, tag, note,
    git commit and strategy key."""
    made = api.post(
        "/api/v1/runs/",
        {
            "experiment": experiment.pk,
            "run_key": "nightly-42",
            "git_sha": "abcdef12",
            "tags": ["nightly", "pr-7"],
            "note": "after the tokenizer change",
        },
        format="json",
    )
    assert made.status_code == 201, made.content
    run = made.json()
    assert run["tags"] == ["nightly", "pr-7"] and run["note"] == "after the tokenizer change"
    other = api.post("/api/v1/runs/", {"experiment": experiment.pk, "tags": "pr-70"}, format="json")
    assert other.json()["tags"] == ["pr-70"]  # a comma-separated string is taken too
    patched = api.patch(
        f"/api/v1/runs/{other.json()['id']}/",
        {"note": "flaky host", "tags": ["retry"]},
        format="json",
    )
    assert patched.status_code == 200 and patched.json()["tags"] == ["retry"]

    def found(q: str) -> set[int]:
        return {r["id"] for r in api.get("/api/v1/runs/", {"q": q}).json()["results"]}

    mine, theirs = run["id"], other.json()["id"]
    assert found("nightly-42") == {mine}  # name
    assert found("pr-7") == {mine}  # a whole tag, not pr-70's prefix
    assert found("retry") == {theirs}
    assert found("tokenizer") == {mine} and found("flaky") == {theirs}  # notes
    assert found("abcdef") == {mine}  # commit prefix
    assert found("train.steps") == {mine, theirs}  # a strategy key both set
    assert found("model.preset=tiny") == {mine, theirs} and found("model.preset=7b") == set()
    bad = api.post(
        "/api/v1/runs/", {"experiment": experiment.pk, "tags": ["ok", "no spaces"]}, format="json"
    )
    assert bad.status_code == 400 and "tags[1]" in str(bad.json())
    tagged = api.patch(
        f"/api/v1/experiments/{experiment.pk}/", {"tags": ["q4", "tokenizer"]}, format="json"
    )
    assert tagged.status_code == 200 and tagged.json()["tags"] == ["q4", "tokenizer"]


def test_a_created_run_says_how_often_to_send_its_telemetry(api, experiment, settings):
    """COSTLAB_TELEMETRY_SEND_EVERY_S reaches clients with the run (the SDK follows it); unset,
    null: the client's own default."""
    body = {"experiment": experiment.pk, "kind": "external"}
    assert api.post("/api/v1/runs/", body, format="json").json()["telemetry_send_every_s"] is None
    settings.COSTLAB_TELEMETRY_SEND_EVERY_S = 60.0
    created = api.post("/api/v1/runs/", {**body, "run_key": "fleet-1"}, format="json")
    assert created.status_code == 201 and created.json()["telemetry_send_every_s"] == 60.0
    shown = api.get(f"/api/v1/runs/{created.json()['id']}/").json()
    assert shown["telemetry_send_every_s"] == 60.0
