"""Alerts for freezes and unfreezes, and for a tenant's budget steps (80 %, 100 %): webhook POST,
e-mail, and a structured log line.

The callers hand over plain payloads: attribution a freeze's (apps.attribution.say.freeze_alerts),
billing a budget step's figures (apps.billing.services). Nothing waits on a receiver: deliveries
are rows written in the caller's transaction and sent by the `costlab.alert_deliver` Celery task
once it commits. A delivery is attempted until it succeeds, fails permanently (a 4xx other than
408/429), or runs out of attempts; each attempt is recorded. The freeze, or the budget step, stands
whatever happens here. A payload's `kind` says which it is: "arm" (a freeze/unfreeze) or "budget".
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal

import httpx
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from apps.alerts.models import AlertChannel, AlertDelivery, BudgetEvent
from apps.core.exceptions import ApplicationError
from apps.core.queues import TaskName
from apps.tenants.models import Tenant

# The name these log lines have always carried (log filters read it), kept from before the move.
logger = logging.getLogger("costlab.alerts")

DELIVER_TASK = TaskName.ALERT_DELIVER
RETRYABLE_STATUS = {408, 425, 429}


# A budget step can stop tens of thousands of runs at once: the payload (a webhook's body, an
# e-mail, a log line) names this many of each kind, and counts them all; the event keeps every id.
BUDGET_ALERT_RUN_IDS = 100


def budget_alert_payload(*, event: BudgetEvent) -> dict:
    """The JSON body of a budget step (also its e-mail's and its log line's content). `runs` names
    up to BUDGET_ALERT_RUN_IDS runs of each kind, `run_counts` counts them all."""
    runs = {key: (event.runs or {}).get(key, []) for key in ("noted", "cancelled", "flagged")}
    return {
        "kind": "budget",
        "event": f"budget_{event.state}",  # budget_warned | budget_exceeded
        "event_id": event.pk,
        "at": event.created_at.isoformat(),
        "tenant": event.tenant.slug,
        "state": event.state,
        "month": f"{event.month:%Y-%m}",
        "spend_usd": f"{event.spend_usd:.6f}",
        "budget_usd": f"{event.budget_usd:.2f}",
        # spend / budget; null where the budget is 0 (any spend exceeds it)
        "share": round(float(event.spend_usd / event.budget_usd), 4) if event.budget_usd else None,
        "reason": event.reason,
        "runs": {key: ids[:BUDGET_ALERT_RUN_IDS] for key, ids in runs.items()},
        "run_counts": {key: len(ids) for key, ids in runs.items()},
    }


def _targets(channels, *, defaults: bool) -> list[tuple[str, str, str]]:
    """(kind, target, secret) once per target of the channels (the first channel's secret wins),
    and with `defaults` the settings' webhook and addresses."""
    targets: dict[tuple[str, str], str] = {}
    for channel in channels:
        if channel.webhook_url:
            targets.setdefault(
                (AlertDelivery.Kind.WEBHOOK, channel.webhook_url), channel.webhook_secret
            )
        if channel.recipients():
            targets.setdefault((AlertDelivery.Kind.EMAIL, ", ".join(channel.recipients())), "")
    if defaults and settings.COSTLAB_ALERT_WEBHOOK_URL:
        targets.setdefault((AlertDelivery.Kind.WEBHOOK, settings.COSTLAB_ALERT_WEBHOOK_URL), "")
    if defaults and settings.COSTLAB_ALERT_EMAILS:
        targets.setdefault((AlertDelivery.Kind.EMAIL, ", ".join(settings.COSTLAB_ALERT_EMAILS)), "")
    return [(kind, target, secret) for (kind, target), secret in targets.items()]


def arm_alerts_queue(
    *, payload: dict, freeze_event_id: int, tenant_id: int, experiment_id: int
) -> list[AlertDelivery]:
    """Write one delivery of a freeze/unfreeze's payload per target: every enabled channel of the
    experiment or its tenant, and the defaults; once the transaction commits, send them and log
    the event."""
    channels = (
        AlertChannel.objects.filter(tenant_id=tenant_id, enabled=True)
        .filter(Q(experiment__isnull=True) | Q(experiment_id=experiment_id))
        .order_by("pk")
    )
    return _deliveries_queue(
        payload=payload, targets=_targets(channels, defaults=True), event_id=freeze_event_id
    )


def budget_event_record(
    *,
    tenant: Tenant,
    month: date,
    state: str,
    spend_usd: Decimal,
    budget_usd: Decimal,
    reason: str,
    runs: dict[str, list[int]],
) -> BudgetEvent:
    """Record a budget step (billing's, apps.billing.services._budget_step) and queue its alerts
    to the tenant's tenant-wide channels, in the caller's transaction (the step's): they are sent
    once it commits."""
    event = BudgetEvent.objects.create(
        tenant=tenant,
        month=month,
        state=state,
        spend_usd=spend_usd,
        budget_usd=budget_usd,
        reason=reason,
        runs=runs,
    )
    channels = AlertChannel.objects.filter(
        tenant=tenant, experiment__isnull=True, enabled=True
    ).order_by("pk")
    _deliveries_queue(
        payload=budget_alert_payload(event=event),
        targets=_targets(channels, defaults=False),
        budget_event=event,
    )
    return event


def _deliveries_queue(
    *, payload: dict, targets: list[tuple[str, str, str]], **alerted
) -> list[AlertDelivery]:
    """One delivery per target of the event in `alerted` (event_id= or budget_event=); after the
    commit, the log line and the sends."""
    now = timezone.now()
    deliveries = AlertDelivery.objects.bulk_create(
        [
            AlertDelivery(
                **alerted,
                kind=kind,
                target=target,
                secret=secret,
                payload=payload,
                next_attempt_at=now,
            )
            for kind, target, secret in targets
        ]
    )
    ids = [d.pk for d in deliveries]
    line = json.dumps({**payload, "deliveries": len(ids)}, sort_keys=True, default=str)
    transaction.on_commit(lambda: logger.warning("%s %s", payload["event"], line))
    transaction.on_commit(lambda: deliveries_send(delivery_ids=ids), robust=True)
    return deliveries


def deliveries_send(*, delivery_ids: list[int], countdown: float | None = None) -> None:
    """Queue the delivery task for each id
    (a broker that is down leaves them pending for the requeue)."""
    from celery import current_app as app

    for pk in delivery_ids:
        app.send_task(DELIVER_TASK, args=[pk], countdown=countdown)


@dataclass(frozen=True)
class AttemptOutcome:
    status: str  # the delivery's status after this attempt
    retry_in_s: float | None = None  # set when the task should try again after this many seconds
    detail: str = ""


def backoff_s(attempt: int) -> float:
    """Seconds to wait after the attempt-th failure: base x 2^(attempt-1), capped."""
    return min(
        settings.COSTLAB_ALERT_BACKOFF_S * 2 ** (attempt - 1), settings.COSTLAB_ALERT_BACKOFF_MAX_S
    )


def _signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _post(
    delivery: AlertDelivery, *, key: str | None = None, timeout_s: float | None = None
) -> tuple[bool, bool, int | None, str]:
    """One webhook POST: (delivered, retryable, status code, error)."""
    body = json.dumps({**delivery.payload, "delivery_id": delivery.pk}, sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "costlab-alerts/1",
        "Idempotency-Key": key or f"costlab-alert-{delivery.pk}",
    }
    timeout_s = timeout_s or settings.COSTLAB_ALERT_TIMEOUT_S
    if delivery.secret:
        headers["X-Costlab-Signature"] = _signature(delivery.secret, body)
    try:
        response = httpx.post(
            delivery.target,
            content=body,
            headers=headers,
            timeout=timeout_s,
            follow_redirects=False,
        )
    except httpx.TimeoutException as exc:
        return (False, True, None, f"timeout after {timeout_s} s ({type(exc).__name__})")
    except httpx.HTTPError as exc:
        return False, True, None, f"{type(exc).__name__}: {exc}"[:1000]
    code = response.status_code
    if 200 <= code < 300:
        return True, False, code, ""
    retryable = code >= 500 or code in RETRYABLE_STATUS
    return False, retryable, code, f"HTTP {code}: {response.text[:500]}"


def _mail(delivery: AlertDelivery) -> tuple[bool, bool, int | None, str]:
    p = delivery.payload
    if p.get("kind") == "budget":
        spent = f"{Decimal(p['spend_usd']):.2f} of {p['budget_usd']} USD"
        subject = f"[costlab] {p['tenant']}: budget {p['state']} ({spent} in {p['month']})"
    elif p.get("kind") == "test":
        subject = f"[costlab] {p['tenant']}: test alert on channel '{p['channel']}'"
    else:
        event = p["event"].removeprefix("arm_")
        subject = f"[costlab] {p['experiment']['name']}: arm '{p['arm']['name']}' {event}"
    lines = [p["reason"], "", json.dumps(p, indent=2, sort_keys=True)]
    recipients = [a.strip() for a in delivery.target.split(",") if a.strip()]
    try:
        send_mail(
            subject, "\n".join(lines), settings.DEFAULT_FROM_EMAIL, recipients, fail_silently=False
        )
    except Exception as exc:  # SMTP and socket errors alike: retried like a webhook
        return False, True, None, f"{type(exc).__name__}: {exc}"[:1000]
    return True, False, None, ""


def _in_flight_s() -> float:
    """While an attempt is sending, its due time is pushed this far out: beyond any scheduled
    retry (so a second task sees it is taken) and beyond a webhook timeout or an SMTP send."""
    return settings.COSTLAB_ALERT_BACKOFF_MAX_S + 300.0


def alert_attempt(*, delivery_id: int) -> AttemptOutcome:
    """Try one delivery once and record the attempt. Never raises for a receiver's failure."""
    delivery = AlertDelivery.objects.filter(pk=delivery_id).first()
    if delivery is None or delivery.status != AlertDelivery.Status.PENDING:
        return AttemptOutcome(status=delivery.status if delivery else "missing")
    # Claim the attempt first (one conditional UPDATE): two tasks for the same delivery (a late
    # retry meeting the stale-requeue, a broker redelivery) cannot both send. No row lock is
    # held while the receiver answers: a slow receiver must not hold database locks.
    attempt, now = delivery.attempts + 1, timezone.now()
    not_in_flight = Q(next_attempt_at__isnull=True) | Q(
        next_attempt_at__lte=now + timedelta(seconds=settings.COSTLAB_ALERT_BACKOFF_MAX_S)
    )
    claimed = AlertDelivery.objects.filter(
        not_in_flight,
        pk=delivery.pk,
        status=AlertDelivery.Status.PENDING,
        attempts=delivery.attempts,
    ).update(attempts=attempt, next_attempt_at=now + timedelta(seconds=_in_flight_s()))
    if not claimed:
        return AttemptOutcome(status="claimed_elsewhere")
    send = _post if delivery.kind == AlertDelivery.Kind.WEBHOOK else _mail
    delivered, retryable, code, error = send(delivery)
    now = timezone.now()
    fields = {"last_status_code": code, "last_error": error}
    retry_in = None
    if delivered:
        fields.update(status=AlertDelivery.Status.SENT, delivered_at=now, next_attempt_at=None)
    elif retryable and attempt < settings.COSTLAB_ALERT_MAX_ATTEMPTS:
        retry_in = backoff_s(attempt)
        fields.update(next_attempt_at=now + timedelta(seconds=retry_in))
    else:
        fields.update(status=AlertDelivery.Status.FAILED, next_attempt_at=None)
        logger.error(
            "alert_failed %s",
            json.dumps(
                {
                    "delivery_id": delivery.pk,
                    "kind": delivery.kind,
                    "target": delivery.target,
                    "attempts": attempt,
                    "error": error,
                },
                sort_keys=True,
            ),
        )
    AlertDelivery.objects.filter(
        pk=delivery.pk, status=AlertDelivery.Status.PENDING, attempts=attempt
    ).update(**fields)
    return AttemptOutcome(
        status=fields.get("status", AlertDelivery.Status.PENDING), retry_in_s=retry_in, detail=error
    )


def deliveries_requeue_stale(*, now=None, grace_s: float = 60.0) -> list[int]:
    """Pending deliveries whose task never ran (broker down at commit, worker lost):
    queue them again."""
    now = now or timezone.now()
    ids = list(
        AlertDelivery.objects.filter(
            status=AlertDelivery.Status.PENDING,
            next_attempt_at__lt=now - timedelta(seconds=grace_s),
        )
        .order_by("pk")
        .values_list("pk", flat=True)[:100]
    )
    if ids:
        AlertDelivery.objects.filter(pk__in=ids).update(next_attempt_at=now)
        deliveries_send(delivery_ids=ids)
    return ids


# ------------------------------------------------------------------------------
# Channels, as the experiment page manages them
# ------------------------------------------------------------------------------
def alert_channels_of(*, experiment) -> list[AlertChannel]:
    """The channels a freeze of this experiment reaches: its own and its tenant's tenant-wide."""
    return list(
        AlertChannel.objects.filter(tenant_id=experiment.tenant_id)
        .filter(Q(experiment__isnull=True) | Q(experiment=experiment))
        .order_by("experiment_id", "name", "pk")
    )


@transaction.atomic
def alert_channel_create(
    *,
    experiment,
    name: str,
    webhook_url: str = "",
    webhook_secret: str = "",
    email_recipients: str = "",
    tenant_wide: bool = False,
) -> AlertChannel:
    """A channel for this experiment (or, tenant_wide, every experiment of its tenant, budget
    steps included); every error names its field."""
    channel = AlertChannel(
        tenant_id=experiment.tenant_id,
        experiment=None if tenant_wide else experiment,
        name=(name or "").strip(),
        webhook_url=(webhook_url or "").strip(),
        webhook_secret=(webhook_secret or "").strip(),
        email_recipients=(email_recipients or "").strip(),
    )
    if not channel.webhook_url and not channel.email_recipients:
        raise ApplicationError(
            "webhook_url: give a webhook URL or e-mail recipients (or both)",
            {"fields": {"webhook_url": ["a target is needed"]}},
            code="invalid",
        )
    try:
        channel.full_clean()
    except ValidationError as exc:
        field, errors = next(iter(exc.message_dict.items()))
        raise ApplicationError(
            f"{field}: {errors[0]}", {"fields": exc.message_dict}, code="invalid"
        ) from None
    channel.save()
    return channel


TEST_TIMEOUT_S = 5.0


def alert_channel_test(*, channel: AlertChannel, actor=None) -> list[dict]:
    """Send a test alert to each target of the channel now, signed as a real one; what each
    answered. Nothing is recorded: a test is not an event."""
    now = timezone.now()
    payload = {
        "kind": "test",
        "event": "test",
        "at": now.isoformat(),
        "tenant": channel.tenant.slug,
        "channel": channel.name,
        "experiment": None
        if channel.experiment_id is None
        else {"id": channel.experiment_id, "name": channel.experiment.name},
        "reason": f"A test alert from costlab{f' sent by {actor}' if actor else ''}: this "
        "channel receives freeze alerts.",
    }
    results = []
    for kind, target, secret in _targets([channel], defaults=False):
        delivery = AlertDelivery(kind=kind, target=target, secret=secret, payload=payload)
        delivered, _retry, code, error = (
            _post(delivery, key=f"costlab-test-{now.timestamp():.0f}", timeout_s=TEST_TIMEOUT_S)
            if kind == AlertDelivery.Kind.WEBHOOK
            else _mail(delivery)
        )
        results.append(
            {"kind": kind, "target": target, "ok": delivered, "status": code, "error": error}
        )
    return results
