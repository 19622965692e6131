"""JSON parsing that refuses hostile documents with a 400 instead of failing deep inside Python."""

import json

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


def json_depth_exceeds(value, limit: int) -> bool:
    """True when containers nest deeper than `limit`; iterative, stops at the first offender."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


class SafeJSONParser(JSONParser):
    """Strict JSON (no NaN/Infinity), nesting capped at COSTLAB_API_MAX_JSON_DEPTH; every refusal
    is a 400."""

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode((parser_context or {}).get("encoding") or "utf-8")
            data = json.loads(text, parse_constant=self._refuse_constant)
        except UnicodeDecodeError:
            raise ParseError("body: JSON must be UTF-8") from None
        except RecursionError:
            raise ParseError(
                f"body: JSON nested deeper than {settings.COSTLAB_API_MAX_JSON_DEPTH} levels"
            ) from None
        except ValueError as exc:
            raise ParseError(f"body: JSON parse error - {exc}") from None
        limit = settings.COSTLAB_API_MAX_JSON_DEPTH
        if isinstance(data, dict | list) and json_depth_exceeds(data, limit):
            raise ParseError(f"body: JSON nested deeper than {limit} levels")
        return data

    @staticmethod
    def _refuse_constant(name: str):
        raise ValueError(f"{name} is not valid JSON")
