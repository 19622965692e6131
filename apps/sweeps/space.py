"""A sweep's search space: which strategy keys vary, over which values. Pure, no Django.

A space is a mapping of dotted key -> a list of values, or an integer range
``{low, high, step}`` / ``{low, high, log2: true}`` (powers of two). Every range is expanded
to its finite list of values, so one space serves Optuna's GridSampler and NSGA-II alike.
``resources.threads`` is not a strategy key: it sets the probe's CPU threads.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from typing import Any

# The keys a sweep may vary, and the Python types their values must have.
SEARCHABLE: dict[str, tuple[type, ...]] = {
    "train.global_batch": (int,),
    "train.micro_batch": (int,),
    "model.seq_len": (int,),
    "precision.compute_dtype": (str,),
    "precision.storage_dtype": (str,),
    "memory.gradient_checkpointing.enabled": (bool,),
    "kernels.compile": (bool,),
    "kernels.fused_optimizer": (bool,),
    "kernels.fused_rmsnorm_qkv": (bool,),
    "optimizer.dynamic_batching.enabled": (bool,),
    "resources.threads": (int,),
}
RESOURCE_KEYS = ("resources.threads",)
MAX_VALUES_PER_KEY = 64


class SpaceError(ValueError):
    """A bad space: ``key`` names the field (``space.<key>``), the message says why."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


def _range_values(key: str, spec: dict[str, Any]) -> list[int]:
    unknown = set(spec) - {"low", "high", "step", "log2"}
    if unknown:
        raise SpaceError(
            f"space.{key}",
            f"unknown range key {sorted(unknown)[0]!r}; allowed: low, high, step, log2",
        )
    low, high = spec.get("low"), spec.get("high")
    for name, value in (("low", low), ("high", high)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SpaceError(f"space.{key}.{name}", f"must be an integer >= 1, got {value!r}")
    if low > high:
        raise SpaceError(f"space.{key}", f"inverted range: low ({low}) is above high ({high})")
    if spec.get("log2"):
        if "step" in spec:
            raise SpaceError(f"space.{key}", "give step or log2, not both")
        values = [2**e for e in range(math.ceil(math.log2(low)), math.floor(math.log2(high)) + 1)]
        if not values:
            raise SpaceError(
                f"space.{key}", f"empty range: no power of two between {low} and {high}"
            )
        return values
    step = spec.get("step", 1)
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise SpaceError(f"space.{key}.step", f"must be an integer >= 1, got {step!r}")
    return list(range(low, high + 1, step))


def space_expand(space: Any) -> dict[str, list[Any]]:
    """Validate a space and return every key's finite, de-duplicated list of values
    (in given order)."""
    if not isinstance(space, dict) or not space:
        raise SpaceError("space", "must be a non-empty mapping of strategy key -> values or range")
    expanded: dict[str, list[Any]] = {}
    for key, spec in space.items():
        if key not in SEARCHABLE:
            raise SpaceError(f"space.{key}", f"unknown key; searchable: {', '.join(SEARCHABLE)}")
        values = _range_values(key, spec) if isinstance(spec, dict) else spec
        if not isinstance(values, list) or not values:
            raise SpaceError(
                f"space.{key}", "empty: give a non-empty list of values or a {low, high} range"
            )
        kinds = SEARCHABLE[key]
        for value in values:
            if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
                raise SpaceError(f"space.{key}", f"{value!r} is not a {kinds[0].__name__}")
        unique = list(dict.fromkeys(values))
        if len(unique) > MAX_VALUES_PER_KEY:
            raise SpaceError(f"space.{key}", f"{len(unique)} values; at most {MAX_VALUES_PER_KEY}")
        expanded[key] = unique
    return expanded


def space_size(expanded: dict[str, list[Any]]) -> int:
    return math.prod(len(v) for v in expanded.values())


def space_points(expanded: dict[str, list[Any]]) -> Iterator[dict[str, Any]]:
    """Every point of the space, lazily, in a stable order (the grid)."""
    keys = list(expanded)
    for combo in itertools.product(*(expanded[k] for k in keys)):
        yield dict(zip(keys, combo, strict=True))


def params_key(params: dict[str, Any]) -> str:
    """A candidate's identity: equal params, equal key (so a duplicate is never measured twice)."""
    return hashlib.sha256(
        json.dumps(params, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def strategy_with(base: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The base strategy (parsed YAML) with the params' strategy keys set;
    resource keys left out."""
    doc = copy.deepcopy(base)
    for key, value in params.items():
        if key in RESOURCE_KEYS:
            continue
        node = doc
        *parents, leaf = key.split(".")
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[leaf] = value
    return doc
