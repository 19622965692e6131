"""The SDK sends the cloud resource a run trains on (resource_id=, else COSTLAB_RESOURCE_ID) when it
creates the run, for the server's billing reconciliation."""

from __future__ import annotations

import pytest

import costlab
from apps.experiments.models import Run
from tests.sdk.conftest import HELD

ARN = "arn:aws:ec2:us-east-1:123456789012:instance/i-0abc"


def test_the_run_is_created_with_its_resource_id(monkeypatch):
    monkeypatch.setenv("COSTLAB_RESOURCE_ID", "i-0env")
    said = costlab.Run(1, "control", mode="disabled", resource_id=ARN)
    assert said._create_body(deferred=False)["resource_id"] == ARN
    assert (
        costlab.Run(1, "control", mode="disabled")._create_body(deferred=False)["resource_id"]
        == "i-0env"
    )
    monkeypatch.delenv("COSTLAB_RESOURCE_ID")
    assert "resource_id" not in costlab.Run(1, "control", mode="disabled")._create_body(
        deferred=False
    )


@pytest.mark.services
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_server_records_what_the_sdk_sent(served, monkeypatch):
    monkeypatch.setenv("COSTLAB_RESOURCE_ID", ARN)
    with costlab.track(served["experiment"].pk, "control", device="cpu", **HELD) as run:
        run.log(step=1, tokens=10)
    assert Run.objects.get(pk=run.run_id).resource_id == ARN
