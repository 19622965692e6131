"""A live server with one tenant's experiment (control + candidate, priced runs) and a token
for the CLI."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.cache import caches

from tests.factories import (
    ArmFactory,
    CostModelFactory,
    ExperimentFactory,
    RunFactory,
    TenantFactory,
)
from tests.helpers import purge_run_queues

CONTROL = (
    "model: {preset: tiny, seq_len: 32}\ndata: {source: synthetic}\n"
    "train: {steps: 5, global_batch: 2}\n"
)
CANDIDATE = CONTROL.replace("steps: 5", "steps: 7")


def priced_run(arm, usd: str, tokens: int = 1_000_000, **fields):
    return RunFactory(
        arm=arm,
        status="succeeded",
        priced_seq=5,
        last_seq=5,
        tokens=tokens,
        steps=50,
        cost_usd=Decimal(usd),
        device_seconds=30.0,
        **fields,
    )


@pytest.fixture
def lab(live_server, transactional_db, settings, monkeypatch):
    from apps.api.services import api_token_create

    settings.COSTLAB_API_THROTTLE_CACHE = (
        "default"  # this process's memory, emptied: no counts from other tests
    )
    caches["default"].clear()
    tenant = TenantFactory(slug="ci-team", max_concurrent_runs=1000)
    experiment = ExperimentFactory(
        tenant=tenant, name="batching", status="active", cost_model=CostModelFactory(tenant=tenant)
    )
    control = ArmFactory(
        experiment=experiment, name="control", is_control=True, strategy_yaml=CONTROL
    )
    candidate = ArmFactory(experiment=experiment, name="candidate", strategy_yaml=CANDIDATE)
    _token, secret = api_token_create(tenant=tenant, name="github-ci")
    monkeypatch.setenv("COSTLAB_URL", live_server.url)
    monkeypatch.setenv("COSTLAB_TOKEN", secret)
    monkeypatch.delenv("GITHUB_SHA", raising=False)
    monkeypatch.delenv("COSTLAB_RUN_KEY", raising=False)
    yield {
        "experiment": experiment,
        "control": control,
        "candidate": candidate,
        "url": live_server.url,
        "token": secret,
    }
    purge_run_queues()


def cli(capsys, *argv) -> tuple[int, str, str]:
    """Run the CLI in this process: (exit code, stdout, stderr), stripped."""
    from costlab_cli.main import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.strip(), err.strip()


@pytest.fixture
def strategy(tmp_path):
    """A writer of strategy files: strategy(text, name) -> its path."""

    def write(text: str, name: str = "strategy.yaml") -> str:
        path = tmp_path / name
        path.write_bytes(text.encode())
        return str(path)

    return write
