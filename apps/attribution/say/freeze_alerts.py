"""What a freeze or an unfreeze says to the alerts app: its payload, built here from attribution's
FreezeEvent, handed over plain (apps.alerts.services.arm_alerts_queue), which writes a delivery
per channel in the decision's transaction and sends them once it commits."""

from __future__ import annotations

from apps.alerts.models import AlertDelivery
from apps.alerts.services import arm_alerts_queue
from apps.attribution.models import FreezeEvent


def alert_payload(*, event: FreezeEvent) -> dict:
    """The JSON body a receiver gets (also the e-mail's and the log line's content)."""
    experiment, arm = event.experiment, event.arm
    evidence = event.evidence or {}
    return {
        "kind": "arm",
        "event": f"arm_{event.action}",  # arm_freeze | arm_unfreeze
        "event_id": event.pk,
        "at": event.created_at.isoformat(),
        "tenant": experiment.tenant.slug,
        "experiment": {
            "id": experiment.pk,
            "name": experiment.name,
            "freeze_policy": experiment.freeze_policy,
        },
        "arm": {"id": arm.pk, "name": arm.name, "state": arm.state, "weight": f"{arm.weight:.4f}"},
        "reason": event.reason,
        "actor": event.actor.get_username() if event.actor_id else None,
        "deviation": event.deviation,
        "deviation_low": event.deviation_low,
        "threshold": event.threshold,
        "metric": evidence.get("metric"),
        "arm_value": evidence.get("value"),
        "control_value": (evidence.get("control") or {}).get("value"),
        "runs": evidence.get("runs"),
        "samples": evidence.get("samples"),
        "observations": evidence.get("observations"),
        "window": evidence.get("window"),
        "cancelled_runs": evidence.get("cancelled_runs", []),
    }


def alerts_queue(*, event: FreezeEvent) -> list[AlertDelivery]:
    """Write one delivery per target of a freeze/unfreeze; once the transaction commits, send
    them and log the event."""
    experiment = event.experiment
    return arm_alerts_queue(
        payload=alert_payload(event=event),
        freeze_event_id=event.pk,
        tenant_id=experiment.tenant_id,
        experiment_id=experiment.pk,
    )
