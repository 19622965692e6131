"""The one error a strategy (or what it asks of the hardware and data) can be refused with."""

from __future__ import annotations

DOCUMENT_KEY = "<document>"


class StrategyError(ValueError):
    """A strategy refused, with one ``{"key": dotted.path, "message": reason}`` per problem.

    ``str(err)`` names every key, so a log line or an HTTP 400 body says what to fix.
    """

    def __init__(self, errors: list[dict[str, str]]):
        if not errors:
            raise ValueError("StrategyError needs at least one error")
        self.errors = [{"key": str(e["key"]), "message": str(e["message"])} for e in errors]
        super().__init__("; ".join(f"{e['key']}: {e['message']}" for e in self.errors))

    @classmethod
    def single(cls, key: str, message: str) -> StrategyError:
        return cls([{"key": key, "message": message}])
