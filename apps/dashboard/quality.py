"""Quality beside cost, as the dashboard says it: the verdict card's quality clause, the
comparison's quality columns and their CSV.

The quality verdict is attribution's (apps.attribution.decide.quality): each arm's finished runs'
final value of the experiment's metric against the control's, as a relative change signed so that a
positive change is worse, with its always-valid interval. It is said as the card says cost, by
dashboard_format.difference: a size and a word ("4.9 % worse", as "18 % cheaper") and the
interval in the same words ("95 % sure it is 4.1–5.7 % worse", "... between 0.4 % better and 0.6 %
worse"). Quality that was not measured is said, never left out nor taken as equal.
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.dashboard.templatetags.dashboard_format import confidence, difference, significant

EVAL_LOSS = "eval_loss"


@dataclass(frozen=True)
class QualitySaid:
    """An arm's quality against the control's, ready to be said."""

    verdict: str  # apps.attribution.decide.quality.QUALITY_VERDICTS
    what: str  # "held-out loss", "held-out accuracy"
    amount: str  # "4.9 % worse", "3.2 % better" ("" without a change)
    bound: str  # "95 % sure it is 4.1–5.7 % worse, beyond the 1 % margin" ("" without one)
    text: str  # the whole clause: "held-out loss within 1 % of the control's (...)"


def metric_words(metric: str) -> str:
    """What the metric is, in words: "held-out loss" for eval_loss, else "held-out <metric>"."""
    return "held-out loss" if metric == EVAL_LOSS else f"held-out {metric}"


# Notes recorded in windows' evidence (kept as stored: a recompute reproduces them), said plainly.
PLAIN_NOTES = {
    "the always-valid bound still spans the margin": "the interval still spans the margin",
}


def quality_said(q: dict | None, *, sure: str | None = None) -> QualitySaid:
    """The card's quality clause of one arm (q: ArmReport.quality, or a snapshot's; None before the
    window had a quality verdict). The interval is said at the confidence the window recorded
    (its alpha), else at `sure` ("95 %")."""
    if not q:
        return QualitySaid(
            "not_measured",
            "held-out quality",
            "",
            "",
            "held-out quality not measured: the latest attribution window has no quality verdict",
        )
    verdict, what = q["verdict"], metric_words(q.get("metric", EVAL_LOSS))
    margin = f"{significant(float(q.get('margin') or 0) * 100, 2)} %"
    note = q.get("note") or ""
    note = PLAIN_NOTES.get(note, note)
    said = difference(q.get("change"), q.get("change_low"), q.get("change_high"), words="quality")
    amount, bound = said.amount, ""
    if said.interval:
        if q.get("alpha") is not None:
            sure = confidence(q["alpha"])
        bound = f"{sure} sure it is {said.interval}" if sure else f"interval: {said.interval}"
    if verdict == "not_measured":
        text = f"held-out quality not measured: {note or 'no evaluated run'}"
        return QualitySaid(verdict, what, "", "", text)
    if verdict in ("worse", "better"):
        bound = f"{bound}, beyond the {margin} margin" if bound else f"beyond the {margin} margin"
        return QualitySaid(verdict, what, amount, bound, f"its {what} is {amount} ({bound})")
    if verdict == "non_inferior":
        text = f"{what} within {margin} of the control's"
        return QualitySaid(verdict, what, amount, bound, f"{text} ({bound})" if bound else text)
    # inconclusive: what it is so far, and what is missing
    text = f"{what} inconclusive" + (f": {amount} so far" if amount else "")
    if bound:
        text += f" ({bound})"
    return QualitySaid(verdict, what, amount, bound, f"{text}; {note}" if note else text)


# ---------------------------------------------------------------------------------------------
# The comparison's quality columns (the experiment page's table and its CSV)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QualityRow:
    """One arm's quality columns, as the comparison table and its CSV show them."""

    said: QualitySaid
    verdict: str  # "control" for the control, else its quality verdict
    value: float | None  # the arm's mean final value of the metric
    change: float | None  # relative to the control's, + = worse (None for the control)
    change_low: float | None
    change_high: float | None
    runs_compared: int  # the finished runs the quality verdict weighed
    usd_to_target: float | None  # estimated: USD to the control's final value
    usd_words: str  # why there is none: "not reached" or "not measured" ("" where there is)
    runs_reached_target: int
    runs_evaluated: int


def quality_row(arm, *, target: float | None) -> QualityRow:
    """An ArmReport's quality columns; `target`: the report's quality_target."""
    q = arm.quality or {}
    said = quality_said(arm.quality)
    if arm.usd_to_target is not None:
        usd_words = ""
    elif target is None or not arm.runs_evaluated:
        usd_words = "not measured"
    else:
        usd_words = "not reached"
    own = not arm.is_control
    return QualityRow(
        said=said,
        verdict="control" if arm.is_control else said.verdict,
        value=q.get("value"),
        change=q.get("change") if own else None,
        change_low=q.get("change_low") if own else None,
        change_high=q.get("change_high") if own else None,
        runs_compared=int(q.get("runs") or 0),
        usd_to_target=arm.usd_to_target,
        usd_words=usd_words,
        runs_reached_target=arm.runs_reached_target,
        runs_evaluated=arm.runs_evaluated,
    )


def quality_csv_columns(report) -> list[str]:
    """The CSV's closing columns: the differences in words first (cost, carbon and quality, as the
    page says them: "28 % cheaper (9.6–47 %)"), then quality's; names carry the metric, the sign
    and what is estimated. The signed columns (deviation, ...) stay numbers, negative = cheaper."""
    metric = report.quality_metric
    return [
        "deviation_said",
        "carbon_deviation_said",
        "quality_change_said",
        "quality_metric",
        "quality_direction",
        "quality_verdict",
        f"{metric}_mean_final",
        "quality_change_vs_control (+ = worse)",
        "quality_change_low",
        "quality_change_high",
        "quality_runs_compared",
        f"quality_target ({metric}: the control's mean final)",
        "usd_to_target (est.)",
        "runs_reached_target",
        "runs_evaluated",
    ]


def quality_csv_values(arm, report) -> list:
    """One arm's quality columns (quality_csv_columns): "not reached" or "not measured" where
    there is no cost to the control's quality."""
    row = quality_row(arm, target=report.quality_target)
    low = None if arm.deviation_low is None else max(arm.deviation_low, -1.0)  # never below -100 %
    return [
        "control" if arm.is_control else str(difference(arm.deviation, low, arm.deviation_high)),
        "control"
        if arm.is_control
        else str(
            difference(
                arm.carbon_deviation,
                None if arm.carbon_deviation_low is None else max(arm.carbon_deviation_low, -1.0),
                arm.carbon_deviation_high,
                words="carbon",
            )
        ),
        "control"
        if arm.is_control
        else str(difference(row.change, row.change_low, row.change_high, words="quality")),
        report.quality_metric,
        report.quality_direction,
        row.verdict,
        row.value,
        row.change,
        row.change_low,
        row.change_high,
        row.runs_compared,
        report.quality_target,
        row.usd_to_target if row.usd_to_target is not None else row.usd_words,
        row.runs_reached_target,
        row.runs_evaluated,
    ]
