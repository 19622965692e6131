"""The per-arm verdict the API reports next to attribution's numbers."""

from __future__ import annotations

from apps.attribution.report import ArmReport


def arm_verdict(arm: ArmReport, *, threshold: float) -> str:
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
