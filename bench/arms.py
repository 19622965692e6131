"""The cost benchmark: plain PyTorch against costlab's strategies, same model, data and machine.

    python bench/arms.py [--quick] [--json] [--device cpu|cuda] [--price-per-hour USD]
                         [--compile auto|on|off] [--rounds N] [--steps N] [--budget-s S]
    python bench/arms.py --ddp N [--quick] [--json] [--device cpu|cuda]
    python bench/arms.py --smoke [--json] [--ddp N]

`--smoke`: the tiny preset at seq_len 32, global batch 4, one round of 3 steps, bf16 and dynamic
batching alone only: the same code path and JSON keys in seconds, to check that the benchmark
runs (tests/bench); its figures mean nothing.

The shape: the `small` preset (26M parameters) at seq_len 256, global batch 8 (64 on CUDA).
At seq_len 64 and micro-batch 2 a forward pass is 128 tokens: per-op overhead, norms and the
optimizer dominate, and a dtype or a batching strategy barely shows. Real LLM training is
matmul-bound; at seq_len 256 the model's GEMMs are most of a step on this CPU too, so what
a cheaper dtype and larger micro-batches buy here is what they buy there. `--quick` (2 rounds
of 6 steps, bf16 and dynamic batching alone only) takes about 3 minutes on a 2-core CPU, and
never more than its budget (`--budget-s`, 300 s with --quick): a round, a strategy alone or a
GEMM pass that would not fit is skipped, and the output says so.

The device first: `gpu_runtime.profile.measure_profile` times a few GEMMs per dtype (about
2 s) and reads the CPU flags or the GPU; `best_dtype` is the fastest dtype that runs natively
here and beats fp32 by >= 1.1x (bf16 on an AMX CPU or a GPU, fp32 on an AVX2-only CPU, where
bf16 is emulated at 1/30 to 1/60 of fp32). The profile goes to every train() call
(`profile=`), and into the output (`profile`, `best_dtype`).

Arms, each a strategy run through gpu_runtime.train() (the real code path):

* baseline: fp32, a static micro-batch (`--baseline-micro-batch`), eager, no prefetch;
* optimized: `precision.compute_dtype: auto` (train() resolves it from the profile: the
  device's best dtype, through autocast) + dynamic batching (starting at the baseline's
  micro-batch and growing toward the global batch while each larger size is measurably
  faster: one timed step per size, so it acts within the run) + fused kernels (RMSNorm+QKV,
  and AdamW: `kernels.fused_optimizer`) + prefetch + `kernels.attention: auto` +
  `kernels.compile: auto` (`--compile auto`, the default: the run's payback rule keeps a short run
  eager; `--compile on` compiles every run, `off` none). Parameters are
  stored in the resolved dtype where the schema allows it; it refuses any storage below fp32
  with `compute_dtype: auto` (auto may resolve to fp32), so they are stored in fp32 and the
  output names the storage dtype (`optimized_precision`).

Both arms run in one process, interleaved over rounds (baseline first in even rounds),
so the machine's drift hits both. A step's time is the gap between two calls of the
cancel callback, which train() makes before every step; each run's first step is
warm-up (allocator, caches, compilation) and not timed. USD per 1M tokens applies one
device-hour price to both arms (an assumed price: pass your own), so the headline
`ratio` (optimized / baseline cost per token) is the inverse throughput ratio, with its
spread over rounds. Target: ratio <= 0.40. A ratio above 1.0 means the "optimized" arm is
dearer here: the output says so plainly (`optimized_is_dearer`). The bench does not then
swap in the cheaper arm: picking the better of two noisy measurements after the fact would
bias the ratio; the strategy itself falls back (auto resolves to fp32 where nothing is
faster, dynamic batching grows only while faster).

Projected to a real run's length (`--steps-projected N`, default 100,000, the seed's): the
payback rule (gpu_runtime.compile_payback) decides for a run of N steps on the optimized arm's
eager step time (its warm-up run) and the compile figures learned on this device class (or the
priors). Where it says compile, a compiled copy of the optimized arm (`optimized_compiled`) runs
in every round, interleaved, after one timed first compile; `ratio_projected` = baseline cost per
token / the compiled arm's over N steps with that compile amortised (else the optimized arm's
own), per round, and `floor_ratio_projected` = ratio_projected / gemm_floor. `projection` holds the
decisions at N and at the demo's 30 steps, and `optimized_compile` what the optimized arm's own
auto chose at its run length. --smoke compiles with dynamo's eager backend (no C++ build).

Held to the machine's floor: every GEMM one step runs (each linear layer's forward and two
backward products, attention's products) is timed at the model's own shapes. `gemm_floor` =
GEMM time of one step in the device's best dtype at the largest micro-batch the optimized arm
reached / fp32 GEMM time at the baseline's micro-batch: the cost ratio that dtype and
micro-batch allow if a step were GEMMs only (on a host whose best dtype is fp32: fp32 at the
larger micro-batch / fp32 at the baseline's). `floor_ratio` = ratio / gemm_floor (target
<= 1.10): how close the optimized arm comes to it; what is not a GEMM (norms, softmax,
elementwise, the optimizer) gains neither from the dtype nor from the micro-batch, so a
device where the best dtype's GEMMs are much faster than fp32 sits further from its floor.
Extra keys: `gemm_floor_dtype_alone` (best dtype / fp32, both at the baseline's micro-batch)
and, where bf16 is native, the bf16 figures (`gemm_floor_bf16`: bf16 / fp32 at the baseline's
micro-batch, the old `gemm_floor`). `loss_delta` = |optimized - baseline final loss| /
baseline at equal tokens (target <= 0.02); a strategy above it buys speed with loss and is
flagged. `optimized_micro_batches` lists every micro-batch the optimized arm ran.

At equal quality: both headline arms evaluate a held-out loss (mean next-token cross-entropy in
fp32, autocast off, on EVAL_ROWS windows of the documents the synthetic generator writes after
the training corpus's: the same distribution, never trained on) every max(1, steps // 10) steps
from the untrained model to the final one (`eval_curve`), between two steps, with the
evaluation's time taken out of both clocks (`eval_s_excluded`): the bench compares training
cost. The target is the baseline's final held-out loss in each round (`target_loss`); an arm's
`cost_to_target` is the tokens at which its curve first reaches it (within REACH_TOLERANCE,
0.1 %), interpolated between the two evaluations that straddle it, times its measured USD per
token. `ratio_to_quality` = optimized / baseline cost to the target, per round (median, min,
max, as `ratio`); null with `ratio_to_quality_why` where the optimized arm never reaches it.
`--ddp` does not report it.

Then each strategy alone against the baseline: tokens/s, peak memory and loss delta. Rows that
force a dtype (bf16 autocast, bf16 storage) are measured comparisons, labelled forced; where
bf16 is not native, --quick and --smoke skip them (a step would take tens of times the
baseline's) and the full run caps them to one short round. Peak memory is the CUDA
allocator's maximum on a GPU; on CPU the growth of the process's resident set over the run,
sampled every 10 ms after returning freed memory to the OS (an estimate). Telemetry is off in
every arm: its cost is bench/runtime_overhead.py's subject.

SIGTERM: train() already stops at the next step boundary; the bench then starts no further
arm, round, strategy or GEMM pass, prints what it measured so far (its JSON with
`"interrupted": true`) and exits 143. A step or GEMM that has not ended within GRACE_S of the
signal is not waited for: the bench prints the same and exits 143 at once.

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
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402
import torch  # noqa: E402
from _setup import (  # noqa: E402  (bench/, the script's directory)
    INTERRUPTED_RC,
    Interrupted,
    Stopper,
)
from _setup import spread as _spread  # noqa: E402

from gpu_runtime import StrategyError, strategy_from_dict, train  # noqa: E402
from gpu_runtime.capability import TORCH_DTYPES, device_label, resolve_device  # noqa: E402
from gpu_runtime.data import SYNTHETIC_TOKENS, synthetic_documents  # noqa: E402
from gpu_runtime.device_keys import device_profile  # noqa: E402
from gpu_runtime.kernels.compiling import CompileControl  # noqa: E402
from gpu_runtime.mfu import peak_flops  # noqa: E402
from gpu_runtime.model import BOS, EOS, preset_args  # noqa: E402
from gpu_runtime.profile import DeviceProfile, best_dtype, measure_profile  # noqa: E402

TARGET = 0.40
STEPS_PROJECTED = 100_000  # the seed's run length: what the projected figures are for
DEMO_STEPS = 30  # the demo's run length: auto must not compile there unless it pays
MIB = 2**20
# Assumed on-demand prices per device-hour (USD), only to put a unit on the cost: the ratio does not
# depend on it.
ASSUMED_PRICE = {"cpu": 0.10, "cuda": 3.50}  # a 2-vCPU cloud VM; one H200-class GPU
# timed steps per micro-batch size (after one warm-up step): short runs must see the scaler act
PROBE_STEPS = 1
FLOOR_TARGET = 1.10  # ratio / gemm_floor
LOSS_TARGET = 0.02  # |optimized - baseline final loss| / baseline, at equal tokens
# --quick ends within this: a round, a strategy alone or a GEMM pass that would not fit is skipped
QUICK_BUDGET_S = 300.0
FORCED_STEPS = 3  # a forced-dtype row where that dtype is not native: one round this short
# the rows that force a dtype whatever the device does best: measured comparisons, labelled forced
FORCED = {"bf16 autocast": "bf16", "bf16 autocast + storage": "bf16"}
EVAL_ROWS = 4  # held-out windows of seq_len+1 tokens each evaluation reads (1,028 tokens at 256)
EVAL_POINTS = 10  # evaluations during a run at most (every max(1, steps // 10) steps), and the end
# A target loss counts as reached within this fraction of it: twins that differ only in fp32 or
# bf16 arithmetic end 0.001-0.02 % apart, which must not decide "reached" or "not reached".
REACH_TOLERANCE = 1e-3


def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def optimized_precision(best: str) -> tuple[dict, list[str]]:
    """The optimized arm's precision section: compute `auto` (train() resolves it to `best`),
    parameters stored in `best` when it is below fp32 and the schema takes that with `auto`, else
    fp32; and a note when the schema refused."""
    section = {"compute_dtype": "auto", "storage_dtype": "fp32"}
    if best == "fp32":
        return section, []
    wanted = {"compute_dtype": "auto", "storage_dtype": best}
    try:
        strategy_from_dict({"precision": wanted})
    except StrategyError as exc:
        return section, [
            f"optimized arm: the schema refuses {best} storage with compute_dtype auto "
            f"({exc}); its parameters are stored in fp32"
        ]
    return wanted, []


def arm_configs(
    ns: argparse.Namespace, compile_optimized: bool, best: str = "bf16"
) -> tuple[dict, dict, dict[str, dict], list[str]]:
    """(baseline, optimized, {strategy alone: overrides of the baseline}, notes); `best` is the
    device's best dtype (gpu_runtime.profile.best_dtype), which sets the optimized arm's
    storage."""
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
                # where the profile's GEMM throughput stops rising, at most the global batch
                "max_micro_batch": "auto",
                "probe_steps": PROBE_STEPS,
            }
        },
        "train": {"micro_batch": None},
    }
    alone = {
        "precision auto": {"precision": {"compute_dtype": "auto"}},
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
    precision, notes = optimized_precision(best)
    optimized = _merge(baseline, {"precision": precision})
    for name in ("dynamic batching", "fused RMSNorm+QKV", "fused AdamW", "prefetch (2 batches)"):
        optimized = _merge(optimized, alone[name])
    # what costlab recommends on any device: the attention kernel that is cheaper there (math on a
    # CPU, SDPA's fused kernels elsewhere: gpu_runtime.device_keys)
    optimized = _merge(optimized, {"kernels": {"attention": "auto"}})
    if compile_optimized:
        optimized = _merge(optimized, alone["torch.compile"])
    elif ns.compile == "auto":  # the run's own payback rule: eager where its length cannot repay
        optimized = _merge(optimized, {"kernels": {"compile": "auto"}})
    return baseline, optimized, alone, notes


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


def run_arm(
    config: dict,
    device: str,
    profile: DeviceProfile | None = None,
    stopper: Stopper | None = None,
    held: torch.Tensor | None = None,
) -> dict[str, Any]:
    """One train() call: tokens/s over the steps after the first (wall and CPU clocks), peak
    memory, loss. With `held` (held_out_rows), also the held-out loss every
    max(1, steps // EVAL_POINTS) steps, from the untrained model to the final one
    (`eval_curve`: (tokens, loss)); each evaluation runs between two steps, and its time is
    taken out of both clocks, so it is no part of the run's cost (`eval_s`). A run that SIGTERM
    (or the stopper) cut short raises Interrupted: its figures are not a run's."""
    wall: list[float] = []
    cpu: list[float] = []
    excluded = {"wall": 0.0, "cpu": 0.0}
    curve: list[tuple[int, float]] = []  # (steps done, held-out loss)
    strategy = strategy_from_dict(config)
    every = max(1, strategy.train.steps // EVAL_POINTS)

    def evaluate(done: int) -> None:
        module = box.get("module")
        if held is None or module is None or (curve and curve[-1][0] == done):
            return
        w, c = time.perf_counter(), time.process_time()
        curve.append((done, held_out_loss(module, held)))
        excluded["wall"] += time.perf_counter() - w
        excluded["cpu"] += time.process_time() - c

    def mark() -> bool:
        wall.append(time.perf_counter() - excluded["wall"])
        cpu.append(time.process_time() - excluded["cpu"])
        done = len(wall) - 1  # train() calls this before every step: the steps done so far
        if done % every == 0 and done < strategy.train.steps:
            evaluate(done)
        return stopper is not None and stopper.stopped

    if stopper is not None:
        stopper.check()
    dev = resolve_device(device)
    began = time.perf_counter()
    with PeakMemory(dev) as memory, capture_model() as box:
        result = train(strategy, device=device, cancel=mark, profile=profile)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        mark()  # the last step ends when train() returns (no checkpoint is written)
        evaluate(result.steps)  # the final model
    if result.status != "completed" or (stopper is not None and stopper.stopped):
        if stopper is not None:
            stopper.event.set()
        raise Interrupted
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
        "eval_curve": [(done * tokens_per_step, loss) for done, loss in curve],
        "eval_every_steps": every,
        "eval_s": dict(excluded),
        "micro_batches": sorted(
            {start_mb} | {e["new_micro_batch"] for e in result.micro_batch_events}
        ),
        "micro_batch_events": [
            (e["step"], e["kind"], e["old_micro_batch"], e["new_micro_batch"])
            for e in result.micro_batch_events
        ],
        "compute_dtype": (result.strategies.get("precision.compute_dtype") or {}).get(
            "resolved", strategy.precision.compute_dtype
        ),
        "auto": result.strategies.get("precision.compute_dtype"),
        "compile": result.strategies.get("kernels.compile"),
        "tokens_per_step": tokens_per_step,
        "seconds": time.perf_counter() - began,
    }


@contextlib.contextmanager
def smoke_compiles(smoke: bool) -> Iterator[None]:
    """--smoke: compile with dynamo's eager backend (tracing, no C++ build): the same code path in
    seconds. Otherwise torch.compile as the runs use it."""
    if not smoke:
        yield
        return
    previous = CompileControl.compile_fn
    CompileControl.compile_fn = lambda self, model: torch.compile(model, backend="eager")
    try:
        yield
    finally:
        CompileControl.compile_fn = previous


def projection_decision(
    ns: argparse.Namespace, b: Bench, warm: dict[str, Any], compile_optimized: bool
) -> dict[str, Any]:
    """The payback rule for a run of --steps-projected steps: the optimized arm's eager step time
    (its warm-up run, wall clock), and the compile figures learned on this device class (the
    ledger) or the priors. `compile`: True where it pays (a dict of what the compile cost, once
    measured)."""
    from gpu_runtime.compile_payback import CompileLedger, decide, prior, shape_key
    from gpu_runtime.kernels.compiling import (
        CACHE_URL_ENV,
        cache_name,
        configure_caches,
        graph_shape,
    )

    config = strategy_from_dict(_merge(b.optimized, {"kernels": {"compile": False}}))
    cache = configure_caches()
    ledger = CompileLedger.default(os.environ.get(CACHE_URL_ENV) if cache["remote"] else None)
    known = ledger.get(shape_key(b.profile.device_class, torch.__version__, graph_shape(config)))
    figures = known or prior(b.dev.type)
    step_s = warm["tokens_per_step"] / warm["tokens_per_s"]["wall"]
    decisions = {
        str(steps): decide(
            planned_steps=steps,
            done_steps=0,
            eager_step_s=step_s,
            figures=figures,
            cached=cache_name(cache) in figures.caches,
        ).as_dict()
        for steps in (DEMO_STEPS, ns.steps_projected)
    }
    pays = decisions[str(ns.steps_projected)]["compile"]
    return {
        "steps": ns.steps_projected,
        "decisions": decisions,
        "compile": (pays and ns.compile == "auto") or compile_optimized,
        "eager_step_s": step_s,
    }


def projected_ratios(per_round: list[dict], projection: dict | None, clock: str) -> dict:
    """Optimized / baseline cost per token for a run of N steps, per round: the compiled arm where
    the payback rule compiles at N (its one compile, wall seconds, amortised over the N steps),
    else the optimized arm as measured."""
    if not per_round or projection is None:
        return {}
    n = projection["steps"]
    compiled = projection["compile"] if isinstance(projection["compile"], dict) else None
    out = []
    for r in per_round:
        arm = r.get("optimized_compiled") or r["optimized"]  # the compiled copy, where it ran
        tps = arm["tokens_per_s"][clock]
        if compiled is not None:  # its one compile, amortised over the n steps
            step_s = arm["tokens_per_step"] / tps
            tps = arm["tokens_per_step"] * n / (n * step_s + (compiled.get("compile_s") or 0.0))
        out.append(r["baseline"]["tokens_per_s"][clock] / tps)
    return spread(out) | {"per_round": out}


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
    ns: argparse.Namespace,
    device: torch.device,
    dtype: torch.dtype,
    micro_batch: int,
    clock: str,
    stopper: Stopper | None = None,
) -> float:
    """Seconds of GEMM one optimizer step needs at this micro-batch and dtype: each shape timed
    (best of 5)."""
    now, total = _timer(clock), 0.0
    for count, layout, m, k, n in gemm_shapes(ns, micro_batch):
        if stopper is not None:
            stopper.check()
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


def _floor_needs(ns: argparse.Namespace, best: str, reached: int, bf16: bool) -> list[tuple]:
    """The (dtype, micro-batch) GEMM timings one floor pass takes, each once: fp32 at the
    baseline's micro-batch, the best dtype there and at `reached`, and (`bf16`) bf16 at both."""
    base = ns.baseline_micro_batch
    needs = [("fp32", base), (best, base), (best, reached)]
    if bf16:
        needs += [("bf16", base), ("bf16", reached)]
    return list(dict.fromkeys(needs))


def gemm_pass_estimate_s(ns: argparse.Namespace, profile: DeviceProfile, needs: list) -> float:
    """About how long one floor pass takes, from the profile's GFLOP/s (each shape runs 7 times),
    with a margin: what --quick's budget keeps back for it."""
    fp32 = profile.dtypes["fp32"].gflops or 1.0
    total = 0.0
    for dtype, micro_batch in needs:
        r = profile.dtypes.get(dtype)
        gflops = r.gflops if r is not None and r.gflops else fp32 / 60
        flops = sum(2 * m * k * n for _, _, m, k, n in gemm_shapes(ns, micro_batch))
        total += 7 * flops / (gflops * 1e9)
    return 1.5 * total + 0.5


def gemm_floor(
    ns: argparse.Namespace,
    device: torch.device,
    best: str,
    reached: int,
    clock: str,
    *,
    bf16: bool = False,
    repeats: int = 3,
    stopper: Stopper | None = None,
    fits: Callable[[float], bool] = lambda seconds: True,
    on_pass: Callable[[dict[str, Any]], None] = lambda figures: None,
) -> dict[str, Any]:
    """What dtype and micro-batch allow: one step's GEMM time at the model's own shapes in the
    device's `best` dtype at the optimized arm's largest micro-batch `reached`, over fp32 at the
    baseline's micro-batch (`gemm_floor`).

    Also `gemm_floor_dtype_alone` (`best` / fp32, both at the baseline's micro-batch) and, with
    `bf16` (where bf16 is native), `gemm_floor_bf16` (bf16 / fp32 at the baseline's micro-batch:
    this benchmark's old `gemm_floor`) and bf16 at `reached`. The timings of a pass run back to
    back, up to `repeats` passes (another only if `fits` its duration), and each ratio's median
    over passes is kept: on a shared CPU (hyperthread siblings share the matrix units) one pass
    can be off by 2x. `on_pass` gets the figures so far after each pass.
    """
    base = ns.baseline_micro_batch
    needs = _floor_needs(ns, best, reached, bf16)
    flops = (
        sum(2 * c * m * k * n for c, _, m, k, n in gemm_shapes(ns, base)) * ns.global_batch / base
    )  # per step: the same at any micro-batch (FLOPs per token do not depend on it)
    passes: list[dict[tuple[str, int], float]] = []
    figures: dict[str, Any] = {}
    for i in range(repeats):
        began = time.perf_counter()
        times = {
            (dtype, mb): gemm_step_seconds(ns, device, TORCH_DTYPES[dtype], mb, clock, stopper)
            for dtype, mb in needs
        }
        passes.append(times)

        def ratios(dtype: str, mb: int) -> list[float]:
            return [p[(dtype, mb)] / p[("fp32", base)] for p in passes]

        def key(dtype: str, mb: int) -> str:
            return dtype if mb == base else f"{dtype}_micro_batch_{mb}"

        floors = ratios(best, reached)
        step_s = {key(d, mb): statistics.median(p[(d, mb)] for p in passes) for d, mb in needs}
        figures = {
            "gemm_floor": statistics.median(floors),
            "gemm_floor_per_pass": floors,
            "gemm_floor_dtype": best,
            "gemm_floor_micro_batch": reached,
            "gemm_floor_dtype_alone": statistics.median(ratios(best, base)),
            # the old key: the floor with the optimized arm's micro-batch, now gemm_floor itself
            "gemm_floor_at_optimized_micro_batch": statistics.median(floors),
            "gemm_floor_bf16": statistics.median(ratios("bf16", base)) if bf16 else None,
            "gemm_floor_bf16_at_optimized_micro_batch": (
                statistics.median(ratios("bf16", reached)) if bf16 else None
            ),
            "gemm_step_s": step_s,
            "gemm_gflops": {name: flops / s / 1e9 for name, s in step_s.items()},
            "gemm_passes": len(passes),
        }
        on_pass(figures)
        if i + 1 < repeats and not fits(time.perf_counter() - began):
            break
    return figures


def usd_per_million(tokens_per_s: float, price_per_hour: float) -> float:
    return price_per_hour / 3600 / tokens_per_s * 1e6


# --- quality: held-out loss during training, and what reaching a target loss costs --------------


def cost_to_target(
    curve: list[tuple[float, float]],
    target: float,
    usd_per_token: float,
    tolerance: float = REACH_TOLERANCE,
) -> dict[str, Any]:
    """What it cost a run to first reach held-out loss `target` (within `tolerance` of it).

    `curve`: (trained tokens so far, held-out loss) in training order, from the untrained model
    (0 tokens) to the final one. A run's cost so far is its tokens times its measured USD per
    token (the timed steps' rate, evaluation excluded), so cumulative cost is linear in tokens:
    the target is placed by linear interpolation between the two evaluations that straddle it,
    which is interpolating on cumulative cost. Never reached: `usd` None and `why`."""
    goal = target * (1 + tolerance)
    previous: tuple[float, float] | None = None
    for tokens, loss in curve:
        if loss <= goal:
            at = tokens
            if previous is not None:  # previous loss > goal >= loss
                t0, l0 = previous
                at = t0 + (l0 - goal) / (l0 - loss) * (tokens - t0)
            return {"usd": at * usd_per_token, "tokens": at, "reached": True, "why": None}
        previous = (tokens, loss)
    if not curve:
        return {"usd": None, "tokens": None, "reached": False, "why": "no evaluation"}
    tokens, loss = curve[-1]
    return {
        "usd": None,
        "tokens": None,
        "reached": False,
        "why": f"its held-out loss never reached {target:.4f} (+{tolerance:.1%}): {loss:.4f} at "
        f"the end ({tokens:,.0f} trained tokens), {min(x[1] for x in curve):.4f} at best",
    }


def cost_to_target_rounds(per_round: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's cost to the target over rounds (cost_to_target's answers): the median of the
    rounds that reached it, with min and max; `usd` None and `why` where none did."""
    reached = [c for c in per_round if c["reached"]]
    out: dict[str, Any] = {
        "usd_per_round": [c["usd"] for c in per_round],
        "tokens_per_round": [c["tokens"] for c in per_round],
        "reached_rounds": len(reached),
        "rounds": len(per_round),
    }
    if not reached:
        why = per_round[-1]["why"] if per_round else "not measured"
        return {"usd": None, "usd_spread": None, "tokens": None, **out, "why": why}
    usd = [c["usd"] for c in reached]
    return {
        "usd": statistics.median(usd),
        "usd_spread": _spread(usd, keys=("median", "min", "max")),
        "tokens": statistics.median(c["tokens"] for c in reached),
        **out,
        "why": None
        if len(reached) == len(per_round)
        else f"reached in {len(reached)} of {len(per_round)} rounds (median of those)",
    }


def quality_ratio(numerators: list[dict], denominators: list[dict]) -> dict[str, Any]:
    """Per round, cost to the target of one arm over another's (cost_to_target's answers): the
    median, min and max over the rounds where both reached it; `ratio` None and `why` where
    none."""
    per = [
        n["usd"] / d["usd"] if n["reached"] and d["reached"] and d["usd"] else None
        for n, d in zip(numerators, denominators, strict=True)
    ]
    known = [x for x in per if x is not None]
    if not known:
        why = next(
            (c["why"] for c in (*numerators, *denominators) if not c["reached"]), "not measured"
        )
        return {"ratio": None, "spread": None, "per_round": per, "why": why}
    return {
        "ratio": statistics.median(known),
        "spread": _spread(known, keys=("median", "min", "max")),
        "per_round": per,
        "why": None
        if len(known) == len(per)
        else f"{len(known)} of {len(per)} rounds reached the target on both sides",
    }


@contextlib.contextmanager
def capture_model() -> Iterator[dict[str, Any]]:
    """The module a train() call in this process trains, as ``box["module"]``: read-only access
    for the benchmarks' held-out evaluations during the run (train() hands no model out; the
    runtime's own `eval:` section is not used here, so every arm evaluates alike). Wraps
    gpu_runtime.runtime.assemble_model for the duration."""
    import gpu_runtime.runtime as runtime

    box: dict[str, Any] = {}
    original = runtime.assemble_model

    def assemble(*args: Any, **kwargs: Any):
        built = original(*args, **kwargs)
        box["module"] = built.module
        return built

    runtime.assemble_model = assemble
    try:
        yield box
    finally:
        runtime.assemble_model = original


def held_out_rows(seed: int, seq_len: int, rows: int = EVAL_ROWS) -> torch.Tensor:
    """(rows, seq_len + 1) held-out tokens for the synthetic corpus: the documents the same
    generator writes after the training corpus's last (the same 512 words and Zipf law: the
    same distribution), never trained on, each framed BOS + bytes + EOS as the corpus frames
    its documents, one stream cut in consecutive windows."""
    trained = len(synthetic_documents(seed))
    need = rows * (seq_len + 1)
    docs = synthetic_documents(seed, SYNTHETIC_TOKENS + 2 * need + 8192)[trained:]
    stream: list[int] = []
    for doc in docs:
        stream += [BOS, *doc, EOS]
    if len(stream) < need:
        raise RuntimeError(f"held-out stream of {len(stream)} tokens; {need} needed")
    return torch.tensor(stream[:need], dtype=torch.long).view(rows, seq_len + 1)


def held_out_loss(module: torch.nn.Module, rows: torch.Tensor) -> float:
    """Mean next-token cross-entropy of costlab's model on the held-out rows, in fp32 (autocast
    off, whatever the run computes in); the module's train/eval mode is restored."""
    was_training = module.training
    device = next(module.parameters()).device
    module.eval()
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            x = rows.to(device)
            _, loss = module(x[:, :-1], x[:, 1:])
        return float(loss)
    finally:
        module.train(was_training)


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
    ns: argparse.Namespace,
    baseline: dict,
    optimized: dict,
    price: float,
    rounds: int,
    profile: DeviceProfile,
    best: str,
    stopper: Stopper,
) -> int:
    """Both arms as ns.ddp-process DDP: device-hours, electricity, completion time, cost per
    token. `auto` resolves in this process from `profile` (the cache train() reads) and the
    ranks get the resolved dtype; SIGTERM ends it after the rounds done (143)."""
    from ddp import run_measured  # bench/ddp.py: one DDP run measured from rank 0's telemetry

    world = ns.ddp
    extra = {
        "distributed": {"nproc_per_node": world},
        "telemetry": {"enabled": True, "interval_s": 0.2},
    }
    arms = {"baseline": _merge(baseline, extra), "optimized": _merge(optimized, extra)}
    head = {"mode": "ddp", "world_size": world, "device": ns.device, "best_dtype": best}
    head["profile"] = profile.as_dict()

    def interrupted_line() -> None:
        if ns.json:
            print(json.dumps({**head, "rounds": 0, "ratio": None, "interrupted": True}))

    stopper.on_timeout = interrupted_line

    def measured(config: dict) -> dict:
        stopper.check()
        try:
            out = run_measured(strategy_from_dict(config), ns.device, warmup_steps=1)
        except SystemExit:  # too few samples: a run SIGTERM cut short, or a real failure
            if stopper.stopped:
                raise Interrupted from None
            raise
        if out["status"] != "completed" or stopper.stopped:
            stopper.event.set()
            raise Interrupted
        return out

    rows = []
    interrupted = False
    try:
        measured(_merge(arms["baseline"], {"train": {"steps": 3}}))  # warm the process
        for r in range(rounds):
            order = ["baseline", "optimized"] if r % 2 == 0 else ["optimized", "baseline"]
            rows.append({name: measured(arms[name]) for name in order})
    except Interrupted:
        interrupted = True
    if not rows:
        print("interrupted (SIGTERM) before a round ended")
        interrupted_line()
        stopper.done.set()
        return INTERRUPTED_RC
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
        f"{len(rows)} interleaved rounds{' (INTERRUPTED by SIGTERM)' if interrupted else ''}; "
        f"price ${price:.2f} per "
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
                    **head,
                    "rounds": len(rows),
                    "interrupted": interrupted,
                    "ratio": s["median"],
                    "ratio_spread": s,
                    "arms": figures,
                    "loss_delta": loss_delta(
                        figures["baseline"]["final_loss"], figures["optimized"]["final_loss"]
                    ),
                }
            )
        )
    stopper.done.set()
    return INTERRUPTED_RC if interrupted else 0


@dataclass
class Bench:
    """One benchmark's settings and what it has measured so far (a SIGTERM reports this)."""

    ns: argparse.Namespace
    dev: torch.device
    profile: DeviceProfile
    best: str
    price: float
    compile_optimized: bool
    baseline: dict
    optimized: dict
    skipped: dict[str, str]
    notes: list[str]
    rounds_planned: int
    started: float
    per_round: list[dict[str, dict]] = field(default_factory=list)
    alone_rows: dict[str, dict] = field(default_factory=dict)
    rates: dict[str, Any] | None = None
    # --steps-projected: the payback rule's decision for a run of that length, and what its
    # compile cost when it said compile (the compiled arm then runs in every round)
    projection: dict[str, Any] | None = None
    compiled: dict | None = None
    phase: str = "start"  # what the bench is doing: a SIGTERM names it
    interrupted_during: str | None = None
    _emitted: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)


def _profile_line(profile: DeviceProfile, best: str) -> str:
    dtypes = ", ".join(
        f"{name} {r.gflops:.0f} GFLOP/s ({r.ratio_vs_fp32:.2f}x, "
        f"{'native' if r.native else 'emulated'})"
        if r.gflops and name != "fp32" and r.ratio_vs_fp32 is not None
        else f"{name} {r.gflops:.0f} GFLOP/s"
        if r.gflops
        else f"{name}: {r.error or 'not measured'}"
        for name, r in profile.dtypes.items()
        if name != "int8"
    )
    return (
        f"device profile: {profile.device_label}, class {profile.device_class}; best dtype "
        f"{best} (auto resolves to it); {dtypes}; measured in {profile.elapsed_s:.1f} s on "
        f"{profile.threads} thread(s)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer rounds, steps and strategies alone: about 3 minutes on a 2-core CPU, "
        f"never more than --budget-s ({QUICK_BUDGET_S:.0f} s)",
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
        "--rounds", type=int, default=None, help="interleaved rounds (default: by mode)"
    )
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: by mode)")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help=f"wall-clock budget: what would not fit is skipped and said (--quick: "
        f"{QUICK_BUDGET_S:.0f}; otherwise none; 0: none)",
    )
    parser.add_argument(
        "--price-per-hour", type=float, default=None, help="USD per device-hour (default: assumed)"
    )
    parser.add_argument(
        "--compile",
        choices=("auto", "on", "off"),
        default="auto",
        help="auto: the optimized arm runs kernels.compile: auto (its payback rule decides for "
        "the run's own length), and a compiled copy of it is measured where the rule says "
        "compiling pays over --steps-projected steps",
    )
    parser.add_argument(
        "--steps-projected",
        type=int,
        default=STEPS_PROJECTED,
        help="the run length the projected figures are for (default: the seed's 100k steps): the "
        "optimized arm compiles where the payback rule says it pays over that many steps, its "
        "compile amortised over them",
    )
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
    stopper = Stopper().install()  # from here on SIGTERM ends the bench with what it measured
    started = time.perf_counter()
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
        rounds, steps, alone_rounds = 1, 3, 0
    elif cuda:
        rounds, steps, alone_rounds = (3, 12, 1) if ns.quick else (6, 30, 2)
    else:
        rounds, steps, alone_rounds = (2, 6, 0) if ns.quick else (5, 10, 1)
    rounds = ns.rounds or rounds
    ns.steps = ns.steps or steps
    if ns.budget_s is None:
        ns.budget_s = QUICK_BUDGET_S if ns.quick and not ns.smoke else 0.0
    deadline = started + ns.budget_s if ns.budget_s else None
    compile_optimized = ns.compile == "on" or (ns.compile == "auto" and cuda)
    price = ns.price_per_hour if ns.price_per_hour is not None else ASSUMED_PRICE[dev.type]

    # the device first: every train() call gets this profile, `auto` resolves from it
    profile = measure_profile(dev, budget_s=0.5 if ns.smoke else None)
    device_profile(dev, profile)  # this process's cache: train() calls given no profile use it
    best = best_dtype(profile)
    print(_profile_line(profile, best), flush=True)
    bf16 = profile.dtypes.get("bf16")
    bf16_native = bool(bf16 is not None and bf16.native and not bf16.error and bf16.gflops)

    baseline, optimized, alone, notes = arm_configs(ns, compile_optimized, best)
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
    forced_short: set[str] = set()
    for name, dtype in FORCED.items():
        r = profile.dtypes.get(dtype)
        if name in skipped or (r is not None and r.native and not r.error):
            continue
        speed = (
            f"{r.ratio_vs_fp32:.2f}x fp32" if r is not None and r.ratio_vs_fp32 else "unmeasured"
        )
        if ns.smoke or ns.quick:
            skipped[name] = (
                f"forced {dtype} is not native on this device ({speed} in its profile): a step "
                f"would take many times the baseline's, so --quick and --smoke skip it; the full "
                f"run measures it in one round of {FORCED_STEPS} steps"
            )
        else:
            forced_short.add(name)
    for name in skipped:
        alone.pop(name, None)

    if ns.ddp:
        if ns.ddp < 2 or ns.global_batch % ns.ddp:
            parser.error(
                f"--ddp: {ns.ddp} processes must be 2 or more and divide the global "
                f"batch {ns.global_batch}"
            )
        return ddp_main(ns, baseline, optimized, price, rounds, profile, best, stopper)

    b = Bench(
        ns=ns,
        dev=dev,
        profile=profile,
        best=best,
        price=price,
        compile_optimized=compile_optimized,
        baseline=baseline,
        optimized=optimized,
        skipped=skipped,
        notes=notes,
        rounds_planned=rounds,
        started=started,
    )
    stopper.on_timeout = lambda: emit(b, interrupted=True, human=False)
    # what --quick keeps back for the GEMM floor's first pass (the largest micro-batch it may meet)
    reserve = gemm_pass_estimate_s(
        ns, profile, _floor_needs(ns, best, ns.global_batch, bf16_native)
    )

    def fits(seconds: float) -> bool:
        return deadline is None or time.perf_counter() + seconds + reserve <= deadline

    def arm(config: dict, held: torch.Tensor | None = None) -> dict[str, Any]:
        return run_arm(config, ns.device, profile, stopper, held)

    held = held_out_rows(baseline["train"]["seed"], ns.seq_len)

    b.phase = "warm-up"
    try:
        arm(_merge(baseline, {"train": {"steps": 2}}))  # warm the process: no arm's first calls
        # compile, and meet every micro-batch shape the scaler can reach, before anything is timed
        with smoke_compiles(ns.smoke):
            warm = arm(
                _merge(
                    optimized,
                    {"train": {"steps": 2 + 2 * (PROBE_STEPS + 1) if compile_optimized else 2}},
                )
            )
        b.phase = "payback"
        b.projection = projection_decision(ns, b, warm, compile_optimized)
        if compile_optimized:  # the optimized arm compiles itself: its warm-up paid the compile
            b.projection["compile"] = warm["compile"] or True
        elif b.projection["compile"]:
            b.compiled = _merge(optimized, {"kernels": {"compile": True}})
            with smoke_compiles(ns.smoke):  # the first compile, timed: what the projection pays
                first = arm(_merge(b.compiled, {"train": {"steps": 2 + 2 * (PROBE_STEPS + 1)}}))
            b.projection["compile"] = first["compile"]
        round_s: list[float] = []
        for r in range(rounds):
            b.phase = f"round {r + 1} of {rounds}"
            if round_s and not fits(round_s[-1]):
                b.notes.append(
                    f"--budget-s {ns.budget_s:.0f}: stopped after {len(b.per_round)} of {rounds} "
                    f"rounds (a round takes ~{round_s[-1]:.0f} s)"
                )
                break
            began = time.perf_counter()
            order = [("baseline", baseline), ("optimized", optimized)]
            if b.compiled is not None:
                order.append(("optimized_compiled", b.compiled))
            if r % 2:
                order.reverse()
            with smoke_compiles(ns.smoke):
                b.per_round.append({name: arm(config, held) for name, config in order})
            round_s.append(time.perf_counter() - began)
        base_s = statistics.median(x["baseline"]["seconds"] for x in b.per_round)
        for name, overrides in alone.items():
            b.phase = f"strategy alone: {name}"
            if not fits(1.2 * base_s):
                b.skipped[name] = (
                    f"--budget-s {ns.budget_s:.0f}: a run (~{base_s:.0f} s) would not fit"
                )
                continue
            if name in forced_short:  # forced and not native: one short round, equal steps
                short = {"train": {"steps": FORCED_STEPS}}
                pair = {
                    "baseline": arm(_merge(baseline, short)),
                    name: arm(_merge(_merge(baseline, overrides), short)),
                }
                runs = [pair]
            elif alone_rounds == 0:  # --quick: one run each, against the headline rounds' baselines
                mine = arm(_merge(baseline, overrides))
                runs = [{"baseline": r["baseline"], name: mine} for r in b.per_round]
            else:
                runs = []
                for r in range(alone_rounds):
                    pair = [("baseline", baseline), (name, _merge(baseline, overrides))]
                    if r % 2:
                        pair.reverse()
                    runs.append({a: arm(config) for a, config in pair})
            row = _alone_row(runs, name, ns.clock)
            if name in FORCED:
                row["forced_dtype"] = FORCED[name]
            if name in forced_short:
                row["short"] = f"1 round of {FORCED_STEPS} steps: {FORCED[name]} is not native"
            b.alone_rows[name] = row
        b.phase = "GEMM floor"
        reached = max(m for r in b.per_round for m in r["optimized"]["micro_batches"])

        def store(figures: dict[str, Any]) -> None:
            b.rates = figures

        gemm_floor(
            ns,
            dev,
            best,
            reached,
            ns.clock,
            bf16=bf16_native,
            stopper=stopper,
            fits=lambda seconds: fits(seconds - reserve),
            on_pass=store,
        )
        if b.rates and b.rates["gemm_passes"] < 3:
            b.notes.append(
                f"--budget-s {ns.budget_s:.0f}: {b.rates['gemm_passes']} GEMM floor pass(es) of 3"
            )
    except Interrupted:
        b.interrupted_during = b.phase
    rc = emit(b, interrupted=b.interrupted_during is not None)
    stopper.done.set()
    return rc


def emit(b: Bench, *, interrupted: bool, human: bool = True) -> int:
    """Print the report once (the main thread, or the SIGTERM watcher when the bench overran its
    grace period: then the JSON line only); 143 when interrupted, else 0."""
    with b._lock:
        if not b._emitted:
            b._emitted = True
            figures = summarize(b, interrupted)
            if human:
                print_report(b, figures)
            else:
                print(f"interrupted (SIGTERM) during {b.phase}: the step under way overran")
            if b.ns.json:
                print(json.dumps(figures))
            sys.stdout.flush()
    return INTERRUPTED_RC if interrupted else 0


def summarize(b: Bench, interrupted: bool) -> dict[str, Any]:
    """Every figure of the report, as the JSON line holds them; None where not measured (an
    interrupted run)."""
    ns, dev = b.ns, b.dev
    per_round, alone_rows, rates = list(b.per_round), dict(b.alone_rows), b.rates
    label = device_label(dev)
    args = preset_args(ns.preset, ns.seq_len)
    flops_per_token = args.flops_per_token(ns.seq_len)
    mem = (
        "CUDA max allocated" if dev.type == "cuda" else "RSS growth, sampled every 10 ms (estimate)"
    )
    arms: dict[str, dict[str, Any]] = {}
    for name, config in (("baseline", b.baseline), ("optimized", b.optimized)) if per_round else ():
        tps = [r[name]["tokens_per_s"][ns.clock] for r in per_round]
        median_tps = statistics.median(tps)
        dtype = per_round[-1][name]["compute_dtype"]
        peak = peak_flops(label, dtype)
        arms[name] = {
            "tokens_per_s": median_tps,
            "tokens_per_s_spread": spread(tps),
            "tokens_per_s_wall": statistics.median(
                r[name]["tokens_per_s"]["wall"] for r in per_round
            ),
            "peak_mem_mb": statistics.median(r[name]["peak_mem_mb"] for r in per_round),
            "usd_per_1m_tokens": usd_per_million(median_tps, b.price),
            "mfu": None if peak is None else median_tps * flops_per_token / peak,
            "final_loss": statistics.median(r[name]["final_loss"] for r in per_round),
            "micro_batches": sorted({m for r in per_round for m in r[name]["micro_batches"]}),
            "compute_dtype": dtype,
            "storage_dtype": config["precision"].get("storage_dtype", "fp32"),
        }
    ratios = [
        r["baseline"]["tokens_per_s"][ns.clock] / r["optimized"]["tokens_per_s"][ns.clock]
        for r in per_round
    ]
    wall_ratios = [
        r["baseline"]["tokens_per_s"]["wall"] / r["optimized"]["tokens_per_s"]["wall"]
        for r in per_round
    ]
    s = spread(ratios) if ratios else None
    ratio = None if s is None else s["median"]
    floor = None if rates is None else rates["gemm_floor"]
    floor_ratio = None if ratio is None or not floor else ratio / floor
    projected = projected_ratios(per_round, b.projection, ns.clock)
    ratio_projected = projected.get("median")
    floor_projected = None if ratio_projected is None or not floor else ratio_projected / floor
    compile_reports = [r["optimized"]["compile"] for r in per_round if r["optimized"]["compile"]]
    delta = (
        loss_delta(arms["baseline"]["final_loss"], arms["optimized"]["final_loss"])
        if arms
        else None
    )
    used = arms["optimized"]["micro_batches"] if arms else []
    flagged = {
        name: row["loss_delta"]
        for name, row in alone_rows.items()
        if row["loss_delta"] > LOSS_TARGET
    }
    if delta is not None and delta > LOSS_TARGET:
        flagged["optimized"] = delta
    auto = next((r["optimized"]["auto"] for r in per_round if r["optimized"]["auto"]), None)
    quality = quality_figures(per_round, ns.clock, b.price)
    for name, figures in quality.pop("arms").items():
        arms[name].update(figures)
    return {
        "ratio": ratio,
        "ratio_spread": None if s is None else (s["max"] - s["min"]) / 2,
        "ratio_min": None if s is None else s["min"],
        "ratio_max": None if s is None else s["max"],
        "ratio_iqr": None if s is None else [s["q1"], s["q3"]],
        "ratio_per_round": ratios,
        "ratio_wall_clock_per_round": wall_ratios,
        "clock": ns.clock,
        "target": TARGET,
        "met": ratio is not None and ratio <= TARGET,
        "optimized_is_dearer": ratio is not None and ratio > 1.0,
        **quality,
        "price_per_hour_usd": b.price,
        "price_assumed": ns.price_per_hour is None,
        "device": label,
        "device_class": b.profile.device_class,
        "best_dtype": b.best,
        "profile": b.profile.as_dict(),
        "optimized_precision": {
            "compute_dtype": b.optimized["precision"]["compute_dtype"],
            "resolved": b.best if auto is None else auto["resolved"],
            "storage_dtype": b.optimized["precision"].get("storage_dtype", "fp32"),
            "resolution": auto,
        },
        "preset": ns.preset,
        "seq_len": ns.seq_len,
        "global_batch": ns.global_batch,
        "baseline_micro_batch": ns.baseline_micro_batch,
        "steps_per_run": ns.steps,
        "rounds": len(per_round),
        "rounds_planned": b.rounds_planned,
        "budget_s": ns.budget_s or None,
        "compile_in_optimized": b.compile_optimized,
        "peak_memory_method": mem,
        "arms": arms,
        "strategies_alone": alone_rows,
        "strategies_skipped": dict(b.skipped),
        "gemm_floor": floor,
        "floor_ratio": floor_ratio,
        "floor_target": FLOOR_TARGET,
        "floor_met": floor_ratio is not None and floor_ratio <= FLOOR_TARGET,
        # --steps-projected: the optimized arm as kernels.compile: auto runs a run of that length
        "steps_projected": ns.steps_projected,
        "ratio_projected": ratio_projected,
        "ratio_projected_min": projected.get("min"),
        "ratio_projected_max": projected.get("max"),
        "ratio_projected_per_round": projected.get("per_round"),
        "floor_ratio_projected": floor_projected,
        "floor_projected_met": floor_projected is not None and floor_projected <= FLOOR_TARGET,
        "projection": b.projection,
        # the optimized arm's own kernels.compile auto at steps_per_run (eager: it cannot repay)
        "optimized_compile": compile_reports[-1] if compile_reports else None,
        **{
            key: None if rates is None else rates[key]
            for key in (
                "gemm_floor_per_pass",
                "gemm_floor_dtype",
                "gemm_floor_micro_batch",
                "gemm_floor_dtype_alone",
                "gemm_floor_at_optimized_micro_batch",
                "gemm_floor_bf16",
                "gemm_floor_bf16_at_optimized_micro_batch",
                "gemm_step_s",
                "gemm_gflops",
                "gemm_passes",
            )
        },
        "loss_delta": delta,
        "loss_target": LOSS_TARGET,
        "loss_flagged": flagged,
        "optimized_micro_batches": used,
        "optimized_above_baseline_micro_batch": bool(used) and max(used) > ns.baseline_micro_batch,
        "optimized_micro_batch_events": [r["optimized"]["micro_batch_events"] for r in per_round],
        "notes": list(b.notes) + list(b.profile.notes),
        "interrupted": interrupted,
        "interrupted_during": (b.interrupted_during or b.phase) if interrupted else None,
        "wall_s": time.perf_counter() - b.started,
    }


def quality_figures(per_round: list[dict[str, dict]], clock: str, price: float) -> dict[str, Any]:
    """Cost at equal quality: the target is the baseline's final held-out loss in each round;
    each arm's cost to reach it (cost_to_target, on that round's evaluation curve and rate), and
    `ratio_to_quality` = optimized / baseline cost to the target, per round (median, min, max,
    as `ratio`); None with `ratio_to_quality_why` where the optimized arm never reaches it."""
    names = ("baseline", "optimized")
    targets, costs = [], {name: [] for name in names}
    for r in per_round:
        if not all(r[name]["eval_curve"] for name in names):
            continue
        target = r["baseline"]["eval_curve"][-1][1]
        targets.append(target)
        for name in names:
            usd_per_token = usd_per_million(r[name]["tokens_per_s"][clock], price) / 1e6
            costs[name].append(cost_to_target(r[name]["eval_curve"], target, usd_per_token))
    arms: dict[str, dict[str, Any]] = {}
    for name in names:
        curves = [r[name]["eval_curve"] for r in per_round if r[name]["eval_curve"]]
        if not curves:
            continue
        arms[name] = {
            "held_out_loss": statistics.median(c[-1][1] for c in curves),
            "eval_curve": curves[-1],
            "eval_every_steps": per_round[-1][name]["eval_every_steps"],
            "eval_s_excluded": statistics.median(r[name]["eval_s"][clock] for r in per_round),
            "cost_to_target": cost_to_target_rounds(costs[name]),
        }
    head = quality_ratio(costs["optimized"], costs["baseline"]) if targets else None
    return {
        "target_loss": statistics.median(targets) if targets else None,
        "target_loss_per_round": targets,
        "target_rule": "the baseline's final held-out loss (mean next-token cross-entropy in fp32 "
        f"on {EVAL_ROWS} held-out windows of the synthetic corpus), each round; cost to it: "
        f"tokens to first reach it, within {REACH_TOLERANCE:.1%} (interpolated between the two "
        "evaluations that straddle it) x the run's measured USD per token, evaluation time "
        "excluded",
        "target_tolerance": REACH_TOLERANCE,
        "ratio_to_quality": None if head is None else head["ratio"],
        "ratio_to_quality_min": None
        if head is None or head["spread"] is None
        else head["spread"]["min"],
        "ratio_to_quality_max": None
        if head is None or head["spread"] is None
        else head["spread"]["max"],
        "ratio_to_quality_per_round": None if head is None else head["per_round"],
        "ratio_to_quality_why": "no held-out evaluation" if head is None else head["why"],
        "arms": arms,
    }


def print_report(b: Bench, f: dict[str, Any]) -> None:
    ns = b.ns
    args = preset_args(ns.preset, ns.seq_len)
    clock = (
        "wall clock"
        if ns.clock == "wall"
        else "this process's CPU time (time.process_time; wall-clock figures alongside)"
    )
    print(
        f"cost benchmark: {ns.preset} preset ({args.num_params() / 1e6:.1f}M parameters), "
        f"seq_len {ns.seq_len}, global batch {ns.global_batch}, baseline micro-batch "
        f"{ns.baseline_micro_batch}, on "
        f"{f['device']}"
        f"{'' if b.dev.type == 'cuda' else f', torch threads {torch.get_num_threads()}'}"
    )
    print(
        f"device class {f['device_class']}: best dtype {f['best_dtype']} "
        f"(precision.compute_dtype auto resolves to it)"
    )
    print(
        f"{f['rounds']} interleaved rounds x {ns.steps} steps (the first of each run "
        f"untimed); step time: {clock}"
    )
    p = f["optimized_precision"]
    print(
        f"optimized = precision auto (-> {p['resolved']} autocast here, {p['storage_dtype']} "
        f"storage) + dynamic batching [{ns.baseline_micro_batch}, {ns.global_batch}] + fused "
        f"RMSNorm+QKV + fused AdamW + prefetch"
        + (
            " + torch.compile"
            if b.compile_optimized
            else " + kernels.compile auto"
            if ns.compile == "auto"
            else " (no compile)"
        )
    )
    print(
        f"price: ${b.price:.2f} per device-hour, "
        f"{'ASSUMED (--price-per-hour sets it)' if ns.price_per_hour is None else 'given'}; "
        "cost = device time only, energy excluded"
    )
    if f["interrupted"]:
        print(f"INTERRUPTED (SIGTERM) during {f['interrupted_during']}: what was measured so far")
    print()
    print(
        f"{'arm':<10} {'tokens/s':>9} {'(wall)':>8} {'peak MiB':>9} {'USD/1M tok':>11} "
        f"{'MFU':>7} {'loss':>7}  micro-batches"
    )
    for name, a in f["arms"].items():
        mfu = "-" if a["mfu"] is None else f"{a['mfu']:.3f}"
        print(
            f"{name:<10} {a['tokens_per_s']:>9.1f} {a['tokens_per_s_wall']:>8.1f} "
            f"{a['peak_mem_mb']:>9.1f} {a['usd_per_1m_tokens']:>11.4f} {mfu:>7} "
            f"{a['final_loss']:>7.3f}  {a['micro_batches']}"
        )
    if f["ratio"] is not None:
        print(
            f"\nratio (optimized / baseline USD per 1M tokens) = {f['ratio']:.3f}  spread: min "
            f"{f['ratio_min']:.3f}, max {f['ratio_max']:.3f}, IQR [{f['ratio_iqr'][0]:.3f}, "
            f"{f['ratio_iqr'][1]:.3f}]  target <= {TARGET:.2f}: "
            f"{'MET' if f['met'] else 'NOT MET'}"
        )
        print(
            f"per round: {', '.join(f'{x:.3f}' for x in f['ratio_per_round'])}   (wall clock: "
            f"{', '.join(f'{x:.3f}' for x in f['ratio_wall_clock_per_round'])})"
        )
        if f["optimized_is_dearer"]:
            print(
                f"THE OPTIMIZED ARM IS DEARER HERE: it costs {f['ratio']:.2f}x the baseline per "
                "token on this device; it is no optimization on it"
            )
    if f["target_loss"] is not None:
        print(
            f"\nat equal quality: target held-out loss {f['target_loss']:.4f} (the baseline's "
            "final); USD to reach it (evaluation time excluded):"
        )
        for name, a in f["arms"].items():
            c = a.get("cost_to_target")
            if c is None:
                continue
            reached = (
                f"{c['usd'] * 1e6:.2f} micro-USD after {c['tokens']:,.0f} tokens"
                if c["usd"] is not None
                else f"not reached: {c['why']}"
            )
            print(f"  {name:<10} held-out loss {a['held_out_loss']:.4f}; {reached}")
        q = f["ratio_to_quality"]
        print(
            "ratio_to_quality (optimized / baseline USD to the target) = "
            + (
                f"{q:.3f} (min {f['ratio_to_quality_min']:.3f}, max "
                f"{f['ratio_to_quality_max']:.3f})"
                if q is not None
                else "none"
            )
            + (f"; {f['ratio_to_quality_why']}" if f["ratio_to_quality_why"] else "")
        )
    rows, flagged = f["strategies_alone"], f["loss_flagged"]

    def label(name: str) -> str:
        row = rows.get(name, {})
        forced = f" [forced {row['forced_dtype']}]" if row.get("forced_dtype") else ""
        return f"{name}{forced}{' [short]' if row.get('short') else ''}"

    print(f"\neach strategy alone vs baseline (median; peak memory: {f['peak_memory_method']})")
    print(
        f"{'strategy':<36} {'tokens/s':>9} {'x base':>7} {'peak MiB':>9} {'x base':>7}  "
        "micro-batches"
    )
    for name, row in rows.items():
        print(
            f"{label(name):<36} {row['tokens_per_s']:>9.1f} {row['tokens_per_s_ratio']:>7.3f} "
            f"{row['peak_mem_mb']:>9.1f} {row['peak_mem_ratio']:>7.3f}  {row['micro_batches']}"
        )
    for name, why in f["strategies_skipped"].items():
        print(f"{name:<36} skipped: {why}")
    print(f"{'strategy':<36} loss delta vs baseline (target <= {LOSS_TARGET})")
    for name, row in rows.items():
        print(
            f"{label(name):<36} {row['loss_delta']:.4f}"
            f"{'  FLAGGED: speed bought with loss' if name in flagged else ''}"
        )
    if f["gemm_floor"] is not None:
        g, best, reached = f["gemm_gflops"], f["gemm_floor_dtype"], f["gemm_floor_micro_batch"]
        print(
            "\nGEMM at the model's own shapes (one step): "
            + ", ".join(f"{name} {value:.0f} GFLOP/s" for name, value in g.items())
        )
        print(
            f"gemm_floor ({best} GEMM time at the optimized arm's micro-batch {reached} / fp32 at "
            f"the baseline's {ns.baseline_micro_batch}: the cost ratio dtype and micro-batch "
            f"allow) = {f['gemm_floor']:.3f} (passes: "
            f"{', '.join(f'{x:.3f}' for x in f['gemm_floor_per_pass'])})"
            + (
                ""
                if best == "fp32"
                else f"; {best} alone at micro-batch {ns.baseline_micro_batch}: "
                f"{f['gemm_floor_dtype_alone']:.3f}"
            )
            + (
                ""
                if f["gemm_floor_bf16"] is None or best == "bf16"
                else f"; bf16 alone: {f['gemm_floor_bf16']:.3f}"
            )
        )
    if f["floor_ratio"] is not None:
        print(
            f"floor_ratio (ratio / gemm_floor) = {f['floor_ratio']:.3f}  target <= "
            f"{FLOOR_TARGET:.2f}: {'MET' if f['floor_met'] else 'NOT MET'}"
        )
    if f["ratio_projected"] is not None:
        proj = f["projection"]
        at_n = proj["decisions"][str(proj["steps"])]
        at_demo = proj["decisions"][str(DEMO_STEPS)]
        spent = proj["compile"].get("compile_s") if isinstance(proj["compile"], dict) else None
        print(
            f"projected to {proj['steps']} steps: ratio {f['ratio_projected']:.3f} "
            f"({f['ratio_projected_min']:.3f}-{f['ratio_projected_max']:.3f}); "
            + (
                f"compiled (its {spent:.0f} s compile amortised)"
                if spent is not None
                else "eager (compiling does not pay)"
            )
            + f"; {at_n['why']}"
        )
        print(f"at {DEMO_STEPS} steps (the demo): {at_demo['why']}")
        if f["floor_ratio_projected"] is not None:
            print(
                f"floor_ratio_projected = {f['floor_ratio_projected']:.3f}  target <= "
                f"{FLOOR_TARGET:.2f}: {'MET' if f['floor_projected_met'] else 'NOT MET'}"
            )
    if f["loss_delta"] is not None:
        delta = f["loss_delta"]
        print(
            f"loss_delta (|optimized - baseline| / baseline final loss, equal tokens) = "
            f"{delta:.4f}  target <= {LOSS_TARGET}: "
            + ("MET" if delta <= LOSS_TARGET else "NOT MET: the optimized arm buys speed with loss")
        )
        used = f["optimized_micro_batches"]
        print(
            f"optimized micro-batches {used}: "
            f"{'above' if f['optimized_above_baseline_micro_batch'] else 'NOT above'} the "
            f"baseline's {ns.baseline_micro_batch}; events per run: "
            f"{f['optimized_micro_batch_events']}"
        )
    for note in f["notes"]:
        print(f"note: {note}")
    print(f"wall time {f['wall_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
