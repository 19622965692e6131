"""An arm's strategy text: validate (gpu_runtime's schema), normalise, hash.

A leaf module: it imports no model and no service, so models, services, the API and the admin
all use it without an import cycle.
"""

from __future__ import annotations

import hashlib

from apps.core.exceptions import ApplicationError


def strategy_sha256(strategy_yaml: str) -> str:
    """Hash of the strategy text as stored (what the run snapshots, and what the CLI hashes)."""
    return hashlib.sha256(strategy_yaml.encode("utf-8")).hexdigest()


def strategy_normalise(strategy_yaml: str) -> str:
    """Text typed into a browser form: LF line endings and one final newline, as a YAML file has."""
    text = strategy_yaml.replace("\r\n", "\n").replace("\r", "\n")
    return text if not text or text.endswith("\n") else text + "\n"


def strategy_validate(strategy_yaml: str, *, field: str = "strategy_yaml") -> None:
    """Refuse a strategy gpu_runtime would refuse, naming the key, before anything is queued."""
    from gpu_runtime import StrategyError, load_strategy

    try:
        load_strategy(strategy_yaml)
    except StrategyError as exc:
        raise ApplicationError(
            f"{field}: {exc}", {"fields": {field: [f"{e['key']}: {e['message']}" for e in exc.errors]}},
            code="invalid_strategy",
        ) from None
