"""costlab's training runtime: pure PyTorch, no Django, usable alone.

``python -m gpu_runtime train strategy.yaml --steps 50 --out metrics.jsonl``

The schema half (``load_strategy``, ``StrategyConfig``, ``StrategyError``,
``strategy_json_schema``) imports no torch, so a web process can validate strategies
cheaply; ``train`` and ``RunResult`` load the runtime on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpu_runtime.errors import StrategyError
from gpu_runtime.schema import (
    StrategyConfig,
    config_sha256,
    load_strategy,
    strategy_from_dict,
    strategy_json_schema,
)

if TYPE_CHECKING:
    from gpu_runtime.capability import check_capability
    from gpu_runtime.launch import train
    from gpu_runtime.result import RunResult

__all__ = [
    "RunResult",
    "StrategyConfig",
    "StrategyError",
    "check_capability",
    "config_sha256",
    "load_strategy",
    "strategy_from_dict",
    "strategy_json_schema",
    "train",
]

_LAZY = {
    "train": "gpu_runtime.launch",
    "RunResult": "gpu_runtime.result",
    "check_capability": "gpu_runtime.capability",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gpu_runtime' has no attribute {name!r}")
