from rest_framework import serializers


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
