from rest_framework import serializers

from apps.pricing.models import CostModel, GpuPrice, GpuSku, PricingTable
from apps.pricing.services import PRICING_TABLE_FIELDS


class GpuSkuSerializer(serializers.ModelSerializer):
    class Meta:
        model = GpuSku
        fields = ["id", "name", "vendor", "memory_gb", "tdp_w", "peak_bf16_tflops"]
        read_only_fields = fields


class GpuPriceSerializer(serializers.ModelSerializer):
    sku = serializers.SlugRelatedField(slug_field="name", queryset=GpuSku.objects.all())

    class Meta:
        model = GpuPrice
        fields = ["sku", "hourly_usd"]


class PricingTableSerializer(serializers.ModelSerializer):
    gpu_prices = GpuPriceSerializer(many=True, required=False)
    confirm_unpriced = serializers.BooleanField(
        required=False,
        write_only=True,
        help_text="Save a table that has no price for a GPU SKU of running or recent runs "
        "(refused with 409 naming the SKUs otherwise): their GPU time is billed as unpriced.",
    )
    confirm_free = serializers.BooleanField(
        required=False,
        write_only=True,
        help_text="Save a GPU price of 0 (refused naming gpu_prices[i].hourly_usd otherwise): "
        "that GPU's time is then free, and shown as free, not as unpriced.",
    )

    retroactive = serializers.BooleanField(
        read_only=True,
        help_text="valid_from lies before the table was posted: it prices runs open when it was "
        "posted only from its created_at, and finished runs only by an explicit re-price "
        "(POST /api/v1/runs/{id}/reprice/, audited). Runs opened after it are priced by it from "
        "its valid_from.",
    )

    class Meta:
        model = PricingTable
        # A PATCH of a table in force that changes a price answers 201 with the new version
        # (its `supersedes` the table patched); the patched table keeps its prices.
        fields = [
            "id",
            *PRICING_TABLE_FIELDS,
            "gpu_prices",
            "supersedes",
            "confirm_unpriced",
            "confirm_free",
            "retroactive",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "supersedes", "created_at", "updated_at"]
        extra_kwargs = {"notes": {"max_length": 10_000}, "name": {"max_length": 120}}
        validators = []  # (tenant, valid_from) uniqueness: checked by full_clean in the service

    def validate(self, attrs):
        """A GPU at 0 USD/h is a choice, not a typo: it needs confirm_free (kept out of the
        table's fields)."""
        confirmed = attrs.pop("confirm_free", False)
        for i, price in enumerate(attrs.get("gpu_prices") or []):
            if price.get("hourly_usd") == 0 and not confirmed:
                raise serializers.ValidationError(
                    {
                        "gpu_prices": {
                            i: {
                                "hourly_usd": [
                                    f"0 makes {price['sku'].name} free: send confirm_free: true "
                                    "if it is (its GPU time is then billed at 0 and shown free)"
                                ]
                            }
                        }
                    }
                )
        return attrs


class CostModelSerializer(serializers.ModelSerializer):
    class Meta:
        model = CostModel
        fields = [
            "id",
            "name",
            "kind",
            "gpu_weight",
            "energy_weight",
            "cpu_weight",
            "memory_weight",
            "unit",
            "tiers",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["id", "created_at", "updated_at"]
        extra_kwargs = {"name": {"max_length": 120}}
        validators = []
