"""The worker records the cloud resource it runs on (COSTLAB_RESOURCE_ID, else an AWS instance's
DMI asset tag) on each run at its device record, for billing's reconciliation."""

from __future__ import annotations

import logging
import threading

import pytest

from apps.experiments.models import Run
from apps.experiments.services import run_submit
from tests.factories import ArmFactory, ExperimentFactory, GpuPriceFactory
from workers import training

pytestmark = pytest.mark.django_db

ARN = "arn:aws:ec2:us-east-1:123456789012:instance/i-0abc1234def567890"


@pytest.fixture
def no_asset_tag(monkeypatch, tmp_path):
    monkeypatch.setattr(training, "AWS_ASSET_TAG", tmp_path / "absent")
    return tmp_path


def device_recorded(monkeypatch) -> Run:
    """A run claimed by this worker, its device recorded, then handed back before training."""
    monkeypatch.setattr(training, "run_profile", lambda **_: None)
    exp = ExperimentFactory(tenant=GpuPriceFactory().pricing_table.tenant, status="active")
    ArmFactory(experiment=exp, name="control", is_control=True)
    run = run_submit(experiment=exp)
    stopped = threading.Event()
    stopped.set()
    training._run_execute(run.pk, stopped)
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and run.host  # the device record ran
    return run


def test_the_worker_records_costlab_resource_id_on_the_run(monkeypatch, settings, no_asset_tag):
    settings.COSTLAB_RESOURCE_ID = f" {ARN} "
    assert device_recorded(monkeypatch).resource_id == ARN


def test_a_malformed_resource_id_is_logged_naming_it_and_the_run_trains_without(
    monkeypatch, settings, caplog, no_asset_tag
):
    settings.COSTLAB_RESOURCE_ID = "i-0abc 1234"
    with caplog.at_level(logging.ERROR, logger="workers.training"):
        run = device_recorded(monkeypatch)
    assert run.resource_id == ""
    assert (
        f"run {run.pk}: no cloud resource recorded: COSTLAB_RESOURCE_ID: character ' ' at "
        "position 7 is not allowed"
    ) in caplog.text


def test_without_the_setting_an_aws_instance_id_is_read_from_its_asset_tag(
    monkeypatch, settings, no_asset_tag
):
    settings.COSTLAB_RESOURCE_ID = ""
    tag = no_asset_tag / "board_asset_tag"
    monkeypatch.setattr(training, "AWS_ASSET_TAG", tag)
    assert training.resource_id(1) == ""  # no such file: nothing recorded
    tag.write_text("Default string\n")  # another cloud's or a desktop's tag: not an instance id
    assert training.resource_id(1) == ""
    tag.write_text("i-0abc1234def567890\n")
    assert training.resource_id(1) == "i-0abc1234def567890"
    settings.COSTLAB_RESOURCE_ID = ARN  # the setting wins
    assert training.resource_id(1) == ARN
