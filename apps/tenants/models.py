from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from apps.core.models import TimeStampedModel


class Tenant(TimeStampedModel):
    """A team. Every experiment, run and pricing table belongs to exactly one tenant."""

    name = models.CharField(max_length=120)
    slug = models.SlugField(max_length=60, unique=True)
    max_concurrent_runs = models.PositiveIntegerField(
        default=4, help_text="Runs queued or running at once; further submissions are refused."
    )
    gpu_memory_fraction = models.DecimalField(
        "GPU memory fraction",
        max_digits=4,
        decimal_places=3,
        default=Decimal("1.000"),
        validators=[MinValueValidator(Decimal("0.001")), MaxValueValidator(Decimal("1"))],
        help_text="Share of one GPU's memory a single job may allocate (0-1].",
    )
    monthly_budget_usd = models.DecimalField(
        "monthly budget (USD)",
        max_digits=14,
        decimal_places=2,
        default=Decimal("1000.00"),
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Spend per calendar month (USD): at 80 % running runs get a warning note; at "
        "100 % they stop at their next step and submissions are refused.",
    )

    class BudgetState(models.TextChoices):
        OK = "ok", "Within budget"
        WARNED = "warned", "80 % spent"
        EXCEEDED = "exceeded", "Spent: runs stopped, submits refused"

    # Where this month's spend stands, as the bill moved it (apps.billing.services.budget_enforce).
    budget_state = models.CharField(
        max_length=16, choices=BudgetState.choices, default=BudgetState.OK
    )
    budget_month = models.DateField(
        null=True, blank=True, help_text="The month budget_state is of (it resets with the month)."
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(gpu_memory_fraction__gt=0) & Q(gpu_memory_fraction__lte=1),
                name="tenant_gpu_memory_fraction_range",
            ),
            models.CheckConstraint(
                condition=Q(monthly_budget_usd__gte=0), name="tenant_budget_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Membership(TimeStampedModel):
    class Role(models.TextChoices):
        MEMBER = "member", "Member"
        ADMIN = "admin", "Admin"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"
