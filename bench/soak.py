"""Soak: `make run`'s supervised stack on the embedded default, under steady load, for N minutes.

Starts `manage.py run_local` (what `make run` starts) on SQLite and the embedded Redis in a
temporary COSTLAB_VAR_DIR, with beat's attribution tick every second, then for N minutes
submits short CPU runs (keeping a small backlog queued) and sends an extra tick to the broker
every second. Then it waits for the backlog to drain and reports:

- crashes: stack processes that exited on their own, plus "Unrecoverable error" lines;
- restarts: restarts the supervisor made;
- runs_submitted, runs_succeeded, runs_stuck (still queued or running after the drain);
- double_billed: finished runs billed for more steps than their config asks per attempt,
  or carrying samples of more attempts than they made (trained twice, or counted twice).

Target: all zero, and runs_submitted == runs_succeeded.

    python bench/soak.py [--minutes N] [--quick] [--smoke] [--json]   (--quick: 3 min; default 30)

`--smoke`: one second of load (runs of 4 steps, not 20), then the same drain and report: the same
code path and JSON keys, to check that the benchmark runs (tests/bench); its figures mean nothing.
The stack is this benchmark's own (SQLite and the embedded Redis in a temporary directory): no
shared service. BENCH_SQLITE_TEMPLATE names a migrated SQLite database to start from (tests/bench
passes one): `migrate` then has nothing left to apply, where migrating from scratch takes seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SOAK_STRATEGY = """\
model:     {{family: llama, preset: tiny, seq_len: 32}}
data:      {{source: synthetic, prefetch: 0}}
train:     {{steps: {steps}, global_batch: 2, lr: 3.0e-4, seed: 0}}
precision: {{compute_dtype: fp32}}
telemetry: {{interval_s: 0.5}}
"""
STEPS, SMOKE_STEPS = 20, 4  # steps per run; --smoke: a few steps still trains, measures and bills
BACKLOG = 2  # queued runs kept waiting: the worker never idles, the queue never grows without bound
DRAIN_S = 180


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StackLog:
    """Reads the stack's output in a thread, keeps the counts, and the tail for the report."""

    def __init__(self, stream, path: Path):
        self.crashes = self.restarts = self.unrecoverable = 0
        self.tail: list[str] = []
        self.file = path.open("w")
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.file.write(line)
            if re.search(r": exited with status -?\d+ after", line):
                self.crashes += 1
            if ": restarting in " in line:
                self.restarts += 1
            if "Unrecoverable error" in line:
                self.unrecoverable += 1
            self.tail = (self.tail + [line.rstrip()])[-20:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true", help="3 minutes")
    parser.add_argument(
        "--smoke", action="store_true", help="1 second of load: checks the code path only"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--keep", action="store_true", help="keep the var directory (logs, database)"
    )
    args = parser.parse_args()
    minutes = 1 / 60 if args.smoke else 3.0 if args.quick else args.minutes
    steps = SMOKE_STEPS if args.smoke else STEPS
    strategy = SOAK_STRATEGY.format(steps=steps)

    var_dir = Path(tempfile.mkdtemp(prefix="costlab-soak-"))
    port = free_port()
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND"):
        os.environ.pop(name, None)
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings.local",
        COSTLAB_VAR_DIR=str(var_dir),
        COSTLAB_ATTRIBUTION_TICK_S="1",
        DJANGO_LOG_LEVEL="WARNING",
        OMP_NUM_THREADS="1",
    )
    if args.smoke:  # the training worker's device profile at start: half a second, not two
        os.environ.setdefault("COSTLAB_DEVICE_PROFILE_BUDGET_S", "0.5")
    template = os.environ.pop("BENCH_SQLITE_TEMPLATE", "")
    if template:
        import shutil

        shutil.copyfile(template, var_dir / "costlab.sqlite3")  # config.settings.base's file
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v0"], cwd=ROOT, check=True
    )
    stack = subprocess.Popen(
        [sys.executable, "manage.py", "run_local", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    log = StackLog(stack.stdout, var_dir / "stack.log")

    import django

    django.setup()
    from django.db import connection

    from apps.demo.services import demo_seed
    from apps.experiments.models import Arm, Experiment, Run
    from apps.experiments.services import run_submit, strategy_sha256
    from apps.telemetry.models import TelemetrySample
    from apps.tenants.models import Tenant
    from config.celery_app import app

    deadline = time.monotonic() + 60
    while not (var_dir / "redis" / "redis.sock").exists() or not Arm.objects.exists():
        if time.monotonic() > deadline or stack.poll() is not None:
            sys.exit("soak: the stack did not come up; see " + str(var_dir / "stack.log"))
        time.sleep(0.5)
    seed = demo_seed()
    Tenant.objects.filter(pk=seed.tenant.pk).update(max_concurrent_runs=1000)
    experiment = Experiment.objects.create(
        tenant=seed.tenant,
        name="soak",
        cost_model=seed.experiment.cost_model,
        status=Experiment.Status.ACTIVE,
    )
    for name, control in (("soak-a", True), ("soak-b", False)):
        Arm.objects.create(
            experiment=experiment,
            name=name,
            strategy_yaml=strategy,
            strategy_sha256=strategy_sha256(strategy),
            is_control=control,
        )

    print(
        f"soak: {minutes:g} min on the embedded default in {var_dir} (web :{port}), "
        "beat tick every 1 s"
    )
    submitted, started = 0, time.monotonic()
    next_tick = started
    end = started + minutes * 60
    while time.monotonic() < end:
        if time.monotonic() >= next_tick:
            app.send_task("costlab.attribution_tick", expires=0.9)  # a second producer of ticks
            next_tick += 1.0
        if experiment.runs.filter(status=Run.Status.QUEUED).count() < BACKLOG:
            run_submit(experiment=experiment)
            submitted += 1
        connection.close()
        time.sleep(0.25)

    drain_end = time.monotonic() + DRAIN_S
    while (
        time.monotonic() < drain_end
        and experiment.runs.filter(status__in=Run.ACTIVE_STATUSES).exists()
    ):
        time.sleep(0.25)

    runs = list(experiment.runs.all())
    succeeded = sum(r.status == Run.Status.SUCCEEDED for r in runs)
    stuck = sum(r.status in Run.ACTIVE_STATUSES for r in runs)
    double = 0
    for run in runs:
        if run.status not in (Run.Status.SUCCEEDED, Run.Status.FAILED):
            continue
        attempts_seen = TelemetrySample.objects.filter(run=run).values("attempt").distinct().count()
        if run.steps > steps * max(run.attempts, 1) or attempts_seen > max(run.attempts, 1):
            double += 1

    stack.send_signal(signal.SIGINT)
    try:
        stack.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(stack.pid, signal.SIGKILL)
    log.thread.join(timeout=5)
    report = {
        "minutes": minutes,
        "crashes": log.crashes + log.unrecoverable,
        "restarts": log.restarts,
        "runs_submitted": submitted,
        "runs_succeeded": succeeded,
        "runs_failed": sum(r.status == Run.Status.FAILED for r in runs),
        "runs_stuck": stuck,
        "double_billed": double,
        "stack_exit_status": stack.returncode,
    }
    width = max(len(k) for k in report)
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    ok = (
        report["crashes"]
        == report["restarts"]
        == report["runs_stuck"]
        == report["double_billed"]
        == 0
        and submitted == succeeded
    )
    print(
        "soak: "
        + ("target met" if ok else "TARGET MISSED; stack log: " + str(var_dir / "stack.log"))
    )
    if not ok:
        print("\n".join(log.tail))
    if args.json:
        print(json.dumps(report))
    if not args.keep and ok:
        import shutil

        shutil.rmtree(var_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
