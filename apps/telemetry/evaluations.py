"""Held-out evaluations: stored from the telemetry samples that carry them, read per run.

A sample may carry `eval_loss` (lower is better), a named `quality` metric with its direction,
and `eval_s`; each becomes one RunEvaluation, stored once per (run, seq, metric) with the
sample's step, cumulative tokens and time. The figure an arm is compared on is each finished
run's last evaluation of the experiment's metric (apps.attribution.quality).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.db.models import OuterRef, Subquery

from apps.telemetry.models import RunEvaluation

EVAL_LOSS = "eval_loss"


def evaluations_of_samples(run_id: int, samples: Iterable[dict]) -> list[RunEvaluation]:
    """The evaluations the samples carry (validated ones: apps.telemetry.ingest.SampleIn)."""
    out = []
    for s in samples:
        loss, quality = s.get("eval_loss"), s.get("quality")
        if loss is None and quality is None:
            continue
        where = {
            "run_id": run_id,
            "seq": s["seq"],
            "ts": s["ts"],
            "step": s["step"],
            "tokens": s["tokens"],
            "eval_s": s.get("eval_s"),
        }
        if loss is not None:
            out.append(RunEvaluation(metric=EVAL_LOSS, value=loss, higher_is_better=False, **where))
        if quality is not None and not (quality["name"] == EVAL_LOSS and loss is not None):
            out.append(
                RunEvaluation(
                    metric=quality["name"],
                    value=quality["value"],
                    higher_is_better=quality["direction"] == "higher",
                    **where,
                )
            )
    return out


def evaluations_insert(*, run_id: int, samples: list[dict], fresh: Iterable[int]) -> int:
    """Store the evaluations of the samples just stored (seqs `fresh`); a repeat stores nothing.
    Returns how many were new to this call (an upper bound where a repeat raced it)."""
    new = set(fresh)
    rows = evaluations_of_samples(run_id, (s for s in samples if s["seq"] in new))
    if rows:
        RunEvaluation.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


@dataclass(frozen=True)
class Evaluation:
    run_id: int
    seq: int
    ts: datetime
    step: int
    tokens: int
    value: float
    higher_is_better: bool
    eval_s: float | None


def run_curves(*, run_ids: Iterable[int], metric: str) -> dict[int, list[Evaluation]]:
    """Per run, its evaluations of `metric` in the order they were taken (by seq)."""
    out: dict[int, list[Evaluation]] = {}
    rows = (
        RunEvaluation.objects.filter(run_id__in=list(run_ids), metric=metric)
        .order_by("run_id", "seq")
        .values_list("run_id", "seq", "ts", "step", "tokens", "value", "higher_is_better", "eval_s")
    )
    for row in rows:
        out.setdefault(row[0], []).append(Evaluation(*row))
    return out


def runs_final_value(*, runs, metric: str) -> dict[int, tuple[float, bool]]:
    """Per run of the queryset `runs` that evaluated `metric`: its last value (highest seq) and
    whether higher is better. One query."""
    last = RunEvaluation.objects.filter(run_id=OuterRef("pk"), metric=metric).order_by("-seq")
    rows = (
        runs.annotate(
            q_value=Subquery(last.values("value")[:1]),
            q_higher=Subquery(last.values("higher_is_better")[:1]),
        )
        .filter(q_value__isnull=False)
        .values_list("pk", "q_value", "q_higher")
    )
    return {pk: (value, bool(higher)) for pk, value, higher in rows}
