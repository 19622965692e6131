from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.api.serializers.fields import TagsField, TenantPrimaryKeyField
from apps.api.serializers.params import MetricSummarySerializer
from apps.billing.interface import breakdown_shown, carbon_shown
from apps.experiments.models import Arm, Experiment, Run, RunAttempt
from apps.experiments.resources import RESOURCE_ID_CHARS, RESOURCE_ID_MAX, resource_id_problem
from apps.experiments.runs import run_artifacts_listed
from apps.experiments.selectors import queue_places, runs_outliers
from apps.pricing.models import GpuSku, PricingTable
from apps.telemetry.evaluations import run_evaluation_summary
from apps.telemetry.metrics import run_metric_summary
from apps.telemetry.models import RunRepricing

HEX = r"^[0-9a-fA-F]*$"


class ArmRefSerializer(serializers.ModelSerializer):
    class Meta:
        model = Arm
        fields = ["id", "name", "is_control"]
        read_only_fields = fields


class RunOutlierSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    arm = serializers.IntegerField()
    device_s_per_token = serializers.FloatField()
    arm_median = serializers.FloatField(help_text="The arm's median device seconds per token.")
    mad = serializers.FloatField(
        help_text="The arm's median absolute deviation (at least 1 % of the median)."
    )
    distance_mads = serializers.FloatField()
    reason = serializers.CharField()


def queue_place_of(field: serializers.Field, run: Run) -> dict | None:
    """A queued worker run's place ({position, eta_s, eta_estimated}); every run of the response
    placed by one selector call (apps.experiments.selectors.queue_places)."""
    if run.status != Run.Status.QUEUED or run.kind != Run.Kind.WORKER:
        return None
    cache = field.context.setdefault("_queue_places", {})
    if run.queue not in cache:
        places = queue_places(queues={run.queue})
        cache[run.queue] = places
    place = cache[run.queue].get(run.pk)
    if place is None:
        return None
    return {"position": place.position, "eta_s": place.eta_s, "eta_estimated": True}


def outliers_of(field: serializers.Field, experiment_id: int) -> dict:
    """Outlier runs (run id -> RunOutlier) of the experiment, and of every experiment on the same
    page:
    one query per serialization, however many rows."""
    cache = field.context.setdefault("_run_outliers", {})
    if experiment_id not in cache:
        rows = (
            getattr(field.parent, "instance", None)
            if isinstance(field.parent, serializers.ListSerializer)
            else None
        )
        ids = {experiment_id} | {getattr(r, "experiment_id", None) or r.pk for r in rows or ()}
        found = runs_outliers(experiment_ids=sorted(ids))
        for pk in ids:
            cache[pk] = {}
        for run_id, outlier in found.items():
            cache.setdefault(outlier.experiment_id, {})[run_id] = outlier
    return cache[experiment_id]


class RunArtifactQuerySerializer(serializers.Serializer):
    name = serializers.CharField(
        max_length=255, help_text="The artifact's file name (its `name` in the run's artifacts)."
    )


class RunArtifactSerializer(serializers.Serializer):
    kind = serializers.CharField(help_text="lora_adapter (the adapter alone) or weights (full).")
    path = serializers.CharField(help_text="Relative to the run's artifacts directory.")
    name = serializers.CharField(help_text="The file name: GET runs/{id}/artifacts/?name=...")
    bytes = serializers.IntegerField(allow_null=True)
    sha256 = serializers.CharField(allow_blank=True)
    config_sha256 = serializers.CharField(
        allow_blank=True, help_text="The strategy it was trained with (in the file's metadata)."
    )
    dataset_sha256 = serializers.CharField(
        allow_blank=True, help_text="The data it was trained on (in the file's metadata)."
    )


class RunSerializer(serializers.ModelSerializer):
    cost_breakdown = serializers.SerializerMethodField(
        help_text="The bill by component (USD). A component billed only where the pricing table "
        "in force had no price for it reads null, and unpriced says for how long; never $0."
    )
    carbon = serializers.SerializerMethodField(
        help_text="gCO2e beside the USD: energy x PUE x the grid intensity of the price version in "
        "force; method (nvml, rapl, modelled) and its band (low, high); unpriced where a version "
        "had no intensity."
    )
    unpriced = serializers.SerializerMethodField(
        help_text="Components billed with no price (gpu: the table in force has no rate for the "
        "run's SKU; every component before the tenant's first table), with their seconds."
    )
    arm = ArmRefSerializer(read_only=True)
    gpu_sku = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    tags = TagsField(read_only=True)
    queue_position = serializers.SerializerMethodField(
        help_text="A queued worker run's place: position (1 = taken next on its queue; ci before "
        "normal before batch, oldest first) and eta_s, an estimate (eta_estimated: always true) "
        "of the seconds until it starts, from its queue's recent run times and how many it trains "
        "at once; null once it is not queued."
    )
    outlier = serializers.SerializerMethodField(
        help_text="Set when the run's device seconds per token lie beyond 3 MADs (scaled to a "
        "standard deviation) from its arm's median: the figures and why (attribution may "
        "exclude such runs: COSTLAB_ATTRIBUTION_EXCLUDE_OUTLIERS)."
    )
    artifacts = serializers.SerializerMethodField(
        help_text="Files the run saved (finetune.save): the LoRA adapter or the full weights as "
        "safetensors, with their hashes; download one at runs/{id}/artifacts/?name=<name>."
    )
    telemetry_send_every_s = serializers.SerializerMethodField(
        help_text="How often, in seconds, a client should send this run's telemetry (the "
        "server's COSTLAB_TELEMETRY_SEND_EVERY_S; the costlab SDK follows it unless its caller "
        "set send_every_s); null: the client's own default."
    )

    class Meta:
        model = Run
        fields = [
            "id",
            "experiment",
            "arm",
            "kind",
            "status",
            "queue",
            "priority",
            "queue_position",
            "run_key",
            "tags",
            "note",
            "git_sha",
            "dataset_sha256",
            "host",
            "device",
            "resource_id",
            "gpu_sku",
            "gpu_count",
            "vcpus",
            "memory_gb",
            "attempts",
            "max_attempts",
            "cancel_requested",
            "error",
            "notes",
            "queued_at",
            "started_at",
            "finished_at",
            "declared_ended_at",
            "prices_as_of",
            "last_seq",
            "steps",
            "tokens",
            "device_seconds",
            "energy_j",
            "energy_estimated",
            "cost_usd",
            "cost_breakdown",
            "unpriced",
            "carbon",
            "config_sha256",
            "config_revision",
            "outlier",
            "params_total",
            "params_trainable",
            "artifacts",
            "telemetry_send_every_s",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.DictField())
    def get_cost_breakdown(self, run: Run) -> dict:
        return breakdown_shown(run.cost_breakdown)

    @extend_schema_field(serializers.DictField())
    def get_carbon(self, run: Run) -> dict:
        return carbon_shown(
            breakdown=run.cost_breakdown,
            gpu_count=run.gpu_count,
            energy_estimated=run.energy_estimated,
            energy_j=run.energy_j,
            wall_s=run.device_seconds,
        )

    @extend_schema_field(serializers.DictField(child=serializers.FloatField()))
    def get_unpriced(self, run: Run) -> dict:
        return dict((run.cost_breakdown or {}).get("unpriced_s") or {})

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_queue_position(self, run: Run) -> dict | None:
        return queue_place_of(self, run)

    @extend_schema_field(RunArtifactSerializer(many=True))
    def get_artifacts(self, run: Run) -> list[dict]:
        return run_artifacts_listed(run)

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_telemetry_send_every_s(self, run: Run) -> float | None:
        return settings.COSTLAB_TELEMETRY_SEND_EVERY_S

    @extend_schema_field(RunOutlierSerializer(allow_null=True))
    def get_outlier(self, run: Run) -> dict | None:
        found = outliers_of(self, run.experiment_id).get(run.pk)
        return None if found is None else found.as_dict()


class RunAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunAttempt
        fields = ["number", "worker", "host", "started_at", "ended_at", "outcome", "reason"]
        read_only_fields = fields


class RunDetailSerializer(RunSerializer):
    attempt_log = RunAttemptSerializer(
        many=True,
        read_only=True,
        help_text="Every time a worker held the run: stops, losses and the outcome.",
    )
    evaluations = serializers.SerializerMethodField(
        help_text="Held-out evaluations per metric (eval_loss, or a named one): how many, the "
        "seconds they took (billed with the run, reported apart: eval_s), the last value with "
        "its step and trained tokens; null when the run evaluated nothing."
    )
    params = serializers.JSONField(
        read_only=True,
        help_text="The parameters the training reported, by kind: {kind: {name: value}} "
        "('hyperparameters': the trainer's arguments; e.g. 'model': its config); {} when none. "
        "Compare two runs at runs/{id}/params/?against=<run id>.",
    )
    resolved = serializers.JSONField(
        read_only=True,
        help_text="What each `auto` key of the strategy became on the run's device, and why, as "
        "the worker resolved it from the device's profile before training started: {key: "
        '{requested: "auto", resolved, why}}, e.g. optimizer.dynamic_batching.max_micro_batch; '
        "{} when the strategy named every value or the run has not started.",
    )
    metrics = serializers.SerializerMethodField(
        help_text="Training metrics per name (loss, grad_norm, learning_rate, eval_* ...): "
        "count, first_step, step and last (the value at the highest step); {} when none. The "
        "series: runs/{id}/metrics/?name=<name>."
    )

    class Meta(RunSerializer.Meta):
        fields = [
            *RunSerializer.Meta.fields,
            "config_yaml",
            "config_history",
            "resolved",
            "attempt_log",
            "evaluations",
            "params",
            "metrics",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_evaluations(self, run: Run) -> dict | None:
        return run_evaluation_summary(run_id=run.pk)

    @extend_schema_field(serializers.DictField(child=MetricSummarySerializer()))
    def get_metrics(self, run: Run) -> dict:
        return run_metric_summary(run_id=run.pk)


class RunSubmitSerializer(serializers.Serializer):
    experiment = TenantPrimaryKeyField(queryset=Experiment.objects.all())
    arm = TenantPrimaryKeyField(
        queryset=Arm.objects.all(),
        tenant_path="experiment__tenant",
        required=False,
        allow_null=True,
        help_text="Omit to let traffic weights choose.",
    )
    run_key = serializers.CharField(
        max_length=200,
        required=False,
        default="",
        help_text="Client key: a retried submission with the same key returns the same run; the "
        "key an arm was assigned to (POST experiments/{id}/assign/).",
    )
    git_sha = serializers.RegexField(
        HEX, max_length=40, required=False, default="", allow_blank=True
    )
    dataset_sha256 = serializers.RegexField(
        HEX, max_length=64, required=False, default="", allow_blank=True
    )
    kind = serializers.ChoiceField(choices=Run.Kind.choices, default=Run.Kind.WORKER)
    gpu_sku = serializers.SlugRelatedField(
        slug_field="name",
        queryset=GpuSku.objects.all(),
        required=False,
        allow_null=True,
        help_text="GPU model by name; omit for a CPU run.",
    )
    gpu_count = serializers.IntegerField(
        min_value=0, max_value=1024, required=False, allow_null=True
    )
    vcpus = serializers.IntegerField(
        min_value=0,
        max_value=4096,
        required=False,
        default=0,
        help_text="External runs: vCPUs held, priced per vCPU-hour.",
    )
    memory_gb = serializers.FloatField(
        min_value=0,
        max_value=65536,
        required=False,
        default=0.0,
        help_text="External runs: host memory held (GB), priced per GB-hour.",
    )
    started_at = serializers.DateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text="External runs: when it started (a historical upload); not in the future and "
        "not before the tenant's oldest pricing table. Its samples may be stamped from then on.",
    )
    ended_at = serializers.DateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text="External runs: when it ended (a historical upload, with started_at); after "
        "started_at and not in the future. Samples stamped after it are refused; it is the run's "
        "finished_at once it finishes.",
    )
    resource_id = serializers.CharField(
        required=False,
        default="",
        allow_blank=True,
        trim_whitespace=True,
        help_text="External runs: the cloud resource it trains on, as the invoice's FOCUS "
        f"ResourceId names it (an instance id or ARN ...); up to {RESOURCE_ID_MAX} characters, "
        f"{RESOURCE_ID_CHARS}. Billing's reconciliation matches it to the invoice.",
    )
    tags = TagsField(default=list)
    note = serializers.CharField(
        max_length=10_000,
        required=False,
        default="",
        allow_blank=True,
        help_text="The team's note.",
    )
    priority = serializers.ChoiceField(
        choices=Run.Priority.choices,
        default=Run.Priority.NORMAL,
        help_text="ci: a pipeline waits on it, taken before every normal and batch run queued "
        "on its queue; batch: demo runs, probes, backfills.",
    )

    def validate_resource_id(self, value: str) -> str:
        problem = resource_id_problem(value)
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value


class RunAnnotateSerializer(serializers.Serializer):
    tags = TagsField()
    note = serializers.CharField(max_length=10_000, required=False, allow_blank=True)


class RunFinishSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=[Run.Status.SUCCEEDED, Run.Status.FAILED])
    error = serializers.CharField(max_length=4000, required=False, default="", allow_blank=True)
    dataset_sha256 = serializers.RegexField(
        HEX, max_length=64, required=False, default="", allow_blank=True
    )


class RunRepriceSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=4000, help_text="Why; kept for audit.")
    pricing_table = TenantPrimaryKeyField(
        queryset=PricingTable.objects.all(),
        required=False,
        allow_null=True,
        help_text="Price the whole run at this table; omit: the tables in force when it ran.",
    )


class RunRepricingSerializer(serializers.ModelSerializer):
    actor = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = RunRepricing
        fields = [
            "id",
            "run",
            "at",
            "actor",
            "reason",
            "pricing_table",
            "cost_before_usd",
            "cost_after_usd",
        ]
        read_only_fields = fields
