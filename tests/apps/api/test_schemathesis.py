"""Schemathesis against the live schema on a live server: no 5xx, every response matches the schema
(the error bodies included), and every operation refuses missing or bad credentials.

Bounded: a few examples per operation (positive and negative), so it runs in seconds.
Not checked: that every schema-valid body is accepted. A strategy's YAML, a reference to an object
that does not exist, a quota or a run's state are rules JSON Schema cannot state; their refusal is a
400/409 that names the field, as documented."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import positive_data_acceptance

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

pytestmark = pytest.mark.slow
REAL_IDS: dict[str, list[int]] = {}


@pytest.fixture
def api_schema(live_server, transactional_db, settings):
    """The schema as served, with real objects of the caller's tenant to aim at
    (and another tenant's)."""
    from apps.api.services import api_token_create

    settings.COSTLAB_API_THROTTLE_CACHE = "default"
    settings.COSTLAB_API_THROTTLE_RATES = dict.fromkeys(
        settings.COSTLAB_API_THROTTLE_RATES, "100000/min"
    )
    tenant, other = (
        TenantFactory(slug="fuzz", max_concurrent_runs=10_000),
        TenantFactory(slug="victim"),
    )
    experiments = []
    for owner in (tenant, other):
        exp = ExperimentFactory(
            tenant=owner, cost_model=CostModelFactory(tenant=owner), status="active"
        )
        ArmFactory(experiment=exp, name="control", is_control=True, strategy_yaml=GOOD)
        ArmFactory(experiment=exp, name="candidate", strategy_yaml=OTHER)
        GpuPriceFactory(pricing_table=PricingTableFactory(tenant=owner), sku=GpuSkuFactory())
        experiments.append(exp)
    exp = experiments[0]
    runs = [
        RunFactory(arm=arm, kind=kind, status="running")
        for arm in exp.arms.all()
        for kind in ("external", "worker")
    ]
    REAL_IDS.clear()
    REAL_IDS.update(
        {
            "experiments": [e.pk for e in experiments],
            "arms": [a.pk for e in experiments for a in e.arms.all()],
            "runs": [r.pk for r in runs],
            "pricing-tables": [t.pk for t in tenant.pricing_tables.all()],
            "cost-models": [exp.cost_model_id],
            "gpu-skus": [1],
        }
    )
    _token, secret = api_token_create(tenant=tenant, name="fuzzer")
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/schema/")
    schema.config.update(headers={"Authorization": f"Bearer {secret}"})

    @schema.hook
    def flatmap_path_parameters(context, path_parameters):
        """Half the cases aim at objects that exist (ours and the other tenant's),
        not random ids."""
        resource = context.operation.path.split("/")[3]
        if not path_parameters or "id" not in path_parameters or resource not in REAL_IDS:
            return st.just(path_parameters)
        return st.sampled_from(REAL_IDS[resource]).map(
            lambda pk: {**path_parameters, "id": pk}
        ) | st.just(path_parameters)

    return schema


def test_the_api_keeps_its_schema(api_schema):
    """Every operation, a few generated cases each. (A loop over operations rather than
    schemathesis.pytest.from_fixture, which reads a pytest attribute that pytest 9 removed.)"""
    failures, operations = [], 0
    for result in api_schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @settings(
            max_examples=10,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def check(case):
            case.call_and_validate(excluded_checks=[positive_data_acceptance])

        try:
            check()
        except Exception as exc:  # collect every operation's failure, then report them together
            failures.append(f"{operation.label}: {exc}")
    assert operations >= 30
    assert not failures, "\n\n".join(failures)


def test_every_operation_refuses_missing_or_bad_credentials(api_schema, live_server):
    """Beyond schemathesis' own probe (it checks operations that answered 2xx): every operation,
    every method."""
    import httpx

    checked = 0
    with httpx.Client(base_url=live_server.url, timeout=10) as http:
        for path, item in api_schema.raw_schema["paths"].items():
            resource = path.split("/")[3]
            url = path.replace("{id}", str(REAL_IDS.get(resource, [1])[0]))
            for method in item:
                for headers in (
                    {},
                    {"Authorization": "Bearer clb_not-a-token"},
                    {"Authorization": "Basic eDp5"},
                ):
                    response = http.request(
                        method.upper(), url, headers=headers, json={} if method != "get" else None
                    )
                    assert response.status_code == 401, (method, url, headers, response.status_code)
                    assert response.json()["error"]["code"] in (
                        "not_authenticated",
                        "authentication_failed",
                    )
                checked += 1
    assert checked >= 30
