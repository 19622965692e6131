"""A held-out evaluation, checked where it is reported: the fields one telemetry sample carries
(``eval_loss``, ``eval_s``, ``quality``), within the server's bounds, or a ValueError naming the
argument. Checked here, not by the server, because a batch the server refuses is dropped whole:
one bad evaluation must never cost the samples it travels with."""

from __future__ import annotations

import math
import re
from typing import Any

EVAL_LOSS = "eval_loss"
DIRECTIONS = ("lower", "higher")
METRIC_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# The server's bounds (apps.telemetry.ingest.SampleIn): past them a value is a unit or encoding
# error, and the batch carrying it would be refused.
MAX_EVAL_LOSS, MAX_EVAL_S, MAX_METRIC = 1e6, 1e7, 1e30


def finite(name: str, value: Any) -> float:
    """`value` (a number or a 0-d tensor) as a finite float, or a ValueError naming `name`."""
    if isinstance(value, str | bytes | bool):
        raise ValueError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(
            f"{name}: expected a number or a 0-d tensor, got {type(value).__name__}"
        ) from None
    if not math.isfinite(number):
        raise ValueError(f"{name}: must be finite, got {number}")
    return number


def metric_name(name: str, argument: str = "metric") -> str:
    """A metric's name as the server stores it, or a ValueError naming `argument`."""
    if not isinstance(name, str) or not METRIC_NAME.match(name):
        raise ValueError(
            f"{argument}: a name of 1-64 letters, digits, '_', '.' or '-', got {name!r}"
        )
    return name


def direction_of(direction: Any, metric: str, argument: str = "direction") -> str:
    """'lower' or 'higher' (which way is better), or a ValueError naming `argument`: a metric
    whose direction is not said cannot be compared."""
    if direction not in DIRECTIONS:
        got = "nothing" if direction is None else repr(direction)
        raise ValueError(
            f"{argument}: say which way is better for '{metric}', 'lower' or 'higher' (got {got})"
        )
    return direction


def evaluation_fields(
    eval_loss: Any = None,
    *,
    metric: str | None = None,
    value: Any = None,
    direction: str | None = None,
    eval_s: Any = None,
) -> dict[str, Any]:
    """The sample keys of one evaluation: the held-out loss, and/or a named metric with its value
    and direction, and the seconds it took. ValueError naming the argument on anything else."""
    fields: dict[str, Any] = {}
    if metric is None:
        if value is not None or direction is not None:
            raise ValueError("metric: name the metric that value and direction belong to")
    else:
        metric_name(metric)
        if value is None:
            raise ValueError(f"value: metric '{metric}' needs its value")
        if metric == EVAL_LOSS:  # the held-out loss by its name: lower is better, as eval_loss
            if eval_loss is not None:
                raise ValueError("metric: eval_loss is given twice (eval_loss= and metric=)")
            if direction not in (None, "lower"):
                raise ValueError("direction: eval_loss is a loss, lower is better")
            eval_loss = value
        else:
            number = finite("value", value)
            if abs(number) > MAX_METRIC:
                raise ValueError(f"value: must be within +-1e30, got {number:g}")
            fields["quality"] = {
                "name": metric,
                "value": number,
                "direction": direction_of(direction, metric),
            }
    if eval_loss is not None:
        loss = finite(EVAL_LOSS, eval_loss)
        if not 0 <= loss <= MAX_EVAL_LOSS:
            raise ValueError(f"eval_loss: must be >= 0 and at most 1e6, got {loss:g}")
        fields[EVAL_LOSS] = loss
    if not fields:
        raise ValueError("eval_loss: give the held-out loss, or a metric with its value")
    if eval_s is not None:
        seconds = finite("eval_s", eval_s)
        if not 0 <= seconds <= MAX_EVAL_S:
            raise ValueError(f"eval_s: must be >= 0 seconds and at most 1e7, got {seconds:g}")
        fields["eval_s"] = seconds
    return fields
