"""An outage of Postgres or of the broker answers 503 with Retry-After, never a 500.

Views raise the driver's error as usual; this turns it into `{"error": {...}}` JSON (every
path: the dashboard's fetches read it too) and logs the detail here, not to the caller.
"""

from __future__ import annotations

import logging

from django.db import InterfaceError as DatabaseInterfaceError
from django.db import OperationalError as DatabaseOperationalError
from django.http import JsonResponse
from kombu.exceptions import OperationalError as BrokerOperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from apps.core.exceptions import error_body

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 5
OUTAGES = (
    ((DatabaseOperationalError, DatabaseInterfaceError), "database"),
    ((BrokerOperationalError, RedisConnectionError, RedisTimeoutError), "broker"),
)


def service_unavailable(service: str) -> JsonResponse:
    response = JsonResponse(
        error_body(
            f"{service}: temporarily unavailable; retry in {RETRY_AFTER_S} s",
            "service_unavailable",
            service=service,
        ),
        status=503,
    )
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


class ServiceUnavailableMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        for types, service in OUTAGES:
            if isinstance(exception, types):
                logger.warning(
                    "%s unavailable on %s %s: %s: %s",
                    service,
                    request.method,
                    request.path,
                    type(exception).__name__,
                    exception,
                )
                return service_unavailable(service)
        return None
