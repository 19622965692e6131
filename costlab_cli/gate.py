"""`costlab gate`: fail the build when a candidate costs more than the control by more than allowed,
or (with --max-quality-loss) trains a worse model than allowed.

Exit 0: pass. 1: cost regression. 2: could not decide (no data, no control, bad input, API error;
usage billed with no price in the arm or the control, naming the SKU; with --evidence, a bound
that does not decide yet). 3: quality regression. 4: quality not measured
while --max-quality-loss is given. Where cost and quality both fail, 1. The comparison is the
report's cost metric (USD per 1M tokens, or per step for a per-step cost model), measured so far;
each check prints one line saying why.

Exact at the limit: the deviation and the limit are compared as decimals in percentage points,
rounded to 0.01 pp, so a candidate exactly at the limit passes whatever the float noise in
the figures. By default the point estimate is judged (any measured regression past the limit
fails: the cautious choice for CI), with a warning on stderr when either side has fewer runs than
the experiment's minimum; --evidence judges the freeze rule's always-valid lower bound instead, so
only a regression established at the experiment's alpha fails, and only once the freeze rule's
minimums are met (else it cannot decide: exit 2).

Quality (the report's `quality` per arm: the relative change of the arm's held-out metric from the
control's, positive = worse, with its always-valid bounds) is judged the same way at
--max-quality-loss: the bound's lower end past the limit fails (3), its upper end within the limit
passes, and a bound that spans the limit (or none yet) leaves it to the point estimate, with a
warning, or with --evidence to exit 2. An arm the server proved worse beyond the experiment's own
quality margin (verdict worse or cheaper_but_worse) never passes a gate given --max-quality-loss.
Without the flag the quality line is printed all the same, and a proven-worse arm warns on stderr,
but the exit status is cost's alone.
"""

from __future__ import annotations

import sys
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from costlab_cli.client import Api, CliError
from costlab_cli.quality import percent, quality_words

PASS, REGRESSION, UNDECIDED, QUALITY_REGRESSION, QUALITY_NOT_MEASURED = 0, 1, 2, 3, 4
# Where several checks fail, the exit status is the first of these (cost keeps its old meaning).
PRECEDENCE = (REGRESSION, QUALITY_REGRESSION, QUALITY_NOT_MEASURED, UNDECIDED, PASS)
RESOLUTION_PP = Decimal("0.01")  # percentage points


def parse_regression(text: str, option: str = "--max-regression") -> Decimal:
    """The limit in percentage points: '5%' -> 5.00; '0.05' -> 5.00.
    A bare number above 1 is refused: say '5%'."""
    raw = text.strip()
    try:
        value = Decimal(raw[:-1]) if raw.endswith("%") else Decimal(raw) * 100
    except InvalidOperation:
        raise CliError(f"{option}: {text!r} is not a number like 5% or 0.05") from None
    if not value.is_finite():
        raise CliError(f"{option}: {text!r} is not a finite number")
    if not raw.endswith("%") and value > 100:
        raise CliError(
            f"{option}: {text!r} is ambiguous; write {raw}% (percent) or a fraction like 0.05"
        )
    if value < 0:
        raise CliError(f"{option}: must be >= 0")
    if value != value.quantize(RESOLUTION_PP):
        raise CliError(
            f"{option}: {text!r} is finer than the gate's resolution of 0.01 percentage points"
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


def _warn(message: str) -> None:
    print(f"costlab gate: warning: {message}", file=sys.stderr, flush=True)


def _versus(q: dict, control: dict, judged: str = "") -> str:
    """' vs control 'main' (3.1500 vs 3.0000; <judged>)': the two mean final values."""
    values = (
        f"{q['value']:.4f} vs {q['control_value']:.4f}"
        if q.get("value") is not None and q.get("control_value") is not None
        else ""
    )
    inside = "; ".join(part for part in (values, judged) if part)
    return f" vs control '{control['name']}'" + (f" ({inside})" if inside else "")


def _warn_if_proven_worse(report: dict, arm: dict) -> None:
    """Without --max-quality-loss the exit status is cost's: a proven-worse model is said on
    stderr."""
    q = arm.get("quality") or {}
    if q.get("verdict") != "worse":
        return
    verdict = arm.get("verdict")
    reads = f"reads {verdict}" if verdict in ("cheaper_but_worse", "worse") else f"is {verdict}"
    cheaper = "cheaper per token, but " if verdict == "cheaper_but_worse" else ""
    _warn(
        f"arm '{arm['name']}' {reads}: {cheaper}proven worse beyond the experiment's "
        f"{percent(q.get('margin', 0.01))} quality margin: "
        f"{quality_words(q, metric=report.get('quality_metric'))}; this gate judges cost only: "
        "add --max-quality-loss to fail on it"
    )


def gate_quality(
    report: dict, arm: dict, control: dict, *, limit: Decimal | None, evidence: bool
) -> int:
    """The arm's quality against the control: one line on stdout, and the exit status it calls for
    (PASS without --max-quality-loss: the line is said, not gated)."""
    q = arm.get("quality")
    metric = report.get("quality_metric")
    who = f"arm '{arm['name']}'"
    if limit is None:
        measured = q and q.get("verdict") != "not_measured"
        print(
            f"quality (not gated): {who} {quality_words(q, metric=metric)}"
            + (_versus(q, control) if measured else "")
        )
        _warn_if_proven_worse(report, arm)
        return PASS
    margin = float(limit) / 100
    if not q or q.get("verdict") == "not_measured":
        print(
            f"QUALITY NOT MEASURED: {who} {quality_words(q, metric=metric)}; --max-quality-loss "
            f"{percent(margin)} fails an arm whose quality is not measured: report a held-out "
            f"evaluation ({metric or 'eval_loss'}) from the arm's and the control's runs"
        )
        return QUALITY_NOT_MEASURED
    low, high, change = q.get("change_low"), q.get("change_high"), q.get("change")
    bounded = low is not None and high is not None
    if (bounded and as_pp(low) > limit) or q.get("verdict") == "worse":
        verdict, failed = "worse", True
        judged = f"lower bound {as_pp(low):+}% vs limit +{limit}%" if low is not None else ""
        if low is None or as_pp(low) <= limit:
            # The experiment's own margin proved it worse: a looser limit never passes it.
            judged += f"; proven worse beyond the experiment's {percent(q['margin'])} margin"
            judged = judged.removeprefix("; ")
    elif bounded and as_pp(high) <= limit:
        verdict = "better" if as_pp(high) < -limit else "non_inferior"
        failed, judged = False, f"upper bound {as_pp(high):+}% vs limit +{limit}%"
    elif evidence or change is None:
        what = quality_words(q, verdict="inconclusive", margin=margin, metric=metric)
        print(
            f"costlab gate: error: {'--evidence: ' if evidence else ''}the quality of {who} "
            f"cannot be decided yet against --max-quality-loss {percent(margin)}: {what}; "
            + ("gate without --evidence or wait" if evidence else "wait for more evaluated runs"),
            file=sys.stderr,
            flush=True,
        )
        return UNDECIDED
    else:
        failed = as_pp(change) > limit
        verdict, judged = "inconclusive", f"estimate {as_pp(change):+}% vs limit +{limit}%"
        _warn(
            f"the quality of {who} is not proven either way at the {percent(margin)} limit "
            f"({q.get('note') or 'the always-valid bound spans it'}): judged on its point "
            "estimate; --evidence waits for the bound"
        )
    said = quality_words(q, verdict=verdict, margin=margin, metric=metric)
    print(
        f"{'QUALITY REGRESSION' if failed else 'PASS'}: {who} {said}" + _versus(q, control, judged)
    )
    return QUALITY_REGRESSION if failed else PASS


def _unpriced_reason(who: str, unpriced: dict, skus: list) -> str:
    parts = ", ".join(f"{c} {seconds:g} s" for c, seconds in sorted(unpriced.items()))
    sku = f" (no price for {', '.join(skus)})" if skus else ""
    return (
        f"{who} has usage billed with no price: {parts}{sku}; a $0 line is not a saving, so "
        "nothing is compared: add the price to the pricing table, then re-price"
    )


def _refuse_unpriced(side: str, arm: dict) -> None:
    """Cannot decide (exit 2) where the arm or the control holds unpriced usage (issue 45: an
    H100 candidate with unpriced GPU time printed PASS -93.81 %)."""
    if arm.get("unpriced") and arm.get("metric", "").startswith("usd"):
        who = f"{'control' if side == 'control' else 'arm'} '{arm['name']}'"
        raise CliError(_unpriced_reason(who, arm["unpriced"], arm.get("unpriced_skus") or []))


def cmd_gate(api: Api, args) -> int:
    limit = parse_regression(args.max_regression)
    quality_text = getattr(args, "max_quality_loss", None)
    quality_limit = (
        None if quality_text is None else parse_regression(quality_text, "--max-quality-loss")
    )
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
    _refuse_unpriced("control", control)

    if args.run is not None:
        if evidence:
            raise CliError(
                "--evidence: a single run has no confidence bound; gate its arm (--arm) instead"
            )
        if quality_limit is not None:
            raise CliError(
                "--max-quality-loss: quality is judged over an arm's evaluated runs; "
                "gate its arm (--arm) instead"
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
        if metric == "usd" and run.get("unpriced"):
            raise CliError(_unpriced_reason(f"run {run['id']}", run["unpriced"], []))
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
        for *_, a in candidates:
            _refuse_unpriced("arm", a)
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
    if arm is not None:
        quality_arms = [a for *_, a in candidates]
    else:  # --run: the quality its arm has shown
        quality_arms = [a for a in report["arms"] if a["name"] == run["arm"]["name"]]
    codes = {REGRESSION if failed else PASS} | {
        gate_quality(report, a, control, limit=quality_limit, evidence=evidence)
        for a in quality_arms
    }
    return next(code for code in PRECEDENCE if code in codes)
