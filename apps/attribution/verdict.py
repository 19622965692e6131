"""The verdict per arm: one rule for the API, the CLI's gate and the dashboard."""

from __future__ import annotations

from typing import Protocol

VERDICTS = (
    "control",
    "frozen",
    "no_data",
    "costlier",
    "cheaper",
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


def arm_verdict(arm: Compared, *, threshold: float) -> str:
    """control | frozen | no_data | costlier | cheaper | within_threshold | inconclusive.

    `costlier` / `cheaper` only when the always-valid bounds exclude the threshold; a point
    estimate beyond it whose bounds still include it is `inconclusive` (more runs needed).
    """
    if arm.is_control:
        return "control"
    if arm.state == "frozen":
        return "frozen"
    if arm.deviation is None:
        return "no_data"
    if arm.deviation_low is not None and arm.deviation_low > threshold:
        return "costlier"
    if arm.deviation_high is not None and arm.deviation_high < -threshold:
        return "cheaper"
    if abs(arm.deviation) <= threshold:
        return "within_threshold"
    return "inconclusive"
