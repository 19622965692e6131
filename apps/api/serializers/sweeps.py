from decimal import Decimal

from rest_framework import serializers

from apps.api.serializers.experiments import STRATEGY_MAX_CHARS
from apps.api.serializers.fields import TenantPrimaryKeyField
from apps.experiments.models import Experiment
from apps.pricing.models import CostModel, GpuSku
from apps.sweeps.models import OBJECTIVES, SAMPLER_CHOICES, Probe, Sweep


class ProbeSerializer(serializers.ModelSerializer):
    on_frontier = serializers.BooleanField(read_only=True, default=False)

    class Meta:
        model = Probe
        fields = [
            "id",
            "number",
            "params",
            "status",
            "reason",
            "device",
            "steps_timed",
            "step_time_s",
            "step_time_spread",
            "tokens_per_s",
            "peak_mem_mb",
            "mem_estimated",
            "energy_j",
            "energy_estimated",
            "cost_usd",
            "usd_per_mtok",
            "final_loss",
            "eval_loss",
            "eval_s",
            "is_base",
            "started_at",
            "finished_at",
            "on_frontier",
            "promotions",
        ]
        read_only_fields = fields


class SweepSerializer(serializers.ModelSerializer):
    gpu_sku = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    probes_done = serializers.SerializerMethodField()

    class Meta:
        model = Sweep
        fields = [
            "id",
            "name",
            "status",
            "sampler",
            "objectives",
            "space",
            "pruned",
            "probe_count",
            "probe_steps",
            "warmup_steps",
            "parallelism",
            "queue",
            "gpu_sku",
            "cost_model",
            "seed",
            "tie_tolerance",
            "quality_margin",
            "probes_done",
            "note",
            "created_at",
            "finished_at",
        ]
        read_only_fields = fields

    def get_probes_done(self, sweep) -> int:
        landed = getattr(
            sweep, "probes_landed", None
        )  # annotated by sweep_list; a single sweep counts here
        return (
            landed if landed is not None else sweep.probes.exclude(status__in=Probe.PENDING).count()
        )


class SweepDetailSerializer(SweepSerializer):
    class Meta(SweepSerializer.Meta):
        fields = [*SweepSerializer.Meta.fields, "base_strategy_yaml"]
        read_only_fields = fields


class SweepCreatedSerializer(SweepDetailSerializer):
    warnings = serializers.ListField(
        child=serializers.CharField(),
        read_only=True,
        help_text="E.g. no worker consumes the sweep's queue now.",
    )

    class Meta(SweepDetailSerializer.Meta):
        fields = [*SweepDetailSerializer.Meta.fields, "warnings"]
        read_only_fields = fields


class SweepCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=120)
    base_strategy_yaml = serializers.CharField(max_length=STRATEGY_MAX_CHARS, trim_whitespace=False)
    space = serializers.JSONField(
        help_text="Dotted strategy key -> list of values, or {low, high, step | log2}."
    )
    objectives = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="Minimised, from: " + ", ".join(OBJECTIVES) + " (eval_loss: the held-out "
        "loss; needs an eval: section in the base strategy).",
    )
    sampler = serializers.ChoiceField(
        choices=SAMPLER_CHOICES,
        default="auto",
        help_text="auto: grid when the space fits the budget, else tpe.",
    )
    seed = serializers.IntegerField(min_value=0, max_value=2**31 - 1, default=0)
    probe_count = serializers.IntegerField(min_value=1, max_value=10_000)
    probe_steps = serializers.IntegerField(min_value=2, max_value=100_000)
    warmup_steps = serializers.IntegerField(min_value=0, max_value=10_000, default=2)
    parallelism = serializers.IntegerField(min_value=1, max_value=1024, default=2)
    gpu_sku = serializers.SlugRelatedField(
        slug_field="name",
        queryset=GpuSku.objects.all(),
        required=False,
        allow_null=True,
        help_text="GPU model by name; omit to probe on CPU.",
    )
    cost_model = TenantPrimaryKeyField(
        queryset=CostModel.objects.all(), required=False, allow_null=True
    )
    tie_tolerance = serializers.DecimalField(
        max_digits=5, decimal_places=4, min_value=0, max_value=Decimal("0.5"), required=False
    )
    quality_margin = serializers.DecimalField(
        max_digits=6,
        decimal_places=4,
        min_value=Decimal("0.0001"),
        max_value=Decimal("1"),
        required=False,
        allow_null=True,
        help_text="A quality constraint: a probe whose held-out loss is more than this much "
        "(relative, 0.01 = 1 %) above the base strategy's is infeasible. Needs an eval: section "
        "in the base strategy.",
    )

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError(
                {unknown[0]: [f"unknown key; allowed: {', '.join(self.fields)}"]}
            )
        return attrs


class SweepPromoteSerializer(serializers.Serializer):
    probe = serializers.IntegerField(help_text="The probe id of a frontier point.")
    weight = serializers.DecimalField(max_digits=7, decimal_places=4, min_value=0, default=1)
    experiment = TenantPrimaryKeyField(
        queryset=Experiment.objects.all(),
        required=False,
        allow_null=True,
        help_text="An existing experiment; omit and give experiment_name for a new one.",
    )
    experiment_name = serializers.CharField(max_length=120, required=False, default="")
    arm_name = serializers.CharField(max_length=80, required=False, default="")
    force = serializers.BooleanField(
        default=False,
        help_text="Promote a point whose held-out loss is worse than the base's beyond the margin "
        "(or not measured); kept in the probe's promotions as forced.",
    )


class SizeSerializer(serializers.Serializer):
    threads = serializers.IntegerField()
    status = serializers.CharField()
    usd_per_mtok = serializers.FloatField(allow_null=True)
    tokens_per_s = serializers.FloatField(allow_null=True)
    reason = serializers.CharField()


class ProfileSerializer(serializers.Serializer):
    cpu_util = serializers.FloatField(
        allow_null=True, help_text="0..1; None on a GPU run (util_pct is the GPU's)."
    )
    io_wait = serializers.FloatField(
        allow_null=True, help_text="Not sampled by the runtime: None, taken as 0."
    )
    mem_usage_gb = serializers.FloatField(allow_null=True)


class RunSizingSerializer(serializers.Serializer):
    profile = ProfileSerializer()
    estimate_vcpus = serializers.IntegerField(
        allow_null=True, help_text="The design document's estimate_vcpus."
    )
    actual_vcpus = serializers.IntegerField()
    sweep = serializers.DictField(
        allow_null=True, help_text="The latest sizing sweep: id and status."
    )
    sizes = SizeSerializer(many=True)
    recommended_vcpus = serializers.IntegerField(
        allow_null=True, help_text="Smallest size within 5 % of the cheapest USD per 1M tok."
    )
    cheapest_vcpus = serializers.IntegerField(allow_null=True)
    compliance_recommended = serializers.FloatField(
        allow_null=True, help_text="Tokens/s there / the best measured."
    )
    compliance_actual = serializers.FloatField(
        allow_null=True, help_text="Tokens/s at the run's size / the best."
    )
    difference_vcpus = serializers.IntegerField(
        allow_null=True, help_text="estimate - recommended."
    )


class RunSizingStartSerializer(serializers.Serializer):
    max_threads = serializers.IntegerField(
        min_value=1,
        max_value=256,
        required=False,
        help_text="Probe 1..N threads (default: COSTLAB_SIZING_MAX_THREADS).",
    )
    probe_steps = serializers.IntegerField(min_value=2, max_value=10_000, default=12)
