"""Experiments, their arms (training strategies) and the runs that train them."""

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from apps.core.models import TimeStampedModel
from apps.core.queues import CeleryQueue
from apps.devices.models import DeviceMeasurement
from apps.experiments.resources import RESOURCE_ID_MAX
from apps.experiments.search import tags_of
from apps.experiments.strategies import strategy_normalise, strategy_sha256
from apps.pricing.models import CostModel, GpuSku, PricingTable
from apps.tenants.models import Tenant


def cs_min_runs_default() -> int:
    """A new experiment's confidence-sequence minimum: the deployment's default."""
    return settings.COSTLAB_CS_MIN_RUNS


class Experiment(TimeStampedModel):
    class Status(models.TextChoices):
        DRAFT = "draft", "Draft"
        ACTIVE = "active", "Active"
        COMPLETED = "completed", "Completed"

    class FreezePolicy(models.TextChoices):
        LET_FINISH = "let_finish", "Let running runs finish"
        CANCEL = "cancel", "Cancel running runs"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="experiments")
    name = models.CharField(max_length=120)
    description = models.TextField(blank=True)
    tags = models.CharField(
        max_length=1000,
        blank=True,
        default="",
        help_text="The team's labels, comma-separated (apps.experiments.search.tags_normalise).",
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT)
    cost_model = models.ForeignKey(CostModel, on_delete=models.PROTECT, related_name="experiments")
    pricing_table = models.ForeignKey(
        PricingTable,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="experiments",
        help_text="Pin one table; empty = the tenant's table valid when each sample was taken.",
    )
    freeze_threshold = models.DecimalField(
        max_digits=6,
        decimal_places=4,
        default=Decimal("0.05"),
        validators=[MinValueValidator(Decimal("0.0001"))],
        help_text="Relative cost deviation from the control above which an arm may be frozen "
        "(0.05 = 5 %).",
    )
    attribution_interval_s = models.PositiveIntegerField(
        "attribution interval (s)",
        default=30,
        validators=[MinValueValidator(5)],
        help_text="Seconds between attribution ticks.",
    )
    min_runs_per_arm = models.PositiveIntegerField(
        default=3, help_text="Evidence needed before a freeze."
    )
    min_samples_per_arm = models.PositiveIntegerField(
        default=30, help_text="Evidence needed before a freeze."
    )
    min_cs_runs_per_arm = models.PositiveIntegerField(
        "min runs before the bound is consulted",
        default=cs_min_runs_default,
        validators=[MinValueValidator(2)],
        help_text="Runs per arm (and in the control) before the always-valid bound is consulted: "
        "it is asymptotic, so no freeze and no conclusive verdict before this many "
        "(default COSTLAB_CS_MIN_RUNS).",
    )
    alpha = models.DecimalField(
        max_digits=5,
        decimal_places=4,
        default=Decimal("0.05"),
        validators=[MinValueValidator(Decimal("0.0001")), MaxValueValidator(Decimal("0.5"))],
        help_text="False-freeze rate bound of the always-valid confidence sequence.",
    )
    freeze_policy = models.CharField(
        max_length=16, choices=FreezePolicy.choices, default=FreezePolicy.LET_FINISH
    )
    dynamic_weights = models.BooleanField(
        default=True, help_text="Shift traffic toward cheaper arms."
    )
    target_steps = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Steps of a full run: the page projects each arm's cost and completion time to "
        "this many (e.g. 100000). Empty: no projection.",
    )
    # Cheaper for the same model: each arm's held-out quality is compared with the control's
    # (apps.attribution.decide.quality), and a cheaper arm proven worse is never given traffic.
    quality_metric = models.CharField(
        max_length=64,
        default="eval_loss",
        validators=[RegexValidator(r"^[A-Za-z0-9_.-]+$", "letters, digits, _ . - only")],
        help_text="The held-out metric arms must not be worse on: eval_loss (default), or a "
        "metric the runs report by name (e.g. accuracy).",
    )
    quality_direction = models.CharField(
        max_length=8,
        choices=[("lower", "Lower is better"), ("higher", "Higher is better")],
        default="lower",
        help_text="Whether a lower (a loss) or a higher (an accuracy) value is better.",
    )
    quality_margin = models.DecimalField(
        max_digits=6,
        decimal_places=4,
        default=Decimal("0.01"),
        validators=[MinValueValidator(Decimal("0.0001")), MaxValueValidator(Decimal("1"))],
        help_text="Relative quality loss an arm may have and still count as non-inferior "
        "(0.01 = 1 % worse than the control).",
    )

    class Meta:
        ordering = ["tenant", "-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "name"], name="experiment_unique_tenant_name"
            ),
            models.CheckConstraint(
                condition=Q(freeze_threshold__gt=0), name="experiment_threshold_positive"
            ),
            models.CheckConstraint(
                condition=Q(attribution_interval_s__gte=5), name="experiment_interval_min"
            ),
            models.CheckConstraint(
                condition=Q(alpha__gt=0) & Q(alpha__lt=1), name="experiment_alpha_range"
            ),
            models.CheckConstraint(
                condition=Q(quality_margin__gt=0) & Q(quality_margin__lte=1),
                name="experiment_quality_margin_range",
            ),
        ]
        indexes = [models.Index(fields=["status"], name="experiment_status_idx")]

    @property
    def tags_list(self) -> list[str]:
        return tags_of(self.tags)

    def __str__(self) -> str:
        return self.name


class Arm(TimeStampedModel):
    """One A/B group: a training strategy (YAML) and its share of traffic."""

    class State(models.TextChoices):
        ACTIVE = "active", "Active"
        FROZEN = "frozen", "Frozen"

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="arms")
    name = models.CharField(max_length=80)
    strategy_yaml = models.TextField(
        "strategy (YAML)", help_text="The training strategy runs of this arm use."
    )
    strategy_sha256 = models.CharField(max_length=64, editable=False)
    weight = models.DecimalField(
        max_digits=7,
        decimal_places=4,
        default=Decimal("1"),
        validators=[MinValueValidator(Decimal("0"))],
        help_text="Relative traffic weight (>= 0); a frozen arm has weight 0.",
    )
    is_control = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    revision = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["experiment", "-is_control", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "name"], name="arm_unique_experiment_name"
            ),
            models.UniqueConstraint(
                fields=["experiment"],
                condition=Q(is_control=True),
                name="arm_one_control_per_experiment",
            ),
            models.CheckConstraint(condition=Q(weight__gte=0), name="arm_weight_non_negative"),
            models.CheckConstraint(
                condition=~Q(state="frozen") | Q(weight=0), name="arm_frozen_has_zero_weight"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.experiment.name}/{self.name}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        if self.state == self.State.FROZEN and self.weight:
            raise ValidationError(
                {"weight": "a frozen arm has weight 0; unfreeze it to give it traffic"}
            )

    def save(self, *args, **kwargs):
        # The hash is derived from the text, both normalised (LF, one final newline): never apart.
        self.strategy_yaml = strategy_normalise(self.strategy_yaml)
        self.strategy_sha256 = strategy_sha256(self.strategy_yaml)
        super().save(*args, **kwargs)


class Run(TimeStampedModel):
    """One training run of an arm. Its row, not the queue, says what happened to it."""

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"
        LOST = "lost", "Lost"

    class Kind(models.TextChoices):
        WORKER = "worker", "Trained by a costlab worker"
        EXTERNAL = "external", "Trained elsewhere; telemetry sent over HTTP"

    class Priority(models.TextChoices):
        CI = "ci", "CI: a pipeline waits on it"
        NORMAL = "normal", "Normal"
        BATCH = "batch", "Batch: demo runs, strategy-search probes, backfills"

    ACTIVE_STATUSES = (Status.QUEUED, Status.RUNNING)
    # Celery's Redis priorities (0 first; the broker's priority_steps 0-9): a ci run's wake-up is
    # taken before every normal and batch one waiting on its queue. Within a priority a tenant's
    # run sinks a level or two below the others' by how many of its own already wait there
    # (FAIR_SHARE_AHEAD), so one team's flood cannot hold another's first runs back.
    PRIORITY_LEVEL = {Priority.CI: 0, Priority.NORMAL: 3, Priority.BATCH: 6}
    FAIR_SHARE_AHEAD = (1, 4)  # its own runs ahead: 0 -> +0, 1-3 -> +1, 4 or more -> +2

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="runs")
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    arm = models.ForeignKey(Arm, on_delete=models.PROTECT, related_name="runs")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.WORKER)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    queue = models.CharField(max_length=32, default=CeleryQueue.CPU.value)
    priority = models.CharField(
        max_length=8,
        choices=Priority.choices,
        default=Priority.NORMAL,
        help_text="Which queued runs a worker takes first: ci, then normal, then batch (oldest "
        "first within each).",
    )
    queue_level = models.PositiveSmallIntegerField(
        default=3,
        help_text="Its Celery priority (0 first): its priority's level, plus 0-2 by how many of "
        "its tenant's runs of that priority already waited on its queue when it was sent.",
    )
    run_key = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="Client key: a retried submission returns the same run (and the arm assigned "
        "to the key, apps.experiments.assignment).",
    )
    cancel_requested = models.BooleanField(default=False)

    # What ran, and on what.
    config_yaml = models.TextField("strategy (YAML)")
    config_sha256 = models.CharField(max_length=64)
    git_sha = models.CharField("git commit", max_length=40, blank=True, default="")
    dataset_sha256 = models.CharField(max_length=64, blank=True, default="")
    host = models.CharField(max_length=255, blank=True, default="")
    device = models.CharField(max_length=120, blank=True, default="")
    resource_id = models.CharField(
        "cloud resource",
        max_length=RESOURCE_ID_MAX,
        blank=True,
        default="",
        help_text="The cloud resource it trained on, as the invoice's FOCUS ResourceId names it "
        "(a worker's COSTLAB_RESOURCE_ID; an external run's resource_id): billing's "
        "reconciliation matches it to the invoice. Empty: not recorded.",
    )
    gpu_sku = models.ForeignKey(
        GpuSku,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="runs",
        verbose_name="GPU",
    )
    # The hardware it trained on: the profile measured of that device, its class (runs compare
    # only within one class: apps.attribution), and the compute dtype precision auto resolved to.
    device_measurement = models.ForeignKey(
        DeviceMeasurement,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="runs",
        help_text="The device profile the run trained on.",
    )
    device_class = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text="Comparable hardware (CPU model and flags, or GPU name); empty: not known.",
    )
    compute_dtype = models.CharField(
        max_length=8,
        blank=True,
        default="",
        help_text="The matmul dtype it trained in (precision auto resolved on its device).",
    )
    # Recorded by the worker before training starts, from the profile the runtime is handed.
    resolved = models.JSONField(
        default=dict,
        blank=True,
        help_text="What each `auto` key of its strategy became on its device, and why: "
        "{key: {requested, resolved, why}}; {} when the strategy named every value.",
    )
    gpu_count = models.PositiveIntegerField(
        "held GPUs", default=0, help_text="Accelerators held by the run (0: CPU only)."
    )
    world_size = models.PositiveIntegerField(
        default=1,
        help_text="Processes the run trains in (DDP ranks, one device each); one "
        "telemetry stream each.",
    )
    # A run across nodes: gang-scheduled as `nnodes` tasks meeting at one c10d rendezvous.
    nnodes = models.PositiveSmallIntegerField(
        default=1, help_text="Workers (nodes) the run trains on at once."
    )
    rdzv_endpoint = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text="host:port of the rendezvous, served by the node that claimed the run.",
    )
    rdzv_id = models.CharField(
        max_length=120, blank=True, default="", help_text="The rendezvous (run) id."
    )
    rdzv_seq_base = models.BigIntegerField(
        default=0, help_text="The attempt's first telemetry seq (nodes interleave)."
    )
    nodes_joined = models.PositiveSmallIntegerField(
        default=0, help_text="Nodes of this attempt's gang so far."
    )
    gang_requeues = models.PositiveSmallIntegerField(
        default=0,
        help_text="Times the run went back to the queue because not every node joined "
        "(at most once).",
    )
    vcpus = models.PositiveIntegerField(
        "held vCPUs", default=0, help_text="vCPUs held by the run, priced per vCPU-hour."
    )
    memory_gb = models.FloatField(
        "memory (GB)",
        default=0.0,
        help_text="Host memory held by the run (GB), priced per GB-hour.",
    )

    # Lease: a worker holds the run while its heartbeat keeps the lease fresh.
    lease_owner = models.CharField(max_length=255, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(
        default=0, help_text="Times a worker took the run (each has a RunAttempt; stops included)."
    )
    max_attempts = models.PositiveIntegerField(
        default=3,
        help_text="Failed attempts (lost worker, error) allowed; a graceful stop does not count.",
    )
    error = models.TextField(blank=True, default="")
    notes = models.TextField(
        blank=True,
        default="",
        help_text="What the platform said to the run: budget warnings, budget stops.",
    )
    tags = models.CharField(
        max_length=1000,
        blank=True,
        default="",
        help_text="The team's labels, comma-separated (apps.experiments.search.tags_normalise).",
    )
    note = models.TextField(blank=True, default="", help_text="The team's note on the run.")
    queued_at = models.DateTimeField(auto_now_add=True)
    # Durable enqueue: the row is the truth, the broker message only a wake-up. A queued run whose
    # message never left (broker down) or was lost (broker restarted) is sent again by the
    # reconciler.
    sent_at = models.DateTimeField(
        null=True, blank=True, help_text="When its id last reached the broker."
    )
    sends = models.PositiveIntegerField(
        default=0, help_text="Messages sent for it (re-sends included)."
    )
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    declared_ended_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="External runs: when it ended, declared at creation (a historical upload); "
        "samples stamped after it are refused and it is its finished_at once it finishes.",
    )
    prices_as_of = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Price versions created after this moment price the run only from their "
        "creation, never back to their valid_from (empty: the run's creation). An explicit "
        "re-price moves it to the re-price's time.",
    )

    # The time span of the run's stored samples, widened by each batch under the run's row lock.
    # Every read of a run's samples looks only inside it, so on Postgres it touches only the
    # partitions of those days (apps.telemetry.partitions).
    samples_from = models.DateTimeField(
        null=True, blank=True, help_text="The earliest stored sample's timestamp."
    )
    samples_to = models.DateTimeField(
        null=True, blank=True, help_text="The latest stored sample's timestamp."
    )
    samples_attempt = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="The attempt every stored sample carries, while they share one (0: several; "
        "null: not known, as for samples stored before this was kept).",
    )
    packed_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When compaction packed the run's samples (one row per rank and minute).",
    )
    kernel_means = models.JSONField(
        null=True,
        blank=True,
        help_text="The GPM means the kernel diagnosis reads (samples after the first step: n, "
        "tensor, dram, occupancy), stored when compaction packs the run's samples, so a packed or "
        "retired run is diagnosed without unpacking them.",
    )
    raw_dropped_before = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Telemetry retention dropped the run's raw samples taken before this moment; "
        "its bill and totals stay, its charts come from the rolled-up blocks.",
    )

    # Running totals, updated as telemetry lands (never recomputed from scratch).
    last_seq = models.BigIntegerField(default=-1, help_text="Highest seq stored.")
    priced_seq = models.BigIntegerField(
        default=-1, help_text="Samples up to this seq are in the totals."
    )
    steps = models.BigIntegerField(default=0)
    tokens = models.BigIntegerField(default=0)
    device_seconds = models.FloatField(default=0.0)
    energy_j = models.FloatField("energy (J)", default=0.0)
    energy_estimated = models.BooleanField(default=False)
    cost_usd = models.DecimalField(
        "cost (USD)", max_digits=16, decimal_places=6, default=Decimal("0")
    )
    cost_breakdown = models.JSONField(
        default=dict, blank=True, help_text="USD by term; used vs idle."
    )
    config_revision = models.PositiveIntegerField(
        default=1, help_text="Arm revision the run applies now."
    )
    config_history = models.JSONField(
        default=list,
        blank=True,
        help_text="Live changes applied while running: "
        "[{revision, applied_at, live, not_applied}].",
    )
    # The model it trained (as the runtime counted it) and what it saved (finetune.save).
    params_total = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Parameters of the model trained (empty: not reported)."
    )
    params_trainable = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Parameters the optimizer stepped (LoRA: the adapters'; empty: not reported).",
    )
    artifacts = models.JSONField(
        default=list,
        blank=True,
        help_text="Files the run saved under its artifacts directory (finetune.save): "
        "[{kind (lora_adapter | weights), path, bytes, sha256, config_sha256, dataset_sha256}].",
    )
    # The SDK sampler streaming each rank ({rank: stream id}, the first to send): a second
    # sampler of a rank would send the same seqs, and only the first copy is stored
    # (apps.telemetry.streams refuses it).
    streams = models.JSONField(default=dict, blank=True, editable=False)
    # What W&B and MLflow keep beside the bill: the run's hyperparameters as its training reported
    # them (costlab.Run.log_params, on a telemetry sample), merged as they arrive
    # (apps.experiments.params).
    params = models.JSONField(
        default=dict,
        blank=True,
        help_text="Reported parameters by kind: {kind: {name: value}} (kind 'hyperparameters': "
        "the trainer's arguments; e.g. 'model': its config). A later report of a key replaces it.",
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "run_key"],
                condition=~Q(run_key=""),
                name="run_unique_experiment_run_key",
            ),
            models.CheckConstraint(
                condition=Q(tokens__gte=0) & Q(steps__gte=0), name="run_totals_non_negative"
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "status"], name="run_tenant_status_idx"),
            models.Index(fields=["arm", "status"], name="run_arm_status_idx"),
            models.Index(fields=["status", "lease_expires_at"], name="run_status_lease_idx"),
            models.Index(fields=["status", "sent_at"], name="run_status_sent_idx"),
            # The dashboard's runs page: a team's runs by date (its default order and date filter),
            # and a git commit by prefix (LIKE 'abc%' needs the pattern operator class on Postgres).
            models.Index(fields=["tenant", "queued_at"], name="run_tenant_queued_idx"),
            # Attribution's per-class verdicts: an experiment's runs by device class.
            models.Index(fields=["experiment", "device_class"], name="run_experiment_class_idx"),
            models.Index(
                fields=["git_sha"], name="run_git_sha_prefix_idx", opclasses=["varchar_pattern_ops"]
            ),
        ]

    @property
    def tags_list(self) -> list[str]:
        return tags_of(self.tags)

    def __str__(self) -> str:
        return f"run {self.pk} ({self.status})"


class RunAttempt(models.Model):
    """One time a worker held a run: when, where, and how it ended. Kept for good, so a retried
    run's history (lost, stopped, failed) survives its final outcome."""

    class Outcome(models.TextChoices):
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed (error)"
        CANCELLED = "cancelled", "Cancelled"
        LOST = "lost", "Lost (lease expired)"
        STOPPED = "stopped", "Stopped (worker shut down; not counted)"

    # Outcomes that use up one of the run's max_attempts; a graceful stop is not a failure.
    COUNTED = (Outcome.FAILED, Outcome.LOST)

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField(
        help_text="1, 2, ...: also the attempt id its telemetry carries."
    )
    worker = models.CharField(max_length=255, help_text="The lease owner: host:pid:nonce.")
    host = models.CharField(max_length=255, blank=True, default="")
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.RUNNING)
    reason = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["run", "number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="run_attempt_unique_number"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} attempt {self.number} ({self.outcome})"


class ArmAssignment(models.Model):
    """The arm a client's run key trains, chosen once (apps.experiments.assignment.arm_assign):
    training that runs elsewhere asks before it starts and gets the same arm every time."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="assignments")
    run_key = models.CharField(max_length=200, help_text="The client's key for the run.")
    arm = models.ForeignKey(Arm, on_delete=models.CASCADE, related_name="assignments")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["experiment", "created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["experiment", "run_key"], name="armassignment_unique_experiment_run_key"
            ),
        ]
        indexes = [
            # The split since the arms last changed: an experiment's assignments by time.
            models.Index(fields=["experiment", "created_at"], name="armassignment_exp_time_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.run_key} -> arm {self.arm_id}"
