"""The tokens page (issue 25): a tenant admin mints a token in the browser (the secret shown
once), lists it with its expiry, and revokes it; members and other teams cannot."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from apps.api.models import ApiToken
from apps.tenants.models import Membership
from tests.apps.dashboard.world import world

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(client, w):
    Membership.objects.filter(user=w.user).update(role=Membership.Role.ADMIN)
    client.force_login(w.user)
    return client


def test_an_admin_mints_sees_the_secret_once_lists_and_revokes(admin, w):
    url = reverse("dashboard:tokens")
    page = admin.get(url)
    assert page.status_code == 200 and "No tokens yet" in page.content.decode()
    minted = admin.post(
        url, {"tenant": w.experiment.tenant_id, "name": "github-ci", "expires_in_days": "30"}
    )
    assert minted.status_code == 201
    secret = re.search(r'id="token-secret">([^<]+)<', minted.content.decode()).group(1)
    assert "not shown again" in minted.content.decode()
    ci = APIClient(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert ci.get("/api/v1/experiments/").status_code == 200  # the token works
    listed = admin.get(url).content.decode()
    token = ApiToken.objects.get(name="github-ci")
    assert "github-ci" in listed and token.token_key in listed and secret not in listed
    assert (
        token.expiry is not None
        and round((token.expiry - token.created).total_seconds() / 86400) == 30
    )
    revoked = admin.post(reverse("dashboard:token-revoke", args=[token.pk]))
    assert revoked.status_code == 302
    assert ci.get("/api/v1/experiments/").status_code == 401  # stops at once
    assert "revoked" in admin.get(url).content.decode()


def test_bad_input_is_refused_naming_the_field(admin, w):
    url = reverse("dashboard:tokens")
    for body, field in (
        ({"name": " "}, "name:"),
        ({"name": "x", "expires_in_days": "0"}, "expires_in_days:"),
    ):
        answer = admin.post(url, {"tenant": w.experiment.tenant_id, **body})
        assert answer.status_code == 400 and field in answer.content.decode()
    assert not ApiToken.objects.exists()


def test_members_and_other_teams_cannot_manage_tokens(member, w):
    page = member.get(reverse("dashboard:tokens")).content.decode()
    assert "You administer no team" in page
    assert (
        member.post(reverse("dashboard:tokens"), {"tenant": w.experiment.tenant_id, "name": "x"})
    ).status_code == 404
    other = world()
    from apps.api.services import api_token_create

    theirs, _ = api_token_create(tenant=other.experiment.tenant, name="theirs")
    Membership.objects.filter(user=w.user).update(role=Membership.Role.ADMIN)
    assert member.post(reverse("dashboard:token-revoke", args=[theirs.pk])).status_code == 404
    assert ApiToken.objects.get(pk=theirs.pk).revoked_at is None
