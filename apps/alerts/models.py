"""Alerts' rows: where alerts go (AlertChannel), each alert to each target (AlertDelivery, the
outbox the deliver task works through) and the budget steps alerted (BudgetEvent).

The tables were attribution's and keep their names (`db_table`): the models moved, the data did
not (apps/alerts/migrations/0001_initial.py).
"""

from django.db import models
from django.db.models import Q

from apps.experiments.models import Experiment
from apps.tenants.models import Tenant


class BudgetEvent(models.Model):
    """A tenant's month spend stepped to 80 % (warned) or 100 % (exceeded) of its budget: the
    figures it stepped on and what was done to its running runs, kept for audit and alerted."""

    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="budget_events", db_index=False
    )  # indexed by (tenant, created_at)
    month = models.DateField(help_text="The first day of the month the spend is of.")
    state = models.CharField(
        max_length=16,
        choices=[
            (Tenant.BudgetState.WARNED, Tenant.BudgetState.WARNED.label),
            (Tenant.BudgetState.EXCEEDED, Tenant.BudgetState.EXCEEDED.label),
        ],
    )
    spend_usd = models.DecimalField(
        "spend (USD)", max_digits=16, decimal_places=6, help_text="The month's spend at the step."
    )
    budget_usd = models.DecimalField(
        "budget (USD)", max_digits=14, decimal_places=2, help_text="monthly_budget_usd then."
    )
    reason = models.TextField()
    runs = models.JSONField(
        default=dict,
        blank=True,
        help_text="Run ids acted on: noted (80 %), cancelled (worker) and flagged (external).",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "attribution_budgetevent"  # attribution's table, kept
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="budgetevent_tenant_time_idx")
        ]

    def __str__(self) -> str:
        return f"{self.tenant} budget {self.state} ({self.month:%Y-%m})"


class AlertChannel(models.Model):
    """Where alerts go: for one experiment (its freezes), or (experiment empty) every experiment
    of a tenant and the tenant's budget steps."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="alert_channels")
    experiment = models.ForeignKey(
        Experiment, on_delete=models.CASCADE, null=True, blank=True, related_name="alert_channels"
    )
    name = models.CharField(max_length=120)
    webhook_url = models.URLField(
        blank=True,
        default="",
        help_text="Receives a JSON POST per freeze/unfreeze (tenant-wide: and per budget step).",
    )
    webhook_secret = models.CharField(
        max_length=128,
        blank=True,
        default="",
        help_text="Signs the body: X-Costlab-Signature: sha256=<hmac>.",
    )
    email_recipients = models.TextField(
        blank=True, default="", help_text="Comma-separated e-mail addresses."
    )
    enabled = models.BooleanField(default=True)

    class Meta:
        db_table = "attribution_alertchannel"  # attribution's table, kept
        ordering = ["tenant", "name"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(webhook_url="") | ~Q(email_recipients=""),
                name="alertchannel_has_a_target",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def recipients(self) -> list[str]:
        return [a.strip() for a in self.email_recipients.replace(";", ",").split(",") if a.strip()]


class AlertDelivery(models.Model):
    """One alert to one target; delivered by a Celery task after the decision commits."""

    class Kind(models.TextChoices):
        WEBHOOK = "webhook", "Webhook"
        EMAIL = "email", "E-mail"

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENT = "sent", "Sent"
        FAILED = "failed", "Failed"

    # What is alerted: a freeze/unfreeze or a budget step, exactly one of the two.
    # A freeze/unfreeze is attribution's row, named by a lazy reference: no import upward.
    event = models.ForeignKey(
        "attribution.FreezeEvent",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="deliveries",
    )
    budget_event = models.ForeignKey(
        BudgetEvent,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="deliveries",
        db_index=False,
    )  # indexed by (budget_event, kind, target)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    target = models.TextField(help_text="URL, or comma-separated addresses.")
    secret = models.CharField(max_length=128, blank=True, default="")
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "attribution_alertdelivery"  # attribution's table, kept
        ordering = ["-created_at"]
        verbose_name_plural = "alert deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["event", "kind", "target"], name="alertdelivery_once_per_target"
            ),
            models.UniqueConstraint(
                fields=["budget_event", "kind", "target"],
                name="alertdelivery_budget_once_per_target",
            ),
            models.CheckConstraint(
                condition=Q(event__isnull=False, budget_event__isnull=True)
                | Q(event__isnull=True, budget_event__isnull=False),
                name="alertdelivery_one_event",
            ),
        ]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="alertdelivery_due_idx")]

    def __str__(self) -> str:
        return f"{self.kind} to {self.target} ({self.status})"
