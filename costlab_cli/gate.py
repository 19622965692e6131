"""`costlab gate`: fail the build when a candidate costs more than the control by more than allowed.

Exit 0: pass. 1: regression. 2: could not decide (no data, no control, bad input, API error).
The comparison is the report's cost metric (USD per 1M tokens, or per step for a per-step cost
model), measured so far; each outcome prints one line saying why.
"""

from __future__ import annotations

from costlab_cli.client import Api, CliError

PASS, REGRESSION = 0, 1


def parse_regression(text: str) -> float:
    """'5%' -> 0.05; '0.05' -> 0.05. A bare number above 1 is refused: say '5%'."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise CliError(f"--max-regression: {text!r} is not a number like 5% or 0.05") from None
    if not raw.endswith("%") and value > 1:
        raise CliError(f"--max-regression: {text!r} is ambiguous; write {raw}% (percent) or a fraction like 0.05")
    if value < 0:
        raise CliError("--max-regression: must be >= 0")
    return value


def _metric_label(metric: str) -> str:
    return "USD/1M tokens" if metric == "usd_per_mtok" else "USD/step"


def run_metric(run: dict, metric: str) -> float | None:
    cost = float(run["cost_usd"])
    if metric == "usd_per_mtok":
        return cost / run["tokens"] * 1e6 if run["tokens"] else None
    return cost / run["steps"] if run["steps"] else None


def cmd_gate(api: Api, args) -> int:
    limit = parse_regression(args.max_regression)
    report = api.get(f"experiments/{args.experiment}/report/")
    control = next((a for a in report["arms"] if a["is_control"]), None)
    if control is None:
        raise CliError(f"experiment {args.experiment} has no control arm to compare with")
    if control["metric_value"] is None:
        raise CliError(f"control arm '{control['name']}' has no priced runs yet: no baseline to compare with")
    label = _metric_label(control["metric"])

    if args.run is not None:
        run = api.get(f"runs/{args.run}/")
        if run["experiment"] != report["experiment_id"]:
            raise CliError(f"--run: run {args.run} belongs to experiment {run['experiment']}, not {args.experiment}")
        if run["status"] != "succeeded":
            raise CliError(f"--run: run {args.run} is {run['status']}; gate a succeeded run (submit --wait)")
        value = run_metric(run, control["metric"])
        if value is None:
            raise CliError(f"--run: run {args.run} reported no tokens or steps to price")
        candidates = [(f"run {run['id']} (arm '{run['arm']['name']}')", value / control["metric_value"] - 1, value)]
    else:
        arms = [a for a in report["arms"] if not a["is_control"]]
        if args.arm:
            missing = sorted(set(args.arm) - {a["name"] for a in arms})
            if missing:
                raise CliError(f"--arm: experiment {args.experiment} has no candidate arm named '{missing[0]}'")
            arms = [a for a in arms if a["name"] in args.arm]
        named = bool(args.arm)
        without = [a["name"] for a in arms if a["deviation"] is None]
        if named and without:
            raise CliError(f"arm '{without[0]}' has no priced runs yet: nothing to compare")
        candidates = [(f"arm '{a['name']}'", a["deviation"], a["metric_value"]) for a in arms if a["deviation"] is not None]
        if not candidates:
            raise CliError(f"experiment {args.experiment} has no candidate arm with priced runs to compare")

    who, deviation, value = max(candidates, key=lambda c: c[1])
    verdict = "REGRESSION" if deviation > limit else "PASS"
    print(f"{verdict}: {who} costs {deviation * 100:+.1f}% {label} vs control '{control['name']}' "
          f"({value:.4f} vs {control['metric_value']:.4f}; limit +{limit * 100:g}%)")
    return REGRESSION if deviation > limit else PASS
