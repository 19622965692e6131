"""Held-out evaluations: stored from the telemetry samples that carry them, read per run.

A sample may carry `eval_loss` (lower is better), a named `quality` metric with its direction,
and `eval_s`; each becomes one RunEvaluation, stored once per (run, seq, metric) with the
sample's step, cumulative tokens and time. The figure an arm is compared on is each finished
run's last evaluation of the experiment's metric (apps.attribution.selectors.quality_runs).
"""

from __future__ import annotations

from collections.abc import Iterable

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


def run_evaluation_summary(*, run_id: int) -> dict | None:
    """A run's held-out evaluations in brief, per metric: how many, the seconds they took (billed
    with the run, reported apart) and the last value with its step and tokens. None without
    any. One query."""
    rows = list(
        RunEvaluation.objects.filter(run_id=run_id)
        .order_by("metric", "seq")
        .values_list("metric", "value", "step", "tokens", "eval_s", "higher_is_better")
    )
    if not rows:
        return None
    out: dict = {}
    for metric, value, step, tokens, eval_s, higher in rows:
        m = out.setdefault(metric, {"evaluations": 0, "eval_s": 0.0})
        m["evaluations"] += 1
        m["eval_s"] += eval_s or 0.0
        m.update(last=value, step=step, tokens=tokens, higher_is_better=higher)
    for m in out.values():
        m["eval_s"] = round(m["eval_s"], 3)
    return out
