"""What telemetry costs: step time of the tiny preset with the sampler on vs off.

    python bench/runtime_overhead.py [--quick] [--smoke] [--json] [--interval 0.1] [--threads 1]
        [--device cpu]

Side by side: the two arms run interleaved in one process (on, off, off, on, ...) so
drift in the machine's load hits both alike. A step's time is the gap between two calls
of the cancel callback, which the trainer makes once before every step; the first steps
of each run are warm-up and dropped. Per round: the ratio of the arms' mean step times.
Headline: ``overhead_ratio``, the median of those ratios, with its spread over rounds.
Budget: < 1 % (ratio < 1.01).

On a small shared machine two identical runs differ by several per cent, more than the
budget, so the table also measures the cost directly: the sampler thread's CPU time per
sample and the training loop's per-step bookkeeping, as a fraction of step time.

The sampler runs every ``--interval`` seconds (default 0.1 s: ten times the default
rate, so both figures are upper bounds for the default configuration).

`--smoke`: two rounds of 5 steps, no warm-up run, 20 direct samples: the same code path and JSON
keys in seconds, to check that the benchmark runs (tests/bench); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from gpu_runtime import strategy_from_dict, train  # noqa: E402
from gpu_runtime.capability import resolve_device  # noqa: E402
from gpu_runtime.probes import open_probe  # noqa: E402
from gpu_runtime.telemetry import Progress, RunCounters, Sampler  # noqa: E402
from gpu_runtime.timeline import Clock, OverlapMeter, StepWindow  # noqa: E402

WARMUP_STEPS = 2


def _config(*, telemetry: bool, interval_s: float, steps: int):
    return strategy_from_dict(
        {
            "model": {"preset": "tiny", "seq_len": 64},
            "data": {"source": "synthetic", "prefetch": 2},
            "train": {"steps": steps, "global_batch": 4, "lr": 3.0e-3, "warmup_steps": 2},
            "telemetry": {"enabled": telemetry, "interval_s": interval_s},
        }
    )


def _run(config, device: str | None) -> tuple[float, int]:
    """Mean seconds per step of one run (warm-up dropped), and how many samples the sink got."""
    marks: list[float] = []
    samples: list[str] = []

    def mark() -> bool:
        marks.append(time.perf_counter())
        return False

    train(config, cancel=mark, sink=lambda s: samples.append(json.dumps(s)), device=device)
    return (marks[-1] - marks[WARMUP_STEPS]) / (len(marks) - 1 - WARMUP_STEPS), len(samples)


def _direct_costs(device: str | None, n: int = 300) -> tuple[float, float]:
    """Sampler CPU seconds per sample (median) and the loop's bookkeeping seconds per step."""
    dev = resolve_device(device)
    clock = Clock(dev)
    windows: deque = deque(maxlen=256)
    io_log: deque = deque(maxlen=128)
    counters = RunCounters(Progress(0, 0, 0.0, 0, None, 4))
    sampler = Sampler(
        probe=open_probe(dev, cpu_tdp_w=65.0),
        counters=counters,
        interval_s=3600.0,
        sink=lambda s: json.dumps(s),
        flops_per_token=1.0,
        peak=None,
        overlap=OverlapMeter(clock, windows, io_log),
    )
    costs = []
    for i in range(n):
        for j in range(4):  # a few steps between samples, as in a run
            step = 4 * i + j
            io_log.append((clock.stamp(), clock.stamp()))
            windows.append(
                StepWindow(step + 1, clock.stamp(), clock.stamp(), clock.stamp(), clock.stamp())
            )
        start = time.thread_time()
        sampler.sample()
        costs.append(time.thread_time() - start)
    sampler.probe.close()
    # The loop's own share: one Progress tuple and one StepWindow per step
    # (stamps are taken anyway).
    start = time.perf_counter()
    for step in range(n * 100):
        counters.progress = Progress(step, step * 256, 0.1 * step, step, 2.5, 4)
        windows.append(StepWindow(step, 0.0, 0.0, 0.0, 0.0))
    return statistics.median(costs), (time.perf_counter() - start) / (n * 100)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds: under a minute")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, seconds: checks the code path only"
    )
    parser.add_argument(
        "--json", action="store_true", help="last line: one JSON object with overhead_ratio"
    )
    parser.add_argument(
        "--interval", type=float, default=0.1, help="sampler interval in seconds (default 0.1)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a small shared box, OpenMP threads spinning "
        "against other processes swamp the effect being measured; 0 keeps torch's default)",
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    ns = parser.parse_args()
    if ns.threads:
        torch.set_num_threads(ns.threads)
    rounds, steps = (2, 5) if ns.smoke else (12, 10) if ns.quick else (30, 20)

    on = _config(telemetry=True, interval_s=ns.interval, steps=steps)
    off = _config(telemetry=False, interval_s=ns.interval, steps=steps)
    if not ns.smoke:
        _run(off, ns.device)  # warm the process: first-call costs belong to neither arm
    rows = []
    for r in range(rounds):
        order = [("on", on), ("off", off)] if r % 2 == 0 else [("off", off), ("on", on)]
        result = {name: _run(config, ns.device) for name, config in order}
        (on_s, n_samples), (off_s, _) = result["on"], result["off"]
        rows.append((off_s, on_s, on_s / off_s, n_samples))
    sample_cost_s, step_bookkeeping_s = _direct_costs(ns.device, n=20 if ns.smoke else 300)

    print(
        "telemetry overhead: tiny preset, seq_len 64, global_batch 4, "
        f"{steps} steps/run, {rounds} rounds, "
        f"sampler every {ns.interval} s, torch threads {torch.get_num_threads()}"
    )
    print(f"{'round':>5}  {'off ms/step':>11}  {'on ms/step':>10}  {'on/off':>7}  {'samples':>7}")
    for r, (off_s, on_s, ratio, n) in enumerate(rows):
        print(f"{r:>5}  {off_s * 1e3:>11.2f}  {on_s * 1e3:>10.2f}  {ratio:>7.4f}  {n:>7}")
    ratios = [row[2] for row in rows]
    median, low, high = statistics.median(ratios), min(ratios), max(ratios)
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    step_s = statistics.median(row[0] for row in rows)
    direct = sample_cost_s / ns.interval + step_bookkeeping_s / step_s
    print(
        f"overhead_ratio (median on/off) = {median:.4f}  spread: min {low:.4f}, max {high:.4f}, "
        f"IQR [{q1:.4f}, {q3:.4f}]  (budget < 1.01)"
    )
    print(
        f"direct: sampler {sample_cost_s * 1e6:.0f} us CPU per sample "
        f"(every {ns.interval} s), loop bookkeeping "
        f"{step_bookkeeping_s * 1e6:.2f} us per {step_s * 1e3:.0f} ms step "
        f"-> {direct * 100:.3f} % of step time"
    )
    if ns.json:
        print(
            json.dumps(
                {
                    "overhead_ratio": median,
                    "overhead_ratio_spread": (high - low) / 2,
                    "overhead_ratio_min": low,
                    "overhead_ratio_max": high,
                    "overhead_ratio_iqr": [q1, q3],
                    "rounds": rounds,
                    "steps_per_run": steps,
                    "interval_s": ns.interval,
                    "torch_threads": torch.get_num_threads(),
                    "step_s_off": step_s,
                    "step_s_on": statistics.median(row[1] for row in rows),
                    "sampler_cpu_s_per_sample": sample_cost_s,
                    "loop_bookkeeping_s_per_step": step_bookkeeping_s,
                    "direct_overhead_fraction": direct,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
