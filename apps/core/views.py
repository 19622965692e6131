from django.http import JsonResponse
from django.views.decorators.http import require_GET

from apps.core.selectors import system_health


@require_GET
def healthz(request):
    """Database and broker reachability; 503 when either is down."""
    health = system_health()
    return JsonResponse(health, status=200 if health["status"] == "ok" else 503)
