"""A run's model over the API: its parameter counts and artifacts on the run, and the download of a
saved file, tenant-isolated and by name only (no path reaches outside the run's directory)."""

from __future__ import annotations

import hashlib

import pytest

from apps.experiments.runs import run_artifacts_dir
from tests.apps.api.conftest import error
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db

CONTENT = b"safetensors bytes" * 64
ADAPTER = {
    "kind": "lora_adapter",
    "path": "adapter_model.safetensors",
    "bytes": len(CONTENT),
    "sha256": hashlib.sha256(CONTENT).hexdigest(),
    "config_sha256": "c" * 64,
    "dataset_sha256": "d" * 64,
}


@pytest.fixture
def saved(experiment, settings, tmp_path):
    """A finished LoRA run of the tenant with its adapter on disk (and a file beside the run's
    directory that no name may reach)."""
    settings.VAR_DIR = tmp_path
    run = RunFactory(
        arm=experiment.arms.get(name="control"),
        status="succeeded",
        params_total=124_439_808,
        params_trainable=294_912,
        artifacts=[ADAPTER],
    )
    base = run_artifacts_dir(run.pk)
    base.mkdir(parents=True)
    (base / ADAPTER["path"]).write_bytes(CONTENT)
    (base.parent / "secret.safetensors").write_bytes(b"another run's")
    return run


def url(run) -> str:
    return f"/api/v1/runs/{run.pk}/artifacts/"


def test_the_run_says_its_parameters_and_artifacts(api, saved):
    for path in (f"/api/v1/runs/{saved.pk}/", "/api/v1/runs/"):
        body = api.get(path).json()
        run = body if "id" in body else next(r for r in body["results"] if r["id"] == saved.pk)
        assert (run["params_total"], run["params_trainable"]) == (124_439_808, 294_912)
        assert run["artifacts"] == [{**ADAPTER, "name": "adapter_model.safetensors"}]


def test_a_run_without_them_reads_null_and_empty(api, experiment):
    run = RunFactory(arm=experiment.arms.get(name="control"), status="succeeded")
    body = api.get(f"/api/v1/runs/{run.pk}/").json()
    assert (body["params_total"], body["params_trainable"], body["artifacts"]) == (None, None, [])


def test_they_are_read_only(api, saved):
    response = api.patch(
        f"/api/v1/runs/{saved.pk}/",
        {"note": "ok", "params_total": 1, "artifacts": []},
        format="json",
    )
    assert response.status_code == 200 and response.json()["params_total"] == 124_439_808
    saved.refresh_from_db()
    assert saved.params_total == 124_439_808 and saved.artifacts == [ADAPTER]


def test_an_artifact_downloads_as_the_file(api, saved):
    response = api.get(url(saved), {"name": "adapter_model.safetensors"})
    assert response.status_code == 200
    assert response["Content-Type"] == "application/octet-stream"
    assert 'filename="adapter_model.safetensors"' in response["Content-Disposition"]
    content = b"".join(response.streaming_content)
    assert content == CONTENT and hashlib.sha256(content).hexdigest() == ADAPTER["sha256"]


def test_a_dashboard_session_downloads_it_too(session, saved):
    response = session.get(url(saved), {"name": "adapter_model.safetensors"})
    assert response.status_code == 200 and b"".join(response.streaming_content) == CONTENT


def test_another_tenants_token_gets_404_as_for_a_missing_run(other_api, saved):
    response = other_api.get(url(saved), {"name": "adapter_model.safetensors"})
    missing = other_api.get("/api/v1/runs/999999999/artifacts/", {"name": "x"})
    assert response.status_code == missing.status_code == 404
    assert error(response) == error(missing)
    assert b"safetensors bytes" not in response.content


@pytest.mark.parametrize(
    "name",
    [
        "other.safetensors",
        "..",
        ".",
        "../secret.safetensors",
        "secret.safetensors",
        "..%2Fsecret.safetensors",
        "/etc/passwd",
        "adapter/../adapter_model.safetensors",
        "a\\b",
    ],
)
def test_names_not_in_the_run_and_traversal_are_404(api, saved, name):
    response = api.get(url(saved), {"name": name})
    assert response.status_code == 404, name
    assert error(response)["code"] == "not_found"
    assert b"another run" not in response.content


def test_a_name_is_required(api, saved):
    response = api.get(url(saved))
    assert response.status_code == 400 and "name" in error(response)["fields"]


def test_an_artifact_whose_file_is_gone_is_404(api, saved):
    (run_artifacts_dir(saved.pk) / ADAPTER["path"]).unlink()
    assert api.get(url(saved), {"name": ADAPTER["path"]}).status_code == 404


def test_the_schema_documents_the_download_and_the_fields():
    import yaml
    from rest_framework.test import APIClient

    schema = yaml.safe_load(APIClient().get("/api/schema/").content)
    op = schema["paths"]["/api/v1/runs/{id}/artifacts/"]["get"]
    assert "application/octet-stream" in op["responses"]["200"]["content"]
    assert any(p["name"] == "name" and p["in"] == "query" for p in op["parameters"])
    run = schema["components"]["schemas"]["RunDetail"]["properties"]
    assert {"params_total", "params_trainable", "artifacts"} <= set(run)
