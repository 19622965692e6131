"""The run page's model facts: the strategy's model (a team's checkpoint by its directory name, and
the fine-tune method), the parameters trained, and the files the run saved, downloadable by the
team only."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from apps.dashboard.selectors import RunParams
from apps.experiments.runs import run_artifacts_dir
from tests.apps.dashboard.test_pages import text
from tests.apps.dashboard.world import run_of, world

pytestmark = pytest.mark.django_db

HF_LORA = (
    "model: {family: hf, path: checkpoints/team-llama-7b/, seq_len: 32}\n"
    "data: {source: synthetic}\n"
    "train: {steps: 5, global_batch: 2}\n"
    "finetune: {method: lora, r: 4, alpha: 8, save: true}\n"
)
ADAPTER = {
    "kind": "lora_adapter",
    "path": "adapter_model.safetensors",
    "bytes": 2_500_000,
    "sha256": "ab12cd34ef56" + "0" * 52,
    "config_sha256": "c0ffee123456" + "1" * 52,
    "dataset_sha256": "da7a5e7abcde" + "2" * 52,
}


def lora_run(arm, **fields):
    return run_of(
        arm,
        config_yaml=HF_LORA,
        params_total=6_738_415_616,
        params_trainable=4_194_304,
        artifacts=[ADAPTER],
        **fields,
    )


def test_the_run_page_shows_the_checkpoint_method_parameters_and_artifacts(member, w):
    run = lora_run(w.candidate)
    response = member.get(reverse("dashboard:run", args=[run.pk]))
    assert response.status_code == 200
    page = text(response)
    assert "team-llama-7b" in page and "Hugging Face checkpoint" in page
    assert "finetune lora" in page and "r 4, alpha 8" in page
    assert "4,194,304 trainable / 6,738,415,616 total" in page and "(0.062 %)" in page
    html = response.content.decode()
    table = html[html.index('id="artifacts"') :]
    table = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", table[: table.index("</table>")]))
    for shown in ("lora_adapter", "adapter_model.safetensors", "2.4 MB", "ab12cd34ef56"):
        assert shown in table, shown
    assert "c0ffee123456" in table and "da7a5e7abcde" in table
    assert ADAPTER["sha256"] in html  # the full hash is there to copy (title)
    download = reverse("dashboard:run-artifact", args=[run.pk, "adapter_model.safetensors"])
    assert f'href="{download}"' in html


def test_a_run_of_costlabs_own_model_says_its_preset_and_no_artifacts(member, w):
    run = run_of(w.control)
    response = member.get(reverse("dashboard:run", args=[run.pk]))
    page = text(response)
    assert "costlab llama, preset tiny, full training from scratch" in page
    assert "Parameters not reported" in page
    assert 'id="artifacts"' not in response.content.decode()


def test_a_full_fine_tune_shows_every_parameter_trainable(member, w):
    full = HF_LORA.replace("method: lora, r: 4, alpha: 8, save: true", "method: full")
    run = run_of(w.control, config_yaml=full, params_total=4_000_000, params_trainable=4_000_000)
    page = text(member.get(reverse("dashboard:run", args=[run.pk])))
    assert "team-llama-7b" in page and "finetune full" in page and "from scratch" not in page
    assert "4,000,000 trainable / 4,000,000 total (100.0 %)" in page


def test_the_share_keeps_a_decimal_and_two_figures_when_tiny():
    assert RunParams(total=1000, trainable=8).trainable_pct_text == "0.8"
    assert RunParams(total=10**9, trainable=340_000).trainable_pct_text == "0.034"
    assert RunParams(total=10, trainable=None).trainable_pct_text == ""


def test_the_team_downloads_an_artifact_and_another_team_gets_404(
    client, member, w, settings, tmp_path
):
    settings.VAR_DIR = tmp_path
    run = lora_run(w.candidate)
    base = run_artifacts_dir(run.pk)
    base.mkdir(parents=True)
    (base / ADAPTER["path"]).write_bytes(b"adapter")
    (base.parent / "secret.safetensors").write_bytes(b"not yours")
    download = reverse("dashboard:run-artifact", args=[run.pk, "adapter_model.safetensors"])
    response = member.get(download)
    assert response.status_code == 200 and b"".join(response.streaming_content) == b"adapter"
    assert "attachment" in response["Content-Disposition"]
    for name in ("other.safetensors", "..", "secret.safetensors", "x..y"):
        path = reverse("dashboard:run-artifact", args=[run.pk, name])
        assert member.get(path).status_code == 404, name
    assert member.get(f"/runs/{run.pk}/artifacts/../secret.safetensors").status_code == 404
    other = world()
    client.force_login(other.user)
    assert client.get(download).status_code == 404
