"""Two tenants, a token and a session for each kind of caller,
and an API client that speaks JSON."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.cache import caches
from rest_framework.test import APIClient

from apps.api.services import api_token_create
from tests.factories import (
    ArmFactory,
    CostModelFactory,
    ExperimentFactory,
    MembershipFactory,
    TenantFactory,
    UserFactory,
)

GOOD = (
    "model: {preset: tiny, seq_len: 32}\ndata: {source: synthetic}\n"
    "train: {steps: 5, global_batch: 2}\n"
)
OTHER = GOOD.replace("steps: 5", "steps: 7")


@pytest.fixture(autouse=True)
def _local_throttle_counters(settings):
    """Throttle counters in this process's memory, empty for each test (never the shared Redis)."""
    settings.COSTLAB_API_THROTTLE_CACHE = "default"
    caches["default"].clear()


@pytest.fixture
def tenant(db):
    return TenantFactory(slug="acme", max_concurrent_runs=100)


@pytest.fixture
def other_tenant(db):
    return TenantFactory(slug="globex", max_concurrent_runs=100)


def token_client(tenant, name="ci") -> APIClient:
    _token, secret = api_token_create(tenant=tenant, name=name)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    client.secret = secret
    return client


@pytest.fixture
def api(tenant) -> APIClient:
    """A CI client: the tenant's API token."""
    return token_client(tenant)


@pytest.fixture
def other_api(other_tenant) -> APIClient:
    return token_client(other_tenant, "other-ci")


@pytest.fixture
def member(tenant):
    return MembershipFactory(tenant=tenant, user=UserFactory(username="mia"), role="member").user


@pytest.fixture
def session(member) -> APIClient:
    """A dashboard user (CSRF checks off here; test_auth checks them)."""
    client = APIClient()
    client.force_login(member)
    return client


@pytest.fixture
def staff(tenant) -> APIClient:
    user = UserFactory(username="sam", is_staff=True)
    MembershipFactory(tenant=tenant, user=user, role="admin")
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def experiment(tenant):
    exp = ExperimentFactory(
        tenant=tenant,
        name="batching",
        status="active",
        cost_model=CostModelFactory(tenant=tenant, name="default"),
    )
    ArmFactory(
        experiment=exp, name="control", is_control=True, strategy_yaml=GOOD, weight=Decimal("1")
    )
    ArmFactory(experiment=exp, name="candidate", strategy_yaml=OTHER, weight=Decimal("1"))
    return exp


def error(response) -> dict:
    """The one error body every failure answers with."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"message", "code"} <= set(body["error"]), body
    return body["error"]
