"""The OpenAPI document: served at /api/schema/,
with auth schemes and the error body on every operation."""

from __future__ import annotations

import pytest
import yaml
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def test_the_schema_documents_auth_and_errors_for_every_operation():
    response = APIClient().get("/api/schema/")
    assert response.status_code == 200
    schema = yaml.safe_load(response.content)
    assert schema["openapi"].startswith("3.")
    token_auth = schema["components"]["securitySchemes"]["tokenAuth"]
    assert (token_auth["type"], token_auth["scheme"]) == ("http", "bearer")
    operations = [
        (path, method, op) for path, item in schema["paths"].items() for method, op in item.items()
    ]
    assert len(operations) >= 30 and all(path.startswith("/api/v1/") for path, _, _ in operations)
    for path, method, op in operations:
        assert {"tokenAuth": []} in op["security"], (path, method)
        for code in ("400", "401", "403", "404", "429"):
            body = op["responses"][code]["content"]["application/json"]["schema"]
            assert body == {"$ref": "#/components/schemas/Error"}, (path, method, code)
        if method in ("post", "patch"):
            assert "413" in op["responses"], (path, method)


def test_swagger_ui_is_served():
    response = APIClient().get("/api/schema/swagger/")
    assert response.status_code == 200 and b"swagger" in response.content.lower()
