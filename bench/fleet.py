"""Fleet telemetry: simulated devices at 1 Hz through the real ingest paths for N minutes, while
attribution, beat's roll-up, telemetry upkeep and dashboard reads run beside them.

    python bench/fleet.py [--quick] [--smoke] [--json] [--minutes N] [--devices N]
    (targets: samples_per_s >= 20,000 with no growing lag, tick_s <= 1, run page <= 1 s,
     <= 20 bytes per settled sample)

On a real Postgres (bench/_setup.py; the samples table range-partitioned by time) and Redis:

- The world: bench/attribution.py's build_world (1,000 experiments x 4 arms x 10 runs, built once
  with bulk_create and kept), and beside it the fleet's own runs in those experiments, one per
  node of RANKS devices (a DDP run, one telemetry stream per rank), so every tick has work.
- Devices: each node sends the samples of its devices every --batch-s seconds (60, a fleet's
  COSTLAB_TELEMETRY_SEND_EVERY_S: a POST's fixed cost is most of its cost at 80 samples, and
  OpenCost scrapes once a minute; --batch-s 10 measures the 10-s cadence; the server runs with
  it and the load checks a run's API answer advises it), one JSON body
  per batch built from readings shaped like NVML's (util and temperature whole numbers, power in
  mW, the energy counter in mJ, cumulative steps and tokens). 3/4 of the nodes POST it to
  /api/v1/runs/<id>/telemetry/ (external runs, each node its own API token) on gunicorn with
  --web-workers sync workers; the rest are worker runs whose sink calls
  apps.billing.services.telemetry_ingest in a process of their own, as workers/training.py's does.
- Beside them, each in a process of its own as Celery would run them: attribution_tick on beat's
  schedule (COSTLAB_ATTRIBUTION_TICK_S), series_blocks_roll_due on its (COSTLAB_SERIES_ROLLUP_S),
  telemetry_upkeep (partitions ahead, stray rows moved, retention) every UPKEEP_S (beat's is
  hourly: more often here, so it runs under load), and a signed-in browser's first view of a run
  page (GET /runs/<id>/ of a run not viewed before) every READ_S.
- A finished run of RETIRED_DAYS ago (past COSTLAB_TELEMETRY_RETENTION_DAYS) lands in the default
  partition first: upkeep moves it into a partition of its own and retention drops that partition.

Measured over the window after a warm-up: accepted samples/s (and per minute, to see a growing
lag), per-POST latency, how far posts and ticks fall behind their schedule (start vs end), tick
and roll-up durations, the run page's first view, the bytes on disk per stored sample (every
partition, indexes and TOAST included), partitions created and dropped, and the CPU share of each
process (the load generator shares the machine with the server). After the load, the fleet's runs
end and compaction packs them: the settled figure is the packed minutes' bytes per sample.

--quick: 3 minutes; --smoke: seconds, a few devices and 10 experiments, on a database of its own
(`_fleet_smoke`): the same code path and JSON keys; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import multiprocessing as mp
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import timedelta
from decimal import Decimal

from _setup import django_on_postgres, spread
from attribution import build_world, reset

FLEET_SHA = "f" * 64  # marks the fleet's runs (and the retired one): removed at the next start
RANKS = 8  # devices per node: one DDP run, one stream per rank
DEVICE = "NVIDIA H100 80GB HBM3"
CYCLE = 60  # readings per device, repeated: the generator renders no number it could precompute
UPKEEP_S, READ_S, RETIRED_DAYS = 60.0, 5.0, 100
TARGETS = {"samples_per_s": 20_000, "tick_s": 1.0, "run_page_first_view_s": 1.0, "bytes": 20}


@dataclass
class Plan:
    devices: int
    batch_s: float
    minutes: float
    warmup_s: float
    experiments: int
    sink_share: float
    web_workers: int
    tick_s: float
    rollup_s: float
    upkeep_s: float
    read_s: float
    bucket_s: float  # the width of the samples/s series' buckets


# --- Devices -------------------------------------------------------------------------------------


class Node:
    """One node's devices: their samples, rendered per batch (JSON for HTTP, dicts for the sink)."""

    def __init__(self, run_id: int, seed: int, start: float, http: bool, ranks: int = RANKS):
        rng = random.Random(seed)
        self.run_id, self.start, self.ranks, self.k = run_id, start, ranks, 0
        self.readings, self.fragments, self.energy = [], [], []
        for rank in range(ranks):
            cycle = []
            for _ in range(CYCLE):
                busy = rng.random() > 0.03  # now and then a data stall
                cycle.append(
                    {
                        "device": f"cuda:{rank} {DEVICE}",
                        "util_pct": rng.randint(88, 100) if busy else rng.randint(0, 30),
                        "mem_used_mb": float(rng.randint(70_000, 76_000)),
                        "mem_total_mb": 81_559.0,
                        "power_w": round(rng.uniform(560, 700) if busy else 140.0, 3),
                        "temperature_c": rng.randint(58, 74),
                        "sm_clock_mhz": float(rng.choice((1755, 1830, 1980))),
                        "step_time_s": round(rng.uniform(0.48, 0.53), 4),
                        "tokens_per_s": round(rng.uniform(15_500, 16_500), 1),
                        "micro_batch": 8,
                        "loss": round(rng.uniform(2.2, 2.6), 4),
                        "mfu": round(rng.uniform(0.38, 0.44), 4),
                    }
                )
            # One form kept: 8 x 60 dicts per node add up over thousands of nodes.
            if http:
                self.fragments.append([json.dumps(r)[1:-1] for r in cycle])
            else:
                self.readings.append(cycle)
            sums, total = [], 0.0
            for r in cycle:
                total += r["power_w"]  # 1 s at that power: the counter, in J
                sums.append(total)
            self.energy.append(sums)

    def _counters(self, k: int, rank: int) -> tuple[int, int, float]:
        cycles, i = divmod(k, CYCLE)
        energy = cycles * self.energy[rank][-1] + self.energy[rank][i]
        return 2 * k, 2 * k * 8192, round(energy, 3)  # 2 steps/s of 8,192 tokens

    def body(self, upto: int) -> bytes:
        """The JSON of the samples k .. upto - 1 of every rank."""
        parts = []
        for k in range(self.k, upto):
            ts = self.start + k
            for rank in range(self.ranks):
                step, tokens, energy = self._counters(k, rank)
                parts.append(
                    f'{{"seq":{k * self.ranks + rank},"ts":{ts:.3f},"step":{step},"rank":{rank},'
                    f'"tokens":{tokens},"energy_j":{energy},{self.fragments[rank][k % CYCLE]}}}'
                )
        return ('{"samples":[' + ",".join(parts) + "]}").encode()

    def samples(self, upto: int) -> list[dict]:
        out = []
        for k in range(self.k, upto):
            for rank in range(self.ranks):
                step, tokens, energy = self._counters(k, rank)
                out.append(
                    {
                        "seq": k * self.ranks + rank,
                        "ts": self.start + k,
                        "step": step,
                        "rank": rank,
                        "tokens": tokens,
                        "energy_j": energy,
                        **self.readings[rank][k % CYCLE],
                    }
                )
        return out


def nodes_of(run_ids: list[int], t0: float, plan: Plan, http: bool) -> list[Node]:
    """Nodes whose batches are spread evenly over the batch period."""
    n = max(1, len(run_ids))
    return [
        Node(run_id, seed=run_id, start=t0 + plan.batch_s * i / n - plan.batch_s, http=http)
        for i, run_id in enumerate(run_ids)
    ]


# --- The HTTP load generator (this process) ------------------------------------------------------


async def http_load(base: str, nodes: list[Node], tokens: list[str], t_end: float, plan: Plan):
    """Each node POSTs its batch when due; (due, sent, done, inserted, status) per POST."""
    import httpx

    records: list[tuple] = []
    connections = 4 * plan.web_workers
    # Waiters queue here, not in httpx's pool (whose wait list costs more per waiter).
    gate = asyncio.Semaphore(connections)
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=120) as client:

        async def node_loop(node: Node, token: str) -> None:
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            url = f"/api/v1/runs/{node.run_id}/telemetry/"
            due = node.start + plan.batch_s
            while due < t_end and time.time() < t_end:  # behind at the end: what is late stays
                await asyncio.sleep(max(0.0, due - time.time()))
                upto = int(due - node.start)
                body = node.body(upto)
                try:
                    async with gate:  # a wait for a connection is lag (sent - due), not latency
                        sent = time.time()
                        response = await client.post(url, content=body, headers=headers)
                    status = response.status_code
                    inserted = response.json()["inserted"] if status == 200 else 0
                except httpx.HTTPError:
                    status, inserted = 599, 0
                if status == 200:
                    node.k = upto  # a failed batch is sent again with the next one
                records.append((due, sent, time.time(), inserted, status))
                due += plan.batch_s

        await asyncio.gather(*(node_loop(n, t) for n, t in zip(nodes, tokens, strict=True)))
    return records


# --- The other processes: sink, beat's jobs, the reader ------------------------------------------


def _scheduled(job, interval: float, t0: float, t_end: float, stop) -> list[tuple]:
    """Run job() at t0, t0 + interval ...: (scheduled, started, seconds, what it did) each; a job
    that overruns its interval starts late, and the lag shows it."""
    out, k = [], 0
    while not stop.is_set():
        due = t0 + k * interval
        if due >= t_end:
            break
        if stop.wait(max(0.0, due - time.time())):
            break
        started = time.time()
        info = job()
        out.append((due, started, time.time() - started, info))
        k += 1
    return out


def _sink(nodes: list[Node], batch_s: float, t_end: float, stop, threads: int = 2) -> list:
    """The worker sink path: telemetry_ingest in this process, each node's batch when due."""
    from django.db import connection

    from apps.billing.services import telemetry_ingest

    records: list[tuple] = []

    def loop(mine: list[Node]) -> None:
        queue = [(node.start + batch_s, i) for i, node in enumerate(mine)]
        heapq.heapify(queue)
        while queue:
            due, i = heapq.heappop(queue)
            if due >= t_end or time.time() >= t_end or stop.wait(max(0.0, due - time.time())):
                break
            node, upto = mine[i], int(due - mine[i].start)
            sent = time.time()
            try:
                result = telemetry_ingest(run_id=node.run_id, samples=node.samples(upto), attempt=1)
                node.k, inserted, status = upto, result.inserted, 200
            except Exception:  # as the worker's sink does: keep the batch, send it with the next
                inserted, status = 0, 500
                connection.close()
            records.append((due, sent, time.time(), inserted, status))
            heapq.heappush(queue, (due + batch_s, i))
        connection.close()

    workers = [
        threading.Thread(target=loop, args=(nodes[j::threads],), daemon=True)
        for j in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return records


def _child(role: str, plan: dict, job: dict, t0, go, stop, results) -> None:
    """A process of its own (spawned): Django set up, ready said, then its job until stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import django

    django.setup()
    plan = Plan(**plan)
    results.put(("ready", role, None))
    go.wait()
    start, t_end = t0.value, t0.value + plan.warmup_s + plan.minutes * 60
    if role == "sink":
        nodes = nodes_of(job["run_ids"], start, plan, http=False)
        data = _sink(nodes, plan.batch_s, t_end, stop)
    elif role == "tick":
        from apps.attribution.services import attribution_tick

        data = _scheduled(lambda: attribution_tick().windows, plan.tick_s, start, t_end, stop)
    elif role == "rollup":
        from apps.dashboard.services import series_blocks_roll_due

        data = _scheduled(series_blocks_roll_due, plan.rollup_s, start, t_end, stop)
    elif role == "upkeep":
        from apps.ops.telemetry_upkeep import telemetry_upkeep

        def upkeep() -> dict:
            return {**telemetry_upkeep().as_dict(), "analyzed": analyze_as_autovacuum()}

        data = _scheduled(upkeep, plan.upkeep_s, start, t_end, stop)
    else:  # reader: a signed-in browser's first view of run pages, one run never viewed before each
        import httpx

        pending = list(job["run_ids"])
        random.Random(0).shuffle(pending)

        def view() -> int:
            run_id = pending.pop() if pending else job["run_ids"][0]
            return httpx.get(
                f"{job['base']}/runs/{run_id}/", cookies=job["cookies"], timeout=120
            ).status_code

        data = _scheduled(view, plan.read_s, start + plan.warmup_s / 2, t_end, stop)
    results.put(("result", role, data))


# --- The world -----------------------------------------------------------------------------------


def fleet_world(plan: Plan, log) -> dict:
    """build_world's experiments, the fleet's runs in them (external ones with a token each, worker
    ones for the sink), the retired run past retention, and a signed-in member."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from apps.api.services import api_token_create
    from apps.experiments.models import Arm, Run
    from apps.telemetry.partitions import PARENT, partitions, partitions_maintain
    from apps.tenants.models import Membership, Tenant

    # The last run's fleet samples go first, whole partitions at a time (build_world's samples,
    # kept for reuse, are months old).
    recent = timezone.now() - timedelta(days=30)
    with connection.cursor() as cursor:
        for part in partitions():
            if not part.is_default and part.hi > recent:
                cursor.execute(f'TRUNCATE "{part.name}"')
        cursor.execute(
            f"DELETE FROM {PARENT} WHERE run_id IN "
            f"(SELECT id FROM {Run._meta.db_table} WHERE config_sha256 = %s)",
            [FLEET_SHA],
        )
    # ... and its runs, before build_world counts the runs it finds.
    Run.objects.filter(config_sha256=FLEET_SHA).delete()
    world = build_world(2 * plan.experiments * 4 * 10, log, plan.experiments)
    tenant = world["tenant"]
    reset(world)
    # build_world predates the runs' spans: give its runs theirs, as ingest would have.
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Run._meta.db_table} r SET samples_from = s.lo, samples_to = s.hi FROM "
            f"(SELECT run_id, MIN(ts) lo, MAX(ts) hi FROM {PARENT} GROUP BY run_id) s "
            "WHERE s.run_id = r.id AND r.tenant_id = %s AND r.samples_from IS NULL",
            [tenant.pk],
        )
    tenant.api_tokens.all().delete()
    # A budget the load cannot reach: a step (a note on every running run at 80 %, a stop of every
    # worker run at 100 %) inside the measured window is not what this measures, and left from
    # an earlier run's world, its notes and stops would be. The per-batch check still runs.
    Tenant.objects.filter(pk=tenant.pk).update(
        monthly_budget_usd=Decimal("1e9"), budget_state=Tenant.BudgetState.OK, budget_month=None
    )
    Run.objects.filter(tenant=tenant).exclude(notes="", cancel_requested=False).update(
        notes="", cancel_requested=False
    )

    arms = list(Arm.objects.filter(experiment__tenant=tenant).order_by("experiment_id", "pk"))
    sku = Run.objects.filter(tenant=tenant).first().gpu_sku
    nodes = max(2, plan.devices // RANKS)
    sink_nodes = max(1, round(nodes * plan.sink_share))
    runs = Run.objects.bulk_create(
        [
            Run(
                tenant=tenant,
                experiment_id=arms[i * 4 % len(arms)].experiment_id,  # spread over experiments
                arm=arms[i * 4 % len(arms) + i % 4],
                kind=Run.Kind.WORKER if i < sink_nodes else Run.Kind.EXTERNAL,
                status=Run.Status.RUNNING,
                attempts=1,
                config_yaml=arms[0].strategy_yaml,
                config_sha256=FLEET_SHA,
                gpu_sku=sku,
                gpu_count=RANKS,
                world_size=RANKS,
                started_at=timezone.now(),
            )
            for i in range(nodes)
        ]
    )
    ids = [r.pk for r in runs]
    log(f"{len(ids)} nodes x {RANKS} devices; making {len(ids) - sink_nodes} API tokens")
    tokens = [api_token_create(tenant=tenant, name=f"node {i}")[1] for i in ids[sink_nodes:]]

    made = partitions_maintain()  # as beat has done since the stack started: today's is ready
    # A finished run of RETIRED_DAYS ago: its hour of samples lands in the default partition.
    then = timezone.now() - timedelta(days=RETIRED_DAYS)
    retired = Run.objects.create(
        tenant=tenant,
        experiment_id=arms[0].experiment_id,
        arm=arms[0],
        status=Run.Status.SUCCEEDED,
        attempts=1,
        config_yaml="x",
        config_sha256=FLEET_SHA,
        gpu_sku=sku,
        gpu_count=1,
        started_at=then,
        finished_at=then + timedelta(hours=1),
        samples_from=then,
        samples_to=then + timedelta(seconds=3599),
        last_seq=3599,
        priced_seq=3599,
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {PARENT} (run_id, seq, attempt, ts, step, rank, device, util_pct, "
            "power_w, energy_j, tokens, estimated) SELECT %s, g, 1, %s + g * INTERVAL '1 second', "
            "g, 0, 'cuda:0 Bench GPU', 90, 650, 650.0 * g, 4096 * g, FALSE "
            "FROM generate_series(0, 3599) g",
            [retired.pk, then],
        )
    user, _ = get_user_model().objects.get_or_create(username="bench-fleet")
    Membership.objects.get_or_create(user=user, tenant=tenant, defaults={"role": "admin"})
    client = Client()
    client.force_login(user)
    from django.conf import settings

    cookies = {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value}
    analyzed = analyze_as_autovacuum()
    if analyzed:
        log(
            f"this Postgres runs with autovacuum off: {len(analyzed)} tables analysed before the "
            "load, and again in each upkeep, as autovacuum's analyze would"
        )
    return {
        "sink": ids[:sink_nodes],
        "http": ids[sink_nodes:],
        "tokens": tokens,
        "cookies": cookies,
        "created_before": len(made.created),
        "analyzed": bool(analyzed),
    }


def analyze_as_autovacuum() -> list[str]:
    """Where the server runs with autovacuum off (a CI box's Postgres may), ANALYZE the tables
    autovacuum would analyse now (changed rows past autovacuum_analyze_threshold plus
    autovacuum_analyze_scale_factor of the rows): a production Postgres keeps its statistics
    fresh, and without them the tick's and the ingest's plans are guesses (a snapshot read took
    a sequential scan of 250,000 rows for 760). Returns the tables analysed; none with autovacuum
    on."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        if cursor.fetchone()[0] == "on":
            return []
        cursor.execute(
            "SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables WHERE "
            "n_mod_since_analyze > current_setting('autovacuum_analyze_threshold')::int + "
            "current_setting('autovacuum_analyze_scale_factor')::float * n_live_tup"
        )
        tables = [row[0] for row in cursor.fetchall()]
        for table in tables:
            cursor.execute(f"ANALYZE {table}")
    return tables


def server_send_every_s(base: str, run_id: int, token: str) -> float | None:
    """The send cadence a run's API answer advises (telemetry_send_every_s)."""
    import httpx

    answer = httpx.get(
        f"{base}/api/v1/runs/{run_id}/", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    answer.raise_for_status()
    return answer.json()["telemetry_send_every_s"]


def web_start(workers: int) -> tuple[subprocess.Popen, str]:
    """gunicorn on this benchmark's database (DEBUG off), once it answers."""
    import httpx
    from django.conf import settings

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DJANGO_DEBUG": "false", "DJANGO_LOG_LEVEL": "ERROR"}
    web = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "config.wsgi:application", "-b", f"127.0.0.1:{port}"]
        + ["--workers", str(workers), "--timeout", "300", "--backlog", "4096"],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if web.poll() is not None:
            raise RuntimeError(f"gunicorn exited at start with status {web.returncode}")
        try:
            if httpx.get(base + "/healthz", timeout=5).status_code in (200, 503):
                return web, base
        except httpx.TransportError:
            time.sleep(0.3)
    os.killpg(web.pid, signal.SIGKILL)
    raise RuntimeError("the web server did not answer within 120 s")


# --- Figures -------------------------------------------------------------------------------------


def cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lag_ends(rows: list[tuple], lo: float, hi: float, width: float) -> tuple[float, float, float]:
    """(due, sent, ...) rows: median lag over the window's first and last `width` s, and the
    worst."""
    lag = [(r[0], r[1] - r[0]) for r in rows if lo <= r[0] < hi]
    if not lag:
        return 0.0, 0.0, 0.0
    first = [v for t, v in lag if t < lo + width] or [lag[0][1]]
    last = [v for t, v in lag if t >= hi - width] or [lag[-1][1]]
    return statistics.median(first), statistics.median(last), max(v for _, v in lag)


def storage() -> tuple[int, int]:
    """(bytes of every sample partition, indexes and TOAST included; samples stored)."""
    from django.db import connection

    from apps.telemetry.partitions import PARENT, partitions

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {PARENT}")
        stored = cursor.fetchone()[0]
    return sum(p.bytes for p in partitions()), stored


PACK_RUNS = 300  # enough for the figure; all 2,500 would add minutes to the bench


def settle_and_pack(run_ids: list[int], log) -> dict:
    """After the load: up to PACK_RUNS of the fleet's runs end (ones whose samples are all billed),
    and compaction packs them as beat's upkeep would; the packed minutes' exact bytes (indexes
    included) over the samples they hold, and how long packing took."""
    from django.db import connection
    from django.db.models import F, Sum
    from django.utils import timezone

    from apps.dashboard.services import series_blocks_refresh
    from apps.experiments.models import Run
    from apps.telemetry.compaction import run_compact
    from apps.telemetry.models import PackedMinute
    from apps.telemetry.partitions import PACKED, partitions

    settled = Run.objects.filter(pk__in=run_ids, last_seq__gte=0, priced_seq=F("last_seq"))
    ids = list(settled.order_by("pk").values_list("pk", flat=True)[:PACK_RUNS])
    Run.objects.filter(pk__in=ids).update(status=Run.Status.SUCCEEDED, finished_at=timezone.now())
    log(f"packing {len(ids)} of the fleet's runs whose samples are all billed")
    t = time.perf_counter()
    series_blocks_refresh(runs=Run.objects.filter(pk__in=ids), whole=True)
    samples = sum(run_compact(run_id=pk) for pk in ids)
    seconds = time.perf_counter() - t
    with connection.cursor() as cursor:
        # FULL: the last run's packed minutes, deleted with its runs (fleet_world), leave dead
        # pages that would count here; in service packed minutes are only ever inserted, and go
        # with their partition.
        cursor.execute(f"VACUUM FULL ANALYZE {PACKED}")
    held = PackedMinute.objects.filter(run_id__in=ids).aggregate(n=Sum("samples"))["n"] or 0
    size = sum(p.bytes for p in partitions(PACKED))
    return {"bytes": size, "samples": held, "packed": samples, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 minutes")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, seconds: checks the code path only"
    )
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--minutes", type=float, default=None, help="measured (default 10)")
    parser.add_argument("--devices", type=int, default=None, help="default 20,000")
    parser.add_argument("--batch-s", type=float, default=None, help="seconds per batch (60)")
    parser.add_argument("--web-workers", type=int, default=4, help="gunicorn sync workers")
    parser.add_argument("--sink-share", type=float, default=0.25, help="nodes on the sink path")
    args = parser.parse_args()

    # Redis, as every deployment has it (the broker; here also the API's throttle counters and
    # the tenants' spend estimates): without it both fall back to their slower paths.
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/11")
    django_on_postgres(smoke=args.smoke)
    from django.conf import settings

    smoke = args.smoke
    plan = Plan(
        devices=args.devices or (4 * RANKS if smoke else 20_000),
        batch_s=args.batch_s or (1.0 if smoke else 60.0),
        minutes=args.minutes or (0.1 if smoke else 3 if args.quick else 10),
        warmup_s=2.0 if smoke else 30.0,
        experiments=10 if smoke else 1000,
        sink_share=args.sink_share,
        web_workers=2 if smoke else args.web_workers,
        tick_s=1.0 if smoke else settings.COSTLAB_ATTRIBUTION_TICK_S,
        rollup_s=1.0 if smoke else settings.COSTLAB_SERIES_ROLLUP_S,
        upkeep_s=2.0 if smoke else UPKEEP_S,
        read_s=1.0 if smoke else READ_S,
        bucket_s=2.0 if smoke else 60.0,
    )

    def log(message: str) -> None:
        print(f"# {message}", flush=True)

    started = time.monotonic()
    world = fleet_world(plan, log)
    log(f"world ready in {time.monotonic() - started:.0f} s; starting gunicorn and the workers")
    # The cadence is the server's, as a fleet's would be: COSTLAB_TELEMETRY_SEND_EVERY_S, read
    # back from a run's API answer (what the SDK follows) before the nodes send at it.
    os.environ["COSTLAB_TELEMETRY_SEND_EVERY_S"] = f"{plan.batch_s:g}"
    web, base = web_start(plan.web_workers)
    advised = server_send_every_s(base, world["http"][0], world["tokens"][0])
    if advised != plan.batch_s:
        os.killpg(web.pid, signal.SIGKILL)
        raise RuntimeError(f"the server advises {advised} s between sends, not {plan.batch_s}")
    ctx = mp.get_context("spawn")
    t0, go, stop, results = ctx.Value("d", 0.0), ctx.Event(), ctx.Event(), ctx.Queue()
    jobs = {
        "sink": {"run_ids": world["sink"]},
        "tick": {},
        "rollup": {},
        "upkeep": {},
        "reader": {
            "run_ids": world["sink"] + world["http"],
            "base": base,
            "cookies": world["cookies"],
        },
    }
    children = {
        role: ctx.Process(
            target=_child, args=(role, asdict(plan), job, t0, go, stop, results), daemon=True
        )
        for role, job in jobs.items()
    }
    data: dict[str, list] = {}
    try:
        for child in children.values():
            child.start()
        for _ in children:
            kind, role, _payload = results.get(timeout=300)
        t0.value = time.time() + 1.0
        lo = t0.value + plan.warmup_s
        hi = lo + plan.minutes * 60
        nodes = nodes_of(world["http"], t0.value, plan, http=True)
        go.set()
        import psutil

        web_pids = [web.pid] + [c.pid for c in psutil.Process(web.pid).children(recursive=True)]
        pids = {
            "generator": [os.getpid()],
            "web": web_pids,
            "sink": [children["sink"].pid],
            "beat jobs": [children[r].pid for r in ("tick", "rollup", "upkeep", "reader")],
        }
        cpu: dict[str, float] = {}

        def cpu_at_window() -> None:
            time.sleep(max(0.0, lo - time.time()))
            cpu.update({k: -cpu_seconds(v) for k, v in pids.items()})
            cpu["machine"] = -sum(psutil.cpu_times()[:3])
            time.sleep(max(0.0, hi - time.time()))
            cpu.update({k: cpu[k] + cpu_seconds(v) for k, v in pids.items()})
            cpu["machine"] += sum(psutil.cpu_times()[:3])

        meter = threading.Thread(target=cpu_at_window, daemon=True)
        meter.start()
        log(
            f"load: {plan.devices:,} devices, {plan.minutes:g} min measured after "
            f"{plan.warmup_s:g} s of warm-up"
        )
        data["http"] = asyncio.run(http_load(base, nodes, world["tokens"], hi, plan))
        meter.join()
        stop.set()
        for _ in children:
            kind, role, payload = results.get(timeout=600)
            data[role] = payload
    finally:
        stop.set()
        os.killpg(web.pid, signal.SIGKILL)
        web.wait()
        for child in children.values():
            child.join(30)
            if child.is_alive():
                child.kill()
    raw = storage()  # before the fleet's runs settle and are packed
    packed = settle_and_pack(world["sink"] + world["http"], log)
    report(plan, world, data, cpu, lo, hi, args.json, raw=raw, packed=packed)


def report(
    plan: Plan,
    world: dict,
    data: dict,
    cpu: dict,
    lo: float,
    hi: float,
    as_json: bool,
    *,
    raw: tuple[int, int],
    packed: dict,
):
    wall = hi - lo
    posts = data["http"] + data["sink"]
    inside = [r for r in posts if lo <= r[2] < hi]
    accepted = sum(r[3] for r in inside)
    buckets = max(1, math.ceil(wall / plan.bucket_s - 1e-9))
    series = [0.0] * buckets
    for r in inside:
        series[min(buckets - 1, int((r[2] - lo) / plan.bucket_s))] += r[3]
    widths = [min(plan.bucket_s, wall - i * plan.bucket_s) for i in range(buckets)]
    series = [round(v / w) for v, w in zip(series, widths, strict=True)]
    http = [r[2] - r[1] for r in data["http"] if lo <= r[2] < hi and r[4] == 200]
    sink = [r[2] - r[1] for r in data["sink"] if lo <= r[2] < hi and r[4] == 200]
    failed = sum(1 for r in inside if r[4] != 200)
    post_lag = lag_ends(posts, lo, hi, plan.bucket_s)
    ticks = [r for r in data["tick"] if r[3]] or data["tick"]  # ticks that attributed something
    tick_d = [r[2] for r in ticks if lo <= r[0] < hi] or [r[2] for r in ticks]
    tick_lag = lag_ends(data["tick"], lo, hi, plan.bucket_s)
    rollups = [r[2] for r in data["rollup"] if lo <= r[0] < hi] or [r[2] for r in data["rollup"]]
    views = [r[2] for r in data["reader"] if r[3] == 200]
    upkeep = data["upkeep"]
    created = world["created_before"] + sum(len(r[3]["created"]) for r in upkeep)
    dropped = sum(len(r[3]["dropped"]) for r in upkeep)
    kept = sorted({name for r in upkeep for name in r[3]["kept"]})
    size, stored = raw
    per_sample = size / max(1, stored)
    per_packed = packed["bytes"] / max(1, packed["samples"])
    ncpu = os.cpu_count() or 1
    shares = {k: round(v / wall / ncpu, 3) for k, v in cpu.items()}
    figures = {
        "samples_per_s": round(accepted / wall),
        "samples_per_s_series": series,
        "offered_samples_per_s": plan.devices,
        "ingest_p50_s": round(quantile(http, 0.5), 4),
        "ingest_p99_s": round(quantile(http, 0.99), 4),
        "sink_p50_s": round(quantile(sink, 0.5), 4) if sink else 0.0,
        "sink_p99_s": round(quantile(sink, 0.99), 4) if sink else 0.0,
        "posts": len(inside),
        "posts_failed": failed,
        "posts_by_status": {str(k): v for k, v in Counter(r[4] for r in inside).items()},
        "post_lag_start_s": round(post_lag[0], 3),
        "post_lag_end_s": round(post_lag[1], 3),
        "tick_s": round(statistics.median(tick_d), 4),
        "tick_s_max": round(max(tick_d), 4),
        "ticks": len(tick_d),
        "tick_lag_s": round(tick_lag[1], 3),
        "tick_lag_start_s": round(tick_lag[0], 3),
        "tick_lag_max_s": round(tick_lag[2], 3),
        "rollup_s": round(statistics.median(rollups), 4),
        "rollup_s_max": round(max(rollups), 4),
        "run_page_first_view_s": round(statistics.median(views), 4) if views else float("nan"),
        "run_page_first_view": spread(views) if views else None,
        "bytes_per_sample_raw": round(per_sample, 1),
        "bytes_per_settled_sample": round(per_packed, 1),
        "samples_packed": packed["samples"],
        "pack_samples_per_s": round(packed["packed"] / max(packed["seconds"], 1e-9)),
        "samples_stored": stored,
        "partitions_created": created,
        "partitions_dropped": dropped,
        "partitions_kept_for_open_runs": kept,
        "cpu_share": shares,
        "devices": plan.devices,
        "nodes": len(world["http"]) + len(world["sink"]),
        "nodes_on_sink": len(world["sink"]),
        "batch_s": plan.batch_s,  # what the server advised (COSTLAB_TELEMETRY_SEND_EVERY_S)
        "experiments": plan.experiments,
        "web_workers": plan.web_workers,
        "minutes": plan.minutes,
        "analyzed_by_benchmark": world["analyzed"],  # the server's autovacuum is off
        "notes": "bytes_per_settled_sample: the fleet's runs, ended after the load, packed by "
        "compaction (apps.telemetry.compaction); the packed minutes' bytes on disk, indexes "
        "included, over the samples they hold. Its compressibility is that of the simulated "
        "readings (NVML-like: integer %, mW, mJ, microsecond clocks)",
    }
    rows = [
        (
            "samples/s sustained",
            figures["samples_per_s"],
            f">= {TARGETS['samples_per_s']:,}",
            figures["samples_per_s"] >= TARGETS["samples_per_s"],
        ),
        (
            "post lag start -> end s",
            f"{post_lag[0]:.2f} -> {post_lag[1]:.2f}",
            "not growing",
            post_lag[1] <= post_lag[0] + plan.batch_s,
        ),
        (
            "ingest POST p50 / p99 s",
            f"{figures['ingest_p50_s']:.3f} / {figures['ingest_p99_s']:.3f}",
            "",
            None,
        ),
        (
            "tick s median / max",
            f"{figures['tick_s']:.3f} / {figures['tick_s_max']:.3f}",
            f"<= {TARGETS['tick_s']:g}",
            figures["tick_s"] <= TARGETS["tick_s"],
        ),
        (
            "tick lag start -> end s",
            f"{tick_lag[0]:.2f} -> {tick_lag[1]:.2f}",
            "not growing",
            tick_lag[1] <= tick_lag[0] + plan.tick_s,
        ),
        (
            "roll-up s median / max",
            f"{figures['rollup_s']:.3f} / {figures['rollup_s_max']:.3f}",
            f"<= {plan.rollup_s:g} (its interval)",
            figures["rollup_s"] <= plan.rollup_s,
        ),
        (
            "run page first view s",
            figures["run_page_first_view_s"],
            f"<= {TARGETS['run_page_first_view_s']:g}",
            figures["run_page_first_view_s"] <= TARGETS["run_page_first_view_s"],
        ),
        ("bytes per sample, raw", figures["bytes_per_sample_raw"], "", None),
        (
            "bytes per settled sample (packed)",
            figures["bytes_per_settled_sample"],
            f"<= {TARGETS['bytes']}",
            figures["bytes_per_settled_sample"] <= TARGETS["bytes"],
        ),
        ("partitions created / dropped", f"{created} / {dropped}", "", None),
    ]
    print(
        f"fleet: {plan.devices:,} devices in {figures['nodes']:,} nodes of {RANKS} "
        f"({len(world['sink'])} on the worker sink), 1 Hz, {plan.batch_s:g} s batches, "
        f"{plan.experiments:,} experiments, {plan.minutes:g} min measured"
    )
    for label, value, target, met in rows:
        verdict = "" if met is None else "met" if met else "MISSED"
        print(f"{label:<52}{value!s:>18}  {target:<22}{verdict}")
    print("samples/s per bucket:", series)
    print("CPU share of the machine:", shares, f"({ncpu} cores)")
    if as_json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
