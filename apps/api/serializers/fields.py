from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.core.exceptions import ApplicationError
from apps.experiments.search import tags_normalise, tags_of


class TenantPrimaryKeyField(serializers.PrimaryKeyRelatedField):
    """A reference to one of the caller's own objects: another tenant's id reads as 'does not
    exist'."""

    def __init__(self, *, tenant_path: str = "tenant", **kwargs):
        self.tenant_path = tenant_path
        super().__init__(**kwargs)

    def get_queryset(self):
        queryset = super().get_queryset()
        tenant = getattr(self.context.get("request"), "tenant", None)
        return (
            queryset.filter(**{self.tenant_path: tenant}) if tenant is not None else queryset.none()
        )


@extend_schema_field({"type": "array", "items": {"type": "string"}})
class TagsField(serializers.Field):
    """A run's or an experiment's tags: a list of strings in and out, stored comma-separated
    (apps.experiments.search.tags_normalise checks each)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        kwargs.setdefault(
            "help_text",
            "Labels: up to 20, each 1-40 letters, digits and _.:/- (a comma-separated string "
            "is taken too).",
        )
        super().__init__(**kwargs)

    def to_representation(self, value):
        return tags_of(value or "")

    def to_internal_value(self, data):
        try:
            return tags_normalise(data, field=self.field_name or "tags")
        except ApplicationError as exc:
            raise serializers.ValidationError(exc.message) from None
