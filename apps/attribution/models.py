"""Every attribution decision, with the evidence it was made on."""

from django.conf import settings
from django.db import models

from apps.experiments.models import Arm, Experiment


class AttributionSnapshot(models.Model):
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="snapshots")
    arm = models.ForeignKey(Arm, on_delete=models.CASCADE, related_name="snapshots")
    computed_at = models.DateTimeField()
    window_end = models.DateTimeField(help_text="Watermark: samples up to this instant were counted.")
    runs = models.PositiveIntegerField(default=0)
    samples = models.BigIntegerField(default=0)
    tokens = models.BigIntegerField(default=0)
    gpu_hours = models.FloatField(default=0.0)
    energy_kwh = models.FloatField(default=0.0)
    energy_estimated = models.BooleanField(default=False)
    total_usd = models.DecimalField(max_digits=16, decimal_places=6, default=0)
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

    def __str__(self) -> str:
        return f"{self.arm} at {self.computed_at:%Y-%m-%d %H:%M:%S}"


class FreezeEvent(models.Model):
    class Action(models.TextChoices):
        FREEZE = "freeze", "Freeze"
        UNFREEZE = "unfreeze", "Unfreeze"

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="freeze_events")
    arm = models.ForeignKey(Arm, on_delete=models.CASCADE, related_name="freeze_events")
    action = models.CharField(max_length=16, choices=Action.choices)
    reason = models.TextField()
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
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
    arm = models.ForeignKey(Arm, on_delete=models.CASCADE, related_name="weight_changes")
    old_weight = models.DecimalField(max_digits=7, decimal_places=4)
    new_weight = models.DecimalField(max_digits=7, decimal_places=4)
    reason = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.arm}: {self.old_weight} -> {self.new_weight}"
