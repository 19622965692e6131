"""The cost benchmark: plain PyTorch against costlab's strategies, on the same model, data and machine.

    python bench/arms.py [--quick] [--json] [--device cpu|cuda] [--price-per-hour USD] [--compile auto|on|off]

Arms, each a strategy run through gpu_runtime.train() (the real code path):

* baseline: fp32, a static micro-batch (`--baseline-micro-batch`), eager, no prefetch;
* optimized: bf16 mixed precision (autocast compute, bf16 parameter storage with fp32
  master weights) + dynamic batching (starting at the baseline's micro-batch, bounded by
  the global batch) + fused kernels (RMSNorm+QKV, and AdamW: `kernels.fused_optimizer`)
  + prefetch + torch.compile (`--compile auto` and `on`: on; measured on the CPU too, where
  it fuses the elementwise work that bf16 matmuls leave as the bulk of a step).

Both arms run in one process, interleaved over rounds (baseline first in even rounds),
so the machine's drift hits both. A step's time is the gap between two calls of the
cancel callback, which train() makes before every step; each run's first step is
warm-up (allocator, caches, compilation) and not timed. USD per 1M tokens applies one
device-hour price to both arms (an assumed price: pass your own), so the headline
`ratio` (optimized / baseline cost per token) is the inverse throughput ratio, with its
spread over rounds. Target: ratio <= 0.40.

Then each strategy alone against the baseline: tokens/s and peak memory. Peak memory is
the CUDA allocator's maximum on a GPU; on CPU the growth of the process's resident set
over the run, sampled every 10 ms after returning freed memory to the OS (an estimate).
Telemetry is off in every arm: its cost is bench/runtime_overhead.py's subject.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ctypes
import gc
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
import torch  # noqa: E402

from gpu_runtime import strategy_from_dict, train  # noqa: E402
from gpu_runtime.capability import device_label, resolve_device  # noqa: E402
from gpu_runtime.mfu import peak_flops  # noqa: E402
from gpu_runtime.model import preset_args  # noqa: E402

TARGET = 0.40
MIB = 2**20
# Assumed on-demand prices per device-hour (USD), only to put a unit on the cost: the ratio does not depend on it.
ASSUMED_PRICE = {"cpu": 0.10, "cuda": 3.50}  # a 2-vCPU cloud VM; one H200-class GPU
DYNAMIC_WINDOW = 2  # steps between micro-batch changes: short runs must see the scaler act


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def arm_configs(ns: argparse.Namespace, compile_optimized: bool) -> tuple[dict, dict, dict[str, dict]]:
    """(baseline, optimized, {strategy alone: overrides of the baseline})."""
    baseline = {
        "model": {"preset": ns.preset, "seq_len": ns.seq_len},
        "data": {"source": "synthetic", "prefetch": 0},
        "train": {"steps": ns.steps, "global_batch": ns.global_batch, "micro_batch": ns.baseline_micro_batch,
                  "warmup_steps": 1, "seed": 0},
        "precision": {"compute_dtype": "fp32"},
        "telemetry": {"enabled": False},
    }
    dynamic = {"optimizer": {"dynamic_batching": {
        "enabled": True, "min_micro_batch": ns.baseline_micro_batch, "max_micro_batch": ns.global_batch,
        "stability_window": DYNAMIC_WINDOW}}, "train": {"micro_batch": None}}
    alone = {
        "bf16 autocast": {"precision": {"compute_dtype": "bf16"}},
        "bf16 autocast + storage": {"precision": {"compute_dtype": "bf16", "storage_dtype": "bf16"}},
        "dynamic batching": dynamic,
        "fused RMSNorm+QKV": {"kernels": {"fused_rmsnorm_qkv": True}},
        "fused AdamW": {"kernels": {"fused_optimizer": True}},
        "prefetch (2 batches)": {"data": {"prefetch": 2}},
        "torch.compile": {"kernels": {"compile": True}},
        "gradient checkpointing": {"memory": {"gradient_checkpointing": {"enabled": True}}},
        "int8 + LoRA (q,v,o)": {"precision": {"quantization": {"enabled": True}}},
        "embedding offload (cpu)": {"offload": {"embedding": "cpu"}},
    }
    optimized = baseline
    for name in ("bf16 autocast + storage", "dynamic batching", "fused RMSNorm+QKV", "fused AdamW",
                 "prefetch (2 batches)"):
        optimized = _merge(optimized, alone[name])
    if compile_optimized:
        optimized = _merge(optimized, alone["torch.compile"])
    return baseline, optimized, alone


class PeakMemory:
    """Peak memory of one run: CUDA allocator maximum, or sampled RSS growth on CPU."""

    def __init__(self, device: torch.device):
        self.device = device
        self._stop = threading.Event()
        self._peak = self._base = 0

    def __enter__(self) -> PeakMemory:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            return self
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed arenas back so RSS starts from rest
        process = psutil.Process()
        self._base = self._peak = process.memory_info().rss

        def sample() -> None:
            while not self._stop.wait(0.01):
                self._peak = max(self._peak, process.memory_info().rss)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type != "cuda":
            self._stop.set()
            self._thread.join()

    def mib(self, result) -> float:
        if self.device.type == "cuda":
            return result.peak_mem_mb
        return (self._peak - self._base) / MIB


def run_arm(config: dict, device: str) -> dict[str, Any]:
    """One train() call: tokens/s over the steps after the first (wall and CPU clocks), peak memory, loss."""
    wall: list[float] = []
    cpu: list[float] = []

    def mark() -> bool:
        wall.append(time.perf_counter())
        cpu.append(time.process_time())
        return False

    strategy = strategy_from_dict(config)
    dev = resolve_device(device)
    with PeakMemory(dev) as memory:
        result = train(strategy, device=device, cancel=mark)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        mark()  # the last step ends when train() returns (no checkpoint is written)
    tokens_per_step = strategy.train.global_batch * strategy.model.seq_len
    first = 1 if len(wall) > 2 else 0  # the first step is warm-up: allocator, caches, compilation
    timed = len(wall) - 1 - first
    start_mb = strategy.train.micro_batch or strategy.optimizer.dynamic_batching.min_micro_batch
    return {"tokens_per_s": {"wall": tokens_per_step * timed / (wall[-1] - wall[first]),
                             "cpu": tokens_per_step * timed / max(cpu[-1] - cpu[first], 1e-9)},
            "peak_mem_mb": memory.mib(result), "final_loss": result.final_loss,
            "micro_batches": sorted({start_mb} | {e["new_micro_batch"] for e in result.micro_batch_events})}


def spread(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "q1": q[0], "q3": q[2]}


def matmul_rates(device: torch.device) -> dict[str, float]:
    """GFLOP/s of one training-sized matmul in fp32 and bf16: why bf16 does or does not pay here."""
    rates = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a = torch.randn(1024, 512, device=device, dtype=dtype)
        b = torch.randn(1408, 512, device=device, dtype=dtype)
        for _ in range(3):
            a @ b.t()
        best = float("inf")
        for _ in range(5):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            for _ in range(10):
                a @ b.t()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, (time.perf_counter() - start) / 10)
        rates[name] = 2 * 1024 * 512 * 1408 / best / 1e9
    return rates


def usd_per_million(tokens_per_s: float, price_per_hour: float) -> float:
    return price_per_hour / 3600 / tokens_per_s * 1e6


def _alone_row(runs: list[dict[str, dict]], name: str, clock: str) -> dict[str, float]:
    def tps(run: dict) -> float:
        return run["tokens_per_s"][clock]

    return {
        "tokens_per_s": statistics.median(tps(x[name]) for x in runs),
        "tokens_per_s_ratio": statistics.median(tps(x[name]) / tps(x["baseline"]) for x in runs),
        "peak_mem_mb": statistics.median(x[name]["peak_mem_mb"] for x in runs),
        "peak_mem_ratio": statistics.median(x[name]["peak_mem_mb"] / max(x["baseline"]["peak_mem_mb"], 1e-9)
                                            for x in runs),
        "micro_batches": sorted({m for x in runs for m in x[name]["micro_batches"]}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps: about a minute on CPU")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object with ratio and per-arm figures")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--seq-len", type=int, default=None, help="default 64 on CPU, 256 on CUDA")
    parser.add_argument("--global-batch", type=int, default=None, help="default 8 on CPU, 64 on CUDA")
    parser.add_argument("--baseline-micro-batch", type=int, default=None, help="default 2 on CPU, 8 on CUDA")
    parser.add_argument("--price-per-hour", type=float, default=None, help="USD per device-hour (default: assumed)")
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto")
    parser.add_argument("--clock", choices=("auto", "wall", "cpu"), default="auto",
                        help="what a step's time is: wall clock, or this process's CPU time (auto: CPU time on a "
                             "CPU, where other tenants' load moves the wall clock by tens of per cent; wall on CUDA)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads on CPU (default 1: OpenMP threads spinning against other "
                             "processes on a small shared box swamp what is measured; 0 keeps torch's default)")
    ns = parser.parse_args()
    dev = resolve_device(ns.device)
    cuda = dev.type == "cuda"
    ns.device = str(dev)
    if ns.threads and not cuda:
        torch.set_num_threads(ns.threads)
    ns.clock = ns.clock if ns.clock != "auto" else ("wall" if cuda else "cpu")
    ns.seq_len = ns.seq_len or (256 if cuda else 64)
    ns.global_batch = ns.global_batch or (64 if cuda else 8)
    ns.baseline_micro_batch = ns.baseline_micro_batch or (8 if cuda else 2)
    if cuda:
        rounds, ns.steps, alone_rounds = (3, 12, 1) if ns.quick else (6, 30, 2)
    else:
        rounds, ns.steps, alone_rounds = (2, 2, 0) if ns.quick else (5, 5, 2)
    compile_optimized = ns.compile != "off"
    price = ns.price_per_hour if ns.price_per_hour is not None else ASSUMED_PRICE[dev.type]
    baseline, optimized, alone = arm_configs(ns, compile_optimized)
    skipped = {}
    if not cuda:
        skipped["embedding offload (cpu)"] = "no device memory to spare on a CPU run: the table is already there"
        if ns.quick and ns.compile != "on":
            skipped["torch.compile"] = "alone, its one-time compile would take a third of --quick's minute on CPU"
    for name in skipped:
        alone.pop(name)

    started = time.perf_counter()
    run_arm(_merge(baseline, {"train": {"steps": 2}}), ns.device)  # warm the process: first-call costs are no arm's
    if compile_optimized:
        run_arm(_merge(optimized, {"train": {"steps": 2}}), ns.device)  # compile once, before anything is timed
    per_round: list[dict[str, dict]] = []
    for r in range(rounds):
        order = [("baseline", baseline), ("optimized", optimized)]
        if r % 2:
            order.reverse()
        per_round.append({name: run_arm(config, ns.device) for name, config in order})
    alone_rows = {}
    for name, overrides in alone.items():
        if alone_rounds == 0:  # --quick: one run each, against the headline rounds' baselines
            mine = run_arm(_merge(baseline, overrides), ns.device)
            runs = [{"baseline": r["baseline"], name: mine} for r in per_round]
        else:
            runs = []
            for r in range(alone_rounds):
                pair = [("baseline", baseline), (name, _merge(baseline, overrides))]
                if r % 2:
                    pair.reverse()
                runs.append({arm: run_arm(config, ns.device) for arm, config in pair})
        alone_rows[name] = _alone_row(runs, name, ns.clock)
    rates = matmul_rates(dev)
    elapsed = time.perf_counter() - started
    return report(ns, dev, price, per_round, alone_rows, skipped, rates, compile_optimized, elapsed,
                  baseline, optimized)


def report(ns, dev, price, per_round, alone_rows, skipped, rates, compile_optimized, elapsed,
           baseline, optimized) -> int:
    label = device_label(dev)
    args = preset_args(ns.preset, ns.seq_len)
    flops_per_token = args.flops_per_token(ns.seq_len)
    arms: dict[str, dict[str, Any]] = {}
    for name, config in (("baseline", baseline), ("optimized", optimized)):
        tps = [r[name]["tokens_per_s"][ns.clock] for r in per_round]
        median_tps = statistics.median(tps)
        peak = peak_flops(label, config["precision"]["compute_dtype"])
        arms[name] = {
            "tokens_per_s": median_tps, "tokens_per_s_spread": spread(tps),
            "tokens_per_s_wall": statistics.median(r[name]["tokens_per_s"]["wall"] for r in per_round),
            "peak_mem_mb": statistics.median(r[name]["peak_mem_mb"] for r in per_round),
            "usd_per_1m_tokens": usd_per_million(median_tps, price),
            "mfu": None if peak is None else median_tps * flops_per_token / peak,
            "final_loss": statistics.median(r[name]["final_loss"] for r in per_round),
            "micro_batches": sorted({m for r in per_round for m in r[name]["micro_batches"]}),
        }
    ratios = [r["baseline"]["tokens_per_s"][ns.clock] / r["optimized"]["tokens_per_s"][ns.clock] for r in per_round]
    wall_ratios = [r["baseline"]["tokens_per_s"]["wall"] / r["optimized"]["tokens_per_s"]["wall"] for r in per_round]
    s = spread(ratios)
    mem = "CUDA max allocated" if dev.type == "cuda" else "RSS growth, sampled every 10 ms (estimate)"
    clock = ("wall clock" if ns.clock == "wall" else
             "this process's CPU time (time.process_time; wall-clock figures alongside)")
    print(f"cost benchmark: {ns.preset} preset ({args.num_params() / 1e6:.1f}M parameters), seq_len {ns.seq_len}, "
          f"global batch {ns.global_batch}, baseline micro-batch {ns.baseline_micro_batch}, on {label}"
          f"{'' if dev.type == 'cuda' else f', torch threads {torch.get_num_threads()}'}")
    print(f"{len(per_round)} interleaved rounds x {ns.steps} steps (the first of each run untimed); step time: {clock}")
    print(f"optimized = bf16 autocast + bf16 storage (fp32 masters) + dynamic batching [{ns.baseline_micro_batch}, {ns.global_batch}] + fused "
          f"RMSNorm+QKV + fused AdamW + prefetch{' + torch.compile' if compile_optimized else ' (no compile)'}")
    print(f"price: ${price:.2f} per device-hour, {'ASSUMED (--price-per-hour sets it)' if ns.price_per_hour is None else 'given'}"
          "; cost = device time only, energy excluded")
    print()
    print(f"{'arm':<10} {'tokens/s':>9} {'(wall)':>8} {'peak MiB':>9} {'USD/1M tok':>11} {'MFU':>7} {'loss':>7}"
          "  micro-batches")
    for name, a in arms.items():
        mfu = "-" if a["mfu"] is None else f"{a['mfu']:.3f}"
        print(f"{name:<10} {a['tokens_per_s']:>9.1f} {a['tokens_per_s_wall']:>8.1f} {a['peak_mem_mb']:>9.1f} "
              f"{a['usd_per_1m_tokens']:>11.4f} {mfu:>7} {a['final_loss']:>7.3f}  {a['micro_batches']}")
    met = s["median"] <= TARGET
    print(f"\nratio (optimized / baseline USD per 1M tokens) = {s['median']:.3f}  spread: min {s['min']:.3f}, "
          f"max {s['max']:.3f}, IQR [{s['q1']:.3f}, {s['q3']:.3f}]  target <= {TARGET:.2f}: "
          f"{'MET' if met else 'NOT MET'}")
    print(f"per round: {', '.join(f'{x:.3f}' for x in ratios)}   (wall clock: {', '.join(f'{x:.3f}' for x in wall_ratios)})")
    print(f"\neach strategy alone vs baseline (median; peak memory: {mem})")
    print(f"{'strategy':<26} {'tokens/s':>9} {'x base':>7} {'peak MiB':>9} {'x base':>7}  micro-batches")
    for name, row in alone_rows.items():
        print(f"{name:<26} {row['tokens_per_s']:>9.1f} {row['tokens_per_s_ratio']:>7.3f} {row['peak_mem_mb']:>9.1f} "
              f"{row['peak_mem_ratio']:>7.3f}  {row['micro_batches']}")
    for name, why in skipped.items():
        print(f"{name:<26} skipped: {why}")
    print(f"\nmatmul 1024x512 @ 512x1408 here: fp32 {rates['fp32']:.0f} GFLOP/s, bf16 {rates['bf16']:.0f} GFLOP/s "
          f"(bf16/fp32 = {rates['bf16'] / rates['fp32']:.2f}); wall time {elapsed:.0f} s")
    if ns.json:
        print(json.dumps({
            "ratio": s["median"], "ratio_spread": (s["max"] - s["min"]) / 2, "ratio_min": s["min"],
            "ratio_max": s["max"], "ratio_iqr": [s["q1"], s["q3"]], "ratio_per_round": ratios,
            "ratio_wall_clock_per_round": wall_ratios, "clock": ns.clock,
            "target": TARGET, "met": met, "price_per_hour_usd": price, "price_assumed": ns.price_per_hour is None,
            "device": label, "preset": ns.preset, "seq_len": ns.seq_len, "global_batch": ns.global_batch,
            "baseline_micro_batch": ns.baseline_micro_batch, "steps_per_run": ns.steps, "rounds": len(per_round),
            "compile_in_optimized": compile_optimized, "peak_memory_method": mem, "arms": arms,
            "strategies_alone": alone_rows, "strategies_skipped": skipped, "matmul_gflops": rates,
            "wall_s": elapsed,
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
