"""What a run trained and saved: its parameter counts and artifacts, recorded by run_finish, and the
one way to a saved file (never a path outside the run's artifacts directory)."""

from __future__ import annotations

import pytest

from apps.experiments import runs
from apps.experiments.models import Run
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db

ADAPTER = {
    "kind": "lora_adapter",
    "path": "adapter_model.safetensors",
    "bytes": 4096,
    "sha256": "a" * 64,
    "config_sha256": "c" * 64,
    "dataset_sha256": "d" * 64,
}


def claimed() -> Run:
    run = RunFactory(status="queued")
    runs.run_claim(run_id=run.pk, owner="w1")
    return run


def test_finish_records_the_parameter_counts_and_the_artifacts():
    run = claimed()
    assert runs.run_finish(
        run_id=run.pk,
        owner="w1",
        status="succeeded",
        dataset_sha256="d" * 64,
        params_total=124_439_808,
        params_trainable=294_912,
        artifacts=[ADAPTER],
    )
    run.refresh_from_db()
    assert run.status == "succeeded" and run.dataset_sha256 == "d" * 64
    assert (run.params_total, run.params_trainable) == (124_439_808, 294_912)
    assert run.artifacts == [ADAPTER]
    # The finish repeated (its answer lost with the connection) changes nothing.
    assert runs.run_finish(run_id=run.pk, owner="w1", status="succeeded", artifacts=[])
    run.refresh_from_db()
    assert run.artifacts == [ADAPTER]


def test_a_finish_without_them_keeps_the_defaults():
    run = claimed()
    assert runs.run_finish(run_id=run.pk, owner="w1", status="failed", error="boom")
    run.refresh_from_db()
    assert run.status == "failed"
    assert (run.params_total, run.params_trainable, run.artifacts) == (None, None, [])


def test_a_finish_refused_records_nothing():
    run = claimed()
    Run.objects.filter(pk=run.pk).update(status="cancelled", lease_owner="")  # no longer ours
    assert not runs.run_finish(
        run_id=run.pk, owner="w1", status="succeeded", params_total=10, artifacts=[ADAPTER]
    )
    run.refresh_from_db()
    assert (run.params_total, run.artifacts) == (None, [])


def test_the_artifacts_directory_is_one_per_run_under_var(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    assert runs.run_artifacts_dir(42) == tmp_path / "artifacts" / "runs" / "42"


def _saved(tmp_path, settings, artifacts, files=("adapter_model.safetensors",)) -> Run:
    settings.VAR_DIR = tmp_path
    run = RunFactory(status="succeeded", artifacts=artifacts)
    base = runs.run_artifacts_dir(run.pk)
    base.mkdir(parents=True)
    for name in files:
        (base / name).parent.mkdir(parents=True, exist_ok=True)
        (base / name).write_bytes(b"\0" * 16)
    return run


def test_an_artifact_file_is_found_by_its_name(settings, tmp_path):
    run = _saved(tmp_path, settings, [ADAPTER])
    artifact, path = runs.run_artifact_file(run, "adapter_model.safetensors")
    assert artifact == {**ADAPTER, "name": "adapter_model.safetensors"}
    assert path == runs.run_artifacts_dir(run.pk).resolve() / "adapter_model.safetensors"


@pytest.mark.parametrize(
    "name",
    ["other.safetensors", "", ".", "..", "../adapter_model.safetensors", "a/b", "a\\b", "x\x00"],
)
def test_names_not_in_the_run_or_that_could_leave_its_directory_are_refused(
    settings, tmp_path, name
):
    run = _saved(tmp_path, settings, [ADAPTER])
    assert runs.run_artifact_file(run, name) is None


def test_a_recorded_path_that_leaves_the_directory_or_a_missing_file_is_refused(settings, tmp_path):
    (tmp_path / "secret.safetensors").write_bytes(b"no")
    escaping = {**ADAPTER, "path": "../../../../secret.safetensors"}
    run = _saved(tmp_path, settings, [escaping, {**ADAPTER, "path": "gone.safetensors"}])
    assert runs.run_artifact_file(run, "secret.safetensors") is None
    assert runs.run_artifact_file(run, "gone.safetensors") is None


def test_an_artifact_in_a_subdirectory_goes_by_its_file_name(settings, tmp_path):
    nested = {**ADAPTER, "path": "adapter/adapter_model.safetensors"}
    run = _saved(tmp_path, settings, [nested], files=("adapter/adapter_model.safetensors",))
    _artifact, path = runs.run_artifact_file(run, "adapter_model.safetensors")
    assert path.parent.name == "adapter"
    listed = runs.run_artifacts_listed(run)
    assert listed[0]["name"] == "adapter_model.safetensors"
    assert listed[0]["path"] == "adapter/adapter_model.safetensors"


def test_the_worker_makes_the_directory_only_for_a_strategy_that_saves(settings, tmp_path):
    import gpu_runtime
    from workers.training import _artifacts_dir

    settings.VAR_DIR = tmp_path
    base = "model: {preset: tiny, seq_len: 32}\ndata: {source: synthetic}\n"
    plain = gpu_runtime.load_strategy(base)
    saves = gpu_runtime.load_strategy(base + "finetune: {save: true}\n")
    assert _artifacts_dir(7, plain) is None
    assert not (tmp_path / "artifacts").exists()
    made = _artifacts_dir(7, saves)
    assert made == str(tmp_path / "artifacts" / "runs" / "7")
    assert (tmp_path / "artifacts" / "runs" / "7").is_dir()
