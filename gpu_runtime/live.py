"""Keys a running job can take without a restart, applied at a step boundary.

A strategy edited while runs train: the live keys below reach those runs (the trainer's
``live`` callback); every other change only applies to runs started afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gpu_runtime.errors import StrategyError
from gpu_runtime.schema import StrategyConfig, strategy_from_dict

log = logging.getLogger(__name__)

LIVE_KEYS: tuple[str, ...] = (
    "optimizer.dynamic_batching.min_micro_batch",
    "optimizer.dynamic_batching.max_micro_batch",
    "optimizer.dynamic_batching.stability_window",
    "telemetry.interval_s",
)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, leaf = path.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def live_changes(old: StrategyConfig, new: StrategyConfig) -> tuple[dict[str, Any], list[str]]:
    """(the live keys that changed, nested like the YAML; the dotted keys that changed but
    are not live)."""
    before, after = _flatten(old.model_dump()), _flatten(new.model_dump())
    changed = sorted(k for k in after.keys() | before.keys() if before.get(k) != after.get(k))
    live = {k: after[k] for k in changed if k in LIVE_KEYS}
    return _nest(live), [k for k in changed if k not in LIVE_KEYS]


def live_poller(
    live: Callable[[], dict[str, Any] | None],
    *,
    current: Callable[[], StrategyConfig],
    apply: Callable[[StrategyConfig], None],
) -> Callable[[], None]:
    """A step-boundary callback: poll `live` for changed live keys, validate,
    hand the new config to `apply`.

    Keys a running job cannot take are logged and ignored; an update the schema refuses
    leaves the run as it is (a bad edit must not end a run that trains fine).
    """

    def poll() -> None:
        changes = live()
        if not changes:
            return
        flat = _flatten(changes)
        ignored = sorted(k for k in flat if k not in LIVE_KEYS)
        if ignored:
            log.warning(
                "live update: ignoring keys a running job cannot take: %s", ", ".join(ignored)
            )
        merged = _flatten(current().model_dump(mode="json"))
        merged.update({k: v for k, v in flat.items() if k in LIVE_KEYS})
        try:
            updated = strategy_from_dict(_nest(merged))
        except StrategyError as exc:
            log.warning("live update refused, the run keeps its settings: %s", exc)
            return
        apply(updated)

    return poll
