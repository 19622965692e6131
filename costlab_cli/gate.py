"""`costlab gate`: fail the build when a candidate costs more than the control by more than allowed.

Exit 0: pass. 1: regression. 2: could not decide (no data, no control, bad input, API error).
The comparison is the report's cost metric (USD per 1M tokens, or per step for a per-step cost
model), measured so far; each outcome prints one line saying why.

Exact at the limit: the deviation and the limit are compared as decimals in percentage points,
rounded to 0.01 pp, so a candidate exactly at the limit passes whatever the float noise in
the figures. By default the point estimate is judged (any measured regression past the limit
fails: the cautious choice for CI), with a warning on stderr when either side has fewer runs than
the experiment's minimum; --evidence judges the freeze rule's always-valid lower bound instead, so
only a regression established at the experiment's alpha fails, and only once the freeze rule's
minimums are met (else it cannot decide: exit 2).
"""

from __future__ import annotations

import sys
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from costlab_cli.client import Api, CliError

PASS, REGRESSION = 0, 1
RESOLUTION_PP = Decimal("0.01")  # percentage points


def parse_regression(text: str) -> Decimal:
    """The limit in percentage points: '5%' -> 5.00; '0.05' -> 5.00.
    A bare number above 1 is refused: say '5%'."""
    raw = text.strip()
    try:
        value = Decimal(raw[:-1]) if raw.endswith("%") else Decimal(raw) * 100
    except InvalidOperation:
        raise CliError(f"--max-regression: {text!r} is not a number like 5% or 0.05") from None
    if not value.is_finite():
        raise CliError(f"--max-regression: {text!r} is not a finite number")
    if not raw.endswith("%") and value > 100:
        raise CliError(
            f"--max-regression: {text!r} is ambiguous; "
            f"write {raw}% (percent) or a fraction like 0.05"
        )
    if value < 0:
        raise CliError("--max-regression: must be >= 0")
    if value != value.quantize(RESOLUTION_PP):
        raise CliError(
            f"--max-regression: {text!r} is finer than the gate's resolution "
            "of 0.01 percentage points"
        )
    return value.quantize(RESOLUTION_PP)


def as_pp(fraction: float) -> Decimal:
    """A relative deviation (0.02) in percentage points at the gate's resolution (2.00)."""
    return (Decimal(repr(fraction)) * 100).quantize(RESOLUTION_PP, rounding=ROUND_HALF_EVEN)


LABELS = {
    "usd_per_mtok": "USD/1M tokens",
    "usd_per_step": "USD/step",
    "gco2e_per_mtok": "gCO2e/1M tokens",
    "gco2e_per_step": "gCO2e/step",
}


def run_metric(run: dict, metric: str) -> float | None:
    """The run's figure on the report's metric (its bill, or its gCO2e as billed)."""
    if metric.startswith("gco2e"):
        grams = (run.get("carbon") or {}).get("g_co2e")
        if grams is None:
            return None
        amount = float(grams)
    else:
        amount = float(run["cost_usd"])
    if metric.endswith("_per_mtok"):
        return amount / run["tokens"] * 1e6 if run["tokens"] else None
    return amount / run["steps"] if run["steps"] else None


def _minimum_runs(report: dict) -> int | None:
    """Runs per arm before the freeze rule decides: the experiment's minimums (None from a server
    that does not say them)."""
    if report.get("min_runs_per_arm") is None:
        return None
    return max(report["min_runs_per_arm"], report.get("min_cs_runs_per_arm") or 0)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _warn_if_noisy(report: dict, control: dict, arm: dict | None) -> None:
    """A point estimate on fewer runs than the experiment's minimum: say how noisy it is (stderr;
    the exit status is the estimate's)."""
    minimum = _minimum_runs(report)
    if minimum is None or "runs" not in control:
        return
    candidate_runs = arm["runs"] if arm is not None else 1  # --run: one run
    if min(control["runs"], candidate_runs) >= minimum:
        return
    print(
        f"costlab gate: warning: {_plural(control['runs'], 'control run')} and "
        f"{_plural(candidate_runs, 'candidate run')}, fewer than the experiment's minimum of "
        f"{minimum}: a point estimate this noisy has moved ±15 % for identical strategies "
        "(--evidence decides only on enough runs)",
        file=sys.stderr,
        flush=True,
    )


def _evidence_met(report: dict, arm: dict, control: dict) -> None:
    """--evidence judges the freeze rule's bound: only once the rule's minimums are met by the arm
    and the control at the latest attribution window (else exit 2, saying what is missing)."""
    minimum = _minimum_runs(report)
    if minimum is None or "evidence_runs" not in arm:
        return
    samples = report.get("min_samples_per_arm") or 0
    short = [
        a
        for a in (arm, control)
        if a["evidence_runs"] < minimum or a.get("evidence_samples", 0) < samples
    ]
    if short:
        counted = ", ".join(
            f"{_plural(a['evidence_runs'], 'run')} and "
            f"{_plural(a.get('evidence_samples', 0), 'sample')} of "
            f"{'the control ' if a['is_control'] else ''}'{a['name']}'"
            for a in (arm, control)
        )
        raise CliError(
            f"--evidence: arm '{arm['name']}' cannot be decided yet: the freeze rule needs "
            f"{minimum} runs and {samples} samples of each arm at an attribution window, and the "
            f"latest counted {counted}; gate without --evidence or wait"
        )


def cmd_gate(api: Api, args) -> int:
    limit = parse_regression(args.max_regression)
    evidence = bool(getattr(args, "evidence", False))
    metric = getattr(args, "metric", "usd")
    report = api.get(f"experiments/{args.experiment}/report/", metric=metric)
    control = next((a for a in report["arms"] if a["is_control"]), None)
    if control is None:
        raise CliError(f"experiment {args.experiment} has no control arm to compare with")
    if control["metric_value"] is None:
        raise CliError(
            f"control arm '{control['name']}' has no "
            + ("gCO2e (no grid intensity) " if metric == "gco2e" else "priced runs ")
            + "yet: no baseline to compare with"
        )
    label = LABELS.get(control["metric"], control["metric"])

    if args.run is not None:
        if evidence:
            raise CliError(
                "--evidence: a single run has no confidence bound; gate its arm (--arm) instead"
            )
        run = api.get(f"runs/{args.run}/")
        if run["experiment"] != report["experiment_id"]:
            raise CliError(
                f"--run: run {args.run} belongs to experiment {run['experiment']}, "
                f"not {args.experiment}"
            )
        if run["status"] != "succeeded":
            raise CliError(
                f"--run: run {args.run} is {run['status']}; gate a succeeded run (submit --wait)"
            )
        value = run_metric(run, control["metric"])
        if value is None:
            raise CliError(
                f"--run: run {args.run} reported no tokens or steps to price"
                + (", or its carbon is unpriced" if metric == "gco2e" else "")
            )
        candidates = [
            (
                f"run {run['id']} (arm '{run['arm']['name']}')",
                value / control["metric_value"] - 1,
                value,
                None,
            )
        ]
    else:
        arms = [a for a in report["arms"] if not a["is_control"]]
        if args.arm:
            missing = sorted(set(args.arm) - {a["name"] for a in arms})
            if missing:
                raise CliError(
                    f"--arm: experiment {args.experiment} has no candidate arm named '{missing[0]}'"
                )
            arms = [a for a in arms if a["name"] in args.arm]
        named = bool(args.arm)
        without = [a["name"] for a in arms if a["deviation"] is None]
        if named and without:
            raise CliError(f"arm '{without[0]}' has no priced runs yet: nothing to compare")
        candidates = [
            (f"arm '{a['name']}'", a["deviation"], a["metric_value"], a)
            for a in arms
            if a["deviation"] is not None
        ]
        if not candidates:
            raise CliError(
                f"experiment {args.experiment} has no candidate arm with priced runs to compare"
            )
        if evidence:
            for *_, a in candidates:
                _evidence_met(report, a, control)
            unbounded = [a["name"] for *_, a in candidates if a["deviation_low"] is None]
            if unbounded:
                raise CliError(
                    f"--evidence: arm '{unbounded[0]}' has no confidence bound yet (no attribution "
                    "window with enough runs); gate without --evidence or wait"
                )

    judged = [
        (who, dev, value, arm, as_pp(arm["deviation_low"] if evidence else dev))
        for who, dev, value, arm in candidates
    ]
    who, deviation, value, arm, score = max(judged, key=lambda c: c[4])
    failed = score > limit
    bounds = ""
    if arm is not None and arm.get("deviation_low") is not None:
        bounds = (
            f"; always-valid bounds {as_pp(arm['deviation_low']):+}% "
            f".. {as_pp(arm['deviation_high']):+}%"
        )
    judged_by = "lower bound" if evidence else "estimate"
    if not evidence:
        _warn_if_noisy(report, control, arm)
    print(
        f"{'REGRESSION' if failed else 'PASS'}: "
        f"{who} {'emits' if metric == 'gco2e' else 'costs'} {as_pp(deviation):+}% {label} vs "
        "control "
        f"'{control['name']}' ({value:.4f} vs {control['metric_value']:.4f}{bounds}; {judged_by} "
        f"{score:+}% vs limit +{limit}%)"
    )
    return REGRESSION if failed else PASS
