"""`costlab sweep start|status|frontier|cancel`: search for a cheaper strategy,
read its Pareto frontier."""

from __future__ import annotations

import json
from pathlib import Path

from costlab_cli.client import Api, CliError, print_warnings

METRICS = [
    ("step s", "step_time_s", 4),
    ("peak MiB", "peak_mem_mb", 0),
    ("USD/1M tok", "usd_per_mtok", 4),
]
HELD_OUT = ("held-out loss", "eval_loss", 4)  # a column only when a probe measured it


def _space(text: str) -> dict:
    """Inline JSON, or a JSON file (JSON only: the CLI needs nothing but httpx)."""
    path = Path(text)
    source = (
        path.read_text(encoding="utf-8")
        if not text.lstrip().startswith("{") and path.exists()
        else text
    )
    try:
        space = json.loads(source)
    except json.JSONDecodeError as exc:
        raise CliError(f"--space: not JSON ({exc})") from None
    if not isinstance(space, dict):
        raise CliError("--space: give a mapping of strategy key -> values, inline or as a file")
    return space


def cmd_sweep_start(api: Api, args) -> int:
    try:
        strategy = Path(args.strategy).read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"--strategy: cannot read {args.strategy}: {exc.strerror}") from None
    body = {
        "name": args.name,
        "base_strategy_yaml": strategy,
        "space": _space(args.space),
        "probe_count": args.probes,
        "probe_steps": args.steps,
        "sampler": args.sampler,
        "parallelism": args.parallel,
        "seed": args.seed,
    }
    if args.objective:
        body["objectives"] = args.objective
    if args.gpu_sku:
        body["gpu_sku"] = args.gpu_sku
    if args.quality_margin is not None:
        body["quality_margin"] = args.quality_margin
    sweep = api.post("sweeps/", body)
    print(
        f"sweep {sweep['id']} started: {sweep['sampler']} over {len(sweep['space'])} keys, "
        f"{sweep['probe_count']} probes of {sweep['probe_steps']} steps on queue {sweep['queue']}"
    )
    print_warnings("sweep start", sweep)
    return 0


def cmd_sweep_status(api: Api, args) -> int:
    sweep = api.get(f"sweeps/{args.sweep}/")
    if args.json:
        print(json.dumps(sweep, indent=2))
        return 0
    front = sum(1 for p in api.get(f"sweeps/{args.sweep}/frontier/") if p["on_frontier"])
    note = f" ({sweep['note']})" if sweep["note"] else ""
    print(
        f"sweep {sweep['id']} '{sweep['name']}': {sweep['status']}, "
        f"{sweep['probes_done']}/{sweep['probe_count']} "
        f"probes landed, {front} on the frontier{note}"
    )
    return 0


def _num(value, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def frontier_table(probes: list[dict]) -> str:
    keys = list(dict.fromkeys(k for p in probes for k in p["params"]))
    metrics_shown = METRICS + (
        [HELD_OUT] if any(p.get("eval_loss") is not None for p in probes) else []
    )
    head = [
        "#",
        *(k.split(".")[-1] for k in keys),
        *(m[0] for m in metrics_shown),
        "frontier",
        "status",
    ]
    rows = []
    for p in probes:
        metrics = [_num(p[field], digits) for _, field, digits in metrics_shown]
        if p["mem_estimated"] and metrics[1] != "-":
            metrics[1] += " est."
        status = (
            p["status"]
            if p["status"] != "infeasible"
            else f"infeasible: {p['reason'].splitlines()[0][:60]}"
        )
        rows.append(
            [
                str(p["number"]) + (" base" if p.get("is_base") else ""),
                *(str(p["params"].get(k, "-")) for k in keys),
                *metrics,
                "✓" if p["on_frontier"] else "",
                status,
            ]
        )
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)
    ]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def cmd_sweep_frontier(api: Api, args) -> int:
    probes = api.get(f"sweeps/{args.sweep}/frontier/")
    print(json.dumps(probes, indent=2) if args.json else frontier_table(probes))
    return 0


def cmd_sweep_cancel(api: Api, args) -> int:
    sweep = api.post(f"sweeps/{args.sweep}/cancel/", {})
    print(f"sweep {sweep['id']}: {sweep['status']}")
    return 0


def add_parser(sub) -> None:
    sw = sub.add_parser(
        "sweep", help="Search a strategy space for cheaper points (a Pareto frontier)."
    )
    cmds = sw.add_subparsers(dest="sweep_command", required=True, metavar="SWEEP_COMMAND")
    s = cmds.add_parser("start", help="Start a sweep from a base strategy and a search space.")
    s.add_argument("--name", required=True)
    s.add_argument("--strategy", required=True, metavar="FILE", help="Base strategy YAML.")
    s.add_argument(
        "--space",
        required=True,
        metavar="JSON|FILE",
        help='e.g. \'{"train.global_batch": [2, 4, 8], "model.seq_len": {"low": 64, "high": 256, '
        '"log2": true}}\' or a JSON file.',
    )
    s.add_argument("--probes", type=int, required=True, metavar="N", help="Probe budget.")
    s.add_argument("--steps", type=int, default=20, metavar="N", help="Timed steps per probe (20).")
    s.add_argument(
        "--objective",
        action="append",
        metavar="NAME",
        help="usd_per_mtok, peak_mem_mb, step_time_s, energy_j or eval_loss (the held-out "
        "loss: the strategy needs an eval: section) (repeatable; default the first two).",
    )
    s.add_argument(
        "--quality-margin",
        metavar="FRACTION",
        help="A quality constraint, e.g. 0.01: a probe whose held-out loss is more than 1 %% "
        "above the base strategy's is infeasible (the strategy needs an eval: section).",
    )
    s.add_argument(
        "--sampler",
        choices=["auto", "grid", "nsga2", "tpe"],
        default="auto",
        help="auto: grid when the space fits the budget, else tpe.",
    )
    s.add_argument(
        "--parallel", type=int, default=2, metavar="N", help="Probes queued at once (2)."
    )
    s.add_argument("--seed", type=int, default=0)
    s.add_argument(
        "--gpu-sku", metavar="NAME", help="Probe on this GPU model's queue; omit for CPU."
    )
    s.set_defaults(handler=cmd_sweep_start)
    for name, handler, text in (
        ("status", cmd_sweep_status, "One line on a sweep: status, probes, frontier size."),
        ("frontier", cmd_sweep_frontier, "Every probe; the frontier marked ✓."),
    ):
        p = cmds.add_parser(name, help=text)
        p.add_argument("sweep", type=int, metavar="SWEEP")
        p.add_argument("--json", action="store_true")
        p.set_defaults(handler=handler)
    c = cmds.add_parser("cancel", help="Stop a sweep's outstanding probes.")
    c.add_argument("sweep", type=int, metavar="SWEEP")
    c.set_defaults(handler=cmd_sweep_cancel)
