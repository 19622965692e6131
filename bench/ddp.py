"""Data parallelism: one process against 2-rank DDP (torch elastic), same seed and global batch.

    python bench/ddp.py [--quick] [--smoke] [--json] [--device cpu|cuda] [--steps N]

Three arms, interleaved in one process round after round (the order rotates, so the
machine's drift hits all alike), each a fresh ``gpu_runtime.train`` of the tiny preset:

- ``single``: one process, one intra-op thread, the whole global batch;
- ``ddp``: two ranks (gloo on CPU, one thread each; nccl on CUDA), half the batch each;
- ``shard``: one process on one rank's half of the batch: a rank's compute alone, without
  communication (the reference for ``allreduce_share``).

Throughput is read from the runs' own telemetry (rank 0's cumulative tokens between the
first sample past the warm-up and the last one), so start-up (the ranks' interpreters and
rendezvous) is left out. Reported:

- ``world_size``: 2;
- ``loss_delta``: |final loss of ddp - single| / single (same seed, global batch, steps).
  Target <= 0.01;
- ``scaling_efficiency``: ddp tokens/s / (2 x single tokens/s), one thread per rank. No target on a
  2-core shared machine;
- ``allreduce_share``: 1 - (shard step time / ddp step time): the share of a rank's step spent
  beyond its own compute — the gradient all-reduce, the step-boundary flag and loss all-reduces,
  and waiting for the slower rank.

Each figure is the median over rounds, with its min and max. Not a test: CI does not run it.

`--smoke`: one round of 6 steps, no warm-up run: the same code path and JSON keys in seconds,
to check that the benchmark runs (tests/bench); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from _setup import spread  # noqa: E402

from gpu_runtime import strategy_from_dict, train  # noqa: E402

WORLD = 2
WARMUP_STEPS = 3


def _config(*, steps: int, global_batch: int, nproc: int, device: str):
    return strategy_from_dict(
        {
            "model": {"preset": "tiny", "seq_len": 64},
            "data": {"source": "synthetic", "prefetch": 2},
            "train": {
                "steps": steps,
                "global_batch": global_batch,
                "lr": 3.0e-3,
                "warmup_steps": 2,
                "seed": 0,
            },
            "telemetry": {"interval_s": 0.1, "peak_flops": 1e11 if device == "cpu" else None},
            "distributed": {"nproc_per_node": nproc},
        }
    )


def run_measured(config, device: str, *, warmup_steps: int = 3) -> dict:
    """One training run: its final loss, and tokens/s and s/step past the warm-up (rank 0's
    telemetry); also the whole call's wall time, device-seconds and energy (bench/arms.py --ddp
    reports them)."""
    samples: list[dict] = []
    result = train(config, sink=samples.append, device=device)
    lead = [s for s in samples if s.get("rank", 0) == 0]
    start = next((s for s in lead if s["step"] >= warmup_steps), None)
    end = lead[-1]
    if start is None or end["step"] <= start["step"] or end["ts"] <= start["ts"]:
        raise SystemExit("too few samples past the warm-up: raise --steps")
    seconds = end["ts"] - start["ts"]
    return {
        "final_loss": result.final_loss,
        "tokens_per_s": (end["tokens"] - start["tokens"]) / seconds,
        "step_s": seconds / (end["step"] - start["step"]),
        "status": result.status,
        "wall_s": result.wall_s,
        "device_s": result.device_s,
        "tokens": result.tokens,
        "energy_j": result.energy_j,
        "energy_estimated": result.energy_estimated,
    }


_spread = functools.partial(spread, keys=("median", "min", "max"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="3 rounds of 20 steps (about two minutes on 2 cores)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="1 round of 6 steps: checks the code path only"
    )
    parser.add_argument(
        "--json", action="store_true", help="last line: one JSON object with the figures"
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu (gloo, one thread per rank) or cuda (nccl: needs two GPUs)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps per run (default 6 smoke, 20 quick, 40 full)",
    )
    ns = parser.parse_args()
    if ns.device == "cuda" and torch.cuda.device_count() < WORLD:
        raise SystemExit(
            f"--device cuda: 2-rank DDP with nccl needs {WORLD} GPUs, this host has "
            f"{torch.cuda.device_count()}"
        )
    torch.set_num_threads(1)  # one thread per process: the ranks get one each too
    rounds = 1 if ns.smoke else 3 if ns.quick else 7
    steps = ns.steps or (6 if ns.smoke else 20 if ns.quick else 40)
    global_batch = 8
    arms = {
        "single": _config(steps=steps, global_batch=global_batch, nproc=1, device=ns.device),
        "ddp": _config(steps=steps, global_batch=global_batch, nproc=WORLD, device=ns.device),
        "shard": _config(
            steps=steps, global_batch=global_batch // WORLD, nproc=1, device=ns.device
        ),
    }
    if not ns.smoke:  # warm the process: first-call costs belong to no arm
        run_measured(arms["single"], ns.device, warmup_steps=WARMUP_STEPS)
    names = list(arms)
    rows = []
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        rows.append(
            {name: run_measured(arms[name], ns.device, warmup_steps=WARMUP_STEPS) for name in order}
        )

    backend = "nccl" if ns.device == "cuda" else "gloo"
    print(
        f"DDP: tiny preset, seq_len 64, global_batch {global_batch}, {steps} steps/run, "
        f"{rounds} rounds, {ns.device} ({backend}), one thread per process; warm-up "
        f"{WARMUP_STEPS} steps dropped"
    )
    print(
        f"{'round':>5}  {'single tok/s':>12}  {'ddp tok/s':>10}  {'shard ms':>9}  {'ddp ms':>8}  "
        f"{'loss single':>11}  {'loss ddp':>9}"
    )
    for r, row in enumerate(rows):
        print(
            f"{r:>5}  {row['single']['tokens_per_s']:>12.0f}  {row['ddp']['tokens_per_s']:>10.0f}  "
            f"{row['shard']['step_s'] * 1e3:>9.1f}  {row['ddp']['step_s'] * 1e3:>8.1f}  "
            f"{row['single']['final_loss']:>11.5f}  {row['ddp']['final_loss']:>9.5f}"
        )
    loss_delta = [
        abs(row["ddp"]["final_loss"] - row["single"]["final_loss"]) / row["single"]["final_loss"]
        for row in rows
    ]
    efficiency = [
        row["ddp"]["tokens_per_s"] / (WORLD * row["single"]["tokens_per_s"]) for row in rows
    ]
    share = [max(0.0, 1 - row["shard"]["step_s"] / row["ddp"]["step_s"]) for row in rows]
    figures = {
        "loss_delta": _spread(loss_delta),
        "scaling_efficiency": _spread(efficiency),
        "allreduce_share": _spread(share),
    }
    for name, fig in figures.items():
        print(
            f"{name} = {fig['median']:.3g}  (min {fig['min']:.3g}, max {fig['max']:.3g})"
            + ("  target <= 0.01" if name == "loss_delta" else "")
        )
    if ns.json:
        print(
            json.dumps(
                {
                    "world_size": WORLD,
                    "device": ns.device,
                    "backend": backend,
                    "rounds": rounds,
                    "steps_per_run": steps,
                    "global_batch": global_batch,
                    "loss_delta": figures["loss_delta"]["median"],
                    "scaling_efficiency": figures["scaling_efficiency"]["median"],
                    "allreduce_share": figures["allreduce_share"]["median"],
                    "spread": figures,
                    "single_tokens_per_s": statistics.median(
                        row["single"]["tokens_per_s"] for row in rows
                    ),
                    "ddp_tokens_per_s": statistics.median(
                        row["ddp"]["tokens_per_s"] for row in rows
                    ),
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
