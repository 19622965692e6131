"""What telemetry costs: step time of the tiny preset with the sampler on vs off.

    python bench/runtime_overhead.py [--quick] [--json] [--interval 0.1] [--threads 1] [--device cpu]

The two arms run interleaved in one process (on, off, off, on, ...) so drift in the
machine's load hits both alike. A step's time is the gap between two calls of the
cancel callback, which the trainer makes once before every step; the first steps of
each run are warm-up and dropped. Per round: the ratio of the arms' median step times.
Reported: the median ratio over rounds and its spread (min, max). Budget: < 1 %.

The sampler runs every ``--interval`` seconds (default 0.1 s: ten times the default
rate, so the figure is an upper bound for the default configuration).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from gpu_runtime import strategy_from_dict, train  # noqa: E402

WARMUP_STEPS = 3


def _config(*, telemetry: bool, interval_s: float, steps: int):
    return strategy_from_dict({
        "model": {"preset": "tiny", "seq_len": 64},
        "data": {"source": "synthetic", "prefetch": 2},
        "train": {"steps": steps, "global_batch": 4, "lr": 3.0e-3, "warmup_steps": 2},
        "telemetry": {"enabled": telemetry, "interval_s": interval_s},
    })


def _run(config, device: str | None) -> tuple[float, float, int]:
    """Mean wall and process-CPU seconds per step of one run (warm-up dropped), and samples sent."""
    walls: list[float] = []
    cpus: list[float] = []
    samples: list[str] = []

    def mark() -> bool:
        walls.append(time.perf_counter())
        cpus.append(time.process_time())
        return False

    train(config, cancel=mark, sink=lambda s: samples.append(json.dumps(s)), device=device)
    n = len(walls) - 1 - WARMUP_STEPS
    return (walls[-1] - walls[WARMUP_STEPS]) / n, (cpus[-1] - cpus[WARMUP_STEPS]) / n, len(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps: under a minute")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with overhead_ratio")
    parser.add_argument("--interval", type=float, default=0.1, help="sampler interval in seconds (default 0.1)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a small shared box, OpenMP threads spinning "
                             "against other processes swamp the effect being measured; 0 keeps torch's default)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    ns = parser.parse_args()
    if ns.threads:
        torch.set_num_threads(ns.threads)
    rounds, steps = (8, 15) if ns.quick else (16, 40)

    on = _config(telemetry=True, interval_s=ns.interval, steps=steps)
    off = _config(telemetry=False, interval_s=ns.interval, steps=steps)
    _run(off, ns.device)  # warm the process: first-call costs belong to neither arm
    rows = []
    for r in range(rounds):
        order = [("on", on), ("off", off)] if r % 2 == 0 else [("off", off), ("on", on)]
        result = {name: _run(config, ns.device) for name, config in order}
        (on_wall, on_cpu, n_samples), (off_wall, off_cpu, _) = result["on"], result["off"]
        rows.append({"off_wall": off_wall, "on_wall": on_wall, "wall_ratio": on_wall / off_wall,
                     "off_cpu": off_cpu, "on_cpu": on_cpu, "cpu_ratio": on_cpu / off_cpu, "samples": n_samples})

    print(f"telemetry overhead: tiny preset, seq_len 64, global_batch 4, {steps} steps/run, {rounds} rounds, "
          f"sampler every {ns.interval} s, torch threads {torch.get_num_threads()}")
    print(f"{'round':>5}  {'off ms':>8}  {'on ms':>8}  {'wall on/off':>11}  {'off cpu ms':>10}  {'on cpu ms':>9}  "
          f"{'cpu on/off':>10}  {'samples':>7}")
    for r, row in enumerate(rows):
        print(f"{r:>5}  {row['off_wall'] * 1e3:>8.2f}  {row['on_wall'] * 1e3:>8.2f}  {row['wall_ratio']:>11.4f}  "
              f"{row['off_cpu'] * 1e3:>10.2f}  {row['on_cpu'] * 1e3:>9.2f}  {row['cpu_ratio']:>10.4f}  "
              f"{row['samples']:>7}")
    summary = {}
    for kind in ("cpu", "wall"):
        ratios = [row[f"{kind}_ratio"] for row in rows]
        summary[kind] = (statistics.median(ratios), min(ratios), max(ratios))
        median, low, high = summary[kind]
        print(f"{kind:>4} time per step, median on/off = {median:.4f}  spread [{low:.4f}, {high:.4f}]  "
              f"({(median - 1) * 100:+.2f} %)")
    median, low, high = summary["cpu"]
    print(f"overhead_ratio = {median:.4f} (process CPU time per step: every sampler cycle is charged to the steps; "
          f"budget < 1.01)")
    if ns.json:
        print(json.dumps({
            "overhead_ratio": median, "overhead_ratio_spread": (high - low) / 2,
            "overhead_ratio_min": low, "overhead_ratio_max": high,
            "wall_ratio": summary["wall"][0], "wall_ratio_min": summary["wall"][1],
            "wall_ratio_max": summary["wall"][2], "rounds": rounds, "steps_per_run": steps,
            "interval_s": ns.interval, "torch_threads": torch.get_num_threads(),
            "step_s_off": statistics.median(row["off_wall"] for row in rows),
            "step_s_on": statistics.median(row["on_wall"] for row in rows),
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
