"""Token management over the API: a tenant admin in a session lists,
mints (secret once) and revokes."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from apps.api.models import ApiToken
from tests.apps.api.conftest import error
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_session(tenant):
    client = APIClient()
    client.force_login(
        MembershipFactory(tenant=tenant, user=UserFactory(username="ada"), role="admin").user
    )
    return client


def test_an_admin_mints_lists_and_revokes(admin_session, tenant):
    created = admin_session.post(
        "/api/v1/tokens/", {"name": "gha", "expires_in_days": 30}, format="json"
    )
    assert created.status_code == 201
    secret = created.json()["token"]
    assert secret.startswith(created.json()["prefix"]) and created.json()["created_by"] == "ada"
    listed = admin_session.get("/api/v1/tokens/").json()["results"]
    assert [t["name"] for t in listed] == ["gha"] and "token" not in listed[0]
    ci = APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert ci.get("/api/v1/me/").status_code == 200
    assert admin_session.delete(f"/api/v1/tokens/{listed[0]['id']}/").status_code == 204
    assert ci.get("/api/v1/me/").status_code == 401
    assert ApiToken.objects.get().revoked_at is not None  # kept for audit


def test_members_and_tokens_cannot_manage_tokens(session, api):
    for client in (session, api):
        response = client.get("/api/v1/tokens/")
        assert response.status_code == 403 and "admin" in error(response)["message"]
    assert api.post("/api/v1/tokens/", {"name": "escalate"}, format="json").status_code == 403
    assert ApiToken.objects.count() == 1  # only the fixture's


def test_a_blank_name_is_refused(admin_session):
    response = admin_session.post("/api/v1/tokens/", {"name": ""}, format="json")
    assert response.status_code == 400 and "name" in error(response)["fields"]
