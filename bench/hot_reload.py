"""Hot reload latency: from an arm's live-key change being committed to a running run applying it.

Two real Celery workers train side by side on the same Postgres and Redis, one woken by
Redis pub/sub (push), one polling the database every second (COSTLAB_PUSH_NOTIFICATIONS=false).
Changes alternate between their two arms, round by round; the applied instant is stamped by
the worker when the trainer takes the change at a step boundary.

    python bench/hot_reload.py [--quick] [--smoke] [--json]      (target: push p99 <= 1 s)

Redis: REDIS_URL (default redis://127.0.0.1:6379/14), the workers' broker and pub/sub too.
`--smoke`: two rounds, on a database of its own (`_hot_reload_smoke`), with workers that profile
their device as the test suite's do (when the run starts, in half a second): the same code path and
JSON keys in seconds, to check that the benchmark runs (tests/bench); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime

from _setup import ROOT, django_on_postgres

STRATEGY = """\
model: {preset: tiny, seq_len: 16}
data: {source: synthetic}
train: {steps: 1000000, global_batch: 1}
telemetry: {interval_s: 0.50}
"""


def start_worker(name: str, push: bool) -> subprocess.Popen:
    # One thread each: two trainings share this machine's cores and must not fight over them.
    env = dict(
        os.environ,
        COSTLAB_PUSH_NOTIFICATIONS="true" if push else "false",
        DJANGO_LOG_LEVEL="WARNING",
        OMP_NUM_THREADS="1",
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config.celery_app",
            "worker",
            "--pool",
            "solo",
            "--queues",
            "cpu",
            "--hostname",
            f"{name}@bench",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "WARNING",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def p99(values: list[float]) -> float:
    """Nearest-rank 99th percentile: never beyond the largest value seen."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--smoke", action="store_true", help="two rounds, seconds: checks the code path only"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rounds = 2 if args.smoke else 10 if args.quick else 40
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
    if args.smoke:  # as tests.helpers.start_worker: no second torch process at start, 0.5 s
        os.environ.setdefault("COSTLAB_DEVICE_PROFILE_AT_START", "false")
        os.environ.setdefault("COSTLAB_DEVICE_PROFILE_BUDGET_S", "0.5")
    django_on_postgres(smoke=args.smoke)
    from django.utils import timezone

    from apps.demo.services import demo_seed
    from apps.experiments.models import Arm, Experiment, Run
    from apps.experiments.services import arm_update, run_submit

    tenant = demo_seed(admin_username="bench-admin").tenant
    tenant.max_concurrent_runs = 100
    tenant.save()
    cost_model = tenant.cost_models.first()
    arms = {}
    for mode in ("push", "poll"):
        exp, _ = Experiment.objects.get_or_create(
            tenant=tenant,
            name=f"bench hot reload {mode}",
            defaults={"cost_model": cost_model, "status": "active"},
        )
        Run.objects.filter(experiment=exp).delete()
        exp.arms.all().delete()
        arms[mode] = Arm.objects.create(
            experiment=exp, name="arm", is_control=True, strategy_yaml=STRATEGY
        )
    workers = {"push": start_worker("push", True), "poll": start_worker("poll", False)}
    runs = {}
    try:
        for mode in ("push", "poll"):
            runs[mode] = run_submit(experiment=arms[mode].experiment)

        def training() -> int:
            return Run.objects.filter(
                pk__in=[r.pk for r in runs.values()], status="running", steps__gt=0
            ).count()

        deadline = time.monotonic() + 120
        while training() < 2:
            if time.monotonic() > deadline:
                # Most likely another consumer on this broker's cpu queue took the messages.
                raise SystemExit(
                    f"hot_reload: {training()} of the 2 runs training after 120 s; is another "
                    "worker consuming the queues of this REDIS_URL's db?"
                )
            time.sleep(0.2)
        # Which worker holds which run does not matter for a fair comparison only if push/poll
        # match: each run is driven by whichever worker took it, so label by the worker's pid.
        pids = {str(p.pid): m for m, p in workers.items()}
        holder = {
            m: pids.get(Run.objects.get(pk=r.pk).lease_owner.split(":")[1], "?")
            for m, r in runs.items()
        }
        latencies: dict[str, list[float]] = {"push": [], "poll": []}
        for r in range(rounds):
            for mode in ("push", "poll") if r % 2 == 0 else ("poll", "push"):
                arm = Arm.objects.get(pk=arms[mode].pk)
                interval = "0.50" if arm.revision % 2 == 0 else "0.40"
                update = arm_update(arm=arm, strategy_yaml=STRATEGY.replace("0.50", interval))
                committed = timezone.now()
                target = update.arm.revision
                end = time.monotonic() + 10
                while time.monotonic() < end:
                    run = Run.objects.get(pk=runs[mode].pk)
                    if run.config_revision >= target:
                        applied = datetime.fromisoformat(run.config_history[-1]["applied_at"])
                        latencies[holder[mode]].append((applied - committed).total_seconds())
                        break
                    time.sleep(0.01)
    finally:
        ids = [r.pk for r in runs.values()]
        Run.objects.filter(pk__in=ids).update(cancel_requested=True)
        end = time.monotonic() + 2  # the cancel is taken at a step boundary; SIGTERM after
        while time.monotonic() < end and Run.objects.filter(pk__in=ids, status="running").exists():
            time.sleep(0.1)
        for proc in workers.values():  # both told first: each takes seconds to shut down
            proc.terminate()
        for proc in workers.values():
            proc.wait(30)
    summary = {
        m: {"p50_s": statistics.median(v), "p99_s": p99(v), "max_s": max(v), "n": len(v)}
        for m, v in latencies.items()
        if v
    }
    print(f"{'path':<26}{'p50 s':>10}{'p99 s':>10}{'max s':>10}{'n':>6}")
    for mode, label in (("push", "Redis pub/sub (push)"), ("poll", "database polling, 1 s")):
        if mode in summary:
            s = summary[mode]
            print(
                f"{label:<26}{s['p50_s']:>10.3f}{s['p99_s']:>10.3f}{s['max_s']:>10.3f}{s['n']:>6}"
            )
    if "push" in summary and "poll" in summary:
        print(
            f"ratio push/poll p99: {summary['push']['p99_s'] / summary['poll']['p99_s']:.3f} "
            f"({rounds} interleaved rounds; target: push p99 <= 1 s)"
        )
    if args.json:
        out = {"p99_s": round(summary.get("push", {}).get("p99_s", float("nan")), 4)}
        for mode, s in summary.items():
            out.update(
                {f"{mode}_{k}": round(v, 4) if isinstance(v, float) else v for k, v in s.items()}
            )
        print(json.dumps(out))


if __name__ == "__main__":
    main()
