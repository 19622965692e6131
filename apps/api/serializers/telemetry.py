from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.telemetry.ingest import MAX_BATCH
from apps.telemetry.selectors import SERIES_UNITS


class QualitySerializer(serializers.Serializer):
    name = serializers.RegexField(r"^[A-Za-z0-9_.-]+$", max_length=64)
    value = serializers.FloatField()
    direction = serializers.ChoiceField(choices=["lower", "higher"])


class TelemetrySampleSerializer(serializers.Serializer):
    """One sample, as gpu_runtime's sink emits it. Documentation only: the ingest service
    validates."""

    seq = serializers.IntegerField(
        min_value=0, help_text="Per-run sequence number; a seq sent twice is stored once."
    )
    ts = serializers.DateTimeField(help_text="ISO 8601, or Unix seconds.")
    step = serializers.IntegerField(min_value=0, required=False)
    device = serializers.CharField(max_length=120, required=False)
    util_pct = serializers.FloatField(min_value=0, max_value=100, required=False, allow_null=True)
    mem_used_mb = serializers.FloatField(min_value=0, required=False, allow_null=True)
    mem_total_mb = serializers.FloatField(min_value=0, required=False, allow_null=True)
    power_w = serializers.FloatField(min_value=0, required=False, allow_null=True)
    energy_j = serializers.FloatField(
        min_value=0,
        required=False,
        allow_null=True,
        help_text="Cumulative energy since the run started (J).",
    )
    step_time_s = serializers.FloatField(min_value=0, required=False, allow_null=True)
    tokens = serializers.IntegerField(min_value=0, required=False, help_text="Cumulative tokens.")
    tokens_per_s = serializers.FloatField(min_value=0, required=False, allow_null=True)
    micro_batch = serializers.IntegerField(min_value=0, required=False, allow_null=True)
    loss = serializers.FloatField(required=False, allow_null=True)
    overlap_ratio = serializers.FloatField(
        min_value=0, max_value=1, required=False, allow_null=True
    )
    mfu = serializers.FloatField(min_value=0, required=False, allow_null=True)
    sm_clock_mhz = serializers.FloatField(min_value=0, required=False, allow_null=True)
    temperature_c = serializers.FloatField(required=False, allow_null=True)
    sm_occupancy_pct = serializers.FloatField(
        min_value=0, max_value=100, required=False, allow_null=True, help_text="NVML GPM (Hopper+)."
    )
    tensor_active_pct = serializers.FloatField(
        min_value=0, max_value=100, required=False, allow_null=True, help_text="NVML GPM (Hopper+)."
    )
    dram_bw_pct = serializers.FloatField(
        min_value=0, max_value=100, required=False, allow_null=True, help_text="NVML GPM (Hopper+)."
    )
    estimated = serializers.BooleanField(
        required=False, help_text="Power and energy were modelled, not measured."
    )
    eval_loss = serializers.FloatField(
        min_value=0,
        required=False,
        allow_null=True,
        help_text="Held-out loss at this sample's step and tokens (finite, >= 0): what arms are "
        "compared on for quality unless the experiment names another metric.",
    )
    eval_s = serializers.FloatField(
        min_value=0, required=False, allow_null=True, help_text="Seconds that evaluation took."
    )
    quality = QualitySerializer(
        required=False,
        allow_null=True,
        help_text="A named held-out metric (e.g. accuracy) with its direction.",
    )


@extend_schema_field(TelemetrySampleSerializer(many=True))
class SampleListField(serializers.Field):
    """A list of objects, checked for shape only: each sample is validated once, by the ingest
    service."""

    def to_internal_value(self, data):
        if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
            raise serializers.ValidationError("expected a list of sample objects")
        if len(data) > MAX_BATCH:
            raise serializers.ValidationError(
                f"at most {MAX_BATCH} samples per batch, got {len(data)}"
            )
        return data

    def to_representation(self, value):
        return value


class TelemetryBatchSerializer(serializers.Serializer):
    samples = SampleListField()
    attempt = serializers.IntegerField(min_value=1, max_value=1000, required=False, allow_null=True)


class IngestResultSerializer(serializers.Serializer):
    received = serializers.IntegerField()
    inserted = serializers.IntegerField()
    duplicates = serializers.IntegerField(
        help_text="Samples whose seq was already stored (a retried batch)."
    )
    refused = serializers.ListField(
        child=serializers.DictField(),
        help_text="Samples refused alone, each {index, seq, field, reason} (e.g. stamped ahead "
        "of the server's clock): correct and resend them; the rest of the batch was stored.",
    )


class TelemetryQuerySerializer(serializers.Serializer):
    fields = serializers.CharField(
        required=False,
        default="util_pct,power_w,tokens_per_s",
        help_text=f"Comma-separated series: {', '.join(SERIES_UNITS)}.",
    )
    budget = serializers.IntegerField(
        required=False, min_value=2, help_text="Points per series at most."
    )
    since = serializers.DateTimeField(required=False)
    until = serializers.DateTimeField(required=False)

    def validate_fields(self, value):
        names = [v.strip() for v in value.split(",") if v.strip()]
        unknown = [n for n in names if n not in SERIES_UNITS]
        if unknown or not names:
            raise serializers.ValidationError(
                f"'{unknown[0] if unknown else value}' is not a series; choose from "
                f"{', '.join(SERIES_UNITS)}"
            )
        return list(dict.fromkeys(names))


class SeriesSerializer(serializers.Serializer):
    unit = serializers.CharField()
    points = serializers.ListField(
        child=serializers.ListField(child=serializers.JSONField(), min_length=2, max_length=2),
        help_text="[[ISO timestamp, value], ...] in sample order.",
    )


class TelemetrySeriesSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    budget = serializers.IntegerField()
    samples = serializers.IntegerField(
        help_text="Stored samples in the window, before downsampling."
    )
    estimated = serializers.BooleanField(
        help_text="Power and energy were modelled for some samples."
    )
    series = serializers.DictField(child=SeriesSerializer())
