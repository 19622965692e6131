"""The verdict per arm: one rule for the API, the CLI's gate, the dashboard and the freeze.

A verdict is conclusive (`costlier`, `cheaper`) exactly when the freeze rule could act on it: the
experiment's minimums met by the arm and by the control at the latest attribution window, and the
always-valid bound of that window beyond the threshold. The rule itself (its minimums, its bound)
is written once, in apps.attribution.decide.freeze_rule, which apps.attribution.decide.decisions
acts on; this module says it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from apps.attribution.decide.freeze_rule import (
    BOUND,
    DEVIATION,
    EVIDENCE,
    STATE,
    Minimums,
    Shortfall,
    bound_clears,
    evidence_shortfalls,
    freeze_blocks,
)

VERDICTS = (
    "control",
    "frozen",
    "no_data",
    "costlier",
    "cheaper",
    "cheaper_but_worse",
    "worse",
    "unpriced",
    "within_threshold",
    "inconclusive",
)


class Compared(Protocol):
    """What a verdict is taken from: an ArmReport, or anything with these fields."""

    is_control: bool
    state: str
    deviation: float | None  # (arm - control) / control on the compared metric
    deviation_low: float | None  # the always-valid bounds of the latest attribution window
    deviation_high: float | None
    evidence_runs: int  # runs and samples that window counted: what the freeze rule weighed
    evidence_samples: int
    quality: dict | None  # that window's quality verdict (apps.attribution.decide.quality), or None
    unpriced: dict  # seconds billed with no price, by component: never compared


def _evidence(arm: Compared, control: Compared | None) -> dict:
    """The runs and samples of the arm and of the control that the latest window counted."""
    return {
        "arm_runs": arm.evidence_runs,
        "arm_samples": arm.evidence_samples,
        "control_runs": control.evidence_runs if control is not None else 0,
        "control_samples": control.evidence_samples if control is not None else 0,
    }


def shortfalls_of(arm: Compared, control: Compared | None, minimums: Minimums) -> list[Shortfall]:
    return evidence_shortfalls(**_evidence(arm, control), minimums=minimums)


def arm_verdict(
    arm: Compared, *, control: Compared | None, threshold: float, minimums: Minimums
) -> str:
    """control | frozen | no_data | costlier | cheaper | cheaper_but_worse | worse |
    within_threshold | inconclusive.

    `costlier` / `cheaper` only when the minimums are met and the always-valid bounds exclude the
    threshold; `within_threshold` only when they are met and the bounds lie inside ±threshold
    (equivalence shown). Anything else with a deviation is `inconclusive` (more runs needed).
    Quality proven worse beyond the experiment's margin turns `cheaper` into `cheaper_but_worse`
    (frozen or not: it is what the freeze was for) and any other verdict of an active arm into
    `worse`. An active arm whose runs, or the control's, hold usage billed with no price is
    `unpriced`: never cheaper nor costlier (a $0 line is not a saving).
    """
    if arm.is_control:
        return "control"
    if arm.state != "frozen" and (
        getattr(arm, "unpriced", None) or getattr(control, "unpriced", None)
    ):
        return "unpriced"
    cost = _cost_verdict(arm, control=control, threshold=threshold, minimums=minimums)
    worse = (getattr(arm, "quality", None) or {}).get("verdict") == "worse"
    if worse and cost == "cheaper":
        return "cheaper_but_worse"
    if arm.state == "frozen":
        return "frozen"
    return "worse" if worse else cost


def _cost_verdict(
    arm: Compared, *, control: Compared | None, threshold: float, minimums: Minimums
) -> str:
    if arm.deviation is None:
        return "no_data"
    low, high = arm.deviation_low, arm.deviation_high
    if low is None or high is None or shortfalls_of(arm, control, minimums):
        return "inconclusive"
    if bound_clears(low, threshold):
        return "costlier"
    if high < -threshold:
        return "cheaper"
    if low >= -threshold and high <= threshold:
        return "within_threshold"
    return "inconclusive"


def _pct(fraction: float) -> str:
    return f"{fraction * 100:+.3g} %"


def freeze_holds(
    arm: Compared,
    *,
    control: Compared | None,
    threshold: float,
    minimums: Minimums,
    arm_name: str = "the arm",
    control_name: str = "the control",
    bound_words: Callable[[float | None, float | None, float], str] | None = None,
) -> list[str]:
    """Why an arm whose deviation lies beyond the threshold is not frozen, in the freeze rule's
    terms, shortest first; empty when it is frozen or within the threshold.

    `bound_words(low, high, threshold)`: how the bound that holds it back is said (low None: no
    bound yet); the dashboard says it in words, the API and the CLI in signed percents."""
    if arm.is_control:
        return []
    blocks = freeze_blocks(
        active=arm.state != "frozen",
        **_evidence(arm, control),
        estimate=arm.deviation,
        low=arm.deviation_low,
        threshold=threshold,
        minimums=minimums,
    )
    # Frozen already, or no deviation beyond the threshold (a cheaper arm is never frozen):
    # nothing to explain.
    if any(b.kind in (STATE, DEVIATION) for b in blocks):
        return []
    holds = []
    names = {"arm": arm_name, "control": control_name}
    by_side: dict[tuple[str, str], Shortfall] = {}
    # Of two run minimums, the larger says it.
    for s in (b.shortfall for b in blocks if b.kind == EVIDENCE):
        key = (s.side, s.what)
        if key not in by_side or s.needs > by_side[key].needs:
            by_side[key] = s
    for s in by_side.values():
        holds.append(f"{names[s.side]} has {s.has} of {s.needs} {s.what}")
    bound = next((b for b in blocks if b.kind == BOUND), None)
    if bound is None:
        pass
    elif bound_words is not None:
        holds.append(bound_words(bound.value, arm.deviation_high, bound.threshold))
    elif bound.value is None:
        holds.append("no always-valid bound yet (each arm needs 2 priced runs in a window)")
    else:
        holds.append(
            f"the always-valid lower bound {_pct(bound.value)} does not clear the "
            f"{_pct(bound.threshold)} threshold"
        )
    return holds


@dataclass(frozen=True)
class Said:
    verdict: str  # one of VERDICTS
    not_frozen: list[str]  # freeze_holds: why a deviation beyond the threshold froze nothing


def arms_verdicts(
    arms: list,
    *,
    threshold: float,
    minimums: Minimums,
    bound_words: Callable[[float | None, float | None, float], str] | None = None,
) -> dict[int, Said]:
    """Per arm id (arms: Compared with an arm_id and a name, the control among them), its verdict
    and why it is not frozen: what the API's report, the experiment page and the list say
    (`bound_words`: freeze_holds')."""
    control = next((a for a in arms if a.is_control), None)
    rule = {"control": control, "threshold": threshold, "minimums": minimums}
    control_name = f"'{control.name}'" if control is not None else "the control"
    return {
        a.arm_id: Said(
            arm_verdict(a, **rule),
            freeze_holds(
                a,
                **rule,
                arm_name=f"'{a.name}'",
                control_name=control_name,
                bound_words=bound_words,
            ),
        )
        for a in arms
    }
