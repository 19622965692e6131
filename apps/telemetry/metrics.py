"""Training metrics: stored from the telemetry samples that carry them, read per run.

A sample may carry `metrics` ({name: value}: loss, grad_norm, learning_rate, eval_accuracy ...,
what costlab.Run.log_metrics reports) and `metrics_step`, the step they were taken at where the
training named one other than the sample's. Each becomes one RunMetric, stored once per
(run, seq, name) with that step and the sample's cumulative tokens and time: a batch sent twice
stores nothing twice. Read back as a summary per name (the run's API answer) and as series by step,
downsampled in SQL (the run's chart, GET runs/{id}/metrics/?name=).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connection
from django.db.models import (
    Avg,
    BigIntegerField,
    Case,
    Count,
    F,
    Max,
    Min,
    Value,
    When,
)

from apps.telemetry.models import RunMetric

SERIES_POINTS = 2000  # the API's series: at most this many points


def metrics_of_samples(run_id: int, samples: Iterable[dict]) -> list[RunMetric]:
    """The training metrics the samples carry (validated ones: apps.telemetry.ingest.SampleIn)."""
    out = []
    for s in samples:
        metrics = s.get("metrics")
        if not metrics:
            continue
        step = s.get("metrics_step")
        where = {
            "run_id": run_id,
            "seq": s["seq"],
            "ts": s["ts"],
            "step": s["step"] if step is None else step,
            "tokens": s["tokens"],
        }
        out.extend(RunMetric(name=name, value=value, **where) for name, value in metrics.items())
    return out


def metrics_insert(*, run_id: int, samples: list[dict], fresh: Iterable[int]) -> int:
    """Store the metrics of the samples just stored (seqs `fresh`); a repeat stores nothing.
    Returns how many were new to this call (an upper bound where a repeat raced it)."""
    carrying = [s for s in samples if s.get("metrics")]
    if not carrying:  # the usual batch: no metrics, nothing more to look at
        return 0
    new = set(fresh)
    rows = metrics_of_samples(run_id, (s for s in carrying if s["seq"] in new))
    if rows:
        RunMetric.objects.bulk_create(rows, batch_size=1000, ignore_conflicts=True)
    return len(rows)


def run_metric_summary(*, run_id: int) -> dict[str, dict]:
    """Per metric name: how many values, the first and last step, and the last value (the one at
    the highest step, the later report at a tie). {} without any. One query: the names' figures
    grouped first, then each name's last value looked up once, in the (run, name, step) index
    (the ORM would group by that lookup too, running it once per row)."""
    table = connection.ops.quote_name(RunMetric._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT g.name, g.n, g.first_step, g.last_step, "
            f"(SELECT m.value FROM {table} m WHERE m.run_id = %s AND m.name = g.name "
            "ORDER BY m.step DESC, m.seq DESC LIMIT 1) "
            f"FROM (SELECT name, COUNT(*) AS n, MIN(step) AS first_step, MAX(step) AS last_step "
            f"FROM {table} WHERE run_id = %s GROUP BY name) g ORDER BY g.name",
            [run_id, run_id],
        )
        rows = cursor.fetchall()
    return {
        name: {"count": n, "first_step": first, "step": step, "last": value}
        for name, n, first, step, value in rows
    }


@dataclass(frozen=True)
class Series:
    """One metric by step: each point a step and its value, or where downsampled a bucket's last
    step with the mean of its values, and their min and max."""

    name: str
    count: int  # values stored
    bucket_steps: int  # steps per bucket; 0: not downsampled, every value is a point
    step: list[int]
    value: list[float]
    lo: list[float] | None  # None: not downsampled (each point is one value)
    hi: list[float] | None

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "count": self.count,
            "downsampled": self.bucket_steps > 0,
            "bucket_steps": self.bucket_steps,
            "step": self.step,
            "value": self.value,
            "min": self.lo,
            "max": self.hi,
        }


def run_metric_series(
    *, run_id: int, names: list[str], points: int = SERIES_POINTS, spans: dict | None = None
) -> dict[str, Series]:
    """The series of the metrics `names`, each at most `points` points: where a metric has more
    values, they are bucketed by step (each metric's buckets equally wide), and each bucket gives
    its last step, mean, min and max, computed in SQL. `spans`: the names' run_metric_summary
    where the caller has it (saves its query). Three queries at most: the spans, the metrics
    sent whole, the metrics bucketed."""
    if not names:
        return {}
    if spans is None:
        spans = {
            n: {"count": c, "first_step": lo, "step": hi}
            for n, c, lo, hi in RunMetric.objects.filter(run_id=run_id, name__in=names)
            .values("name")
            .annotate(c=Count("pk"), lo=Min("step"), hi=Max("step"))
            .values_list("name", "c", "lo", "hi")
        }
    names = [n for n in names if n in spans]
    if not names:
        return {}
    rows = RunMetric.objects.filter(run_id=run_id, name__in=names)
    whole = [n for n in names if spans[n]["count"] <= points]
    bucketed = [n for n in names if spans[n]["count"] > points]
    out: dict[str, Series] = {}
    if whole:
        found: dict[str, tuple[list, list]] = {n: ([], []) for n in whole}
        for name, step, value in (
            rows.filter(name__in=whole)
            .order_by("name", "step", "seq")
            .values_list("name", "step", "value")
        ):
            found[name][0].append(step)
            found[name][1].append(value)
        for name, (steps, values) in found.items():
            out[name] = Series(name, spans[name]["count"], 0, steps, values, None, None)
    if bucketed:
        widths = {}  # steps per bucket, each metric its own: at most `points` buckets
        for n in bucketed:
            span = spans[n]["step"] - spans[n]["first_step"] + 1
            widths[n] = max(1, -(-span // points))
        bucket = Case(
            *(
                When(
                    name=n,
                    then=(F("step") - Value(spans[n]["first_step"])) / Value(widths[n]),
                )
                for n in bucketed
            ),
            output_field=BigIntegerField(),
        )
        found = {n: ([], [], [], []) for n in bucketed}
        for name, _bucket, step, mean, lo, hi in (
            rows.filter(name__in=bucketed)
            .annotate(bucket=bucket)
            .values("name", "bucket")
            .annotate(s=Max("step"), mean=Avg("value"), lo=Min("value"), hi=Max("value"))
            .order_by("name", "bucket")
            .values_list("name", "bucket", "s", "mean", "lo", "hi")
        ):
            for column, v in zip(found[name], (step, mean, lo, hi), strict=True):
                column.append(v)
        for name, (steps, means, los, his) in found.items():
            out[name] = Series(name, spans[name]["count"], widths[name], steps, means, los, his)
    return {n: out[n] for n in names}
