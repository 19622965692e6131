"""The experiment page's verdict card: the verdicts (apps.dashboard.verdicts) with the lines only
the card says. The outlier runs each verdict weighed, with the verdict without them (the latest
window rebuilt without them by the tick's own path), or that the window left them out; and the
carbon beside the cost, in the cost's words, never as a result before the cost is compared.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from django.utils import timezone

from apps.attribution.models import AttributionSnapshot, AttributionWindow
from apps.attribution.reads import window_without
from apps.dashboard.templatetags.dashboard_format import difference, significant
from apps.dashboard.verdicts import (
    Freeze,
    Verdict,
    clip_low,
    latest_snapshots,
    snapshots_said,
    sure_it_is,
)
from apps.experiments.models import Experiment
from apps.experiments.selectors import OUTLIER_MADS, RunOutlier


@dataclass(frozen=True)
class Card:
    """An experiment's verdicts, with their outlier lines, and the attribution window they are of
    (None before the first)."""

    verdicts: list[Verdict]
    window: AttributionWindow | None


def experiment_card(
    *,
    experiment: Experiment,
    now: datetime | None = None,
    outliers: dict[int, RunOutlier] | None = None,
) -> Card:
    """The card: the list's verdicts of this one experiment, each with the outlier runs it weighed
    (`outliers`: the experiment's, run id -> RunOutlier; one query more where there are), and its
    latest attribution window, read with the verdicts (a query of its own only when that window
    holds no snapshot)."""
    now = now or timezone.now()
    by_experiment, freezes = latest_snapshots(experiments=[experiment])
    rows = by_experiment.get(experiment.pk, [])
    said = snapshots_said(experiment=experiment, rows=rows, freezes=freezes, now=now)
    if outliers and rows:
        lines = outlier_lines(
            experiment=experiment, rows=rows, outliers=outliers, freezes=freezes, now=now
        )
        said = [
            replace(
                v,
                outliers=lines.get(v.arm_id, ""),
                outliers_left_out=lines.get(v.arm_id, "").startswith(LEFT_OUT),
            )
            for v in said
        ]
    window = (
        rows[0].window
        if rows
        else AttributionWindow.objects.filter(experiment=experiment).order_by("-number").first()
    )
    return Card(said, window)


# ---------------------------------------------------------------------------------------------
# Outlier runs: how many each verdict weighed, and the verdict without them
# ---------------------------------------------------------------------------------------------
OUTLIER_WHY = (
    "device time per token far from the rest of their arm's (more than "
    f"{OUTLIER_MADS:g} median absolute deviations from its median), as when other work slows a host"
)


LEFT_OUT = "Outliers left out of this verdict:"


def _runs_of(name: str, run_ids: list[int]) -> str:
    """'2 runs of optimized (runs 41, 44)'."""
    n, s = len(run_ids), "s" if len(run_ids) != 1 else ""
    return f"{n} run{s} of {name} (run{s} {', '.join(map(str, sorted(run_ids)))})"


def outlier_lines(
    *,
    experiment: Experiment,
    rows: list[AttributionSnapshot],
    outliers: dict[int, RunOutlier],
    freezes: dict[int, Freeze] | None = None,
    now: datetime | None = None,
) -> dict[int, str]:
    """Per non-control arm whose runs or the control's hold outliers, one line: how many, and
    either that the latest window left them out (COSTLAB_ATTRIBUTION_EXCLUDE_OUTLIERS) or the
    verdict without them, from that window rebuilt without them by the recompute's path
    (apps.attribution.say.snapshots.window_without)."""
    arms = {s.arm_id: s for s in rows}
    control = next((s for s in rows if s.arm.is_control), None)
    if control is None:
        return {}
    left_out = {  # what the window itself left out, as its evidence records it
        s.arm_id: [r["run"] for r in (s.evidence or {}).get("excluded_runs") or []] for s in rows
    }
    counted: dict[int, list[int]] = {}
    for o in outliers.values():
        if o.arm_id in arms and o.run_id not in left_out[o.arm_id]:
            counted.setdefault(o.arm_id, []).append(o.run_id)
    without: dict[int, Verdict] = {}
    if counted:
        rebuilt = window_without(
            window=rows[0].window,
            snapshots=rows,
            experiment=experiment,
            leave_out={arm_id: set(runs) for arm_id, runs in counted.items()},
        )
        for snapshot in rebuilt:
            snapshot.arm = arms[snapshot.arm_id].arm  # the arm as the page holds it: no query
        without = {
            v.arm_id: v
            for v in snapshots_said(experiment=experiment, rows=rebuilt, freezes=freezes, now=now)
        }
    lines = {}
    for s in rows:
        if s.arm.is_control:
            continue
        parts = []
        sides = ((s.arm_id, s.arm.name), (control.arm_id, control.arm.name))
        gone = [_runs_of(name, left_out[pk]) for pk, name in sides if left_out[pk]]
        if gone:
            parts.append(
                f"{LEFT_OUT} {' and '.join(gone)}: {OUTLIER_WHY} "
                "(COSTLAB_ATTRIBUTION_EXCLUDE_OUTLIERS)."
            )
        kept = [_runs_of(name, counted[pk]) for pk, name in sides if counted.get(pk)]
        if kept and s.arm_id in without:
            v = without[s.arm_id]
            result = (v.amount or "no deviation") + (f" ({v.bound})" if v.bound else "")
            result += f": {v.status}"
            parts.append(
                f"Outliers counted: {' and '.join(kept)}: {OUTLIER_WHY}. Every run counts unless "
                f"COSTLAB_ATTRIBUTION_EXCLUDE_OUTLIERS is set; without them: {result}."
            )
        if parts:
            lines[s.arm_id] = " ".join(parts)
    return lines


# ---------------------------------------------------------------------------------------------
# Carbon beside cost, in the cost's words
# ---------------------------------------------------------------------------------------------
def carbon_line(*, arm, control_name: str, verdict: Verdict | None, sure: str) -> str:
    """The card's carbon line of one arm (arm: its ArmReport): gCO2e per 1M tokens against the
    control's, "" without a figure. Before cost is compared (no verdict yet, unpriced usage) it is
    said as what it is, energy so far and not a verdict, so the card never reads a result on one
    line and "no cost compared yet" on the line above."""
    if arm.carbon_deviation is None:
        return ""
    said = difference(
        arm.carbon_deviation,
        clip_low(arm.carbon_deviation_low),  # no less than none at all
        arm.carbon_deviation_high,
        words="carbon",
    )
    than = "as" if said.amount == "the same" else "than"
    if verdict is None or verdict.verdict in ("no_data", "unpriced"):
        return (
            f"Energy per 1M tokens so far: {said.amount} {than} {control_name}'s. Not a verdict: "
            "the cost is not compared yet."
        )
    text = f"Carbon: {said.amount} gCO2e per 1M tokens {than} {control_name}"
    if said.interval:
        text += f" ({sure_it_is(sure, said.interval)})"
    carbon = arm.carbon or {}
    method, band = carbon.get("method"), carbon.get("band")
    if method == "modelled":
        text += "; energy modelled, not measured"
    elif method in ("nvml", "rapl"):
        text += f"; energy measured by {method}"
    if band is not None and method in ("modelled", "nvml", "rapl"):
        text += f" (±{significant(band * 100, 2)} % on the grams)"
    if verdict.outliers_left_out:  # the report's carbon weighs every run
        text += "; over every run, the outliers left out of the cost included"
    return text + "."
