"""The sweep benchmark: an exhaustive grid against Optuna's searches (TPE, NSGA-II)
with half the probes.

    python bench/sweep.py [--quick] [--smoke] [--json] [--steps N] [--seed S]

Both are real sweeps on the platform (Postgres, the sweep services, the probe code of the
workers: gpu_runtime.train() of each candidate on the CPU, warm-up untimed, priced with the
cost engine on a bench pricing table). The probes run in this process, interleaved (one grid
probe, one TPE probe, one NSGA-II probe, ...), so the machine's drift hits all three; the Celery
fan-out is the end-to-end test's subject, not this one's. Probes use one CPU thread
(``--threads``): on a shared host, more threads than free cores turn a neighbour's burst into a
10x slower step.

Space (72 points): train.global_batch {1, 2, 4, 8} x model.seq_len {64, 128, 256} x
precision.compute_dtype {fp32, bf16, auto} x memory.gradient_checkpointing.enabled {off, on};
objectives USD per 1M tokens and peak memory. The grid measures every point (it is the ground
truth); the searches get a third of its probes (24) over the space as a sweep prunes it: this
host's device profile is recorded first (gpu_runtime.profile, as a worker records it), so points
it shows dominated are left out before the search (apps.sweeps.pruning: bf16 where it is
emulated, auto where it is the twin of a named dtype). Each search runs with ``--seeds`` seeds
(3). Reports:

* ``grid_probes`` and ``probes`` (the search's budget, a third of the grid); ``pruned``: the
  values left out and why;
* ``regret``: the search's cheapest USD/1M tokens / the grid's cheapest - 1 (target <= 0.05),
  each from its own measurements; ``regret_same_measure`` values the search's points with the
  grid's measurements, which takes measurement noise out of it;
* ``frontier_recall``: the share of the grid's frontier points the search also probed;
* the headline figures are TPE's, the sampler ``auto`` picks when the grid does not fit the
  budget; NSGA-II's are under ``nsga2``.
* ``wall_s``: the whole benchmark's wall time.

SIGTERM stops it: the probe under way stops at its next step, no further probe starts, and it
exits 143 (``{"interrupted": true, ...}`` with ``--json``).

``--smoke``: a 4-point space (global_batch {1, 2} x seq_len {32} x dtype {fp32, bf16}), 1 probe
per search, 3 timed steps each, on a database of its own (``_sweep_smoke``): the same code path
and JSON keys in seconds, to check that the benchmark runs (tests/bench); its figures mean
nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _setup import INTERRUPTED_RC, Stopper, django_on_postgres  # noqa: E402

TARGET_REGRET = 0.05
SPACE = {
    "train.global_batch": [1, 2, 4, 8],
    "model.seq_len": [64, 128, 256],
    "precision.compute_dtype": ["fp32", "bf16", "auto"],
    "memory.gradient_checkpointing.enabled": [False, True],
}
SMOKE_SPACE = {
    "train.global_batch": [1, 2],
    "model.seq_len": [32],
    "precision.compute_dtype": ["fp32", "bf16"],
}
BASE = (
    "model: {preset: tiny, seq_len: 64}\ndata: {source: synthetic}\n"
    "train: {steps: 1000, global_batch: 2, seed: 0}\n"
)


def _tenant():
    from apps.pricing.models import PricingTable
    from apps.tenants.models import Tenant

    tenant, _ = Tenant.objects.get_or_create(slug="bench-sweep", defaults={"name": "bench: sweep"})
    PricingTable.objects.get_or_create(
        tenant=tenant,
        name="bench prices",
        defaults={
            "valid_from": datetime(2026, 1, 1, tzinfo=UTC),
            "electricity_usd_per_kwh": Decimal("0.15"),
            "pue": Decimal("1.2"),
            "vcpu_hour_usd": Decimal("0.04"),
            "memory_gb_hour_usd": Decimal("0.005"),
        },
    )
    return tenant


def _next_queued(sweep):
    return sweep.probes.filter(status="queued").order_by("number").first()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="fewer timed steps per probe (under a minute)"
    )
    ap.add_argument(
        "--json", action="store_true", help="last line: one JSON object with the figures"
    )
    ap.add_argument(
        "--smoke", action="store_true", help="tiny space and probes: checks the code path only"
    )
    ap.add_argument(
        "--steps", type=int, help="timed steps per probe (default 12, --quick 6, --smoke 3)"
    )
    ap.add_argument("--seed", type=int, default=0, help="the first search seed")
    ap.add_argument("--seeds", type=int, help="search seeds (default 3, --smoke 1)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads per probe (1)")
    args = ap.parse_args()
    steps = args.steps or (3 if args.smoke else 6 if args.quick else 12)
    seeds = args.seeds or (1 if args.smoke else 3)
    space = SMOKE_SPACE if args.smoke else SPACE
    grid_size = math.prod(len(values) for values in space.values())
    budget = max(1, grid_size // 3)
    started = time.perf_counter()
    django_on_postgres(smoke=args.smoke)

    import socket

    import torch

    from apps.devices.models import Device
    from apps.devices.services import device_profile_record
    from apps.sweeps import probes, services
    from apps.sweeps.selectors import sweep_frontier
    from gpu_runtime.profile import best_dtype, measure_profile
    from workers.sweeps import probe_execute

    probes.probe_send = lambda **_: None  # probes run here, interleaved; no broker message
    torch.set_num_threads(
        args.threads
    )  # fewer threads than cores: less noise from neighbours on a shared host
    tenant = _tenant()
    stamp = datetime.now(UTC).strftime("%H%M%S")
    common = dict(
        tenant=tenant,
        base_strategy_yaml=BASE,
        space=space,
        probe_steps=steps,
        warmup_steps=2,
        parallelism=1,
    )
    # The grid is the ground truth: created before this host's profile is on record, so it
    # prunes nothing and measures every point.
    Device.objects.all().delete()
    grid = services.sweep_create(
        name=f"bench grid {stamp}", probe_count=grid_size, sampler="grid", seed=0, **common
    )
    profile = measure_profile(torch.device("cpu"), threads=args.threads)
    device_profile_record(
        host=socket.gethostname(), label="cpu", queues=["cpu"], profile=profile.as_dict()
    )
    searches = {
        (name, seed): services.sweep_create(
            name=f"bench {name} seed {seed} {stamp}",
            probe_count=budget,
            sampler=name,
            seed=seed,
            **common,
        )
        for seed in range(args.seed, args.seed + seeds)
        for name in ("tpe", "nsga2")
    }
    pruned = next(iter(searches.values())).pruned
    # SIGTERM: a probe's train() stops at its next step; no further probe starts after it.
    stopper = Stopper().install()
    done = 0
    stopper.on_timeout = lambda: print(json.dumps({"interrupted": True, "probes_done": done}))
    while not stopper.stopped:
        pending = [
            p for p in (_next_queued(s) for s in (grid, *searches.values())) if p is not None
        ]
        if not pending:
            break
        for probe in pending:
            if stopper.stopped:
                break
            probe_execute(probe.pk)
            done += 1
    if stopper.stopped:
        print(f"interrupted (SIGTERM) after {done} probes: no figures")
        if args.json:
            print(json.dumps({"interrupted": True, "probes_done": done}))
        return INTERRUPTED_RC
    stopper.done.set()

    grid_probes = sweep_frontier(sweep=grid)
    grid_ok = [p for p in grid_probes if p.usd_per_mtok is not None]
    grid_best = min(p.usd_per_mtok for p in grid_ok)
    grid_usd = {p.params_key: p.usd_per_mtok for p in grid_ok}
    grid_front = {p.params_key for p in grid_probes if p.on_frontier}
    per_seed: dict[str, list[dict]] = {"tpe": [], "nsga2": []}
    searched: dict[str, set] = {"tpe": set(), "nsga2": set()}
    for (name, _seed), sweep in searches.items():
        probes = sweep_frontier(sweep=sweep)
        keys = {p.params_key for p in probes}
        searched[name] |= keys
        measured = [p.usd_per_mtok for p in probes if p.usd_per_mtok is not None]
        per_seed[name].append(
            {
                "probes": len(probes),
                "regret": min(measured) / grid_best - 1 if measured else math.inf,
                "regret_same_measure": min(grid_usd[k] for k in keys if k in grid_usd) / grid_best
                - 1,
                "frontier_recall": len(grid_front & keys) / len(grid_front),
            }
        )
    figures = {}
    for name, rows in per_seed.items():
        same = [r["regret_same_measure"] for r in rows]
        figures[name] = {
            "probes": max(r["probes"] for r in rows),
            "regret": statistics.median(r["regret"] for r in rows),
            "regret_same_measure": statistics.median(same),
            "regret_same_measure_max": max(same),
            "frontier_recall": statistics.median(r["frontier_recall"] for r in rows),
            "seeds": len(rows),
        }
    wall = time.perf_counter() - started

    print(
        f"sweep benchmark: {len(grid_probes)} grid probes vs {budget} TPE and {budget} NSGA-II "
        f"probes per seed ({seeds} seeds), {steps} timed steps each, CPU "
        f"({profile.cpu_model}; auto = {best_dtype(profile)}), {args.threads} thread(s)"
    )
    for p in pruned:
        print(f"pruned before the search: {p['key']} = {p['value']}: {p['reason']}")
    print(
        f"{'#':>2}  {'global_batch':>12} {'seq_len':>7} {'dtype':>5} {'ckpt':>4}  "
        f"{'USD/1M tok':>10} {'peak MiB est.':>13}  "
        f"{'grid front':>10}  {'TPE':>3}  {'NSGA-II':>7}"
    )
    for p in grid_probes:
        ckpt = p.params.get("memory.gradient_checkpointing.enabled", False)
        print(
            f"{p.number:>2}  {p.params['train.global_batch']:>12} {p.params['model.seq_len']:>7} "
            f"{p.params['precision.compute_dtype']:>5} {'on' if ckpt else 'off':>4}  "
            f"{p.usd_per_mtok or float('nan'):>10.4f} "
            f"{p.peak_mem_mb or float('nan'):>13.0f}  {'✓' if p.on_frontier else '':>10}  "
            f"{'✓' if p.params_key in searched['tpe'] else '':>3}  "
            f"{'✓' if p.params_key in searched['nsga2'] else '':>7}"
        )
    for name, f in figures.items():
        print(
            f"{name:>5}: {f['probes']} probes, regret {f['regret']:+.3f} (median of {seeds} "
            f"seeds; target <= {TARGET_REGRET}; on the grid's measurements "
            f"{f['regret_same_measure']:+.3f}, worst seed {f['regret_same_measure_max']:+.3f}), "
            f"frontier recall {f['frontier_recall']:.2f}"
        )
    print(f"grid cheapest {grid_best:.4f} USD/1M tok; wall {wall:.1f} s")
    if args.json:
        rounded = {name: {k: round(v, 4) for k, v in f.items()} for name, f in figures.items()}
        print(
            json.dumps(
                {
                    "grid_probes": len(grid_probes),
                    **rounded["tpe"],
                    "nsga2": rounded["nsga2"],
                    "pruned": pruned,
                    "best_dtype": best_dtype(profile),
                    "device_class": profile.device_class,
                    "wall_s": round(wall, 1),
                    "steps_per_probe": steps,
                    "threads": args.threads,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
