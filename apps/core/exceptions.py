"""One error shape for every interface.

Services raise ApplicationError (or Django's ValidationError); the API exception
handler turns those, DRF's own errors, 404 and 403 into the same JSON body:
{"error": {"message": str, "code": str, "fields": {field: [messages]}}}.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404

if TYPE_CHECKING:
    from rest_framework.response import Response


class ApplicationError(Exception):
    """A business rule refused the request. `extra` carries machine-readable detail."""

    status_code = 400
    code = "application_error"

    def __init__(
        self,
        message: str,
        extra: dict[str, Any] | None = None,
        *,
        code: str | None = None,
        status: int | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.extra = extra or {}
        if code:
            self.code = code
        if status:
            self.status_code = status  # e.g. 409 when the object's state forbids the change


def error_body(message: str, code: str, fields: dict[str, Any] | None = None, **extra: Any) -> dict:
    body: dict[str, Any] = {"message": message, "code": code}
    if fields:
        body["fields"] = fields
    body.update(extra)
    return {"error": body}


def api_exception_handler(exc: Exception, context: dict) -> Response | None:
    # DRF is imported here, by the API's first error: services, workers and commands raise
    # ApplicationError without loading it. A worker's start without system checks: 1.26 -> 1.01
    # CPU-s (AMD EPYC, 2 cores, bf16 emulated (slow)).
    from rest_framework import exceptions as drf_exceptions
    from rest_framework.response import Response
    from rest_framework.views import exception_handler

    if isinstance(exc, DjangoValidationError):
        fields = (
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
        if "__all__" in fields:  # Django's name for errors of the whole object
            fields["non_field_errors"] = fields.pop("__all__")
        exc = drf_exceptions.ValidationError(detail=fields)
    elif isinstance(exc, Http404):
        exc = drf_exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = drf_exceptions.PermissionDenied()

    if isinstance(exc, ApplicationError):
        return Response(error_body(exc.message, exc.code, **exc.extra), status=exc.status_code)

    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, drf_exceptions.ValidationError):
        detail = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        path, reason = _first_error(detail)
        response.data = error_body(f"{path}: {reason}", "invalid", fields=detail)
    else:
        detail = getattr(exc, "detail", str(exc))
        response.data = error_body(str(detail), getattr(detail, "code", None) or "error")
    return response


def _first_error(detail: Any, path: str = "") -> tuple[str, str]:
    """The first leaf of a (nested) DRF error detail, with its dotted path: 'gpu_prices[0].sku',
    reason."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            if value:
                step = f"[{key}]" if isinstance(key, int) else (f".{key}" if path else str(key))
                return _first_error(value, path + step)
    elif isinstance(detail, list):
        for index, value in enumerate(detail):
            if value:
                if isinstance(value, dict | list):
                    return _first_error(value, f"{path}[{index}]")
                return path or "request", str(value)
    elif detail:
        return path or "request", str(detail)
    return path or "request", "invalid"
