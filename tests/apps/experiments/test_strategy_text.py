"""Strategy text is normalised (LF line endings, one final newline) before it is hashed or stored,
whichever way it comes in: the admin (arm page or experiment inline), the API, a direct save, the
CLI.
So a strategy typed into a browser (CRLF, no final newline) has the SHA-256 of the same YAML
file."""

from __future__ import annotations

import hashlib

import pytest
from django.urls import reverse

from apps.experiments.models import Arm
from apps.experiments.services import arm_create, arm_update
from apps.experiments.strategies import strategy_normalise, strategy_sha256
from tests.factories import ArmFactory, UserFactory

pytestmark = pytest.mark.django_db

FILE = (
    "model: {preset: tiny, seq_len: 32}\ndata: {source: synthetic}\n"
    "train: {steps: 5, global_batch: 2}\n"
)
TYPED = FILE.replace("\n", "\r\n").rstrip("\r\n")  # what a browser's textarea sends
FILE_SHA = hashlib.sha256(FILE.encode()).hexdigest()  # what `sha256sum strategy.yaml` says


def test_the_hash_is_of_the_normalised_text():
    assert strategy_sha256(TYPED) == strategy_sha256(FILE) == FILE_SHA
    assert strategy_sha256(FILE.replace("\n", "\r")) == FILE_SHA, "old Mac line endings too"
    assert strategy_normalise(FILE + "\n\n") == FILE, "one final newline"


def test_services_store_the_text_as_the_file_has_it():
    arm = ArmFactory()
    typed = arm_create(experiment=arm.experiment, name="typed", strategy_yaml=TYPED)
    assert typed.strategy_yaml == FILE and typed.strategy_sha256 == FILE_SHA
    edited = arm_update(arm=arm, strategy_yaml=TYPED).arm
    assert edited.strategy_yaml == FILE and edited.strategy_sha256 == FILE_SHA


def test_a_direct_save_keeps_text_and_hash_together():
    arm = ArmFactory()
    arm.strategy_yaml = TYPED
    arm.save()
    arm.refresh_from_db()
    assert arm.strategy_yaml == FILE and arm.strategy_sha256 == FILE_SHA


def test_the_api_stores_typed_text_as_the_file_has_it(client):
    from apps.api.services import api_token_create

    arm = ArmFactory()
    _, secret = api_token_create(tenant=arm.experiment.tenant, name="t")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {secret}"}
    created = client.post(
        "/api/v1/arms/",
        {"experiment": arm.experiment_id, "name": "typed", "strategy_yaml": TYPED, "weight": "0"},
        content_type="application/json",
        **auth,
    )
    assert created.status_code == 201, created.content
    assert created.json()["strategy_sha256"] == FILE_SHA
    found = client.get("/api/v1/arms/", {"strategy_sha256": FILE_SHA}, **auth).json()["results"]
    assert [a["name"] for a in found] == ["typed"]
    checked = client.post(
        "/api/v1/arms/validate/", {"strategy_yaml": TYPED}, content_type="application/json", **auth
    )
    assert checked.json()["strategy_sha256"] == FILE_SHA


def test_admin_inline_typed_text_is_stored_as_the_file_and_a_strategy_is_required(client):
    """The reported bug: arms added in the experiment's inline were stored with CRLF and no final
    newline."""
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    control = ArmFactory(is_control=True)
    exp = control.experiment
    url = reverse("admin:experiments_experiment_change", args=[exp.pk])
    form = {
        k: v for k, v in client.get(url).context["adminform"].form.initial.items() if v is not None
    }
    form.update(
        {
            "tenant": exp.tenant_id,
            "cost_model": exp.cost_model_id,
            "pricing_table": "",
            "target_steps": "",
            "status": exp.status,
            "freeze_policy": exp.freeze_policy,
            "arms-TOTAL_FORMS": "2",
            "arms-INITIAL_FORMS": "1",
            "arms-MIN_NUM_FORMS": "0",
            "arms-MAX_NUM_FORMS": "1000",
            "arms-0-id": str(control.pk),
            "arms-0-experiment": str(exp.pk),
            "arms-0-name": control.name,
            "arms-0-is_control": "on",
            "arms-0-weight": "1",
            "arms-0-strategy_yaml": control.strategy_yaml,
            "arms-1-experiment": str(exp.pk),
            "arms-1-name": "typed",
            "arms-1-weight": "0",
            "arms-1-strategy_yaml": "",
        }
    )
    refused = client.post(url, form)
    assert refused.status_code == 200, "an inline arm without a strategy is refused"
    assert "strategy_yaml" in refused.context["inline_admin_formsets"][0].formset.errors[1]
    form["arms-1-strategy_yaml"] = TYPED
    assert client.post(url, form).status_code == 302
    typed = Arm.objects.get(experiment=exp, name="typed")
    assert typed.strategy_yaml == FILE and typed.strategy_sha256 == FILE_SHA


def test_the_cli_hashes_the_file_as_the_server_does():
    from costlab_cli.submit import strategy_digest

    for text in (FILE, TYPED, FILE.replace("\n", "\r"), FILE + "\n\n"):
        assert strategy_digest(text) == strategy_sha256(text) == FILE_SHA
