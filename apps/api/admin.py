from django.contrib import admin, messages
from knox.models import AuthToken as KnoxAuthToken

from apps.api.models import ApiToken
from apps.api.services import api_token_revoke


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are minted with `manage.py api_token_create` (or POST /api/v1/tokens/); here they are
    audited and revoked."""

    list_display = [
        "name",
        "tenant",
        "token_key",
        "created",
        "expiry",
        "revoked_at",
        "last_used_at",
        "created_by",
    ]
    list_filter = ["tenant", "revoked_at"]
    search_fields = ["name", "token_key", "tenant__slug"]
    list_select_related = ["tenant", "created_by"]
    readonly_fields = [
        "name",
        "tenant",
        "token_key",
        "created",
        "expiry",
        "revoked_at",
        "last_used_at",
        "created_by",
    ]
    exclude = ["digest"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            api_token_revoke(token=token)
        self.message_user(request, f"Revoked {queryset.count()} tokens.", messages.SUCCESS)


# One token section: costlab's tenant tokens above. knox's own per-user token model (the table its
# app brings) is never used for sign-in here, so it is not shown beside them.
if admin.site.is_registered(KnoxAuthToken):
    admin.site.unregister(KnoxAuthToken)
