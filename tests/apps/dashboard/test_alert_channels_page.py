"""Alert channels on the experiment page (issue 25): a tenant admin adds a webhook channel, sends
a test that a real local receiver gets signed, and removes it; a member sees them, cannot
change them; bad input names its field."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from django.core import mail
from django.urls import reverse

from apps.alerts.models import AlertChannel
from apps.tenants.models import Membership
from tests.apps.attribution.receiver import webhook_receiver

pytestmark = pytest.mark.django_db


def page_of(client, w) -> str:
    return client.get(reverse("dashboard:experiment", args=[w.experiment.pk])).content.decode()


def test_an_admin_adds_tests_and_removes_a_channel(client, w):
    Membership.objects.filter(user=w.user).update(role=Membership.Role.ADMIN)
    client.force_login(w.user)
    assert "No alert channel" in page_of(client, w)
    add = reverse("dashboard:alert-channel-add", args=[w.experiment.pk])
    with webhook_receiver() as receiver:
        answer = client.post(
            add, {"name": "ops", "webhook_url": receiver.url, "webhook_secret": "s3cret"}
        )
        assert answer.status_code == 302
        channel = AlertChannel.objects.get(name="ops")
        assert (
            channel.experiment_id == w.experiment.pk and channel.tenant_id == w.experiment.tenant_id
        )
        assert "ops" in page_of(client, w) and "Send a test" in page_of(client, w)
        tested = client.post(
            reverse("dashboard:alert-channel-test", args=[channel.pk]), follow=True
        ).content.decode()
        assert "delivered (HTTP 200)" in tested
        [request] = receiver.requests
        assert request["body"]["kind"] == "test" and request["body"]["channel"] == "ops"
        raw = request["raw"].encode()
        signed = "sha256=" + hmac.new(b"s3cret", raw, hashlib.sha256).hexdigest()
        assert request["headers"]["X-Costlab-Signature"] == signed
    client.post(add, {"name": "team", "email_recipients": "a@example.com", "scope": "tenant"})
    team = AlertChannel.objects.get(name="team")
    assert team.experiment_id is None  # every experiment of the team, budget steps included
    client.post(reverse("dashboard:alert-channel-test", args=[team.pk]))
    assert mail.outbox and "test alert on channel 'team'" in mail.outbox[-1].subject
    client.post(reverse("dashboard:alert-channel-delete", args=[channel.pk]))
    assert not AlertChannel.objects.filter(pk=channel.pk).exists()


def test_bad_channels_are_refused_naming_the_field(client, w):
    Membership.objects.filter(user=w.user).update(role=Membership.Role.ADMIN)
    client.force_login(w.user)
    add = reverse("dashboard:alert-channel-add", args=[w.experiment.pk])
    for body, field in (
        ({"name": "x"}, "webhook_url:"),
        ({"name": "x", "webhook_url": "not a url"}, "webhook_url:"),
        ({"name": "", "email_recipients": "a@example.com"}, "name:"),
    ):
        shown = client.post(add, body, follow=True).content.decode()
        assert field in shown, body
    assert not AlertChannel.objects.exists()


def test_a_member_sees_channels_but_cannot_change_them(member, w):
    channel = AlertChannel.objects.create(
        tenant_id=w.experiment.tenant_id, name="ops", webhook_url="http://127.0.0.1:9/x"
    )
    page = page_of(member, w)
    assert "ops" in page and "Send a test" not in page
    member.post(reverse("dashboard:alert-channel-add", args=[w.experiment.pk]), {"name": "y"})
    assert AlertChannel.objects.count() == 1
    assert (
        member.post(reverse("dashboard:alert-channel-test", args=[channel.pk])).status_code == 404
    )
    assert (
        member.post(reverse("dashboard:alert-channel-delete", args=[channel.pk])).status_code == 404
    )
