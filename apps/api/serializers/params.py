"""A run's training metrics and reported parameters, and parameter diffs between runs and arms."""

from rest_framework import serializers

from apps.telemetry.ingest import METRIC_NAME
from apps.telemetry.metrics import SERIES_POINTS


class MetricSummarySerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Values stored.")
    first_step = serializers.IntegerField()
    step = serializers.IntegerField(help_text="The highest step with a value.")
    last = serializers.FloatField(help_text="The value at that step (the later report at a tie).")


class MetricQuerySerializer(serializers.Serializer):
    name = serializers.RegexField(
        METRIC_NAME,
        max_length=64,
        help_text="The metric (a name in the run's `metrics`).",
    )
    points = serializers.IntegerField(
        required=False,
        min_value=2,
        max_value=SERIES_POINTS,
        default=SERIES_POINTS,
        help_text=f"Points at most (default and most: {SERIES_POINTS}).",
    )


class MetricSeriesSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    name = serializers.CharField()
    count = serializers.IntegerField(help_text="Values stored, before downsampling.")
    downsampled = serializers.BooleanField(
        help_text="True: each point is a bucket of bucket_steps steps (its last step, the mean of "
        "its values; min and max beside them)."
    )
    bucket_steps = serializers.IntegerField(help_text="0 where not downsampled.")
    step = serializers.ListField(child=serializers.IntegerField())
    value = serializers.ListField(child=serializers.FloatField())
    min = serializers.ListField(child=serializers.FloatField(), allow_null=True)
    max = serializers.ListField(child=serializers.FloatField(), allow_null=True)


class ParamsQuerySerializer(serializers.Serializer):
    against = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=2**63 - 1,
        help_text="Another run of the team: answer the keys whose values differ.",
    )


class ParamDiffSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="Flattened, dotted (hyperparameters' keys bare).")
    this = serializers.JSONField(allow_null=True)
    other = serializers.JSONField(allow_null=True)
    only = serializers.ChoiceField(
        choices=["this", "other"],
        required=False,
        help_text="Present where one side lacks the key (its value reads null).",
    )


class RunParamsSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    params = serializers.JSONField(help_text="As reported, by kind.")
    flat = serializers.DictField(
        child=serializers.JSONField(allow_null=True), help_text="Flattened, dotted keys."
    )
    against = serializers.IntegerField(allow_null=True)
    diff = ParamDiffSerializer(
        many=True,
        allow_null=True,
        help_text="With against: the keys that differ (this run's value, the other's); null "
        "without.",
    )
    same = serializers.IntegerField(
        allow_null=True, help_text="With against: the keys both have with one value."
    )


class ArmsParamsQuerySerializer(serializers.Serializer):
    a = serializers.CharField(max_length=200, help_text="An arm of the experiment: name or id.")
    b = serializers.CharField(max_length=200, help_text="Another arm: name or id.")


class ArmParamsSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    runs = serializers.IntegerField(
        help_text="Its newest succeeded runs that reported params (at most 200), compared."
    )
    params = serializers.DictField(
        child=serializers.JSONField(allow_null=True),
        help_text="The flattened keys on which all those runs agree.",
    )
    varying = serializers.ListField(
        child=serializers.CharField(),
        help_text="Keys on which they differ (or that some lack): left out of the diff.",
    )


class ArmsParamsDiffSerializer(serializers.Serializer):
    experiment = serializers.IntegerField()
    a = ArmParamsSerializer()
    b = ArmParamsSerializer()
    diff = ParamDiffSerializer(many=True, help_text="this: arm a's value; other: arm b's.")
    same = serializers.IntegerField()
