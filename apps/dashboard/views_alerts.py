"""Alert channels on the experiment page: a tenant admin (or staff) adds a webhook or mail channel
for the experiment or the whole team, sends a test, and removes one (asked first)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from apps.alerts.models import AlertChannel
from apps.alerts.services import alert_channel_create, alert_channel_test
from apps.dashboard import selectors
from apps.dashboard.actions import act


def _managed(request, pk: int):
    """The experiment, when the user may manage its alert channels (404 otherwise)."""
    experiment = get_object_or_404(selectors.experiments_visible(user=request.user), pk=pk)
    if experiment.tenant_id not in {t.pk for t in selectors.token_tenants(user=request.user)}:
        messages.error(request, "alert channels: only a tenant admin (or staff) manages them")
        return experiment, False
    return experiment, True


def _channel(request, pk: int) -> AlertChannel:
    tenants = [t.pk for t in selectors.token_tenants(user=request.user)]
    return get_object_or_404(
        AlertChannel.objects.select_related("tenant", "experiment"), pk=pk, tenant_id__in=tenants
    )


def _back(channel_or_experiment_id: int):
    return redirect(f"/experiments/{channel_or_experiment_id}/#alert-channels")


@login_required
@require_POST
def alert_channel_add(request, pk: int):
    experiment, allowed = _managed(request, pk)
    if allowed:
        post = request.POST
        act(
            request,
            lambda: alert_channel_create(
                experiment=experiment,
                name=post.get("name", ""),
                webhook_url=post.get("webhook_url", ""),
                webhook_secret=post.get("webhook_secret", ""),
                email_recipients=post.get("email_recipients", ""),
                tenant_wide=post.get("scope") == "tenant",
            ),
            done=lambda channel: f"Alert channel '{channel.name}' added.",
        )
    return _back(experiment.pk)


@login_required
@require_POST
def alert_channel_test_view(request, pk: int):
    channel = _channel(request, pk)
    back = int(request.POST.get("experiment") or 0) or channel.experiment_id or 0
    for r in alert_channel_test(channel=channel, actor=request.user):
        code = f" (HTTP {r['status']})" if r["status"] else ""
        outcome = f"delivered{code}" if r["ok"] else f"not delivered ({r['error']})"
        said = f"{r['kind']} {r['target']}: {outcome}"
        (messages.success if r["ok"] else messages.error)(
            request, f"Test of '{channel.name}': {said}"
        )
    return _back(back)


@login_required
@require_POST
def alert_channel_delete(request, pk: int):
    channel = _channel(request, pk)
    back = int(request.POST.get("experiment") or 0) or channel.experiment_id or 0
    name = channel.name
    channel.delete()
    messages.success(request, f"Alert channel '{name}' removed.")
    return _back(back)
