from django.db.models import QuerySet

from apps.api.models import ApiToken


def api_token_list(*, tenant) -> QuerySet[ApiToken]:
    return (
        ApiToken.objects.filter(tenant=tenant)
        .select_related("created_by")
        .order_by("-created", "-pk")
    )
