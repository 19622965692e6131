"""Writes on experiments and arms."""

from __future__ import annotations

import hashlib


def strategy_sha256(strategy_yaml: str) -> str:
    """Hash of the strategy text as stored (what the run snapshots)."""
    return hashlib.sha256(strategy_yaml.encode("utf-8")).hexdigest()
