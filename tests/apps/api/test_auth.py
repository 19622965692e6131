"""Tokens (hashed, scoped to one tenant, expiring, revocable), sessions with CSRF, throttling."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from apps.api.models import ApiToken
from tests.apps.api.conftest import error, token_client
from tests.factories import MembershipFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db
ME = "/api/v1/me/"


def test_no_credentials_is_401_with_the_error_body_and_a_challenge():
    response = APIClient().get("/api/v1/experiments/")
    assert response.status_code == 401
    assert error(response)["code"] == "not_authenticated"
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "header", ["Bearer nope", "Bearer clb_0123456789abcdef", "Token x y", "Bearer \u00e9t\u00e9"]
)
def test_a_bad_token_is_refused(header, tenant):
    token_client(tenant)  # a real token exists; a wrong one must still fail
    response = APIClient().get(ME, HTTP_AUTHORIZATION=header.encode("utf-8").decode("latin-1"))
    assert response.status_code == 401
    assert error(response)["code"] == "authentication_failed"


def test_the_token_is_stored_as_a_digest_and_acts_for_its_tenant_only(api, tenant):
    token = ApiToken.objects.get()
    assert api.secret.startswith("clb_") and len(api.secret) == 68
    assert api.secret not in (token.digest, token.token_key) and token.digest != api.secret
    assert len(token.digest) == 128  # sha512 hex
    body = api.get(ME).json()
    assert (
        body["tenant"]["slug"] == tenant.slug and body["auth"] == "token" and body["staff"] is False
    )
    assert body["principal"] == "token:ci"
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_revoked_and_expired_tokens_stop_working(api, tenant):
    assert api.get(ME).status_code == 200
    ApiToken.objects.update(expiry=timezone.now() - timedelta(seconds=1))
    response = api.get(ME)
    assert response.status_code == 401 and "expired" in error(response)["message"]
    ApiToken.objects.update(expiry=None, revoked_at=timezone.now())
    response = api.get(ME)
    assert response.status_code == 401 and "revoked" in error(response)["message"]


def test_the_management_command_prints_the_secret_once_and_revoke_stops_it(tenant):
    out, err = StringIO(), StringIO()
    call_command(
        "api_token_create",
        "--tenant",
        tenant.slug,
        "--name",
        "github",
        "--expires-days",
        "7",
        stdout=out,
        stderr=err,
    )
    secret = out.getvalue().strip()
    assert secret.startswith("clb_") and "not shown again" in err.getvalue()
    token = ApiToken.objects.get(name="github")
    assert timedelta(days=6) < token.expiry - timezone.now() <= timedelta(days=7)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {secret}")  # knox's keyword works too
    assert client.get(ME).status_code == 200
    call_command("api_token_revoke", "--tenant", tenant.slug, "--name", "github", stdout=StringIO())
    assert client.get(ME).status_code == 401


def test_a_session_needs_csrf_for_writes(member, experiment):
    session = APIClient(enforce_csrf_checks=True)
    session.force_login(member)
    assert session.get("/api/v1/experiments/").status_code == 200
    body = {
        "experiment": experiment.pk,
        "name": "new",
        "strategy_yaml": experiment.arms.first().strategy_yaml,
    }
    refused = session.post("/api/v1/arms/", body, format="json")
    assert refused.status_code == 403 and "CSRF" in error(refused)["message"]
    session.get("/admin/login/")  # any page that sets the CSRF cookie
    csrf = session.cookies["csrftoken"].value
    assert (
        session.post("/api/v1/arms/", body, format="json", HTTP_X_CSRFTOKEN=csrf).status_code == 201
    )


def test_a_member_of_several_tenants_names_one(member, tenant):
    second = TenantFactory(slug="second")
    MembershipFactory(user=member, tenant=second)
    client = APIClient()
    client.force_login(member)
    response = client.get(ME)
    assert response.status_code == 403 and "X-Costlab-Tenant" in error(response)["message"]
    assert client.get(ME, HTTP_X_COSTLAB_TENANT="second").json()["tenant"]["slug"] == "second"
    stranger = TenantFactory(slug="stranger")
    response = client.get(ME, HTTP_X_COSTLAB_TENANT=stranger.slug)
    assert response.status_code == 403 and "not a member" in error(response)["message"]


def test_a_user_without_a_tenant_is_refused():
    client = APIClient()
    client.force_login(UserFactory(username="loner"))
    response = client.get(ME)
    assert response.status_code == 403 and error(response)["code"] == "no_tenant"


def test_staff_may_act_on_any_tenant_they_name(staff, other_tenant):
    assert (
        staff.get(ME, HTTP_X_COSTLAB_TENANT=other_tenant.slug).json()["tenant"]["slug"] == "globex"
    )
    assert staff.get(ME).json()["staff"] is True


def test_a_token_minted_by_staff_has_no_staff_rights(tenant):
    client = token_client(tenant)
    ApiToken.objects.update(created_by=UserFactory(username="boss", is_staff=True))
    response = client.post("/api/v1/cost-models/", {"name": "x"}, format="json")
    assert response.status_code == 403 and "staff" in error(response)["message"]


def test_clients_are_throttled_per_token_with_retry_after(settings, tenant):
    settings.COSTLAB_API_THROTTLE_RATES = {**settings.COSTLAB_API_THROTTLE_RATES, "client": "3/min"}
    first, second = token_client(tenant, "a"), token_client(tenant, "b")
    assert [first.get(ME).status_code for _ in range(3)] == [200, 200, 200]
    response = first.get(ME)
    assert response.status_code == 429 and error(response)["code"] == "throttled"
    assert int(response["Retry-After"]) > 0
    assert second.get(ME).status_code == 200  # another client has its own budget


def test_failed_token_attempts_are_throttled_by_address(settings, api):
    settings.COSTLAB_API_THROTTLE_RATES = {
        **settings.COSTLAB_API_THROTTLE_RATES,
        "auth_failures": "2/min",
    }
    guesser = APIClient(HTTP_AUTHORIZATION="Bearer clb_guess", REMOTE_ADDR="10.0.0.9")
    assert [guesser.get(ME).status_code for _ in range(3)] == [401, 401, 429]
    assert (
        api.get(ME, REMOTE_ADDR="10.0.0.10").status_code == 200
    )  # a good token elsewhere is unaffected


def test_a_client_cannot_dodge_the_address_throttle_with_a_forwarded_header(settings):
    settings.COSTLAB_API_THROTTLE_RATES = {
        **settings.COSTLAB_API_THROTTLE_RATES,
        "auth_failures": "2/min",
    }
    codes = [
        APIClient(HTTP_AUTHORIZATION="Bearer clb_guess", HTTP_X_FORWARDED_FOR=f"10.9.9.{i}")
        .get(ME)
        .status_code
        for i in range(3)
    ]
    assert codes == [401, 401, 429]
