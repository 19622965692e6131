"""One error shape for every interface.

Services raise ApplicationError (or Django's ValidationError); the API exception
handler turns those, DRF's own errors, 404 and 403 into the same JSON body:
{"error": {"message": str, "code": str, "fields": {field: [messages]}}}.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler


class ApplicationError(Exception):
    """A business rule refused the request. `extra` carries machine-readable detail."""

    status_code = 400
    code = "application_error"

    def __init__(self, message: str, extra: dict[str, Any] | None = None, *, code: str | None = None,
                 status: int | None = None):
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
    if isinstance(exc, DjangoValidationError):
        fields = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
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
        first = next(iter(detail.items()), ("request", ["invalid"]))
        message = f"{first[0]}: {first[1][0] if isinstance(first[1], list) and first[1] else first[1]}"
        response.data = error_body(message, "invalid", fields=detail)
    else:
        detail = getattr(exc, "detail", str(exc))
        response.data = error_body(str(detail), getattr(detail, "code", None) or "error")
    return response
