"""Validation of incoming telemetry and the idempotent insert by (run, seq).

Postgres: a batch whose seqs all lie beyond the run's highest stored seq (the usual case:
a sink appends) is COPied straight into the table inside a savepoint; the unique index on
(run, seq, ts) still guards it, and should it fire, the savepoint is rolled back and the batch
takes the general path. That path (a retry, a late or overlapping batch) COPies into a
temporary staging table, then inserts the rows whose seq is not stored yet (looked for inside
the run's stored span, so only its days' partitions are read; the caller holds the run's row
lock, so no other batch of the run inserts meanwhile). Elsewhere: the stored seqs are read,
then bulk_create. Either way a batch sent twice, or out of order, leaves the stored set as if
each sample had arrived once.
"""

from __future__ import annotations

import itertools
import operator
import re
import sys
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal, NotRequired

from django.db import IntegrityError, connection, models, transaction
from pydantic import (
    AfterValidator,
    AwareDatetime,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    with_config,
)
from typing_extensions import TypedDict  # pydantic needs this TypedDict before Python 3.12

from apps.core.db import copy_rows, is_postgres
from apps.core.exceptions import ApplicationError
from apps.experiments.params import MAX_BYTES, MAX_KINDS, params_json
from apps.telemetry.models import TelemetrySample

MAX_BATCH = 10_000

# Columns written, in COPY order (run_id and attempt are per batch).
COLUMNS = (
    "seq",
    "ts",
    "step",
    "rank",
    "device",
    "util_pct",
    "mem_used_mb",
    "mem_total_mb",
    "power_w",
    "energy_j",
    "step_time_s",
    "tokens",
    "tokens_per_s",
    "micro_batch",
    "loss",
    "overlap_ratio",
    "mfu",
    "sm_clock_mhz",
    "temperature_c",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "dram_bw_pct",
    "estimated",
)


# Bounds: what the column holds (bigint, integer) and what a physical reading can be. A
# number past them is a unit or encoding error upstream, and would overflow a bill.
INT32 = 2**31 - 1
Count = Annotated[int, Field(strict=True, ge=0, le=2**62)]  # strict: true is not 1, "5" not 5
Reading = Annotated[float | None, Field(strict=True, default=None, ge=0, le=1e9)]
Percent = Annotated[float | None, Field(strict=True, default=None, ge=0, le=100)]
NoNul = r"^[^\x00]*$"  # Postgres text cannot hold NUL


@with_config(ConfigDict(extra="forbid", allow_inf_nan=False))
class QualityIn(TypedDict):
    """A named held-out metric: its value and which way is better (no default: a metric whose
    direction is not said cannot be compared)."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    value: Annotated[float, Field(strict=True, ge=-1e30, le=1e30)]
    direction: Literal["lower", "higher"]


# Training metrics on a sample (apps.telemetry.metrics): {name: value}, a few dozen at most.
MAX_METRICS = 64
METRIC_NAME = r"^[A-Za-z0-9_./-]+$"  # loss, grad_norm, eval_accuracy, train/loss
MetricName = Annotated[str, Field(min_length=1, max_length=64, pattern=METRIC_NAME)]
MetricValue = Annotated[float, Field(strict=True, ge=-1e30, le=1e30)]
ParamsKind = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]


# A NUL as JSON escapes it (not "\\u0000" written out: an escaped backslash, then "u0000").
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _params_checked(params: dict | None) -> dict | None:
    """Reported parameters that JSON (and Postgres's jsonb) holds, at most MAX_BYTES serialized."""
    if params is None:
        return None
    if len(params) > MAX_KINDS:
        raise ValueError(f"at most {MAX_KINDS} kinds, got {len(params)}")
    try:
        text = params_json(params)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if len(text.encode()) > MAX_BYTES:
        raise ValueError(f"{len(text.encode())} bytes serialized, at most {MAX_BYTES}")
    if _NUL.search(text):
        raise ValueError("a string holds NUL, which the database cannot store")
    return params


@with_config(ConfigDict(extra="forbid", allow_inf_nan=False))
class SampleIn(TypedDict):
    """One sample as gpu_runtime's sink emits it (and as external runs send it).

    A TypedDict, not a model: pydantic-core validates a batch into plain dicts about three
    times faster than into model instances, and every field comes out (defaults filled in),
    in the shape ``_ROW`` reads. Unknown fields are refused: a typo (``power`` for
    ``power_w``) would otherwise bill nothing, silently.
    """

    seq: Count
    # Unix seconds, or ISO 8601 with a zone ("Z" or an offset): pydantic-core parses both, no Python
    # hop.
    ts: AwareDatetime
    step: NotRequired[Annotated[Count, Field(default=0)]]
    rank: NotRequired[Annotated[int, Field(strict=True, default=0, ge=0, le=65535)]]
    device: NotRequired[Annotated[str, Field(default="", max_length=120, pattern=NoNul)]]
    util_pct: NotRequired[Percent]
    mem_used_mb: NotRequired[Reading]
    mem_total_mb: NotRequired[Reading]
    power_w: NotRequired[
        Annotated[float | None, Field(strict=True, default=None, ge=0, le=1e7)]
    ]  # 10 MW
    energy_j: NotRequired[
        Annotated[float | None, Field(strict=True, default=None, ge=0, le=1e15)]
    ]  # 280 GWh
    step_time_s: NotRequired[
        Annotated[float | None, Field(strict=True, default=None, ge=0, le=1e7)]
    ]
    tokens: NotRequired[Annotated[Count, Field(default=0)]]
    tokens_per_s: NotRequired[
        Annotated[float | None, Field(strict=True, default=None, ge=0, le=1e13)]
    ]
    micro_batch: NotRequired[
        Annotated[int | None, Field(strict=True, default=None, ge=0, le=INT32)]
    ]
    loss: NotRequired[Annotated[float | None, Field(strict=True, default=None, ge=-1e30, le=1e30)]]
    overlap_ratio: NotRequired[
        Annotated[float | None, Field(strict=True, default=None, ge=0, le=1)]
    ]
    mfu: NotRequired[Annotated[float | None, Field(strict=True, default=None, ge=0, le=10)]]
    sm_clock_mhz: NotRequired[
        Annotated[float | None, Field(strict=True, default=None, ge=0, le=1e6)]
    ]
    temperature_c: NotRequired[
        Annotated[float | None, Field(strict=True, default=None, ge=-273.15, le=1e4)]
    ]
    # NVML GPM metrics (Hopper and later), each a percentage; absent elsewhere.
    sm_occupancy_pct: NotRequired[Percent]
    tensor_active_pct: NotRequired[Percent]
    dram_bw_pct: NotRequired[Percent]
    estimated: NotRequired[Annotated[bool, Field(strict=True, default=False)]]
    # A held-out evaluation taken at this sample's step and tokens (apps.telemetry.evaluations):
    # the loss, and/or a named metric with its direction; eval_s the seconds it took.
    eval_loss: NotRequired[Annotated[float | None, Field(strict=True, default=None, ge=0, le=1e6)]]
    eval_s: NotRequired[Annotated[float | None, Field(strict=True, default=None, ge=0, le=1e7)]]
    quality: NotRequired[QualityIn | None]
    # Training metrics taken at this sample's step and tokens, or at `metrics_step` where the
    # training named another step (apps.telemetry.metrics); shown, never billed.
    metrics: NotRequired[
        Annotated[dict[MetricName, MetricValue] | None, Field(default=None, max_length=MAX_METRICS)]
    ]
    metrics_step: NotRequired[Annotated[Count | None, Field(default=None)]]
    # Parameters by kind ({"hyperparameters": {...}}), merged into Run.params on arrival.
    params: NotRequired[
        Annotated[
            dict[ParamsKind, dict[str, Any]] | None,
            Field(default=None),
            AfterValidator(_params_checked),
        ]
    ]
    # The sampler that took it (the SDK's id, one per process and rank): a run takes one sampler
    # per rank, a second is refused (apps.telemetry.streams). Not stored on the sample.
    stream: NotRequired[
        Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    ]
    # The sender says its cumulative counters (tokens, step, energy_j) restarted from 0 at this
    # sample (a process restarted inside one attempt); not stored.
    counter_reset: NotRequired[Annotated[bool, Field(strict=True, default=False)]]


_ROW = operator.itemgetter(*COLUMNS)  # one C call per sample, in COPY column order
_BATCH = TypeAdapter(list[SampleIn])
_BILLED_NAMES = ("util_pct", "power_w", "energy_j")  # the readings the bill computes with
_BILLED = operator.itemgetter(*_BILLED_NAMES)
_TINY = sys.float_info.min  # the smallest normal float


def _invalid(where: str, reason: str) -> ApplicationError:
    return ApplicationError(f"{where}: {reason}", {"fields": {where: [reason]}}, code="invalid")


def samples_validate(
    samples: list,
    *,
    earliest: datetime | None = None,
    latest: datetime | None = None,
    refused: list[dict] | None = None,
    after_latest: str = "ahead of the server's clock",
    before_earliest: str = "before the run started",
) -> list[SampleIn]:
    """Every sample valid, or an error naming the sample index and field; nothing partial.

    earliest/latest: the window a timestamp must fall in (the run's start and now, or its
    declared end, give or take the clock skew; `after_latest` and `before_earliest` say which
    end in a refusal); a
    sample from another year would bill a fortune. With `refused`
    given, a sample outside the window is refused alone: left out, and described there
    ({index, seq, field, reason}) for the client to correct and resend; the rest go on.
    """
    if not isinstance(samples, list):
        raise ApplicationError("samples: expected a list of sample objects", code="invalid")
    if len(samples) > MAX_BATCH:
        raise ApplicationError(
            f"samples: at most {MAX_BATCH} per batch, got {len(samples)}", code="invalid"
        )
    try:
        parsed = _BATCH.validate_python(samples)  # one call into pydantic-core for the whole batch
    except ValidationError as exc:
        err = exc.errors()[0]
        index, *path = err["loc"]
        where = f"samples[{index}]" + "".join(f".{p}" for p in path)
        raise _invalid(where, err["msg"]) from None
    if parsed and earliest is not None and latest is not None:
        first, last = min(s["ts"] for s in parsed), max(s["ts"] for s in parsed)
        if first < earliest or last > latest:
            outside = [i for i, s in enumerate(parsed) if not earliest <= s["ts"] <= latest]

            def why(i: int) -> str:
                ts = parsed[i]["ts"]
                side = after_latest if ts > latest else before_earliest
                return (
                    f"{ts.isoformat()} is outside the run's time window {earliest.isoformat()} .. "
                    f"{latest.isoformat()} ({side}; clock skew allowed)"
                )

            if refused is None:
                raise _invalid(f"samples[{outside[0]}].ts", why(outside[0]))
            refused.extend(
                {"index": i, "seq": parsed[i]["seq"], "field": f"samples[{i}].ts", "reason": why(i)}
                for i in outside
            )
            skip = set(outside)
            parsed = [s for i, s in enumerate(parsed) if i not in skip]
    # Subnormal floats (5e-324) store, but Postgres arithmetic on them underflows: the billed
    # readings must not hold one. A C-speed scan of three fields (about 0.4 ms per 1000 samples).
    if any(0.0 < v < _TINY for sample in parsed for v in _BILLED(sample) if v):
        i, name = next(
            (i, n)
            for i, s in enumerate(parsed)
            for n, v in zip(_BILLED_NAMES, _BILLED(s), strict=True)
            if v and 0.0 < v < _TINY
        )
        raise _invalid(
            f"samples[{i}].{name}",
            f"{parsed[i][name]!r} is too close to zero to compute with (send 0)",
        )
    # A seq twice in one batch is the same sample sent twice: keep the first.
    unique = {}
    for sample in parsed:
        unique.setdefault(sample["seq"], sample)
    return list(unique.values())


COUNTERS = ("tokens", "step", "energy_j")  # cumulative within an attempt


def counters_refuse_decreasing(
    parsed: list[SampleIn],
    *,
    before: Mapping | None,
    sent: list,
    refused: list[dict],
) -> list[SampleIn]:
    """The batch without the samples whose cumulative counter (tokens, step, energy_j) is lower
    than the sample before it in its stream (rank), each refused alone naming the field, unless
    it says ``counter_reset: true``. `before`: the stored sample just before the batch in the
    same attempt (rank 0), if any; `sent`: the batch as sent (a refusal names its index)."""
    prev: dict[int, Mapping] = {} if before is None else {0: before}
    kept = []
    for sample in sorted(parsed, key=operator.itemgetter("seq")):
        rank = sample["rank"]
        last = prev.get(rank)
        if last is not None and not sample["counter_reset"]:
            name = next(
                (
                    n
                    for n in COUNTERS
                    if sample[n] is not None and last[n] is not None and sample[n] < last[n]
                ),
                None,
            )
            if name is not None:
                i = next(i for i, s in enumerate(sent) if s.get("seq") == sample["seq"])
                refused.append(
                    {
                        "index": i,
                        "seq": sample["seq"],
                        "field": f"samples[{i}].{name}",
                        "reason": f"{name} {sample[name]!r} is below {last[name]!r} at seq "
                        f"{last['seq']} in the same attempt: a cumulative counter never "
                        "decreases (send counter_reset: true if it restarted)",
                    }
                )
                continue
        prev[rank] = sample
        kept.append(sample)
    return kept


def samples_insert(
    *,
    run_id: int,
    attempt: int,
    samples: list[SampleIn],
    after_seq: int | None = None,
    stored: tuple[datetime, datetime] | None = None,
) -> list[int]:
    """Insert, ignoring (run, seq) already stored. Returns the seqs that were new. The caller
    holds the run's row lock.

    `after_seq`: the run's highest stored seq. A batch entirely beyond it cannot conflict, so it
    skips the staging table. `stored`: the span of the run's stored samples (Run.samples_from ..
    samples_to; None: nothing stored), where a stored seq is looked for.
    """
    if not samples:
        return []
    if is_postgres():  # COPY through a staging table
        if after_seq is not None and min(s["seq"] for s in samples) > after_seq:
            try:
                with (
                    transaction.atomic()
                ):  # a savepoint: a wrong guess costs a rollback, not the batch
                    return _copy_direct(run_id=run_id, attempt=attempt, samples=samples)
            except IntegrityError:
                pass  # a row stored without moving the watermark: the general path sorts it out
        return _insert_copy(run_id=run_id, attempt=attempt, samples=samples, stored=stored)
    seqs = [s["seq"] for s in samples]
    taken = set(
        TelemetrySample.objects.filter(run_id=run_id, seq__in=seqs).values_list("seq", flat=True)
    )
    new = [s for s in samples if s["seq"] not in taken]
    TelemetrySample.objects.bulk_create(
        [
            TelemetrySample(
                run_id=run_id, attempt=attempt, **dict(zip(COLUMNS, _ROW(s), strict=True))
            )
            for s in new
        ],
        batch_size=1000,
    )
    return [s["seq"] for s in new]


def out_of_range(samples: list) -> ApplicationError:
    """The error for a batch Postgres refused as out of range (a number it cannot store or compute
    with)."""
    return _invalid("samples", "a number is out of the range the database stores or computes with")


def _copy_direct(*, run_id: int, attempt: int, samples: list[SampleIn]) -> list[int]:
    with connection.cursor() as cursor:
        copy_rows(
            cursor,
            f"{TelemetrySample._meta.db_table} (run_id, attempt, {', '.join(COLUMNS)})",
            ((run_id, attempt, *_ROW(s)) for s in samples),
        )
    return [s["seq"] for s in samples]


def _insert_copy(
    *, run_id: int, attempt: int, samples: list[SampleIn], stored: tuple[datetime, datetime] | None
) -> list[int]:
    table = TelemetrySample._meta.db_table
    cols = ", ".join(COLUMNS)
    with connection.cursor() as cursor:
        # Same column types as the real table, none of its constraints. Created once per
        # connection and emptied at every commit, so a batch pays for no catalog changes.
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS telemetry_staging ON COMMIT DELETE ROWS AS "
            f"SELECT {cols} FROM {table} WITH NO DATA"
        )
        copy_rows(cursor, f"telemetry_staging ({cols})", map(_ROW, samples))
        # A seq stored under another ts would not hit the (run, seq, ts) index: it is looked for.
        unseen, params = "", [run_id, attempt]
        if stored is not None:
            unseen = (
                f"WHERE NOT EXISTS (SELECT 1 FROM {table} t WHERE t.run_id = %s AND "
                "t.seq = st.seq AND t.ts >= %s AND t.ts <= %s) "
            )
            params += [run_id, *stored]
        cursor.execute(
            f"INSERT INTO {table} (run_id, attempt, {cols}) "
            f"SELECT %s, %s, {cols} FROM telemetry_staging st {unseen}"
            "ON CONFLICT DO NOTHING RETURNING seq",
            params,
        )
        inserted = [row[0] for row in cursor.fetchall()]
        # Several batches in one transaction must not see each other's rows. DELETE, not
        # TRUNCATE: no new relation file; the commit empties the table cheaply anyway.
        cursor.execute("DELETE FROM telemetry_staging")
    return inserted


def run_spans_refresh(run_ids: list[int]) -> int:
    """Each run's stored span (Run.samples_from .. samples_to) read again from its samples, for
    rows written around samples_insert (a migration, a bench's bulk load, a test's fixtures).
    Unpruned: one pass over the runs' rows in every partition. Returns the runs updated."""
    from django.db.models import Max, Min, OuterRef, Subquery

    from apps.experiments.models import Run

    of_run = TelemetrySample.objects.filter(run=OuterRef("pk")).values("run")
    return Run.objects.filter(pk__in=run_ids).update(
        samples_from=Subquery(of_run.annotate(v=Min("ts")).values("v")),
        samples_to=Subquery(of_run.annotate(v=Max("ts")).values("v")),
    )


def _shift(times: list, fixed: list) -> float:
    """Seconds moved in all from `times` to `fixed`."""
    return sum(abs(a - b).total_seconds() for a, b in zip(times, fixed, strict=True))


def clocks_clamp(*, run, samples: list[SampleIn], attempt: int, appended: bool) -> tuple[int, int]:
    """Order within a run is by seq: a sample whose time disagrees with the samples around it (a
    clock that jumped forward and back, or back and forward) is moved to agree, in its rank's
    stream and attempt, whether it is in this batch or stored. Of the two ways to make the times
    follow seq, each later time at least the one before (pulling early stamps up) or each earlier
    time at most the one after (pulling late stamps down), the one that moves less time in all is
    taken: one sample stamped 25 s ahead is pulled back, not the 25 after it pushed forward; one
    stamped a minute behind is pulled up. A true batch is then never refused because of an
    earlier stamp, and the wall time billed is the stream's true span.

    Returns (new samples moved, stored samples moved); stored ones are updated here (the caller
    then bills the run again from its samples). Stored rows are read only where they can be
    involved: a batch appended at or after every stored time reads none."""
    stored: list[dict] = []
    if samples and run.samples_from is not None and run.raw_dropped_before is None:
        low, high = min(s["ts"] for s in samples), max(s["ts"] for s in samples)
        if not (appended and low >= run.samples_to):
            lo_seq, hi_seq = min(s["seq"] for s in samples), max(s["seq"] for s in samples)
            stored = list(
                TelemetrySample.objects.of_run(run)
                .filter(attempt=attempt, rank__in={s["rank"] for s in samples})
                .filter(
                    models.Q(seq__lt=hi_seq, ts__gt=low) | models.Q(seq__gt=lo_seq, ts__lt=high)
                )
                .values("pk", "seq", "ts", "rank")
            )
    batch_seqs = {s["seq"] for s in samples}
    streams: dict[int, list[tuple[dict, bool]]] = {}
    for row, is_stored in [(s, False) for s in samples] + [
        (r, True) for r in stored if r["seq"] not in batch_seqs
    ]:
        streams.setdefault(row["rank"], []).append((row, is_stored))
    moved_new, moved_stored = 0, []
    for rows in streams.values():
        rows.sort(key=lambda x: x[0]["seq"])
        times = [row["ts"] for row, _ in rows]
        up = list(itertools.accumulate(times, max))  # each at least the one before
        down = list(itertools.accumulate(reversed(times), min))[::-1]  # at most the one after
        if up == times:
            continue

        fixed = down if _shift(times, down) <= _shift(times, up) else up
        for (row, is_stored), before, after in zip(rows, times, fixed, strict=True):
            if after == before:
                continue
            if is_stored:
                moved_stored.append((row["pk"], after))
            else:
                row["ts"] = after
                moved_new += 1
    for pk, ts in moved_stored:
        TelemetrySample.objects.filter(pk=pk, run_id=run.pk).update(ts=ts)
    return moved_new, len(moved_stored)
