"""Telemetry ingest throughput: the platform's path vs raw COPY into the same table.

The platform path is what a worker's sink calls: validation, the idempotent insert by
(run, seq) (an appending batch: COPY straight into the table in a savepoint; any other:
COPY into a staging table + INSERT ... ON CONFLICT DO NOTHING), and the incremental cost
update, one transaction per batch. The baseline is a bare COPY of the same samples
straight into the samples table, from the same dicts (the headline `ratio`), and also
with its rows built before the timer starts (the best case, `ratio_vs_prebuilt_rows`).
`late_ratio`: the platform path when every tenth batch is held back and delivered last,
its samples reversed (each such batch lands below the watermark and re-prices the run
around it), against the same raw COPY. Validation (time window, order against seq) and
late-sample pricing are on in both platform paths. All run in one process, interleaved
round by round, on the same Postgres.

    python bench/ingest.py [--quick] [--smoke] [--json]  (targets: ratio >= 0.5, late_ratio >= 0.4)

`--smoke`: one round of two 200-sample batches, a few seconds, on a database of its own
(`_ingest_smoke`): the same code path and JSON keys, to check that the benchmark
runs (tests/bench); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import operator
import random
import time
from datetime import UTC, datetime, timedelta

from _setup import django_on_postgres, spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (under a minute)")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, seconds: checks the code path only"
    )
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument(
        "--batch", type=int, default=None, help="samples per batch (default 2000; --smoke 200)"
    )
    args = parser.parse_args()
    args.batch = args.batch or (200 if args.smoke else 2000)
    rounds, batches = (1, 2) if args.smoke else (5, 10) if args.quick else (15, 10)

    django_on_postgres(smoke=args.smoke)
    from django.db import connection, transaction
    from django.utils import timezone

    from apps.billing.services import telemetry_ingest
    from apps.core.db import copy_rows as db_copy_rows
    from apps.demo.services import demo_seed
    from apps.experiments.models import Run
    from apps.telemetry.ingest import COLUMNS
    from apps.telemetry.models import TelemetrySample

    experiment = demo_seed(admin_username="bench-admin").experiment
    arm = experiment.arms.first()

    def new_run() -> Run:
        run = Run.objects.create(
            tenant=experiment.tenant,
            experiment=experiment,
            arm=arm,
            status=Run.Status.RUNNING,
            attempts=1,
            config_yaml=arm.strategy_yaml,
            config_sha256=arm.strategy_sha256,
            vcpus=2,
        )
        # Created a day ago: the samples below (from 3 h ago) fall inside its time window.
        Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(days=1))
        return run

    def make_batches() -> list[list[dict]]:
        t0, out = time.time() - 3 * 3600, []
        for b in range(batches):
            out.append(
                [
                    {
                        "seq": i,
                        "ts": t0 + i * 0.5,
                        "step": i,
                        "rank": 0,
                        "device": "cuda:0 NVIDIA H100",
                        "util_pct": 90.0,
                        "mem_used_mb": 40_000.0,
                        "mem_total_mb": 81_559.0,
                        "power_w": 650.0,
                        "energy_j": 325.0 * i,
                        "step_time_s": 0.5,
                        "tokens": 4096 * i,
                        "tokens_per_s": 8192.0,
                        "micro_batch": 8,
                        "loss": 2.5,
                        "overlap_ratio": 0.8,
                        "mfu": 0.4,
                        "sm_clock_mhz": 1980.0,
                        "temperature_c": 61.0,
                        "sm_occupancy_pct": 55.0,
                        "tensor_active_pct": 40.0,
                        "dram_bw_pct": 30.0,
                        "estimated": False,
                    }
                    for i in range(b * args.batch, (b + 1) * args.batch)
                ]
            )
        if set(out[0][0]) != set(COLUMNS):  # the raw COPY needs every column, as a sink sends
            raise SystemExit(f"bench samples vs COLUMNS: {sorted(set(out[0][0]) ^ set(COLUMNS))}")
        return out

    def platform(run: Run, data: list[list[dict]]) -> float:
        start = time.perf_counter()
        for batch in data:
            telemetry_ingest(run_id=run.pk, samples=batch, attempt=1)
        return time.perf_counter() - start

    def platform_late(run: Run, data: list[list[dict]]) -> float:
        late = set(range(0, len(data), 10))  # every tenth batch, the first one included
        order = [b for i, b in enumerate(data) if i not in late] + [
            data[i][::-1] for i in sorted(late)
        ]
        start = time.perf_counter()
        for batch in order:
            telemetry_ingest(run_id=run.pk, samples=batch, attempt=1)
        return time.perf_counter() - start

    table, cols = TelemetrySample._meta.db_table, ", ".join(("run_id", "attempt", *COLUMNS))

    def copy_rows(rows: list[tuple]) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            db_copy_rows(cursor, f"{table} ({cols})", rows)

    pick, ts_at = operator.itemgetter(*COLUMNS), COLUMNS.index("ts")

    def to_rows(run: Run, batch: list[dict]) -> list[tuple]:
        # As lean as a COPY client gets in Python: one itemgetter call and one datetime per sample.
        rows = []
        for sample in batch:
            values = list(pick(sample))
            values[ts_at] = datetime.fromtimestamp(values[ts_at], tz=UTC)
            rows.append((run.pk, 1, *values))
        return rows

    def raw_copy(run: Run, data: list[list[dict]]) -> float:
        # From the same sample dicts the platform gets: turning them into rows is part of a COPY.
        start = time.perf_counter()
        for batch in data:
            copy_rows(to_rows(run, batch))
        return time.perf_counter() - start

    def raw_copy_prepared(run: Run, data: list[list[dict]]) -> float:
        # Best case for the baseline: rows already built, only the COPY is timed.
        rows = [to_rows(run, batch) for batch in data]
        start = time.perf_counter()
        for batch in rows:
            copy_rows(batch)
        return time.perf_counter() - start

    paths = {
        "platform": platform,
        "platform_late": platform_late,
        "raw": raw_copy,
        "raw_prepared": raw_copy_prepared,
    }
    rates: dict[str, list[float]] = {name: [] for name in paths}
    ratios: dict[str, list[float]] = {"raw": [], "raw_prepared": [], "late": []}
    n = batches * args.batch
    for r in range(rounds):
        data = make_batches()
        order = list(paths.items())
        random.Random(r).shuffle(order)
        times = {name: fn(new_run(), data) for name, fn in order}
        for name in paths:
            rates[name].append(n / times[name])
        for name in ("raw", "raw_prepared"):
            ratios[name].append(times[name] / times["platform"])
        ratios["late"].append(times["raw"] / times["platform_late"])
    Run.objects.filter(experiment=experiment).delete()

    labels = {
        "platform": "platform ingest",
        "platform_late": "platform, 10 % late+reversed",
        "raw": "raw COPY (from the dicts)",
        "raw_prepared": "raw COPY (rows prebuilt)",
    }
    print(f"{'path':<30}{'samples/s (median)':>20}{'min':>12}{'max':>12}")
    for name, label in labels.items():
        p = spread(rates[name])
        print(f"{label:<30}{p['median']:>20,.0f}{p['min']:>12,.0f}{p['max']:>12,.0f}")
    s, b, late = spread(ratios["raw"]), spread(ratios["raw_prepared"]), spread(ratios["late"])
    print(
        f"ratio platform/raw COPY: {s['median']:.3f} "
        f"(IQR {s['q1']:.3f}-{s['q3']:.3f}, min {s['min']:.3f}, "
        f"max {s['max']:.3f}); against prebuilt rows: {b['median']:.3f} "
        f"(IQR {b['q1']:.3f}-{b['q3']:.3f}); "
        f"{rounds} interleaved rounds of {n} samples; target >= 0.5"
        f"{' (--smoke: the figures mean nothing)' if args.smoke else ''}"
    )
    print(
        f"late_ratio (10 % of batches late and reversed)/raw COPY: {late['median']:.3f} "
        f"(IQR {late['q1']:.3f}-"
        f"{late['q3']:.3f}, min {late['min']:.3f}, max {late['max']:.3f}); target >= 0.4"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "ratio": round(s["median"], 4),
                    "ratio_q1": round(s["q1"], 4),
                    "ratio_q3": round(s["q3"], 4),
                    "ratio_min": round(s["min"], 4),
                    "ratio_max": round(s["max"], 4),
                    "ratio_vs_prebuilt_rows": round(b["median"], 4),
                    "late_ratio": round(late["median"], 4),
                    "late_ratio_q1": round(late["q1"], 4),
                    "late_ratio_q3": round(late["q3"], 4),
                    "rounds": rounds,
                    "samples_per_round": n,
                }
            )
        )


if __name__ == "__main__":
    main()
