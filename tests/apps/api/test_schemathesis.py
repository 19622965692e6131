"""Schemathesis against the live schema on a live server: no 5xx, every response matches the schema
(the error bodies included), and every operation refuses missing or bad credentials.

Bounded: a few examples per operation (positive and negative), so it runs in seconds."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.apps.api.conftest import GOOD, OTHER
from tests.factories import (
    ArmFactory,
    CostModelFactory,
    ExperimentFactory,
    GpuPriceFactory,
    GpuSkuFactory,
    PricingTableFactory,
    RunFactory,
    TenantFactory,
)

pytestmark = [pytest.mark.services, pytest.mark.slow]
REAL_IDS: dict[str, list[int]] = {}


@pytest.fixture
def api_schema(live_server, transactional_db, settings):
    """The schema as served, with real objects of the caller's tenant to aim at (and another tenant's)."""
    from apps.api.services import api_token_create

    settings.COSTLAB_API_THROTTLE_CACHE = "default"
    settings.COSTLAB_API_THROTTLE_RATES = dict.fromkeys(settings.COSTLAB_API_THROTTLE_RATES, "100000/min")
    tenant, other = TenantFactory(slug="fuzz", max_concurrent_runs=10_000), TenantFactory(slug="victim")
    experiments = []
    for owner in (tenant, other):
        exp = ExperimentFactory(tenant=owner, cost_model=CostModelFactory(tenant=owner), status="active")
        ArmFactory(experiment=exp, name="control", is_control=True, strategy_yaml=GOOD)
        ArmFactory(experiment=exp, name="candidate", strategy_yaml=OTHER)
        GpuPriceFactory(pricing_table=PricingTableFactory(tenant=owner), sku=GpuSkuFactory())
        experiments.append(exp)
    exp = experiments[0]
    runs = [RunFactory(arm=arm, kind=kind, status="running") for arm in exp.arms.all() for kind in ("external", "worker")]
    REAL_IDS.clear()
    REAL_IDS.update({
        "experiments": [e.pk for e in experiments], "arms": [a.pk for e in experiments for a in e.arms.all()],
        "runs": [r.pk for r in runs], "pricing-tables": [t.pk for t in tenant.pricing_tables.all()],
        "cost-models": [exp.cost_model_id], "gpu-skus": [1],
    })
    _token, secret = api_token_create(tenant=tenant, name="fuzzer")
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/schema/")
    schema.config.update(headers={"Authorization": f"Bearer {secret}"})

    @schema.hook
    def flatmap_path_parameters(context, path_parameters):
        """Half the cases aim at objects that exist (ours and the other tenant's), not random ids."""
        resource = context.operation.path.split("/")[3]
        if "id" not in path_parameters or resource not in REAL_IDS:
            return st.just(path_parameters)
        return st.sampled_from(REAL_IDS[resource]).map(lambda pk: {**path_parameters, "id": pk}) | \
            st.just(path_parameters)

    return schema


lazy = schemathesis.pytest.from_fixture("api_schema")


@lazy.parametrize()
@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_the_api_keeps_its_schema(case):
    case.call_and_validate()
