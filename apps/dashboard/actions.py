"""The one shape of a dashboard form's action: do it, and say how it went in a message (the
service's error, which names its field, or what was done)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from django.contrib import messages

from apps.core.exceptions import ApplicationError

T = TypeVar("T")


def act(request, do: Callable[[], T], *, done: str | Callable[[T], str]) -> T | None:
    """do(); on an ApplicationError its message as an error (None returned), else `done` (a text,
    or made from the result) as a success."""
    try:
        result = do()
    except ApplicationError as exc:
        messages.error(request, exc.message)
        return None
    messages.success(request, done(result) if callable(done) else done)
    return result
