"""Training metrics and parameters, checked where they are reported (``Run.log_metrics``,
``Run.log_params``): the sample keys ``metrics`` / ``metrics_step`` and ``params`` within the
server's bounds (apps.telemetry.ingest.SampleIn), because a batch the server refuses is dropped
whole and must never cost the samples it travels with.

Metrics come from the training loop, so a value the server cannot take is left out with one line
on stderr (once per name), never raised into the training. Parameters are made JSON: a value JSON
has no form for becomes its str(), and a report past 64 KiB loses its largest values, said.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Mapping
from typing import Any

from costlab.evaluation import MAX_METRIC, finite

METRIC_NAME = re.compile(r"^[A-Za-z0-9_./-]{1,64}$")  # loss, grad_norm, eval_accuracy, train/loss
PARAMS_KIND = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_METRICS = 64  # per call (the server refuses a sample with more)
MAX_PARAMS_BYTES = 64 * 1024  # one report, serialized as the server measures it
MAX_DEPTH = 32  # deeper is made a string
MAX_QUEUED = 10_000  # events waiting for the sampler; beyond, new ones are dropped and said


def metrics_checked(metrics: Any, *, said: set[str]) -> tuple[dict[str, float], list[str]]:
    """The metrics the server takes, as floats, and the reasons for those left out (each name's
    reason listed once: `said` keeps the names already reported). ValueError only where `metrics`
    is not a mapping."""
    if not isinstance(metrics, Mapping):
        raise ValueError(
            f"metrics: expected a mapping of name to number, got {type(metrics).__name__}"
        )
    kept: dict[str, float] = {}
    skipped: list[str] = []

    def skip(name: Any, why: str) -> None:
        key = str(name)
        if key not in said:
            said.add(key)
            skipped.append(f"{key!r} ({why})")

    for name, value in metrics.items():
        if not isinstance(name, str) or not METRIC_NAME.match(name):
            skip(name, "a name is 1-64 letters, digits, '_', '.', '/' or '-'")
            continue
        try:
            number = finite(name, value)
        except ValueError as exc:
            skip(name, str(exc).partition(": ")[2])
            continue
        if abs(number) > MAX_METRIC:
            skip(name, f"beyond +-1e30: {number:g}")
            continue
        if len(kept) == MAX_METRICS:
            skip(name, f"more than {MAX_METRICS} metrics in one call")
            continue
        kept[name] = number
    return kept, skipped


def step_checked(step: Any) -> int:
    try:
        number = operator.index(step)
    except TypeError:
        raise ValueError(f"step: expected an integer, got {type(step).__name__}") from None
    if not 0 <= number <= 2**62:
        raise ValueError(f"step: must be >= 0, got {number}")
    return number


def _jsonable(value: Any, depth: int = 0) -> Any:
    """`value` as JSON can hold it: dicts (keys as strings), lists, finite numbers, strings
    without NUL; anything else its str()."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if depth >= MAX_DEPTH:
        return _jsonable(str(value))
    if isinstance(value, Mapping):
        return {_jsonable(str(k)): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v, depth + 1) for v in value]
    return _jsonable(str(value))


def _size(report: Mapping) -> int:
    return len(
        json.dumps(report, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()
    )


def params_checked(params: Any, kind: str) -> tuple[dict[str, Any], list[str]]:
    """The report {kind: params} as JSON, at most MAX_PARAMS_BYTES: where larger, its largest
    values are replaced, one by one, with a note of their size; returns it and the keys cut.
    `params`: a mapping, or an object with to_dict() (a Trainer's arguments, a model's config).
    ValueError naming the argument for a kind or params of the wrong kind."""
    if not isinstance(kind, str) or not PARAMS_KIND.match(kind):
        raise ValueError(f"kind: a name of 1-64 letters, digits, '_', '.' or '-', got {kind!r}")
    if not isinstance(params, Mapping) and callable(getattr(params, "to_dict", None)):
        params = params.to_dict()
    if not isinstance(params, Mapping):
        raise ValueError(f"params: expected a mapping, got {type(params).__name__}")
    values = _jsonable(params)
    cut: list[str] = []
    total = _size({kind: values})
    if total <= MAX_PARAMS_BYTES:
        return values, cut
    sizes = {k: _size({k: v}) for k, v in values.items()}
    for key in sorted(sizes, key=sizes.__getitem__, reverse=True):  # the largest first
        if total <= MAX_PARAMS_BYTES:
            break
        note = f"(left out: {sizes[key]} bytes serialized)"
        smaller = _size({key: note})
        if smaller < sizes[key]:
            values[key] = note
            total -= sizes[key] - smaller
            cut.append(key)
    while values and total > MAX_PARAMS_BYTES:  # thousands of keys: the last ones go
        while values and total > MAX_PARAMS_BYTES:
            key, value = values.popitem()
            total -= _size({key: value}) - 1  # its entry and a comma
            cut.append(key)
        total = _size({kind: values})
    return values, cut
