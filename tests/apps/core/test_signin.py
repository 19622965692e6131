"""Sign-in lockouts: one username from one address, and one address over many usernames."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.urls import reverse

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

SPRAYER = "10.0.0.66"
PASSWORD = "right-password-1"
SIGN_IN_URLS = ["dashboard:login", "admin:login"]


@pytest.fixture
def staff():
    user = UserFactory(username="ops", is_staff=True)
    user.set_password(PASSWORD)
    user.save()
    return user


def _sign_in(client, url: str, username: str, password: str, address: str):
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address)


def _spray(client, url: str, failures: int, address: str = SPRAYER, prefix: str = "guess"):
    """Failed sign-ins from one address, each for another username; returns the last answer."""
    answers = [
        _sign_in(client, url, f"{prefix}-{i}", "Winter2026!", address) for i in range(failures)
    ]
    assert [a.status_code for a in answers[:-1]] == [200] * (failures - 1)
    return answers[-1]


def _signed_in(client) -> bool:
    return "_auth_user_id" in client.session


def test_the_address_bound_is_higher_than_the_per_username_one():
    assert settings.COSTLAB_LOGIN_ADDRESS_FAILURE_LIMIT == 30 and settings.AXES_FAILURE_LIMIT == 10


@pytest.mark.parametrize("name", SIGN_IN_URLS)
def test_a_spray_from_one_address_is_locked_out_after_the_address_bound(client, staff, name):
    """30 failed sign-ins from one address, each for a different username: the next one is
    refused (429), even a real user with the right password; another address is not affected."""
    url = reverse(name)
    assert _spray(client, url, settings.COSTLAB_LOGIN_ADDRESS_FAILURE_LIMIT).status_code == 429
    refused = _sign_in(client, url, "ops", PASSWORD, SPRAYER)
    assert refused.status_code == 429
    text = refused.content.decode()
    assert "Too many failed sign-ins from your address, over any usernames" in text
    assert "(30 within 15 min)" in text and not _signed_in(client)
    ok = _sign_in(client, url, "ops", PASSWORD, "10.0.0.67")
    assert ok.status_code == 302 and _signed_in(client)


def test_one_failure_below_the_address_bound_still_signs_in(client, staff):
    url = reverse("dashboard:login")
    assert _spray(client, url, settings.COSTLAB_LOGIN_ADDRESS_FAILURE_LIMIT - 1).status_code == 200
    ok = _sign_in(client, url, "ops", PASSWORD, SPRAYER)
    assert ok.status_code == 302 and _signed_in(client)


def test_the_failure_that_reaches_the_bound_gets_the_lockout_page(client):
    last = _spray(client, reverse("dashboard:login"), settings.COSTLAB_LOGIN_ADDRESS_FAILURE_LIMIT)
    assert last.status_code == 429 and b"over any usernames" in last.content


def test_signing_in_to_ones_own_account_does_not_clear_the_address_count(client):
    """A sprayer who owns an account clears only that account's failures by signing in."""
    own = UserFactory(username="insider")
    own.set_password(PASSWORD)
    own.save()
    url = reverse("dashboard:login")
    assert _spray(client, url, 20, prefix="first").status_code == 200
    assert _sign_in(client, url, "insider", "typo", SPRAYER).status_code == 200
    assert _sign_in(client, url, "insider", PASSWORD, SPRAYER).status_code == 302
    client.logout()
    last = _spray(client, url, settings.COSTLAB_LOGIN_ADDRESS_FAILURE_LIMIT - 20, prefix="then")
    assert last.status_code == 429
    assert _sign_in(client, url, "insider", PASSWORD, SPRAYER).status_code == 429


def test_the_per_username_lockout_still_holds_below_the_address_bound(client, staff):
    """10 wrong passwords for one username lock that username at that address out; the same
    address may still sign in as someone else (10 < 30)."""
    other = UserFactory(username="analyst")
    other.set_password(PASSWORD)
    other.save()
    url = reverse("dashboard:login")
    for _ in range(settings.AXES_FAILURE_LIMIT):
        _sign_in(client, url, "ops", "wrong", SPRAYER)
    refused = _sign_in(client, url, "ops", PASSWORD, SPRAYER)
    assert refused.status_code == 429 and not _signed_in(client)
    text = refused.content.decode()
    assert "Too many failed sign-ins for <strong>ops</strong> from your address" in text
    assert "(10 in a row)" in text
    ok = _sign_in(client, url, "analyst", PASSWORD, SPRAYER)
    assert ok.status_code == 302 and _signed_in(client)
