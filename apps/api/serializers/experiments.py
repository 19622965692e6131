from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.api.serializers.fields import TagsField, TenantPrimaryKeyField
from apps.api.serializers.runs import ArmRefSerializer, RunOutlierSerializer, outliers_of
from apps.core.queues import CeleryQueue
from apps.experiments.models import Arm, Experiment
from apps.experiments.services import EXPERIMENT_EDITABLE
from apps.pricing.models import CostModel, PricingTable

STRATEGY_MAX_CHARS = 64 * 1024  # gpu_runtime refuses larger documents too


class ArmSummarySerializer(serializers.ModelSerializer):
    class Meta:
        model = Arm
        fields = ["id", "name", "is_control", "state", "weight", "revision", "strategy_sha256"]
        read_only_fields = fields


class ExperimentSerializer(serializers.ModelSerializer):
    cost_model = TenantPrimaryKeyField(queryset=CostModel.objects.all())
    pricing_table = TenantPrimaryKeyField(
        queryset=PricingTable.objects.all(), allow_null=True, required=False
    )
    arms = ArmSummarySerializer(many=True, read_only=True)
    tags = TagsField()
    outlier_runs = serializers.SerializerMethodField(
        help_text="Runs whose device seconds per token lie beyond 3 x MAD from their arm's median."
    )

    class Meta:
        model = Experiment
        fields = ["id", *EXPERIMENT_EDITABLE, "arms", "outlier_runs", "created_at", "updated_at"]
        read_only_fields = ["id", "arms", "outlier_runs", "created_at", "updated_at"]
        extra_kwargs = {
            "name": {"max_length": 120},
            "description": {"max_length": 10_000},
            "attribution_interval_s": {"max_value": 86_400},
            "min_runs_per_arm": {"max_value": 1_000_000},
            "min_samples_per_arm": {"max_value": 1_000_000_000},
            "min_cs_runs_per_arm": {"max_value": 1_000_000},
            "target_steps": {"max_value": 10**12},
        }
        # (tenant, name) uniqueness is checked by the service, which knows the tenant
        validators = []

    @extend_schema_field(RunOutlierSerializer(many=True))
    def get_outlier_runs(self, experiment: Experiment) -> list[dict]:
        if experiment.pk is None:
            return []
        return [
            o.as_dict()
            for o in sorted(outliers_of(self, experiment.pk).values(), key=lambda o: o.run_id)
        ]


class ArmSerializer(serializers.ModelSerializer):
    experiment = TenantPrimaryKeyField(queryset=Experiment.objects.all())
    strategy_yaml = serializers.CharField(max_length=STRATEGY_MAX_CHARS, trim_whitespace=False)

    class Meta:
        model = Arm
        fields = [
            "id",
            "experiment",
            "name",
            "strategy_yaml",
            "strategy_sha256",
            "weight",
            "is_control",
            "state",
            "revision",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
            "id",
            "strategy_sha256",
            "state",
            "revision",
            "created_at",
            "updated_at",
        ]
        validators = []


class ArmUpdateSerializer(serializers.Serializer):
    """What may change on an arm: its strategy (a new revision) and its traffic weight."""

    strategy_yaml = serializers.CharField(
        max_length=STRATEGY_MAX_CHARS, trim_whitespace=False, required=False
    )
    weight = serializers.DecimalField(max_digits=7, decimal_places=4, min_value=0, required=False)


class StrategyWarningSerializer(serializers.Serializer):
    queue = serializers.CharField(help_text="The queue whose devices say so.")
    key = serializers.CharField(help_text="The strategy key warned about.")
    message = serializers.CharField()
    ratio = serializers.FloatField(
        allow_null=True, help_text="Measured throughput of the named dtype over fp32 (best device)."
    )
    devices = serializers.IntegerField(help_text="Devices of the queue it was measured on.")


class ArmWriteResultSerializer(ArmSerializer):
    warnings = StrategyWarningSerializer(
        many=True,
        read_only=True,
        help_text="What the training queues' measured devices say of the strategy's dtypes.",
    )

    class Meta(ArmSerializer.Meta):
        fields = [*ArmSerializer.Meta.fields, "warnings"]


class ArmUpdateResultSerializer(ArmWriteResultSerializer):
    live_keys = serializers.DictField(
        read_only=True, help_text="Changed keys that reach running runs at their next step."
    )
    new_runs_only = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="Changed keys that only runs started from now on use.",
    )

    class Meta(ArmSerializer.Meta):
        fields = [*ArmWriteResultSerializer.Meta.fields, "live_keys", "new_runs_only"]


class ArmAssignSerializer(serializers.Serializer):
    run_key = serializers.CharField(
        min_length=1,
        max_length=200,
        trim_whitespace=False,
        help_text="The client's key for the run it is about to start (then POST runs/ with the "
        "same run_key and the arm): the same key always gets the same arm.",
    )


class ArmAssignmentSerializer(serializers.Serializer):
    experiment = serializers.IntegerField(source="experiment.pk")
    run_key = serializers.CharField()
    arm = ArmRefSerializer()
    strategy_yaml = serializers.CharField(
        source="arm.strategy_yaml", help_text="The arm's strategy, as stored."
    )
    strategy = serializers.DictField(
        help_text="The strategy parsed by gpu_runtime's schema, every default filled in."
    )
    declared = serializers.DictField(
        help_text="Only the keys the arm's YAML sets (normalised by the schema): what a trainer "
        "elsewhere applies; the rest is the schema's default, which the script's own settings "
        "override (costlab.to_trainer_args)."
    )
    sticky = serializers.BooleanField(
        help_text="True when the key was assigned before (or already ran) and gets the same arm "
        "again; false for a fresh assignment."
    )


class StrategyCheckSerializer(serializers.Serializer):
    strategy_yaml = serializers.CharField(max_length=STRATEGY_MAX_CHARS, trim_whitespace=False)
    queue = serializers.ChoiceField(
        choices=[CeleryQueue.CPU.value, CeleryQueue.GPU.value],
        default=CeleryQueue.CPU.value,
        help_text="Whose devices to check the strategy against (their measured profiles).",
    )


class StrategyCheckResultSerializer(serializers.Serializer):
    valid = serializers.BooleanField()
    strategy_sha256 = serializers.CharField()
    warnings = StrategyWarningSerializer(many=True)
