from __future__ import annotations

from django.conf import settings
from django.db import models

from apps.experiments.models import Run


class SampleQuerySet(models.QuerySet):
    def of_run(self, run: Run) -> SampleQuerySet:
        """The run's samples, looked for only inside its stored span (Run.samples_from ..
        samples_to), so Postgres reads only the partitions of those days. A run without a span
        (nothing ingested; rows written around ingest) is looked for everywhere."""
        if run.samples_from is None or run.samples_to is None:
            return self.filter(run_id=run.pk)
        return self.filter(run_id=run.pk, ts__gte=run.samples_from, ts__lte=run.samples_to)


class TelemetrySample(models.Model):
    """One telemetry reading of one device of a run. At-least-once delivery, stored once per (run,
    seq).

    On Postgres the table is partitioned by ts (apps.telemetry.partitions), and its unique index
    is (run, seq, ts); ingest keeps (run, seq) unique under the run's row lock.

    A DDP run's ranks share the run's one seq space (the worker numbers their samples as they
    arrive), so (run, seq) still identifies a sample, and (run, rank) orders one device's stream.
    """

    id = models.BigAutoField(primary_key=True)
    # No foreign key in the database (db_constraint=False): a check per inserted sample costs
    # ingest, and dropping a partition that has one would lock the runs table. Ingest inserts
    # under the run's row lock; deleting a run deletes its samples (Django's cascade).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="samples", db_constraint=False
    )
    seq = models.BigIntegerField()
    attempt = models.PositiveSmallIntegerField(
        default=1,
        help_text="Worker attempt that measured it; cumulative counters restart with each attempt.",
    )
    ts = models.DateTimeField()
    step = models.BigIntegerField(default=0)
    rank = models.PositiveIntegerField(
        default=0,
        help_text="DDP rank whose device this reading is (0 for a single-process "
        "run); seq stays unique per run, across ranks.",
    )
    device = models.CharField(max_length=120, blank=True, default="")
    util_pct = models.FloatField(null=True, blank=True, help_text="Device utilization (%).")
    mem_used_mb = models.FloatField(null=True, blank=True)
    mem_total_mb = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    energy_j = models.FloatField(
        null=True, blank=True, help_text="Cumulative energy since run start (J)."
    )
    step_time_s = models.FloatField(null=True, blank=True)
    tokens = models.BigIntegerField(default=0, help_text="Cumulative tokens since run start.")
    tokens_per_s = models.FloatField(null=True, blank=True)
    micro_batch = models.IntegerField(null=True, blank=True)
    loss = models.FloatField(null=True, blank=True)
    overlap_ratio = models.FloatField(null=True, blank=True)
    mfu = models.FloatField(null=True, blank=True)
    sm_clock_mhz = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)
    # NVML GPM (Hopper and later): empty where the device or driver has none.
    sm_occupancy_pct = models.FloatField(
        null=True, blank=True, help_text="SM occupancy (%), NVML GPM; empty where unavailable."
    )
    tensor_active_pct = models.FloatField(
        null=True, blank=True, help_text="Tensor-pipe activity (%), NVML GPM."
    )
    dram_bw_pct = models.FloatField(
        null=True, blank=True, help_text="DRAM bandwidth utilisation (%), NVML GPM."
    )
    estimated = models.BooleanField(
        default=False, help_text="Power and energy were modelled, not measured."
    )

    objects = SampleQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="sample_unique_run_seq"),
            models.CheckConstraint(condition=models.Q(seq__gte=0), name="sample_seq_non_negative"),
        ]
        indexes = [models.Index(fields=["run", "ts"], name="sample_run_ts_idx")]

    def __str__(self) -> str:
        return f"run {self.run_id} #{self.seq}"


class PackedMinute(models.Model):
    """The samples of one run and attempt in one minute, every rank's, packed losslessly into one
    blob (apps.telemetry.packing) by compaction, once the run is settled
    (apps.telemetry.compaction). `rank` is the lowest rank the blob holds; a blob of version 1
    (packed before ranks shared one) holds that rank's samples only.

    On Postgres partitioned by `minute` like the samples by `ts` (the same day ranges), so
    retention drops both a day at a time."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(  # as TelemetrySample.run: no foreign key in the database
        Run, on_delete=models.CASCADE, related_name="packed_minutes", db_constraint=False
    )
    rank = models.PositiveIntegerField(default=0)
    attempt = models.PositiveSmallIntegerField(default=1)
    minute = models.DateTimeField(help_text="The minute (UTC) its samples were taken in.")
    samples = models.PositiveIntegerField()
    seq_first = models.BigIntegerField()
    seq_last = models.BigIntegerField()
    data = models.BinaryField(help_text="The samples, packed (apps.telemetry.packing).")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "minute", "rank", "attempt"], name="packed_unique_run_minute"
            )
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} rank {self.rank} {self.minute:%Y-%m-%d %H:%M}"


class RunEvaluation(models.Model):
    """One held-out evaluation of a run: its loss (`eval_loss`, lower is better) or a named quality
    metric with its direction, at the step and cumulative trained tokens it was taken at.

    It arrives on a telemetry sample (the keys eval_loss / quality, apps.telemetry.ingest) and is
    stored once per (run, seq, metric), as the sample is: a batch sent twice stores nothing twice.
    Kept apart from the samples (a handful a run, never compacted) so that the sample table's
    bytes stay what they were. What arms are compared on (apps.attribution.decide.quality)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="evaluations")
    seq = models.BigIntegerField(help_text="The telemetry sample that carried it.")
    ts = models.DateTimeField()
    step = models.BigIntegerField(default=0)
    tokens = models.BigIntegerField(default=0, help_text="Cumulative trained tokens at it.")
    metric = models.CharField(max_length=64, help_text="eval_loss, or the metric's name.")
    value = models.FloatField()
    higher_is_better = models.BooleanField(default=False)
    eval_s = models.FloatField(
        null=True, blank=True, help_text="Seconds the evaluation took (billed with the run)."
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "seq", "metric"], name="evaluation_unique_run_seq_metric"
            )
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} #{self.seq} {self.metric}={self.value:g}"


class RunMetric(models.Model):
    """One training metric of a run at a step: the loss the trainer logged, grad_norm,
    learning_rate, an evaluation's eval_* figures, anything the training names.

    It arrives on a telemetry sample (the key ``metrics``: {name: value}, apps.telemetry.ingest)
    and is stored once per (run, seq, name), as the sample is (apps.telemetry.metrics). Shown,
    never billed nor compared: a held-out evaluation that arms are compared on is a
    RunEvaluation."""

    # Indexed by the two indexes below, both led by the run.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="training_metrics", db_index=False
    )
    seq = models.BigIntegerField(help_text="The telemetry sample that carried it.")
    ts = models.DateTimeField()
    step = models.BigIntegerField(default=0, help_text="The training step it was taken at.")
    tokens = models.BigIntegerField(default=0, help_text="Cumulative trained tokens at it.")
    name = models.CharField(max_length=64)
    value = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["run", "seq", "name"], name="metric_unique_run_seq_name"
            )
        ]
        indexes = [
            # A run's series of one metric by step (its chart, GET runs/{id}/metrics/?name=), and
            # its names with their last values (the run's answer).
            models.Index(fields=["run", "name", "step"], name="metric_run_name_step_idx")
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} #{self.seq} {self.name}={self.value:g}"


class RunRepricing(models.Model):
    """An explicit re-pricing of a finished run (its bill is otherwise final): who, why, under
    which table, from what to what."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="repricings")
    at = models.DateTimeField(auto_now_add=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    reason = models.TextField()
    pricing_table = models.ForeignKey(
        "pricing.PricingTable",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        help_text="The table the whole run was priced at; empty: the tables in force when it ran.",
    )
    cost_before_usd = models.DecimalField(max_digits=16, decimal_places=6)
    cost_after_usd = models.DecimalField(max_digits=16, decimal_places=6)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"run {self.run_id} re-priced {self.cost_before_usd} -> {self.cost_after_usd} USD"
