"""A priced tenant with an experiment (control + candidate) and an API token, for the SDK and its
callbacks to report to; the runs it left open are closed quickly at the end of each test."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.core.cache import caches

from tests.factories import (
    ArmFactory,
    CostModelFactory,
    ExperimentFactory,
    PricingTableFactory,
    TenantFactory,
)
from tests.helpers import purge_run_queues

CONTROL = (
    "model: {preset: tiny, seq_len: 32}\ndata: {source: synthetic}\n"
    "train: {steps: 10, global_batch: 4}\n"
)
CANDIDATE = CONTROL.replace("global_batch: 4", "global_batch: 8")
TWO_RANKS = CONTROL + "distributed: {nproc_per_node: 2}\n"  # a job of two processes, one run
# What an external CPU run of these tests holds, priced per vCPU-hour and GB-hour: a bill > 0.
HELD = {"vcpus": 2, "memory_gb": 4.0}


@pytest.fixture
def lab(transactional_db, settings, monkeypatch):
    """The tenant's world, committed (a server in another thread or process sees it)."""
    from apps.api.services import api_token_create

    settings.COSTLAB_API_THROTTLE_CACHE = "default"  # this process's memory: no earlier counts
    caches["default"].clear()
    tenant = TenantFactory(max_concurrent_runs=1000)
    PricingTableFactory(tenant=tenant, valid_from=datetime(2025, 6, 1, tzinfo=UTC))
    experiment = ExperimentFactory(
        tenant=tenant, status="active", cost_model=CostModelFactory(tenant=tenant)
    )
    control = ArmFactory(
        experiment=experiment, name="control", is_control=True, strategy_yaml=CONTROL
    )
    candidate = ArmFactory(experiment=experiment, name="candidate", strategy_yaml=CANDIDATE)
    ArmFactory(experiment=experiment, name="ddp", strategy_yaml=TWO_RANKS, weight=0)
    _token, secret = api_token_create(tenant=tenant, name="sdk")
    monkeypatch.setenv("COSTLAB_TOKEN", secret)
    for name in ("COSTLAB_RUN_KEY", "GITHUB_SHA", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    yield {"experiment": experiment, "control": control, "candidate": candidate, "token": secret}
    purge_run_queues()


@pytest.fixture
def served(lab, live_server, monkeypatch):
    """`lab` behind Django's live server (this process, another thread)."""
    monkeypatch.setenv("COSTLAB_URL", live_server.url)
    return {**lab, "url": live_server.url}


@pytest.fixture(autouse=True)
def close_left_runs():
    """A failed test must not leave a run whose exit handler waits on a server that is gone."""
    yield
    from costlab.exits import open_runs

    for run in list(open_runs):
        run.flush_timeout_s = 0.5
        run.close("failed", "left open by a test")
