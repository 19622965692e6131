from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from apps.core.exceptions import error_body
from apps.core.permissions import ops_caller
from apps.ops.metrics import metrics_registry


@require_GET
def metrics(request):
    """Prometheus text format; for staff or the ops token, like the health details."""
    if not ops_caller(request):
        response = JsonResponse(
            error_body(
                "metrics: staff or the ops token (Authorization: Bearer "
                "<COSTLAB_OPS_TOKEN>) required",
                "not_authenticated",
            ),
            status=401,
        )
        response["WWW-Authenticate"] = 'Bearer realm="costlab-ops"'
        return response
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE_LATEST)
