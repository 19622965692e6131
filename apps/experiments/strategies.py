"""An arm's strategy text: validate (gpu_runtime's schema), normalise, hash.

A leaf module: it imports no model and no service, so models, services, the API and the admin
all use it without an import cycle.
"""

from __future__ import annotations

import hashlib

from apps.core.exceptions import ApplicationError


def strategy_sha256(strategy_yaml: str) -> str:
    """Hash of the normalised strategy text: what is stored and what a run snapshots. The same YAML hashes
    the same whether it was typed in a browser (CRLF, no final newline) or read from a file; the CLI
    hashes a file the same way (costlab_cli.submit.strategy_digest)."""
    return hashlib.sha256(strategy_normalise(strategy_yaml).encode("utf-8")).hexdigest()


def strategy_normalise(strategy_yaml: str) -> str:
    """LF line endings and exactly one final newline, as a YAML file has (text typed into a browser form
    comes with CRLF and no final newline). Applied before any strategy text is hashed or stored."""
    text = strategy_yaml.replace("\r\n", "\n").replace("\r", "\n").rstrip("\n")
    return text + "\n" if text else ""


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
