"""OpenAPI details: every operation documents the one error body it can answer with."""

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import inline_serializer
from rest_framework import serializers

ErrorDetail = inline_serializer(
    name="ErrorDetail",
    fields={
        "message": serializers.CharField(
            help_text="What went wrong, naming the field and the reason."
        ),
        "code": serializers.CharField(
            help_text="Machine-readable: invalid, not_found, throttled ..."
        ),
        "fields": serializers.DictField(required=False, help_text="Per field: the messages."),
    },
)
ErrorBody = inline_serializer(name="Error", fields={"error": ErrorDetail})

ALWAYS = {
    "400": "Invalid request",
    "401": "Missing or invalid credentials",
    "403": "Not allowed",
    "404": "Not found (or another tenant's)",
    "429": "Throttled; see Retry-After",
}
WRITES = {"409": "The object's state forbids this", "413": "Body over the size limit"}


class ApiAutoSchema(AutoSchema):
    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        codes = dict(ALWAYS)
        if self.method in ("POST", "PUT", "PATCH", "DELETE"):
            codes.update(WRITES)
        for code, description in codes.items():
            if code not in responses:
                response = self._get_response_for_code(ErrorBody, code, direction=direction)
                response["description"] = description
                responses[code] = response
        return responses
