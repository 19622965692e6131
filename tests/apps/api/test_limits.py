"""Oversized and hostile bodies are refused with the error body, and nothing is stored."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from apps.experiments.models import Arm, Experiment
from apps.telemetry.models import TelemetrySample
from tests.apps.api.conftest import GOOD, error
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db

ALIAS_BOMB = (
    GOOD
    + """
bomb:
  a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]
  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
  c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
  d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
  e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
  f: [*e, *e, *e, *e, *e, *e, *e, *e, *e]
"""
)


def post_raw(client, url, raw: bytes, content_type="application/json"):
    return client.generic("POST", url, raw, content_type=content_type)


def test_a_body_over_the_cap_is_413_before_it_is_read(api, experiment, settings):
    settings.COSTLAB_API_MAX_BODY_BYTES = 10_000
    body = json.dumps(
        {"experiment": experiment.pk, "name": "huge", "strategy_yaml": GOOD + "#" * 20_000}
    )
    response = post_raw(api, "/api/v1/arms/", body.encode())
    assert response.status_code == 413
    assert (
        error(response)["code"] == "request_too_large" and error(response)["limit_bytes"] == 10_000
    )
    assert "10000 bytes" in error(response)["message"]
    assert not Arm.objects.filter(name="huge").exists()


def test_telemetry_ingest_has_its_own_larger_cap(api, experiment, settings):
    settings.COSTLAB_API_MAX_BODY_BYTES = 1_000
    settings.COSTLAB_API_MAX_INGEST_BODY_BYTES = 200_000
    run = RunFactory(
        arm=experiment.arms.first(),
        kind="external",
        status="running",
        created=datetime.fromtimestamp(1_700_000_000 - 60, UTC),
    )
    samples = [{"seq": i, "ts": 1_700_000_000 + i, "power_w": 250.0} for i in range(500)]
    url = f"/api/v1/runs/{run.pk}/telemetry/"
    assert api.post(url, {"samples": samples}, format="json").json()["inserted"] == 500
    too_big = [{"seq": i, "ts": 1_700_000_000 + i, "device": "x" * 100} for i in range(5000)]
    response = api.post(url, {"samples": too_big}, format="json")
    assert response.status_code == 413 and TelemetrySample.objects.count() == 500


def test_a_batch_over_the_sample_limit_is_refused(api, experiment, settings):
    settings.COSTLAB_API_MAX_INGEST_BODY_BYTES = 10 * 1024 * 1024
    run = RunFactory(arm=experiment.arms.first(), kind="external", status="running")
    response = api.post(
        f"/api/v1/runs/{run.pk}/telemetry/",
        {"samples": [{"seq": i} for i in range(10_001)]},
        format="json",
    )
    assert (
        response.status_code == 400 and "at most 10000" in error(response)["fields"]["samples"][0]
    )
    assert not TelemetrySample.objects.exists()


def test_a_yaml_alias_bomb_is_refused_naming_the_anchor(api, experiment):
    response = api.post(
        "/api/v1/arms/",
        {"experiment": experiment.pk, "name": "bomb", "strategy_yaml": ALIAS_BOMB},
        format="json",
    )
    assert response.status_code == 400
    assert (
        error(response)["code"] == "invalid_strategy"
        and "anchors (&a) are not allowed" in error(response)["message"]
    )
    assert not Arm.objects.filter(name="bomb").exists()
    arm = experiment.arms.get(name="candidate")
    patched = api.patch(f"/api/v1/arms/{arm.pk}/", {"strategy_yaml": ALIAS_BOMB}, format="json")
    assert patched.status_code == 400 and Arm.objects.get(pk=arm.pk).revision == 1


def test_a_strategy_over_64_kib_is_refused(api, experiment):
    response = api.post(
        "/api/v1/arms/",
        {"experiment": experiment.pk, "name": "long", "strategy_yaml": GOOD + "#" * 70_000},
        format="json",
    )
    assert response.status_code == 400 and "strategy_yaml" in error(response)["fields"]


@pytest.mark.parametrize("depth", [40, 100_000])
def test_deeply_nested_json_is_refused(api, experiment, depth):
    raw = "[" * depth + "]" * depth
    body = f'{{"name": "deep", "cost_model": {experiment.cost_model_id}, "description": {raw}}}'
    response = post_raw(api, "/api/v1/experiments/", body.encode())
    assert response.status_code == 400 and "nested deeper than 32" in error(response)["message"]
    assert not Experiment.objects.filter(name="deep").exists()


@pytest.mark.parametrize("raw", [b'{"name": NaN}', b"{not json", b"\xff\xfe", b'{"name": "x",'])
def test_malformed_json_is_400_with_the_reason(api, raw):
    response = post_raw(api, "/api/v1/experiments/", raw)
    assert response.status_code == 400 and error(response)["message"].startswith("body:")


def test_other_media_types_are_415(api):
    response = post_raw(
        api, "/api/v1/experiments/", b"name=x", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 415 and error(response)["code"] == "unsupported_media_type"


def test_unknown_api_paths_answer_json_404(api):
    response = api.get("/api/v2/whatever")
    assert response.status_code == 404 and error(response)["code"] == "not_found"
    slashless = api.post("/api/v1/runs", {}, format="json")
    assert (
        slashless.status_code == 404
        and "end with a slash: /api/v1/runs/" in error(slashless)["message"]
    )
