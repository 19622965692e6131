"""Quality beside cost, said one way by every command (`costlab report`, `costlab gate`).

The report's `quality` per arm (GET experiments/{id}/report/; null before the first attribution
window): verdict (not_measured, non_inferior, better, worse, inconclusive), metric, direction,
margin, value and control_value (mean final values), change (relative, positive = worse) and
change_low / change_high, its always-valid bounds, and a note saying why where there is one.
The dashboard's wording is apps.dashboard.quality; the CLI imports no Django,
so it says the same here.
"""

from __future__ import annotations

NOT_YET = "no attribution window has compared it yet"


def metric_label(metric: str | None) -> str:
    """eval_loss -> 'held-out loss'; a named metric keeps its name."""
    return "held-out loss" if metric in (None, "", "eval_loss") else metric


def percent(fraction: float) -> str:
    """0.01 -> '1 %', 0.015 -> '1.5 %' (a margin or a limit)."""
    return f"{round(fraction * 100, 2):g} %"


def _magnitude(fraction: float) -> str:
    return f"{abs(fraction) * 100:.1f}"


def change_words(change: float) -> str:
    """0.049 -> '4.9 % worse'; -0.02 -> '2.0 % better'; 0.0003 -> '0.0 % worse'."""
    if change == 0:
        return "0.0 %"
    return f"{_magnitude(change)} % {'worse' if change > 0 else 'better'}"


def bound_words(low: float, high: float) -> str:
    """The always-valid bounds of the change: 'bound 3.1–6.8 % worse', 'bound 0.8 % better to
    1.9 % worse'."""
    if low >= 0:
        return f"bound {_magnitude(low)}–{_magnitude(high)} % worse"
    if high <= 0:
        return f"bound {_magnitude(high)}–{_magnitude(low)} % better"
    return f"bound {_magnitude(low)} % better to {_magnitude(high)} % worse"


def _verdict(q: dict | None, verdict: str | None) -> str:
    if not q:
        return "not_measured"
    return verdict or q.get("verdict") or "not_measured"


def verdict_words(
    q: dict | None, *, verdict: str | None = None, margin: float | None = None
) -> str:
    """The verdict in a table cell: '4.9 % worse', 'non-inferior within 1 %', 'not measured'.
    `verdict` and `margin` replace the server's (the gate judges at its own limit)."""
    verdict = _verdict(q, verdict)
    if verdict == "not_measured":
        return "not measured"
    margin = q.get("margin", 0.01) if margin is None else margin
    change = q.get("change")
    if verdict == "non_inferior":
        return f"non-inferior within {percent(margin)}"
    if change is None:
        return "inconclusive"
    if verdict in ("worse", "better"):
        return change_words(change)
    return f"{change_words(change)}, inconclusive"


def quality_words(
    q: dict | None,
    *,
    verdict: str | None = None,
    margin: float | None = None,
    metric: str | None = None,
) -> str:
    """The verdict with its metric and its evidence, for a line: 'held-out loss 4.9 % worse
    (bound 3.1–6.8 % worse)', 'held-out loss not measured (no finished run of the arm evaluated
    eval_loss)'. `metric` names it where the arm has no quality block (the report's
    quality_metric)."""
    label = metric_label((q or {}).get("metric") or metric)
    verdict = _verdict(q, verdict)
    if verdict == "not_measured":
        return f"{label} not measured ({(q or {}).get('note') or NOT_YET})"
    said = verdict_words(q, verdict=verdict, margin=margin)
    low, high, change = q.get("change_low"), q.get("change_high"), q.get("change")
    evidence = bound_words(low, high) if low is not None and high is not None else q.get("note")
    if verdict == "non_inferior" and change is not None:
        evidence = f"{change_words(change)}; {evidence}" if evidence else change_words(change)
    return f"{label} {said}" + (f" ({evidence})" if evidence else "")


def usd_to_target_words(arm: dict, *, target: float | None) -> str:
    """The arm's estimated USD to reach the control's quality: '≈0.7012 (3/4 runs)', 'not reached
    (0/4 runs)', '-' where nothing was evaluated or there is no target."""
    evaluated = arm.get("runs_evaluated") or 0
    if target is None or not evaluated:
        return "-"
    runs = f"({arm.get('runs_reached_target') or 0}/{evaluated} runs)"
    if arm.get("usd_to_target") is None:
        return f"not reached {runs}"
    return f"≈{arm['usd_to_target']:,.4f} {runs}"
