from django.http import JsonResponse
from django.views.decorators.http import require_GET

from apps.core.permissions import ops_caller
from apps.core.selectors import system_health


@require_GET
def healthz(request):
    """ok / degraded (503) for anyone; which service is down, and why,
    only for staff or the ops token."""
    health = system_health()
    status = 200 if health["status"] == "ok" else 503
    if not ops_caller(request):
        health = {"status": health["status"]}
    return JsonResponse(health, status=status)
