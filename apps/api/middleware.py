"""Guards in front of /api/: a body-size cap (413 before anything is read) and JSON for every
error."""

from __future__ import annotations

import logging

from django.conf import settings
from django.http import JsonResponse

from apps.core.exceptions import error_body

logger = logging.getLogger(__name__)


class ApiGuardMiddleware:
    """Refuse an /api/ request whose declared body is over its view's cap, and turn a crash into
    JSON.

    The cap is the view's `max_body_bytes` (telemetry ingest takes bigger batches:
    COSTLAB_API_MAX_INGEST_BODY_BYTES) or COSTLAB_API_MAX_BODY_BYTES. The check runs on
    Content-Length, before the body is read, so nothing of an oversized request is parsed or
    stored.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    @staticmethod
    def _is_api(request) -> bool:
        return request.path_info.startswith("/api/")

    def process_view(self, request, view_func, view_args, view_kwargs):
        if not self._is_api(request):
            return None
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse(error_body("Content-Length: not a number", "invalid"), status=400)
        cap = self._cap(view_func)
        if length > cap:
            return JsonResponse(
                error_body(
                    f"body: {length} bytes is over the limit of {cap} bytes for this endpoint",
                    "request_too_large",
                    limit_bytes=cap,
                ),
                status=413,
            )
        return None

    @staticmethod
    def _cap(view_func) -> int:
        """The view's (or viewset action's) `max_body_bytes`: bytes, or the name of a setting."""
        cap = (
            (getattr(view_func, "initkwargs", None) or {}).get("max_body_bytes")
            or getattr(getattr(view_func, "cls", None), "max_body_bytes", None)
            or "COSTLAB_API_MAX_BODY_BYTES"
        )
        return getattr(settings, cap) if isinstance(cap, str) else int(cap)

    def process_exception(self, request, exception):
        if not self._is_api(request):
            return None
        logger.exception("api: unhandled error on %s %s", request.method, request.path)
        return JsonResponse(
            error_body("internal error; it has been logged", "server_error"), status=500
        )
