"""Sweeps (a search over strategies) and their probes (short real trainings)."""

from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from apps.core.models import TimeStampedModel
from apps.pricing.models import CostModel, GpuSku
from apps.tenants.models import Tenant

OBJECTIVES = {
    "usd_per_mtok": "USD per 1M tokens",
    "peak_mem_mb": "peak memory (MiB)",
    "step_time_s": "step time (s)",
    "energy_j": "energy (J)",
    "eval_loss": "held-out loss",
}
DEFAULT_OBJECTIVES = ["usd_per_mtok", "peak_mem_mb"]


def default_objectives() -> list[str]:
    return list(DEFAULT_OBJECTIVES)


class Sweep(TimeStampedModel):
    """A search over a base strategy's keys: probes proposed by Optuna,
    kept on a Pareto frontier."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        COMPLETED = "completed", "Completed"
        CANCELLED = "cancelled", "Cancelled"

    class Sampler(models.TextChoices):
        GRID = "grid", "Grid (every point)"
        NSGA2 = "nsga2", "NSGA-II (multi-objective, subsamples)"
        TPE = "tpe", "TPE (multi-objective, subsamples; fewer probes wasted on small budgets)"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="sweeps")
    name = models.CharField(max_length=120)
    base_strategy_yaml = models.TextField(
        help_text="Validated by gpu_runtime's schema, as an arm's strategy is."
    )
    space = models.JSONField(
        help_text="Dotted strategy key -> list of values or {low, high, step|log2}."
    )
    objectives = models.JSONField(
        default=default_objectives, help_text="Minimised: " + ", ".join(OBJECTIVES)
    )
    sampler = models.CharField(max_length=16, choices=Sampler.choices)
    seed = models.PositiveIntegerField(default=0)
    probe_count = models.PositiveIntegerField(
        validators=[MinValueValidator(1)], help_text="Probe budget."
    )
    probe_steps = models.PositiveIntegerField(
        validators=[MinValueValidator(2)], help_text="Timed steps per probe."
    )
    warmup_steps = models.PositiveIntegerField(
        default=2, help_text="Untimed steps first (warm-up, compilation)."
    )
    parallelism = models.PositiveIntegerField(
        default=2, validators=[MinValueValidator(1)], help_text="Probes queued at once."
    )
    queue = models.CharField(max_length=32, default="cpu")
    gpu_sku = models.ForeignKey(
        GpuSku, on_delete=models.PROTECT, null=True, blank=True, related_name="sweeps"
    )
    cost_model = models.ForeignKey(
        CostModel,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="sweeps",
        help_text="Weights of the resource terms; empty = all 1.",
    )
    tie_tolerance = models.DecimalField(
        max_digits=5,
        decimal_places=4,
        default=Decimal("0.02"),
        validators=[MinValueValidator(Decimal("0")), MaxValueValidator(Decimal("0.5"))],
        help_text="Relative difference below which two probes tie "
        "(widened by their measured spread).",
    )
    quality_margin = models.DecimalField(
        max_digits=6,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0.0001")), MaxValueValidator(Decimal("1"))],
        help_text="A quality constraint: a probe whose held-out loss is more than this much "
        "(relative, 0.01 = 1 %) above the base strategy's is infeasible. Empty: no constraint.",
    )
    pruned = models.JSONField(
        default=list,
        blank=True,
        help_text="Values of the space left out before the search, each with why: "
        "[{key, value, reason}] (apps.sweeps.pruning).",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    finished_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(
        blank=True, default="", help_text="Why it ended early, e.g. the space was exhausted."
    )
    run = models.ForeignKey(
        "experiments.Run",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="sizing_sweeps",
        help_text="Set on a vCPU sizing sweep: the run it sizes.",
    )

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.CheckConstraint(
                condition=Q(probe_count__gte=1) & Q(probe_steps__gte=2),
                name="sweep_budget_positive",
            ),
            models.CheckConstraint(
                condition=Q(quality_margin__isnull=True)
                | (Q(quality_margin__gt=0) & Q(quality_margin__lte=1)),
                name="sweep_quality_margin_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Probe(models.Model):
    """One candidate strategy, trained briefly on a worker and measured."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        INFEASIBLE = "infeasible", "Infeasible (out of memory, refused or failed)"
        CANCELLED = "cancelled", "Cancelled"

    PENDING = (Status.QUEUED, Status.RUNNING)

    sweep = models.ForeignKey(Sweep, on_delete=models.CASCADE, related_name="probes")
    number = models.PositiveIntegerField(
        help_text="0, 1, ... in proposal order (Optuna's trial number)."
    )
    params = models.JSONField(help_text="The point of the space: dotted key -> value.")
    params_key = models.CharField(
        max_length=64, help_text="Hash of params: a duplicate is never measured twice."
    )
    strategy_yaml = models.TextField(
        help_text="The base strategy with the params applied (what a promoted arm gets)."
    )
    sampler_attrs = models.JSONField(
        default=dict,
        blank=True,
        help_text="Optuna's system attrs of the trial (e.g. its NSGA-II generation).",
    )
    is_base = models.BooleanField(
        default=False,
        help_text="The base strategy itself, probed first when the sweep measures held-out loss: "
        "the reference every candidate's loss is judged against.",
    )
    promoted_to = models.ForeignKey(
        "experiments.Arm",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The arm its latest promote created (the sweep page links its experiment).",
    )
    promotions = models.JSONField(
        default=list,
        blank=True,
        help_text="Audit of every promote: [{arm, experiment, at, by, forced, quality}], "
        "quality being the held-out check it passed or, when forced, overrode.",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    reason = models.TextField(blank=True, default="", help_text="Why it is infeasible.")
    worker = models.CharField(max_length=255, blank=True, default="")
    device = models.CharField(max_length=120, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(
        null=True, blank=True, help_text="When its id last reached the broker."
    )
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="Renewed by its worker while it trains."
    )

    # Measured over the timed steps only (after warm-up).
    steps_timed = models.PositiveIntegerField(default=0)
    step_time_s = models.FloatField(null=True, blank=True)
    step_time_spread = models.FloatField(
        null=True, blank=True, help_text="Coefficient of variation of step time."
    )
    tokens_per_s = models.FloatField(null=True, blank=True)
    peak_mem_mb = models.FloatField(
        null=True,
        blank=True,
        help_text="CUDA max allocated; on CPU the process's peak RSS above its start.",
    )
    mem_estimated = models.BooleanField(default=False)
    energy_j = models.FloatField(null=True, blank=True)
    energy_estimated = models.BooleanField(default=False)
    cost_usd = models.DecimalField(max_digits=16, decimal_places=9, null=True, blank=True)
    usd_per_mtok = models.FloatField(null=True, blank=True)
    final_loss = models.FloatField(null=True, blank=True)
    eval_loss = models.FloatField(
        null=True,
        blank=True,
        help_text="Held-out loss at the probe's end (the strategy's eval: section); "
        "empty when it does not evaluate.",
    )
    eval_s = models.FloatField(
        null=True,
        blank=True,
        help_text="Seconds spent evaluating (inside the measured cost, reported apart).",
    )

    class Meta:
        ordering = ["sweep", "number"]
        constraints = [
            models.UniqueConstraint(fields=["sweep", "number"], name="probe_unique_number"),
            models.UniqueConstraint(fields=["sweep", "params_key"], name="probe_unique_params"),
            models.UniqueConstraint(
                fields=["sweep"], condition=Q(is_base=True), name="probe_one_base_per_sweep"
            ),
        ]
        indexes = [models.Index(fields=["sweep", "status"], name="probe_sweep_status_idx")]

    def __str__(self) -> str:
        return f"probe {self.sweep_id}/{self.number} ({self.status})"

    def objective_values(self, objectives: list[str]) -> list[float | None]:
        return [getattr(self, name) for name in objectives]


# What a request may ask for: a sampler, or auto (grid when the space fits the budget, else tpe).
SAMPLER_CHOICES = ("auto", *Sweep.Sampler.values)
