"""What the SDK costs a training loop: step time with and without `costlab.track` + `log()`.

    python bench/sdk_overhead.py [--quick] [--smoke] [--json] [--interval 1.0] [--threads N]

A CPU training loop (a small MLP, SGD) runs interleaved rounds of two arms in one process:
`plain` (the loop alone) and `tracked` (the same loop inside `costlab.track`, `run.log(step,
tokens, loss)` after every step, the sampler at `--interval` seconds, delivery every 2 s). Arms
alternate which goes first. Each arm's round times its steps only (the run's start and end, a
POST each, are outside); the first steps are warm-up and dropped. Per round: tracked / plain mean
step time. Headline `ratio`: the median of those ratios, with its spread; `overhead_pct` =
(ratio - 1) x 100. Target: < 1 % (ratio < 1.01).

The server is a true boundary: a small HTTP stub in its own process (`--serve PORT`, this file)
that answers the routes the SDK calls (runs, telemetry, finish) as costlab does, so every sample
is serialised and posted over a socket. It stores nothing: what the server does with a batch is
bench/ingest.py's subject.

On a small shared machine two identical runs differ by more than the budget, so the cost is also
measured directly: `log()` per call (a tight loop), the sampler's CPU per sample and the sender's
CPU per batch (each timed alone), summed per second of training into `direct_overhead_fraction`
(as if every background CPU second came out of the training's own; an upper bound).

An unreachable site must not hold the run up either (issue 49: it added 40 s, a 10-s wait at the
start and 30 s at the end): `--site-down-seconds` (7) rounds of the same loop run plain and inside
`costlab.track` against a port nothing listens on, interleaved, each timed from before the start
to after the end (the samples go to a temporary spool). Headline `site_down_added_s`: the median
wall seconds added, with its spread. Target: under 1 s.

`--smoke`: 2 rounds of 0.6 s per arm, 0.2 s sampling (site down: 2 rounds of 0.3 s): the same
code path and JSON keys in seconds, to check that the benchmark runs (tests/sdk); its figures
mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._setup import spread  # noqa: E402

WARMUP_STEPS = 5
TARGET_RATIO = 1.01
TARGET_SITE_DOWN_ADDED_S = 1.0


class Stub(BaseHTTPRequestHandler):
    """costlab's answers to the SDK's calls, from memory."""

    protocol_version = "HTTP/1.1"
    run = {"id": 1, "status": "running", "arm": {"id": 1, "name": "bench", "is_control": True}}

    def log_message(self, *args):  # quiet
        pass

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._answer(200, {"results": [{"id": 1, "name": "bench"}]})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path.endswith("/telemetry/"):
            n = len(body.get("samples", []))
            self._answer(200, {"received": n, "inserted": n, "duplicates": 0, "refused": []})
        elif self.path.endswith(("/finish/", "/cancel/")):
            self._answer(
                200, {**self.run, "status": body.get("status", "cancelled"), "cost_usd": "0"}
            )
        else:
            self._answer(201, self.run)


def serve(port: int) -> None:
    ThreadingHTTPServer(("127.0.0.1", port), Stub).serve_forever()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_stub() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the stub server did not start within 30 s")


def make_loop(width: int, batch: int):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, width), torch.randn(batch, width)

    def step():
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def run_arm(step, *, tracked: bool, seconds: float, url: str, interval_s: float, tokens: int):
    """Mean seconds per step over `seconds` of training (warm-up dropped), and steps run."""
    import costlab

    marks: list[float] = []
    if tracked:
        run = costlab.track(
            1, "bench", url=url, token="bench", interval_s=interval_s, device="cpu"
        ).start()
    try:
        end = time.perf_counter() + seconds
        n = 0
        while True:
            loss = step()
            n += 1
            if tracked:
                run.log(step=n, tokens=tokens, loss=loss)
            marks.append(time.perf_counter())
            if marks[-1] >= end and n > WARMUP_STEPS + 2:
                break
    finally:
        if tracked:
            run.close()
    timed = marks[WARMUP_STEPS:]
    return (timed[-1] - timed[0]) / (len(timed) - 1), n


def direct_costs(url: str, n: int) -> dict:
    """log() per call, the sampler's CPU per sample and the sender's CPU per batch, alone."""
    import torch

    import costlab
    from costlab.client import Client

    run = costlab.Run(1, "bench", url=url, token="bench", interval_s=3600, device="cpu").start()
    loss = torch.tensor(1.0)
    t0 = time.perf_counter()
    for i in range(n * 100):
        run.log(step=i, tokens=512, loss=loss)
    log_s = (time.perf_counter() - t0) / (n * 100)
    sampler = run._sampler
    batch = [sampler.sample(), sampler.sample()]  # a 1 s sampler's batch at 2 s delivery
    c0 = time.thread_time()
    for _ in range(n):
        sampler.sample()
    sample_cpu_s = (time.thread_time() - c0) / n
    client = Client(url, "bench")
    c0 = time.thread_time()
    for _ in range(n):
        client.post_samples(1, batch, 10.0)
    batch_cpu_s = (time.thread_time() - c0) / n
    client.close()
    run.close()
    return {"log_s": log_s, "sample_cpu_s": sample_cpu_s, "batch_cpu_s": batch_cpu_s}


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def site_down_rounds(step, *, seconds: float, rounds: int) -> list[float]:
    """Wall seconds a run of `seconds` gains inside costlab.track when the site is unreachable,
    per round; the two arms interleaved, alternating which goes first."""
    import costlab

    def loop(run=None) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            loss = step()
            if run is not None:
                run.log(tokens=1, loss=loss)

    added = []
    with tempfile.TemporaryDirectory(prefix="costlab-bench-spool-") as spool:
        for r in range(rounds):
            wall = {}
            for arm in ("plain", "down") if r % 2 == 0 else ("down", "plain"):
                t0 = time.perf_counter()
                if arm == "plain":
                    loop()
                else:
                    with costlab.track(
                        1,
                        "bench",
                        url=f"http://127.0.0.1:{closed_port()}",
                        token="bench",
                        device="cpu",
                        spool_dir=spool,
                        interval_s=0.5,
                    ) as run:
                        loop(run)
                wall[arm] = time.perf_counter() - t0
            added.append(wall["down"] - wall["plain"])
            print(f"site down, round {r + 1}/{rounds}: +{added[-1]:.3f} s", file=sys.stderr)
    return added


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--interval", type=float, default=None, help="sampling seconds (1.0)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None, help="per arm and round")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--site-down-seconds", type=float, default=7.0)
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve)
        return 0
    rounds = args.rounds or (2 if args.smoke else 4 if args.quick else 10)
    seconds = args.seconds or (0.6 if args.smoke else 5.0 if args.quick else 10.0)
    interval_s = args.interval or (0.2 if args.smoke else 1.0)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    stub, url = start_stub()
    try:
        step = make_loop(args.width, args.batch)
        tokens = args.batch * args.width
        run_arm(
            step,
            tracked=True,
            seconds=min(seconds, 1.0),
            url=url,
            interval_s=interval_s,
            tokens=tokens,
        )
        ratios, plain_s, tracked_s = [], [], []
        for r in range(rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            times = {}
            for tracked in order:
                times[tracked], _ = run_arm(
                    step,
                    tracked=tracked,
                    seconds=seconds,
                    url=url,
                    interval_s=interval_s,
                    tokens=tokens,
                )
            plain_s.append(times[False])
            tracked_s.append(times[True])
            ratios.append(times[True] / times[False])
            print(
                f"round {r + 1}/{rounds}: plain {times[False] * 1e3:.3f} ms/step, "
                f"tracked {times[True] * 1e3:.3f} ms/step, ratio {ratios[-1]:.4f}",
                file=sys.stderr,
                flush=True,
            )
        direct = direct_costs(url, 5 if args.smoke else 50)
        down = site_down_rounds(
            step,
            seconds=0.3 if args.smoke else args.site_down_seconds,
            rounds=2 if args.smoke else 3,
        )
    finally:
        stub.kill()
        stub.wait()

    ratio = spread(ratios)
    step_s = spread(plain_s)["median"]
    per_second = direct["sample_cpu_s"] / interval_s + direct["batch_cpu_s"] / 2.0
    direct_fraction = direct["log_s"] / step_s + per_second
    figures = {
        "ratio": ratio["median"],
        "ratio_spread": ratio,
        "overhead_pct": (ratio["median"] - 1) * 100,
        "target_ratio": TARGET_RATIO,
        "met": ratio["median"] < TARGET_RATIO,
        "direct_overhead_fraction": direct_fraction,
        "direct_met": direct_fraction < TARGET_RATIO - 1,
        "log_us": direct["log_s"] * 1e6,
        "sample_cpu_us": direct["sample_cpu_s"] * 1e6,
        "batch_cpu_ms": direct["batch_cpu_s"] * 1e3,
        "step_ms": step_s * 1e3,
        "interval_s": interval_s,
        "rounds": rounds,
        "seconds_per_arm": seconds,
        "site_down_added_s": statistics.median(down),
        "site_down_spread": spread(down, ("median", "min", "max", "rounds")),
        "site_down_run_s": 0.3 if args.smoke else args.site_down_seconds,
        "site_down_met": statistics.median(down) < TARGET_SITE_DOWN_ADDED_S,
        "threads": torch.get_num_threads(),
        "cpus": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
    }
    print()
    print(
        f"SDK overhead, {rounds} interleaved rounds of {seconds:g} s per arm, "
        f"sampling every {interval_s:g} s"
    )
    print(f"  plain step            {step_s * 1e3:10.3f} ms")
    print(
        f"  tracked / plain       {ratio['median']:10.4f}  (min {ratio['min']:.4f}, "
        f"q1 {ratio['q1']:.4f}, q3 {ratio['q3']:.4f}, max {ratio['max']:.4f})"
    )
    print(f"  overhead              {figures['overhead_pct']:10.2f} %   (target < 1 %)")
    print(f"  log() per call        {figures['log_us']:10.2f} us")
    print(f"  sampler CPU / sample  {figures['sample_cpu_us']:10.1f} us")
    print(f"  sender CPU / batch    {figures['batch_cpu_ms']:10.3f} ms")
    print(f"  direct overhead       {direct_fraction * 100:10.3f} %   (upper bound)")
    print(
        f"  site down             {figures['site_down_added_s']:+10.3f} s   a run of "
        f"{figures['site_down_run_s']:g} s (spread {min(down):+.3f} to {max(down):+.3f}; "
        f"target under {TARGET_SITE_DOWN_ADDED_S:g} s)"
    )
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
