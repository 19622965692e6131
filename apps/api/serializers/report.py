from rest_framework import serializers

from apps.attribution.models import FreezeEvent
from apps.attribution.reads import QUALITY_VERDICTS
from apps.attribution.reads import VERDICTS as ARM_VERDICTS

VERDICTS = list(ARM_VERDICTS)

# The report's one sign convention, said once and referred to by every signed field.
SIGNED = (
    "Signed relative difference from the control, (arm - control) / control: negative is the "
    "good side (cheaper, less carbon, a better model), positive the bad side (dearer, more, "
    "worse); -0.28 = 28 % cheaper. Its _low / _high fields are the always-valid interval at "
    "1 - alpha, signed alike."
)


class ProjectionSerializer(serializers.Serializer):
    target_steps = serializers.IntegerField()
    gpu_hours = serializers.FloatField()
    electricity_usd = serializers.FloatField()
    total_usd = serializers.FloatField()
    completion_s = serializers.FloatField()
    estimated = serializers.BooleanField(
        help_text="Always true: every figure here is projected, not measured."
    )


class PricingTableRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    valid_from = serializers.DateTimeField()


class QualityVerdictSerializer(serializers.Serializer):
    verdict = serializers.ChoiceField(
        choices=list(QUALITY_VERDICTS),
        help_text="worse / better: the always-valid bound of the relative change beyond "
        "±margin; non_inferior: its upper end within +margin; not_measured: the arm or the "
        "control has no finished run that evaluated the metric (never taken as equal).",
    )
    metric = serializers.CharField(help_text="eval_loss, or the experiment's named metric.")
    direction = serializers.ChoiceField(choices=["lower", "higher"], help_text="Which is better.")
    margin = serializers.FloatField(help_text="The experiment's quality_margin (0.01 = 1 %).")
    value = serializers.FloatField(
        allow_null=True, help_text="The arm's mean final value over its finished runs."
    )
    control_value = serializers.FloatField(allow_null=True)
    change = serializers.FloatField(
        allow_null=True,
        help_text="Relative change from the control, positive = worse, negative = better "
        "(the sign convention of deviation).",
    )
    change_low = serializers.FloatField(allow_null=True)
    change_high = serializers.FloatField(allow_null=True)
    runs = serializers.IntegerField(help_text="The arm's evaluated finished runs counted.")
    control_runs = serializers.IntegerField()
    note = serializers.CharField(allow_blank=True)
    alpha = serializers.FloatField(required=False)


class ArmReportSerializer(serializers.Serializer):
    """One arm against the control. Every relative difference here (deviation, carbon_deviation,
    quality.change, and their _low / _high) is signed one way: negative = cheaper (less carbon, a
    better model), positive = dearer (more carbon, a worse model)."""

    arm_id = serializers.IntegerField()
    name = serializers.CharField()
    is_control = serializers.BooleanField()
    state = serializers.CharField()
    weight = serializers.DecimalField(max_digits=7, decimal_places=4)
    runs = serializers.IntegerField()
    runs_succeeded = serializers.IntegerField()
    tokens = serializers.IntegerField()
    steps = serializers.IntegerField()
    gpu_hours = serializers.FloatField()
    energy_kwh = serializers.FloatField()
    energy_estimated = serializers.BooleanField(help_text="Some energy was modelled, not measured.")
    electricity_usd = serializers.FloatField()
    total_usd = serializers.FloatField(
        help_text="As billed: each run at the tables in force while it ran."
    )
    compared_usd = serializers.FloatField(
        help_text="The arm's usage priced at the report's one comparison table (pricing_table): "
        "what usd_per_mtok, metric_value and deviation compare."
    )
    usd_per_mtok = serializers.FloatField(
        allow_null=True, help_text="USD per million tokens, at the comparison table."
    )
    metric = serializers.CharField(
        help_text="What deviation compares: usd_per_mtok, or usd_per_step."
    )
    metric_value = serializers.FloatField(allow_null=True)
    throughput_tok_s = serializers.FloatField(allow_null=True)
    completion_s = serializers.FloatField(
        allow_null=True, help_text="Mean wall time of succeeded runs (s)."
    )
    deviation = serializers.FloatField(
        allow_null=True, help_text=f"{SIGNED} On the compared metric: 0.05 = 5 % dearer."
    )
    deviation_low = serializers.FloatField(
        allow_null=True,
        help_text="The lower end of deviation's always-valid interval at the latest attribution "
        "window (signed as deviation: -0.47 = 47 % cheaper).",
    )
    deviation_high = serializers.FloatField(
        allow_null=True, help_text="Its upper end (signed as deviation)."
    )
    projected = ProjectionSerializer(allow_null=True)
    evidence_runs = serializers.IntegerField(
        help_text="Runs the latest attribution window counted for the arm (its reference device "
        "class, since its last unfreeze): what the freeze rule and the verdict weigh against "
        "the minimums. `runs` counts every priced run."
    )
    evidence_samples = serializers.IntegerField(
        help_text="Telemetry samples the latest attribution window counted for the arm."
    )
    verdict = serializers.ChoiceField(
        choices=VERDICTS,
        help_text="costlier / cheaper (conclusive) exactly when the freeze rule could act: every "
        "minimum met by the arm and the control, and the always-valid bounds beyond ±threshold; "
        "within_threshold only when the bounds lie inside ±threshold; else inconclusive. "
        "cheaper_but_worse: cheaper, with quality proven worse beyond the margin (never given "
        "traffic, frozen); worse: quality proven worse, cost not cheaper; unpriced: the arm or the "
        "control has usage billed with no price (see unpriced), so nothing is compared.",
    )
    quality = QualityVerdictSerializer(
        allow_null=True,
        help_text="Quality against the control at the latest attribution window (null before "
        "the first).",
    )
    usd_to_target = serializers.FloatField(
        allow_null=True,
        help_text="Estimated: mean USD the arm's finished runs took to reach quality_target "
        "(each run's bill pro rata of its wall time at its evaluations, interpolated); null "
        "where none reached it.",
    )
    unpriced = serializers.DictField(
        child=serializers.FloatField(),
        help_text="Seconds of the arm's usage billed with no price, by component (gpu, energy, "
        "vcpu, memory); empty when every second was priced. An arm with any, or whose control "
        "has any, reads verdict `unpriced`: never cheaper nor costlier.",
    )
    unpriced_skus = serializers.ListField(
        child=serializers.CharField(), help_text="GPU SKUs its runs used with no price."
    )
    runs_reached_target = serializers.IntegerField()
    runs_evaluated = serializers.IntegerField(
        help_text="Finished runs with an evaluation curve of the metric."
    )
    not_frozen = serializers.ListField(
        child=serializers.CharField(),
        help_text="Why an active arm whose deviation lies beyond the threshold is not frozen, in "
        "the freeze rule's terms (empty otherwise).",
    )
    carbon = serializers.DictField(
        help_text="gCO2e as billed (each run at its price versions' grid intensity): g_co2e, "
        "method (nvml, rapl, modelled: the widest of the arm's runs), band and its low and high; "
        "g_co2e null and unpriced true where no version had an intensity."
    )
    compared_g_co2e = serializers.FloatField(
        allow_null=True,
        help_text="The arm's energy at the comparison version's intensity (as billed before the "
        "first window); null where that version has none.",
    )
    gco2e_per_mtok = serializers.FloatField(allow_null=True)
    carbon_deviation = serializers.FloatField(
        allow_null=True,
        help_text="(arm - control) / control on gCO2e per unit of work, signed as deviation: "
        "negative = less carbon.",
    )
    carbon_deviation_low = serializers.FloatField(
        allow_null=True,
        help_text="Always-valid bounds of carbon_deviation over the arms' runs (given "
        "min_cs_runs_per_arm runs per arm), signed as deviation.",
    )
    carbon_deviation_high = serializers.FloatField(allow_null=True)


class ReportQuerySerializer(serializers.Serializer):
    metric = serializers.ChoiceField(
        choices=["usd", "gco2e"],
        default="usd",
        help_text="What metric, metric_value, deviation and verdict compare: USD (default) or "
        "gCO2e per unit of work. The freeze rule compares USD either way.",
    )


class ClassArmSerializer(serializers.Serializer):
    arm_id = serializers.IntegerField()
    name = serializers.CharField()
    is_control = serializers.BooleanField()
    runs = serializers.IntegerField(help_text="The arm's priced runs on this device class.")
    metric_value = serializers.FloatField(
        allow_null=True, help_text="Cost per unit of work over these runs (as billed)."
    )
    deviation = serializers.FloatField(
        allow_null=True, help_text="Signed as the arm's deviation: negative = cheaper."
    )
    deviation_low = serializers.FloatField(allow_null=True)
    deviation_high = serializers.FloatField(allow_null=True)
    verdict = serializers.ChoiceField(choices=VERDICTS)


class ClassVerdictSerializer(serializers.Serializer):
    device_class = serializers.CharField(
        help_text="CPU model and the flags that decide dtype speed, or the GPU's name; "
        "empty: runs with no recorded profile."
    )
    label = serializers.CharField()
    reference = serializers.BooleanField(
        help_text="The class the arms' verdicts above, freezes and traffic compare within."
    )
    runs = serializers.IntegerField()
    control_runs = serializers.IntegerField()
    arms = ClassArmSerializer(many=True)
    note = serializers.CharField(help_text="Why this class is counted but not compared, if so.")


class ExperimentReportSerializer(serializers.Serializer):
    experiment_id = serializers.IntegerField()
    name = serializers.CharField()
    threshold = serializers.FloatField(help_text="The experiment's freeze threshold (0.05 = 5 %).")
    min_runs_per_arm = serializers.IntegerField(
        help_text="Runs the arm and the control each need before a freeze or a conclusive verdict."
    )
    min_samples_per_arm = serializers.IntegerField(
        help_text="Telemetry samples the arm and the control each need, likewise."
    )
    min_cs_runs_per_arm = serializers.IntegerField(
        help_text="Runs each needs before the always-valid bound is consulted (it is asymptotic)."
    )
    target_steps = serializers.IntegerField(allow_null=True)
    window_end = serializers.DateTimeField(
        allow_null=True, help_text="Latest attribution window; null before the first."
    )
    pricing_table = PricingTableRefSerializer(
        allow_null=True,
        help_text="The one table every arm is compared at (the latest window's: pinned, else in "
        "force at its end); null before the first window (compared as billed).",
    )
    arms = ArmReportSerializer(many=True)
    device_class = serializers.CharField(
        help_text="The device class the verdicts compare within (the control's first run's)."
    )
    device_classes = ClassVerdictSerializer(
        many=True, help_text="One verdict per device class, each from that class's runs alone."
    )
    compared_on = serializers.ChoiceField(
        choices=["usd", "gco2e"], help_text="What the arms' metric and deviation compare."
    )
    quality_metric = serializers.CharField()
    quality_direction = serializers.ChoiceField(choices=["lower", "higher"])
    quality_margin = serializers.FloatField()
    quality_target = serializers.FloatField(
        allow_null=True,
        help_text="The control's mean final value of the quality metric: what usd_to_target is to.",
    )


class FreezeRequestSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=2000, help_text="Why; kept for audit.")


class UnfreezeRequestSerializer(FreezeRequestSerializer):
    weight = serializers.DecimalField(
        max_digits=7,
        decimal_places=4,
        min_value=0,
        required=False,
        allow_null=True,
        help_text="Traffic weight to restore; default the weight it had before.",
    )


class FreezeEventSerializer(serializers.ModelSerializer):
    actor = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    arm_state = serializers.CharField(source="arm.state", read_only=True)

    class Meta:
        model = FreezeEvent
        fields = [
            "id",
            "arm",
            "action",
            "reason",
            "actor",
            "deviation",
            "deviation_low",
            "threshold",
            "evidence",
            "arm_state",
            "created_at",
        ]
        read_only_fields = fields


class RunsCancelRequestSerializer(serializers.Serializer):
    arm = serializers.IntegerField(
        required=False, allow_null=True, help_text="Only this arm's runs; omit: every arm's."
    )


class RunsCancelledSerializer(serializers.Serializer):
    ended = serializers.ListField(
        child=serializers.IntegerField(), help_text="Runs cancelled now (queued, external)."
    )
    stopping = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Runs training on a worker: they stop at their next step.",
    )
