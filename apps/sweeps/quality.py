"""Held-out quality in a sweep: which sweeps measure it, where the base strategy sits in the space,
and the rule a candidate's held-out loss is judged by against the base's. Pure, no Django.

A sweep measures quality when its base strategy has an ``eval:`` section: every probe then reports
its held-out loss (``eval_loss``), and the base strategy is probed too (``Probe.is_base``), since
"worse" only means something against the base. A candidate is worse when its loss is more than
``margin`` (relative) above the base's; a missing loss on either side is "not measured", never
taken as equal. One short probe against one other: a point comparison, not the always-valid bound
an experiment's arms are judged by (apps.attribution.decide.quality) -- promotion is where that
starts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any

EVAL_LOSS = "eval_loss"
# An infeasible probe's reason starts with this when the quality constraint alone excluded it
# (measured, and otherwise a candidate): a forced promote may still take it.
CONSTRAINT_REASON = "quality_margin: "


def evaluates(document: dict[str, Any]) -> bool:
    """True when a strategy document (parsed YAML) has an ``eval:`` section that is not switched
    off: its runs report a held-out loss."""
    section = document.get("eval")
    return isinstance(section, dict) and section.get("enabled", True) is not False


def in_space(params: dict[str, Any], expanded: dict[str, list[Any]]) -> bool:
    """True when params name a point of the (pruned) space: every key, each value among its
    values."""
    # compared with their types: True == 1, but a bool is no batch size
    return set(params) == set(expanded) and all(
        any(type(v) is type(params[k]) and v == params[k] for v in expanded[k]) for k in expanded
    )


def held_out_loss(result: Any, samples: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(eval_loss, eval_s) of a probe: the runtime's result, else the last sample carrying one."""
    loss, seconds = getattr(result, "eval_loss", None), getattr(result, "eval_s", None)
    if loss is None:
        carrying = [s for s in samples if s.get("eval_loss") is not None]
        if carrying:
            last = max(carrying, key=lambda s: s["seq"])
            loss = last["eval_loss"]
            seconds = seconds if seconds is not None else last.get("eval_s")
    return (None if loss is None else float(loss)), (None if seconds is None else float(seconds))


def percent(fraction: float | Decimal) -> str:
    return f"{float(fraction) * 100:.1f} %".replace(".0 %", " %")


@dataclass(frozen=True)
class Judgement:
    """A candidate's held-out loss against the base's, under a margin."""

    verdict: str  # within_margin, worse, not_measured, unchecked (the sweep measures no quality)
    eval_loss: float | None = None
    base_eval_loss: float | None = None
    margin: str | None = None  # the relative margin, as a decimal string
    margin_from: str = ""  # where the margin came from, in words
    detail: str = ""  # the sentence a refusal or an infeasible probe's reason says

    @property
    def acceptable(self) -> bool:
        return self.verdict in ("within_margin", "unchecked")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(
    *,
    eval_loss: float | None,
    base_eval_loss: float | None,
    margin: Decimal,
    margin_from: str,
    base_missing: str = "",
) -> Judgement:
    """Within the margin, worse beyond it, or not measured (either loss missing or not finite).
    ``base_missing`` says why the base has no loss, when known (its probe infeasible, pending)."""
    common = {
        "eval_loss": eval_loss,
        "base_eval_loss": base_eval_loss,
        "margin": str(margin),
        "margin_from": margin_from,
    }
    margin_words = f"the margin is {percent(margin)} ({margin_from})"
    if base_eval_loss is None or not math.isfinite(base_eval_loss):
        why = base_missing or "its probe reported none"
        return Judgement(
            "not_measured",
            detail=f"the base strategy's held-out loss was not measured ({why}); {margin_words}",
            **common,
        )
    if eval_loss is None or not math.isfinite(eval_loss):
        return Judgement(
            "not_measured",
            detail=f"its held-out loss was not measured, the base strategy's is "
            f"{base_eval_loss:.4f}; {margin_words}",
            **common,
        )
    gap = (eval_loss - base_eval_loss) / abs(base_eval_loss) if base_eval_loss else 0.0
    if eval_loss - base_eval_loss > float(margin) * abs(base_eval_loss):
        return Judgement(
            "worse",
            detail=f"its held-out loss {eval_loss:.4f} is {percent(gap)} above the base "
            f"strategy's {base_eval_loss:.4f}; {margin_words}",
            **common,
        )
    side = "above" if gap > 0 else "below"
    return Judgement(
        "within_margin",
        detail=f"its held-out loss {eval_loss:.4f} is {percent(abs(gap))} {side} the base "
        f"strategy's {base_eval_loss:.4f}; {margin_words}",
        **common,
    )
