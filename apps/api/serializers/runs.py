from rest_framework import serializers

from apps.api.serializers.fields import TenantPrimaryKeyField
from apps.experiments.models import Arm, Experiment, Run, RunAttempt
from apps.pricing.models import GpuSku

HEX = r"^[0-9a-fA-F]*$"


class ArmRefSerializer(serializers.ModelSerializer):
    class Meta:
        model = Arm
        fields = ["id", "name", "is_control"]
        read_only_fields = fields


class RunSerializer(serializers.ModelSerializer):
    arm = ArmRefSerializer(read_only=True)
    gpu_sku = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)

    class Meta:
        model = Run
        fields = [
            "id", "experiment", "arm", "kind", "status", "queue", "run_key", "git_sha", "dataset_sha256", "host",
            "device", "gpu_sku", "gpu_count", "attempts", "max_attempts", "cancel_requested", "error", "queued_at",
            "started_at", "finished_at", "steps", "tokens", "device_seconds", "energy_j", "energy_estimated",
            "cost_usd", "cost_breakdown", "config_sha256", "config_revision",
        ]
        read_only_fields = fields


class RunAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunAttempt
        fields = ["number", "worker", "host", "started_at", "ended_at", "outcome", "reason"]
        read_only_fields = fields


class RunDetailSerializer(RunSerializer):
    attempt_log = RunAttemptSerializer(many=True, read_only=True,
                                       help_text="Every time a worker held the run: stops, losses and the outcome.")

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "config_yaml", "config_history", "attempt_log"]
        read_only_fields = fields


class RunSubmitSerializer(serializers.Serializer):
    experiment = TenantPrimaryKeyField(queryset=Experiment.objects.all())
    arm = TenantPrimaryKeyField(queryset=Arm.objects.all(), tenant_path="experiment__tenant", required=False,
                                allow_null=True, help_text="Omit to let traffic weights choose.")
    run_key = serializers.CharField(max_length=120, required=False, default="",
                                    help_text="Client key: a retried submission with the same key returns the same run.")
    git_sha = serializers.RegexField(HEX, max_length=40, required=False, default="", allow_blank=True)
    dataset_sha256 = serializers.RegexField(HEX, max_length=64, required=False, default="", allow_blank=True)
    kind = serializers.ChoiceField(choices=Run.Kind.choices, default=Run.Kind.WORKER)
    gpu_sku = serializers.SlugRelatedField(slug_field="name", queryset=GpuSku.objects.all(), required=False,
                                           allow_null=True, help_text="GPU model by name; omit for a CPU run.")
    gpu_count = serializers.IntegerField(min_value=0, max_value=1024, required=False, allow_null=True)


class RunFinishSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=[Run.Status.SUCCEEDED, Run.Status.FAILED])
    error = serializers.CharField(max_length=4000, required=False, default="", allow_blank=True)
    dataset_sha256 = serializers.RegexField(HEX, max_length=64, required=False, default="", allow_blank=True)
