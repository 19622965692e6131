from rest_framework import serializers

from apps.api.models import ApiToken


class ApiTokenSerializer(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    prefix = serializers.CharField(
        source="token_key", read_only=True, help_text="First characters of the secret."
    )

    class Meta:
        model = ApiToken
        fields = [
            "id",
            "name",
            "prefix",
            "created",
            "expiry",
            "revoked_at",
            "last_used_at",
            "created_by",
        ]
        read_only_fields = fields


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=80)
    expires_in_days = serializers.IntegerField(
        min_value=1,
        max_value=3650,
        required=False,
        allow_null=True,
        help_text="Default COSTLAB_API_TOKEN_TTL_DAYS.",
    )
    no_expiry = serializers.BooleanField(default=False)


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(
        read_only=True, help_text="The secret. Shown this once; only its digest is stored."
    )

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields
