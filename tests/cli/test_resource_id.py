"""`costlab submit --external --resource-id` sends the cloud resource an external run trains on
(billing's reconciliation matches it to the invoice); a worker run refuses it."""

from __future__ import annotations

import pytest

from apps.experiments.models import Run
from tests.cli.conftest import CANDIDATE, cli

pytestmark = pytest.mark.slow
ARN = "arn:aws:ec2:us-east-1:123456789012:instance/i-0abc"


def test_submit_external_sends_its_resource_id(lab, capsys, strategy):
    exp = str(lab["experiment"].pk)
    path = strategy(CANDIDATE)
    base = ("submit", "--experiment", exp, "--strategy", path)
    code, _, err = cli(capsys, *base, "--external", "--resource-id", ARN)
    assert code == 0, err
    assert Run.objects.get().resource_id == ARN
    code, _, err = cli(capsys, *base, "--resource-id", ARN)
    assert code == 2 and "--resource-id: only for --external runs" in err
    code, _, err = cli(capsys, *base, "--external", "--resource-id", "i-0abc def")
    assert code == 2 and "resource_id: character ' ' at position 7 is not allowed" in err
