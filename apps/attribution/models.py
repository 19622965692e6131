"""Every attribution decision, with the evidence it was made on, and the rollup it was made from.

The rollup: each tick closes one AttributionWindow per due experiment and records, for every
run whose priced totals moved since its RunCursor, one RunWindow observation (the deltas).
Snapshots carry cumulative sufficient statistics (sums, sums of squares and products), so the
next window adds to them instead of rescanning anything.
"""

from django.conf import settings
from django.db import models

from apps.experiments.models import Arm, Experiment, Run


def _exact(max_digits: int = 24, decimal_places: int = 6, **kwargs) -> models.DecimalField:
    """Exact sums: the same observations always add up to the same snapshot, whatever the order."""
    return models.DecimalField(
        max_digits=max_digits, decimal_places=decimal_places, default=0, **kwargs
    )


class UsageTotals(models.Model):
    """What runs consumed and cost, summed exactly: one run's delta in a window (RunWindow), one
    run's cumulative attributed totals (RunCursor), or an arm's sums over its epoch
    (AttributionSnapshot). One width for all three: a snapshot adds up many observations,
    so every total is sized for that."""

    cost_usd = _exact(16, 6, help_text="As billed: each run at the tables in force while it ran.")
    tokens = models.BigIntegerField(default=0)
    steps = models.BigIntegerField(default=0)
    gpu_seconds = _exact(24, 6, help_text="Device-seconds (GPU, or CPU for CPU runs).")
    wall_s = _exact(24, 6)
    energy_j = _exact(28, 6)

    class Meta:
        abstract = True


class AttributionWindow(models.Model):
    """One tick's window of one experiment: the watermark the next tick starts from."""

    class Status(models.TextChoices):
        ATTRIBUTED = "attributed", "Attributed"
        SKIPPED = "skipped", "Skipped (see reason)"

    # Indexed by the (experiment, number) constraint; a separate FK index would only slow inserts.
    experiment = models.ForeignKey(
        Experiment, on_delete=models.CASCADE, related_name="attribution_windows", db_index=False
    )
    number = models.PositiveIntegerField(help_text="1, 2, 3 ... per experiment.")
    window_start = models.DateTimeField(
        null=True, blank=True, help_text="The previous window's end."
    )
    window_end = models.DateTimeField(
        help_text="Run totals committed by this instant were counted."
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ATTRIBUTED)
    skip_reason = models.TextField(blank=True, default="")
    observations = models.PositiveIntegerField(
        default=0, help_text="Runs whose totals moved in the window."
    )
    # The table this window's comparison priced every arm's usage at (in force at window_end,
    # or the experiment's pinned one); a later window re-prices this window's usage at its own.
    pricing_table = models.ForeignKey(
        "pricing.PricingTable",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
    )

    class Meta:
        ordering = ["experiment", "-number"]
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "number"], name="window_unique_experiment_number"
            ),
            models.UniqueConstraint(
                fields=["experiment", "window_end"], name="window_unique_experiment_end"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.experiment} window {self.number}"


# The rows a tick derives (run windows, cursors, snapshots) keep no foreign key in the database
# (db_constraint=False), as the telemetry samples do: the tick writes tens of thousands a time at
# 1,000 experiments, and Django's deferred keys check each one at COMMIT, locking the run, arm or
# window row it names. The tick writes them from rows it has just read in the same transaction;
# deleting a run, arm, experiment or window deletes them too (Django's cascade, tested).


class RunWindow(UsageTotals):
    """One observation: what one run added to its totals during one window."""

    window = models.ForeignKey(
        AttributionWindow,
        on_delete=models.CASCADE,
        related_name="run_windows",
        db_index=False,
        db_constraint=False,
    )  # indexed by (window, run)
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="attribution_windows", db_constraint=False
    )
    arm = models.ForeignKey(
        Arm,
        on_delete=models.CASCADE,
        related_name="run_windows",
        db_index=False,
        db_constraint=False,
    )  # indexed by (arm, window)
    first_seen = models.BooleanField(default=False, help_text="The run's first observation.")
    omitted = models.BooleanField(
        default=False, help_text="Left out of the statistics (see the window's reason)."
    )
    upto_seq = models.BigIntegerField(help_text="The run's priced_seq at the window's end.")
    samples = models.BigIntegerField(default=0)
    energy_estimated = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["window", "run"], name="runwindow_unique_window_run")
        ]
        indexes = [models.Index(fields=["arm", "window"], name="runwindow_arm_window_idx")]

    def __str__(self) -> str:
        return f"run {self.run_id} in window {self.window_id}"


class RunCursor(UsageTotals):
    """Per run: its totals as attributed so far (the sum of its observations)."""

    run = models.OneToOneField(
        Run,
        on_delete=models.CASCADE,
        primary_key=True,
        related_name="attribution_cursor",
        db_constraint=False,
    )
    window = models.ForeignKey(
        AttributionWindow,
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )  # never looked up by; one row per run
    priced_seq = models.BigIntegerField(default=-1)
    # The run's counted (not omitted) observations in its arm's epoch, summed as they are recorded:
    # the freeze rule's run-level moments read these, one row a run, instead of every observation
    # of the epoch (apps.attribution.evidence.moments.run_moments). epoch_after: the window number
    # the sums count after (the arm's epoch); -1 when unknown (a new column, or an epoch that
    # restarted): the tick sums those runs' observations again
    # (apps.attribution.evidence.rollup.cursors_advance).
    epoch_after = models.IntegerField(default=-1)
    epoch_observations = models.BigIntegerField(default=0)
    epoch_cost_usd = _exact(16, 6)
    epoch_tokens = models.BigIntegerField(default=0)
    epoch_steps = models.BigIntegerField(default=0)

    class Meta:
        indexes = [  # the few cursors whose epoch sums are to be summed again
            models.Index(
                fields=["run"], condition=models.Q(epoch_after=-1), name="runcursor_epoch_unknown"
            )
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} attributed to seq {self.priced_seq}"


class AttributionSnapshot(UsageTotals):
    # Snapshots are the widest rows the tick writes: no index that another one already covers.
    experiment = models.ForeignKey(
        Experiment,
        on_delete=models.CASCADE,
        related_name="snapshots",
        db_index=False,
        db_constraint=False,
    )  # indexed by (experiment, computed_at)
    arm = models.ForeignKey(
        Arm, on_delete=models.CASCADE, related_name="snapshots", db_constraint=False
    )
    window = models.ForeignKey(
        AttributionWindow,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="snapshots",
        db_index=False,
        db_constraint=False,
    )  # indexed by (window, arm)
    epoch_start = models.PositiveIntegerField(
        default=0,
        help_text="Sums count windows after this number (the arm's last unfreeze; 0: all).",
    )
    computed_at = models.DateTimeField()
    window_end = models.DateTimeField(
        help_text="Watermark: samples up to this instant were counted."
    )
    runs = models.PositiveIntegerField(default=0)
    samples = models.BigIntegerField(default=0)
    observations = models.BigIntegerField(
        default=0, help_text="Run-window observations in the sums."
    )
    gpu_hours = models.FloatField(default=0.0)
    energy_kwh = models.FloatField(default=0.0)
    energy_estimated = models.BooleanField(default=False)
    compared_usd = models.DecimalField(
        max_digits=16,
        decimal_places=6,
        default=0,
        help_text="The same usage priced at the comparison table: "
        "what metric and deviation are computed on.",
    )
    pricing_table = models.ForeignKey(
        "pricing.PricingTable",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
        db_constraint=False,
        help_text="The comparison table.",
    )
    pricing_valid_from = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The comparison table's valid_from (kept if it is deleted).",
    )
    # Exact running sums (with UsageTotals'); the figures above and below are derived from them.
    cost_sq = _exact(48, 12, help_text="Sum of cost^2 over observations.")
    cost_tokens = _exact(48, 6, help_text="Sum of cost x tokens over observations.")
    tokens_sq = _exact(48, 0, help_text="Sum of tokens^2 over observations.")
    cost_steps = _exact(48, 6)
    steps_sq = _exact(48, 0)
    metric = models.CharField(
        max_length=16, default="usd_per_mtok", help_text="usd_per_mtok or usd_per_step."
    )
    metric_value = models.FloatField(null=True, blank=True)
    metric_ci_low = models.FloatField(null=True, blank=True)
    metric_ci_high = models.FloatField(null=True, blank=True)
    usd_per_mtok = models.FloatField(null=True, blank=True)
    usd_per_mtok_ci_low = models.FloatField(null=True, blank=True)
    usd_per_mtok_ci_high = models.FloatField(null=True, blank=True)
    throughput_tok_s = models.FloatField(null=True, blank=True)
    deviation = models.FloatField(null=True, blank=True, help_text="(arm - control) / control.")
    deviation_low = models.FloatField(null=True, blank=True)
    deviation_high = models.FloatField(null=True, blank=True)
    weight = models.DecimalField(max_digits=7, decimal_places=4, default=0)
    state = models.CharField(max_length=16, default="active")
    evidence = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-computed_at"]
        indexes = [models.Index(fields=["experiment", "computed_at"], name="snapshot_exp_time_idx")]
        constraints = [
            models.UniqueConstraint(fields=["window", "arm"], name="snapshot_unique_window_arm")
        ]

    def __str__(self) -> str:
        return f"{self.arm} at {self.computed_at:%Y-%m-%d %H:%M:%S}"


class FreezeEvent(models.Model):
    class Action(models.TextChoices):
        FREEZE = "freeze", "Freeze"
        UNFREEZE = "unfreeze", "Unfreeze"

    experiment = models.ForeignKey(
        Experiment, on_delete=models.CASCADE, related_name="freeze_events"
    )
    arm = models.ForeignKey(Arm, on_delete=models.CASCADE, related_name="freeze_events")
    action = models.CharField(max_length=16, choices=Action.choices)
    reason = models.TextField()
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    window = models.ForeignKey(
        AttributionWindow,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="freeze_events",
    )
    deviation = models.FloatField(null=True, blank=True)
    deviation_low = models.FloatField(null=True, blank=True)
    threshold = models.FloatField(null=True, blank=True)
    evidence = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["experiment", "created_at"], name="freeze_exp_time_idx")]

    def __str__(self) -> str:
        return f"{self.action} {self.arm} at {self.created_at:%Y-%m-%d %H:%M:%S}"


class WeightChange(models.Model):
    class Kind(models.TextChoices):
        DYNAMIC = "dynamic", "Shifted toward cheaper arms"
        FREEZE = "freeze", "Frozen"
        UNFREEZE = "unfreeze", "Unfrozen"
        MANUAL = "manual", "Set by hand"

    arm = models.ForeignKey(Arm, on_delete=models.CASCADE, related_name="weight_changes")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.DYNAMIC)
    window = models.ForeignKey(
        AttributionWindow,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="weight_changes",
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    old_weight = models.DecimalField(max_digits=7, decimal_places=4)
    new_weight = models.DecimalField(max_digits=7, decimal_places=4)
    reason = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.arm}: {self.old_weight} -> {self.new_weight}"


class FrozenArm(Arm):
    """Arms as staff see them in the 'Frozen arms' admin page, where they can be unfrozen."""

    class Meta:
        proxy = True
        verbose_name = "frozen arm"


class AttributionLock(models.Model):
    """A row to lock where the database has no advisory locks (SQLite; see locks.py)."""

    name = models.CharField(max_length=64, primary_key=True)
    acquired_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name
