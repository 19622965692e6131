"""A run's reported parameters (Run.params): merged as they arrive, flattened to dotted keys, and
compared between two runs or two arms.

A training reports them by kind (costlab.Run.log_params): {"hyperparameters": {...the trainer's
arguments...}, "model": {...its config...}}. Flattened, the hyperparameters' keys stand bare
("learning_rate", "lr_scheduler_kwargs.power") and another kind's carry its name ("model.
hidden_size"); a list is one value. A diff lists the keys whose values differ, and those only
one side has."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from django.db.models import QuerySet

from apps.experiments.models import Arm, Run

logger = logging.getLogger(__name__)
HYPERPARAMETERS = "hyperparameters"  # the kind whose keys are flattened without a prefix
MAX_BYTES = 64 * 1024  # one report, serialized (apps.telemetry.ingest refuses more)
MAX_STORED_BYTES = 256 * 1024  # a run's params, all reports merged
MAX_KINDS = 16
# An arm's parameters are those on which its newest finished runs agree.
ARM_RUNS = 200
_MISSING = object()


def params_json(params: Mapping) -> str:
    return json.dumps(params, separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def params_size(params: Mapping) -> int:
    """Bytes serialized (UTF-8)."""
    return len(params_json(params).encode())


def params_merged(stored: Mapping | None, reports: Iterable[Mapping]) -> tuple[dict, bool]:
    """`stored` with the `reports` ({kind: {key: value}}) applied in order: a key reported again
    replaces the value (a nested dict whole). Returns (merged, complete): complete is False where
    a report was left out because the run's params would pass MAX_STORED_BYTES or MAX_KINDS."""
    merged = {kind: dict(values) for kind, values in (stored or {}).items()}
    complete = True
    for report in reports:
        candidate = {kind: dict(values) for kind, values in merged.items()}
        for kind, values in report.items():
            candidate.setdefault(kind, {}).update(values)
        if len(candidate) > MAX_KINDS or params_size(candidate) > MAX_STORED_BYTES:
            complete = False
            continue
        merged = candidate
    return merged, complete


def run_params_merge(*, run_id: int, samples: list[dict], fresh: Iterable[int]) -> bool:
    """Merge into the run's params the reports of the samples just stored (seqs `fresh`), in seq
    order; a repeated batch merges nothing again. The caller holds the run's row lock. Returns
    whether the params changed. A report past what a run keeps (MAX_STORED_BYTES, MAX_KINDS) is
    left out, and logged."""
    carrying = [s for s in samples if s.get("params")]
    if not carrying:  # the usual batch
        return False
    new = set(fresh)
    reports = [s["params"] for s in sorted(carrying, key=lambda s: s["seq"]) if s["seq"] in new]
    if not reports:
        return False
    stored = Run.objects.filter(pk=run_id).values_list("params", flat=True).first()
    merged, complete = params_merged(stored, reports)
    if not complete:
        logger.warning(
            "run %s: a params report was left out: the run's params would pass %s bytes or %s "
            "kinds",
            run_id,
            MAX_STORED_BYTES,
            MAX_KINDS,
        )
    if merged == stored:
        return False
    Run.objects.filter(pk=run_id).update(params=merged)
    return True


def params_flat(params: Mapping | None) -> dict[str, Any]:
    """{dotted key: value}: nested dicts opened, lists kept whole, hyperparameters' keys bare."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and value:
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        else:
            out[prefix] = value

    for kind, values in (params or {}).items():
        if isinstance(values, Mapping) and values:
            walk("" if kind == HYPERPARAMETERS else kind, values)
        else:
            out[kind] = values
    return dict(sorted(out.items()))


def params_diff(this: Mapping[str, Any], other: Mapping[str, Any]) -> list[dict]:
    """Flattened params compared: per key that differs {key, this, other}, and for a key only one
    side has, `only` ('this' or 'other') with the missing side null. Sorted by key."""
    out = []
    for key in sorted(set(this) | set(other)):
        a, b = this.get(key, _MISSING), other.get(key, _MISSING)
        if a is _MISSING:
            out.append({"key": key, "this": None, "other": b, "only": "other"})
        elif b is _MISSING:
            out.append({"key": key, "this": a, "other": None, "only": "this"})
        elif not _same(a, b):
            out.append({"key": key, "this": a, "other": b})
    return out


def _same(a: Any, b: Any) -> bool:
    # 1 and 1.0 are the same learning rate; True and 1 are not the same setting.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def params_agreed(runs: Iterable[Mapping | None]) -> tuple[dict[str, Any], list[str], int]:
    """The flattened keys on which every run that reported params agrees (a run that reported
    none is left out), the keys on which they differ (or that some lack), and how many runs
    reported params."""
    flats = [params_flat(p) for p in runs if p]
    if not flats:
        return {}, [], 0
    keys = set().union(*flats)
    agreed, varying = {}, []
    for key in sorted(keys):
        first = flats[0].get(key, _MISSING)
        if first is not _MISSING and all(_same(f.get(key, _MISSING), first) for f in flats[1:]):
            agreed[key] = first
        else:
            varying.append(key)
    return agreed, varying, len(flats)


def arm_params(arm: Arm, *, runs: int = ARM_RUNS) -> dict:
    """An arm's parameters: those on which its newest `runs` succeeded runs agree. One query."""
    reported = (
        Run.objects.filter(arm=arm, status=Run.Status.SUCCEEDED)
        .exclude(params={})
        .order_by("-finished_at", "-pk")
        .values_list("params", flat=True)[:runs]
    )
    agreed, varying, counted = params_agreed(reported)
    return {"params": agreed, "varying": varying, "runs": counted}


def arm_find(arms: QuerySet[Arm], ref: str) -> Arm | None:
    """The arm named `ref`, or whose id it is (a name wins: an arm may be called "2")."""
    ref = ref.strip()
    found = arms.filter(name=ref).first()
    if found is None and ref.isascii() and ref.isdigit() and len(ref) <= 18:
        found = arms.filter(pk=int(ref)).first()
    return found
