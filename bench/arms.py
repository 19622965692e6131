"""The cost benchmark: plain PyTorch against costlab's strategies, same model, data and machine.

    python bench/arms.py [--quick] [--json] [--device cpu|cuda] [--price-per-hour USD]
                         [--compile auto|on|off]
    python bench/arms.py --ddp N [--quick] [--json] [--device cpu|cuda]
    python bench/arms.py --smoke [--json] [--ddp N]

`--smoke`: the tiny preset at seq_len 32, global batch 4, one round of 3 steps, bf16 and dynamic
batching alone only: the same code path and JSON keys in seconds, to check that the benchmark
runs (tests/bench); its figures mean nothing.

The shape: the `small` preset (26M parameters) at seq_len 256, global batch 8 (64 on CUDA).
At seq_len 64 and micro-batch 2 a forward pass is 128 tokens: per-op overhead, norms and the
optimizer dominate, and a dtype or a batching strategy barely shows. Real LLM training is
matmul-bound; at seq_len 256 the model's GEMMs are most of a step on this CPU too, so what
bf16 and larger micro-batches buy here is what they buy there. `--quick` (2 rounds of 6
steps, bf16 and dynamic batching alone only) takes about 3 minutes on a 2-core CPU.

Arms, each a strategy run through gpu_runtime.train() (the real code path):

* baseline: fp32, a static micro-batch (`--baseline-micro-batch`), eager, no prefetch;
* optimized: bf16 mixed precision (autocast compute, bf16 parameter storage with fp32
  master weights) + dynamic batching (starting at the baseline's micro-batch and growing
  toward the global batch while each larger size is measurably faster: one timed step per
  size, so it acts within the run) + fused kernels (RMSNorm+QKV, and AdamW:
  `kernels.fused_optimizer`) + prefetch + torch.compile (`--compile on`; `auto`: on CUDA
  only, as a CPU compile of every micro-batch shape costs minutes).

Both arms run in one process, interleaved over rounds (baseline first in even rounds),
so the machine's drift hits both. A step's time is the gap between two calls of the
cancel callback, which train() makes before every step; each run's first step is
warm-up (allocator, caches, compilation) and not timed. USD per 1M tokens applies one
device-hour price to both arms (an assumed price: pass your own), so the headline
`ratio` (optimized / baseline cost per token) is the inverse throughput ratio, with its
spread over rounds. Target: ratio <= 0.40.

Held to the machine's floor: every GEMM one step runs (each linear layer's forward and two
backward products, attention's products) is timed at the model's own shapes in fp32 and
bf16. `gemm_floor` = bf16 / fp32 GEMM time at the baseline's micro-batch: the cost ratio
the dtype alone allows. `floor_ratio` = ratio / gemm_floor (target <= 1.10): how close the
optimized arm comes to it. `loss_delta` = |optimized - baseline final loss| / baseline at
equal tokens (target <= 0.02); a strategy above it buys speed with loss and is flagged.
`optimized_micro_batches` lists every micro-batch the optimized arm ran.

Then each strategy alone against the baseline: tokens/s, peak memory and loss delta. Peak
memory is the CUDA allocator's maximum on a GPU; on CPU the growth of the process's resident
set over the run, sampled every 10 ms after returning freed memory to the OS (an estimate).
Telemetry is off in every arm: its cost is bench/runtime_overhead.py's subject.

`--ddp N`: the design document's comparison, native DDP against costlab's strategies on the
same world size. Both arms train as N-process DDP (torch's elastic launcher; gloo and one
thread per rank on a CPU, nccl on CUDA), interleaved over rounds, and the table gives per arm
what the seed's does: device-hours (N devices x the call's wall time, start-up included),
electricity (kWh; modelled from the CPU's TDP on a CPU, so marked estimated), completion time,
and tokens/s and USD per 1M tokens at steady state (rank 0's telemetry past the first steps,
as bench/ddp.py reads it). `ratio` is optimized / baseline USD per 1M tokens.
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
from _setup import spread as _spread  # noqa: E402  (bench/, the script's directory)

from gpu_runtime import strategy_from_dict, train  # noqa: E402
from gpu_runtime.capability import device_label, resolve_device  # noqa: E402
from gpu_runtime.mfu import peak_flops  # noqa: E402
from gpu_runtime.model import preset_args  # noqa: E402

TARGET = 0.40
MIB = 2**20
# Assumed on-demand prices per device-hour (USD), only to put a unit on the cost: the ratio does not
# depend on it.
ASSUMED_PRICE = {"cpu": 0.10, "cuda": 3.50}  # a 2-vCPU cloud VM; one H200-class GPU
# timed steps per micro-batch size (after one warm-up step): short runs must see the scaler act
PROBE_STEPS = 1
FLOOR_TARGET = 1.10  # ratio / gemm_floor
LOSS_TARGET = 0.02  # |optimized - baseline final loss| / baseline, at equal tokens


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def arm_configs(
    ns: argparse.Namespace, compile_optimized: bool
) -> tuple[dict, dict, dict[str, dict]]:
    """(baseline, optimized, {strategy alone: overrides of the baseline})."""
    baseline = {
        "model": {"preset": ns.preset, "seq_len": ns.seq_len},
        "data": {"source": "synthetic", "prefetch": 0},
        "train": {
            "steps": ns.steps,
            "global_batch": ns.global_batch,
            "micro_batch": ns.baseline_micro_batch,
            "warmup_steps": 1,
            "seed": 0,
        },
        "precision": {"compute_dtype": "fp32"},
        "telemetry": {"enabled": False},
    }
    dynamic = {
        "optimizer": {
            "dynamic_batching": {
                "enabled": True,
                "min_micro_batch": ns.baseline_micro_batch,
                "max_micro_batch": ns.global_batch,
                "probe_steps": PROBE_STEPS,
            }
        },
        "train": {"micro_batch": None},
    }
    alone = {
        "bf16 autocast": {"precision": {"compute_dtype": "bf16"}},
        "bf16 autocast + storage": {
            "precision": {"compute_dtype": "bf16", "storage_dtype": "bf16"}
        },
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
    for name in (
        "bf16 autocast + storage",
        "dynamic batching",
        "fused RMSNorm+QKV",
        "fused AdamW",
        "prefetch (2 batches)",
    ):
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
            ctypes.CDLL("libc.so.6").malloc_trim(
                0
            )  # hand freed arenas back so RSS starts from rest
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
    """One train() call: tokens/s over the steps after the first (wall and CPU clocks), peak
    memory, loss."""
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
    return {
        "tokens_per_s": {
            "wall": tokens_per_step * timed / (wall[-1] - wall[first]),
            "cpu": tokens_per_step * timed / max(cpu[-1] - cpu[first], 1e-9),
        },
        "peak_mem_mb": memory.mib(result),
        "final_loss": result.final_loss,
        "micro_batches": sorted(
            {start_mb} | {e["new_micro_batch"] for e in result.micro_batch_events}
        ),
        "micro_batch_events": [
            (e["step"], e["kind"], e["old_micro_batch"], e["new_micro_batch"])
            for e in result.micro_batch_events
        ],
    }


def spread(values: list[float]) -> dict[str, float]:
    return _spread(values, keys=("median", "min", "max", "q1", "q3"))


def _timer(clock: str):
    return time.process_time if clock == "cpu" else time.perf_counter


def gemm_shapes(ns: argparse.Namespace, micro_batch: int) -> list[tuple[int, str, int, int, int]]:
    """(count, layout, m, k, n) of every matmul one micro-batch's forward and backward runs (per
    step: x accumulation).

    Each linear layer runs three GEMMs, in the operand layouts autograd gives them: forward
    `F.linear(x, W)` (M x in, W out x in), the input's gradient `dy @ W` (M x out @ out x in) and
    the weight's `dy.T @ x` (a transposed M x out @ M x in), M = micro-batch x seq_len tokens.
    Attention's two products (per batch x head: S x hd @ hd x S, S x S @ S x hd) run forward and
    twice backward, here as the same-sized plain GEMMs.
    """
    args = preset_args(ns.preset, ns.seq_len)
    m, d, kv, h, s, hd = (
        micro_batch * ns.seq_len,
        args.dim,
        args.kv_heads * args.head_dim,
        args.hidden_dim,
        ns.seq_len,
        args.head_dim,
    )
    linears = [(d, d), (d, kv), (d, kv), (d, d), (d, h), (d, h), (h, d)]
    shapes: dict[tuple[str, int, int, int], int] = {}

    def add(count: int, shape: tuple[str, int, int, int]) -> None:
        shapes[shape] = shapes.get(shape, 0) + count

    for fan_in, fan_out in linears * args.n_layers + [(d, args.vocab_size)]:
        add(1, ("linear", m, fan_in, fan_out))
        add(1, ("mm", m, fan_out, fan_in))
        add(1, ("mm_tn", fan_out, m, fan_in))
    heads = micro_batch * args.n_heads * args.n_layers
    add(3 * heads, ("mm", s, hd, s))  # q @ k.T, and its two gradients have the same FLOPs
    add(3 * heads, ("mm", s, s, hd))  # p @ v, likewise
    return [(count, *shape) for shape, count in shapes.items()]


def _gemm(layout: str, m: int, k: int, n: int, device: torch.device, dtype: torch.dtype):
    """A callable running one GEMM of (m x k) @ (k x n) in the given operand layout."""
    if layout == "linear":
        x, w = (
            torch.randn(m, k, device=device, dtype=dtype),
            torch.randn(n, k, device=device, dtype=dtype),
        )
        return lambda: torch.nn.functional.linear(x, w)
    a = (
        torch.randn(k, m, device=device, dtype=dtype).t()
        if layout == "mm_tn"
        else torch.randn(m, k, device=device, dtype=dtype)
    )
    b = torch.randn(k, n, device=device, dtype=dtype)
    return lambda: a @ b


def gemm_step_seconds(
    ns: argparse.Namespace, device: torch.device, dtype: torch.dtype, micro_batch: int, clock: str
) -> float:
    """Seconds of GEMM one optimizer step needs at this micro-batch and dtype: each shape timed
    (best of 5)."""
    now, total = _timer(clock), 0.0
    for count, layout, m, k, n in gemm_shapes(ns, micro_batch):
        run = _gemm(layout, m, k, n, device, dtype)
        for _ in range(2):
            run()
        best = float("inf")
        for _ in range(5):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = now()
            run()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, now() - start)
        total += count * best
    return total * ns.global_batch / micro_batch


def gemm_floor(
    ns: argparse.Namespace,
    device: torch.device,
    optimized_micro_batch: int,
    clock: str,
    repeats: int = 3,
) -> dict[str, Any]:
    """What dtype alone allows: bf16 / fp32 GEMM time of one step at the model's own shapes.

    `gemm_floor` compares both dtypes at the baseline's micro-batch (dtype alone);
    `gemm_floor_at_optimized_micro_batch` puts bf16 at the largest micro-batch the optimized arm
    reached. fp32 and bf16 are timed back to back, `repeats` times, and the ratios' median kept: on
    a shared CPU (hyperthread siblings share the matrix units) one pass can be off by 2x.
    """
    passes = []
    for _ in range(repeats):
        fp32 = gemm_step_seconds(ns, device, torch.float32, ns.baseline_micro_batch, clock)
        bf16 = gemm_step_seconds(ns, device, torch.bfloat16, ns.baseline_micro_batch, clock)
        bf16_opt = (
            bf16
            if optimized_micro_batch == ns.baseline_micro_batch
            else gemm_step_seconds(ns, device, torch.bfloat16, optimized_micro_batch, clock)
        )
        passes.append((fp32, bf16, bf16_opt))
    floors = [b / f for f, b, _ in passes]
    at_opt = [o / f for f, _, o in passes]
    fp32, bf16, bf16_opt = (statistics.median(p[i] for p in passes) for i in range(3))
    flops = (
        sum(2 * c * m * k * n for c, _, m, k, n in gemm_shapes(ns, ns.baseline_micro_batch))
        * ns.global_batch
        / ns.baseline_micro_batch
    )
    return {
        "gemm_floor": statistics.median(floors),
        "gemm_floor_per_pass": floors,
        "gemm_floor_at_optimized_micro_batch": statistics.median(at_opt),
        "gemm_step_s": {
            "fp32": fp32,
            "bf16": bf16,
            f"bf16_micro_batch_{optimized_micro_batch}": bf16_opt,
        },
        "gemm_gflops": {"fp32": flops / fp32 / 1e9, "bf16": flops / bf16 / 1e9},
    }


def usd_per_million(tokens_per_s: float, price_per_hour: float) -> float:
    return price_per_hour / 3600 / tokens_per_s * 1e6


def _alone_row(runs: list[dict[str, dict]], name: str, clock: str) -> dict[str, float]:
    def tps(run: dict) -> float:
        return run["tokens_per_s"][clock]

    return {
        "tokens_per_s": statistics.median(tps(x[name]) for x in runs),
        "tokens_per_s_ratio": statistics.median(tps(x[name]) / tps(x["baseline"]) for x in runs),
        "peak_mem_mb": statistics.median(x[name]["peak_mem_mb"] for x in runs),
        "peak_mem_ratio": statistics.median(
            x[name]["peak_mem_mb"] / max(x["baseline"]["peak_mem_mb"], 1e-9) for x in runs
        ),
        "micro_batches": sorted({m for x in runs for m in x[name]["micro_batches"]}),
        "loss_delta": loss_delta(
            statistics.median(x["baseline"]["final_loss"] for x in runs),
            statistics.median(x[name]["final_loss"] for x in runs),
        ),
    }


def loss_delta(baseline_loss: float, loss: float) -> float:
    """|loss - baseline| / baseline: both ran the same steps of the same global batch, so equal
    tokens."""
    return abs(loss - baseline_loss) / baseline_loss


def ddp_main(
    ns: argparse.Namespace, baseline: dict, optimized: dict, price: float, rounds: int
) -> int:
    """Both arms as ns.ddp-process DDP: device-hours, electricity, completion time, cost per
    token."""
    from ddp import run_measured  # bench/ddp.py: one DDP run measured from rank 0's telemetry

    world = ns.ddp
    extra = {
        "distributed": {"nproc_per_node": world},
        "telemetry": {"enabled": True, "interval_s": 0.2},
    }
    arms = {"baseline": _merge(baseline, extra), "optimized": _merge(optimized, extra)}
    run_measured(
        strategy_from_dict(_merge(arms["baseline"], {"train": {"steps": 3}})),
        ns.device,
        warmup_steps=1,
    )  # warm the process: first-call costs are no arm's
    rows = []
    for r in range(rounds):
        order = ["baseline", "optimized"] if r % 2 == 0 else ["optimized", "baseline"]
        rows.append(
            {
                name: run_measured(strategy_from_dict(arms[name]), ns.device, warmup_steps=1)
                for name in order
            }
        )
    figures: dict[str, dict[str, Any]] = {}
    for name in arms:
        runs = [row[name] for row in rows]
        tps = statistics.median(x["tokens_per_s"] for x in runs)
        energy = [x["energy_j"] for x in runs if x["energy_j"] is not None]
        figures[name] = {
            "device_hours": statistics.median(x["device_s"] for x in runs) / 3600,
            "electricity_kwh": statistics.median(energy) / 3.6e6 if energy else None,
            "electricity_estimated": any(x["energy_estimated"] for x in runs),
            "completion_s": statistics.median(x["wall_s"] for x in runs),
            "tokens_per_s": tps,
            "usd_per_1m_tokens": usd_per_million(tps, price * world),
            "final_loss": statistics.median(x["final_loss"] for x in runs),
        }
    ratios = [row["baseline"]["tokens_per_s"] / row["optimized"]["tokens_per_s"] for row in rows]
    s = spread(ratios)
    unit = "GPU-hours" if ns.device.startswith("cuda") else "device-hours (CPU)"
    print(
        f"DDP comparison: {world} processes per arm "
        f"({'nccl' if ns.device.startswith('cuda') else 'gloo, one thread each'}), {ns.preset} "
        f"preset, seq_len {ns.seq_len}, global batch {ns.global_batch}, {ns.steps} steps, "
        f"{rounds} interleaved rounds; price ${price:.2f} per "
        f"device-hour{' (ASSUMED)' if ns.price_per_hour is None else ''}"
    )
    print(
        f"{'arm':<10} {unit:>19} {'electricity kWh':>16} {'completion s':>13} {'tokens/s':>9} "
        f"{'USD/1M tok':>11}"
    )
    for name, f in figures.items():
        kwh = (
            "n/a"
            if f["electricity_kwh"] is None
            else f"{f['electricity_kwh']:.6f}{' est.' if f['electricity_estimated'] else ''}"
        )
        print(
            f"{name:<10} {f['device_hours']:>19.5f} {kwh:>16} {f['completion_s']:>13.1f} "
            f"{f['tokens_per_s']:>9.0f} {f['usd_per_1m_tokens']:>11.4f}"
        )
    print(
        f"ratio (optimized / baseline USD per 1M tokens, both as {world}-process DDP): "
        f"{s['median']:.3f} (min {s['min']:.3f}, max {s['max']:.3f}); loss delta "
        f"{loss_delta(figures['baseline']['final_loss'], figures['optimized']['final_loss']):.4f}"
    )
    if ns.json:
        print(
            json.dumps(
                {
                    "mode": "ddp",
                    "world_size": world,
                    "device": ns.device,
                    "rounds": rounds,
                    "ratio": s["median"],
                    "ratio_spread": s,
                    "arms": figures,
                    "loss_delta": loss_delta(
                        figures["baseline"]["final_loss"], figures["optimized"]["final_loss"]
                    ),
                }
            )
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer rounds, steps and strategies alone: about 3 minutes on a 2-core CPU",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="last line: one JSON object with ratio and per-arm figures",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, seconds: checks the code path only"
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--preset", default=None, help="default small (--smoke: tiny)")
    parser.add_argument(
        "--seq-len", type=int, default=None, help="default 256 (matmuls dominate a step)"
    )
    parser.add_argument(
        "--global-batch", type=int, default=None, help="default 8 on CPU, 64 on CUDA"
    )
    parser.add_argument(
        "--baseline-micro-batch", type=int, default=None, help="default 2 on CPU, 8 on CUDA"
    )
    parser.add_argument(
        "--price-per-hour", type=float, default=None, help="USD per device-hour (default: assumed)"
    )
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto")
    parser.add_argument(
        "--clock",
        choices=("auto", "wall", "cpu"),
        default="auto",
        help="what a step's time is: wall clock, or this process's CPU time (auto: CPU time on a "
        "CPU, where other tenants' load moves the wall clock by tens of per cent; wall on CUDA)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads on CPU (default 1: OpenMP threads spinning against other "
        "processes on a small shared box swamp what is measured; 0 keeps torch's default)",
    )
    parser.add_argument(
        "--ddp",
        type=int,
        default=0,
        metavar="N",
        help="both arms as N-process DDP: device-hours, electricity, completion "
        "time (the seed's table)",
    )
    ns = parser.parse_args()
    dev = resolve_device(ns.device)
    cuda = dev.type == "cuda"
    ns.device = str(dev)
    if ns.threads and not cuda:
        torch.set_num_threads(ns.threads)
    ns.clock = ns.clock if ns.clock != "auto" else ("wall" if cuda else "cpu")
    ns.preset = ns.preset or ("tiny" if ns.smoke else "small")
    ns.seq_len = ns.seq_len or (32 if ns.smoke else 256)
    ns.global_batch = ns.global_batch or (4 if ns.smoke else 64 if cuda else 8)
    ns.baseline_micro_batch = ns.baseline_micro_batch or (8 if cuda and not ns.smoke else 2)
    if ns.smoke:
        rounds, ns.steps, alone_rounds = 1, 3, 0
    elif cuda:
        rounds, ns.steps, alone_rounds = (3, 12, 1) if ns.quick else (6, 30, 2)
    else:
        rounds, ns.steps, alone_rounds = (2, 6, 0) if ns.quick else (5, 10, 1)
    compile_optimized = ns.compile == "on" or (ns.compile == "auto" and cuda)
    price = ns.price_per_hour if ns.price_per_hour is not None else ASSUMED_PRICE[dev.type]
    baseline, optimized, alone = arm_configs(ns, compile_optimized)
    skipped = {}
    if not cuda:
        skipped["embedding offload (cpu)"] = (
            "no device memory to spare on a CPU run: the table is already there"
        )
    if ns.smoke or (ns.quick and not cuda):
        for name in alone:
            if name not in ("bf16 autocast", "dynamic batching"):
                skipped.setdefault(
                    name,
                    "--quick and --smoke keep bf16 and dynamic batching alone; "
                    "the full run measures it",
                )
    for name in skipped:
        alone.pop(name)

    if ns.ddp:
        if ns.ddp < 2 or ns.global_batch % ns.ddp:
            parser.error(
                f"--ddp: {ns.ddp} processes must be 2 or more and divide the global "
                f"batch {ns.global_batch}"
            )
        return ddp_main(ns, baseline, optimized, price, rounds)
    started = time.perf_counter()
    run_arm(
        _merge(baseline, {"train": {"steps": 2}}), ns.device
    )  # warm the process: first-call costs are no arm's
    # compile, and meet every micro-batch shape the scaler can reach, before anything is timed
    run_arm(
        _merge(
            optimized, {"train": {"steps": 2 + 2 * (PROBE_STEPS + 1) if compile_optimized else 2}}
        ),
        ns.device,
    )
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
    reached = max(m for r in per_round for m in r["optimized"]["micro_batches"])
    rates = gemm_floor(ns, dev, reached, ns.clock)
    elapsed = time.perf_counter() - started
    return report(
        ns,
        dev,
        price,
        per_round,
        alone_rows,
        skipped,
        rates,
        compile_optimized,
        elapsed,
        baseline,
        optimized,
    )


def report(
    ns,
    dev,
    price,
    per_round,
    alone_rows,
    skipped,
    rates,
    compile_optimized,
    elapsed,
    baseline,
    optimized,
) -> int:
    label = device_label(dev)
    args = preset_args(ns.preset, ns.seq_len)
    flops_per_token = args.flops_per_token(ns.seq_len)
    arms: dict[str, dict[str, Any]] = {}
    for name, config in (("baseline", baseline), ("optimized", optimized)):
        tps = [r[name]["tokens_per_s"][ns.clock] for r in per_round]
        median_tps = statistics.median(tps)
        peak = peak_flops(label, config["precision"]["compute_dtype"])
        arms[name] = {
            "tokens_per_s": median_tps,
            "tokens_per_s_spread": spread(tps),
            "tokens_per_s_wall": statistics.median(
                r[name]["tokens_per_s"]["wall"] for r in per_round
            ),
            "peak_mem_mb": statistics.median(r[name]["peak_mem_mb"] for r in per_round),
            "usd_per_1m_tokens": usd_per_million(median_tps, price),
            "mfu": None if peak is None else median_tps * flops_per_token / peak,
            "final_loss": statistics.median(r[name]["final_loss"] for r in per_round),
            "micro_batches": sorted({m for r in per_round for m in r[name]["micro_batches"]}),
        }
    ratios = [
        r["baseline"]["tokens_per_s"][ns.clock] / r["optimized"]["tokens_per_s"][ns.clock]
        for r in per_round
    ]
    wall_ratios = [
        r["baseline"]["tokens_per_s"]["wall"] / r["optimized"]["tokens_per_s"]["wall"]
        for r in per_round
    ]
    s = spread(ratios)
    floor_ratio = s["median"] / rates["gemm_floor"]
    delta = loss_delta(arms["baseline"]["final_loss"], arms["optimized"]["final_loss"])
    used = arms["optimized"]["micro_batches"]
    flagged = {
        name: row["loss_delta"]
        for name, row in alone_rows.items()
        if row["loss_delta"] > LOSS_TARGET
    }
    if delta > LOSS_TARGET:
        flagged["optimized"] = delta
    mem = (
        "CUDA max allocated" if dev.type == "cuda" else "RSS growth, sampled every 10 ms (estimate)"
    )
    clock = (
        "wall clock"
        if ns.clock == "wall"
        else "this process's CPU time (time.process_time; wall-clock figures alongside)"
    )
    print(
        f"cost benchmark: {ns.preset} preset ({args.num_params() / 1e6:.1f}M parameters), "
        f"seq_len {ns.seq_len}, global batch {ns.global_batch}, baseline micro-batch "
        f"{ns.baseline_micro_batch}, on "
        f"{label}{'' if dev.type == 'cuda' else f', torch threads {torch.get_num_threads()}'}"
    )
    print(
        f"{len(per_round)} interleaved rounds x {ns.steps} steps (the first of each run "
        f"untimed); step time: {clock}"
    )
    print(
        "optimized = bf16 autocast + bf16 storage (fp32 masters) + dynamic batching "
        f"[{ns.baseline_micro_batch}, {ns.global_batch}] + fused RMSNorm+QKV + fused AdamW + "
        f"prefetch{' + torch.compile' if compile_optimized else ' (no compile)'}"
    )
    print(
        f"price: ${price:.2f} per device-hour, "
        f"{'ASSUMED (--price-per-hour sets it)' if ns.price_per_hour is None else 'given'}; "
        "cost = device time only, energy excluded"
    )
    print()
    print(
        f"{'arm':<10} {'tokens/s':>9} {'(wall)':>8} {'peak MiB':>9} {'USD/1M tok':>11} "
        f"{'MFU':>7} {'loss':>7}  micro-batches"
    )
    for name, a in arms.items():
        mfu = "-" if a["mfu"] is None else f"{a['mfu']:.3f}"
        print(
            f"{name:<10} {a['tokens_per_s']:>9.1f} {a['tokens_per_s_wall']:>8.1f} "
            f"{a['peak_mem_mb']:>9.1f} {a['usd_per_1m_tokens']:>11.4f} {mfu:>7} "
            f"{a['final_loss']:>7.3f}  {a['micro_batches']}"
        )
    met = s["median"] <= TARGET
    print(
        f"\nratio (optimized / baseline USD per 1M tokens) = {s['median']:.3f}  spread: min "
        f"{s['min']:.3f}, max {s['max']:.3f}, IQR [{s['q1']:.3f}, {s['q3']:.3f}]  target <= "
        f"{TARGET:.2f}: {'MET' if met else 'NOT MET'}"
    )
    print(
        f"per round: {', '.join(f'{x:.3f}' for x in ratios)}   (wall clock: "
        f"{', '.join(f'{x:.3f}' for x in wall_ratios)})"
    )
    print(f"\neach strategy alone vs baseline (median; peak memory: {mem})")
    print(
        f"{'strategy':<26} {'tokens/s':>9} {'x base':>7} {'peak MiB':>9} {'x base':>7}  "
        "micro-batches"
    )
    for name, row in alone_rows.items():
        print(
            f"{name:<26} {row['tokens_per_s']:>9.1f} {row['tokens_per_s_ratio']:>7.3f} "
            f"{row['peak_mem_mb']:>9.1f} {row['peak_mem_ratio']:>7.3f}  {row['micro_batches']}"
        )
    for name, why in skipped.items():
        print(f"{name:<26} skipped: {why}")
    print(f"{'strategy':<26} loss delta vs baseline (target <= {LOSS_TARGET})")
    for name, row in alone_rows.items():
        print(
            f"{name:<26} {row['loss_delta']:.4f}"
            f"{'  FLAGGED: speed bought with loss' if name in flagged else ''}"
        )
    g = rates["gemm_gflops"]
    print(
        "\nGEMM at the model's own shapes (one step, baseline micro-batch "
        f"{ns.baseline_micro_batch}): fp32 {g['fp32']:.0f} GFLOP/s, bf16 {g['bf16']:.0f} GFLOP/s"
    )
    print(
        "gemm_floor (bf16 / fp32 GEMM time: the cost ratio dtype alone allows) = "
        f"{rates['gemm_floor']:.3f} (passes: "
        f"{', '.join(f'{x:.3f}' for x in rates['gemm_floor_per_pass'])}); with bf16 at "
        f"micro-batch {max(used)}: {rates['gemm_floor_at_optimized_micro_batch']:.3f}"
    )
    print(
        f"floor_ratio (ratio / gemm_floor) = {floor_ratio:.3f}  target <= {FLOOR_TARGET:.2f}: "
        f"{'MET' if floor_ratio <= FLOOR_TARGET else 'NOT MET'}"
    )
    print(
        f"loss_delta (|optimized - baseline| / baseline final loss, equal tokens) = {delta:.4f}"
        f"  target <= {LOSS_TARGET}: "
        f"{'MET' if delta <= LOSS_TARGET else 'NOT MET: the optimized arm buys speed with loss'}"
    )
    above = max(used) > ns.baseline_micro_batch
    print(
        f"optimized micro-batches {used}: {'above' if above else 'NOT above'} the baseline's "
        f"{ns.baseline_micro_batch}; events per run: "
        f"{[r['optimized']['micro_batch_events'] for r in per_round]}"
    )
    print(f"wall time {elapsed:.0f} s")
    if ns.json:
        print(
            json.dumps(
                {
                    "ratio": s["median"],
                    "ratio_spread": (s["max"] - s["min"]) / 2,
                    "ratio_min": s["min"],
                    "ratio_max": s["max"],
                    "ratio_iqr": [s["q1"], s["q3"]],
                    "ratio_per_round": ratios,
                    "ratio_wall_clock_per_round": wall_ratios,
                    "clock": ns.clock,
                    "target": TARGET,
                    "met": met,
                    "price_per_hour_usd": price,
                    "price_assumed": ns.price_per_hour is None,
                    "device": label,
                    "preset": ns.preset,
                    "seq_len": ns.seq_len,
                    "global_batch": ns.global_batch,
                    "baseline_micro_batch": ns.baseline_micro_batch,
                    "steps_per_run": ns.steps,
                    "rounds": len(per_round),
                    "compile_in_optimized": compile_optimized,
                    "peak_memory_method": mem,
                    "arms": arms,
                    "strategies_alone": alone_rows,
                    "strategies_skipped": skipped,
                    "gemm_floor": rates["gemm_floor"],
                    "floor_ratio": floor_ratio,
                    "floor_target": FLOOR_TARGET,
                    "floor_met": floor_ratio <= FLOOR_TARGET,
                    "gemm_floor_per_pass": rates["gemm_floor_per_pass"],
                    "gemm_floor_at_optimized_micro_batch": rates[
                        "gemm_floor_at_optimized_micro_batch"
                    ],
                    "gemm_step_s": rates["gemm_step_s"],
                    "gemm_gflops": rates["gemm_gflops"],
                    "loss_delta": delta,
                    "loss_target": LOSS_TARGET,
                    "loss_flagged": flagged,
                    "optimized_micro_batches": used,
                    "optimized_above_baseline_micro_batch": above,
                    "optimized_micro_batch_events": [
                        r["optimized"]["micro_batch_events"] for r in per_round
                    ],
                    "wall_s": elapsed,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
