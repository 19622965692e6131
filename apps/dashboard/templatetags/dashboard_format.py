"""Numbers as the dashboard shows them: always with their unit, never more digits than they mean."""

from __future__ import annotations

import math
from datetime import timedelta

from django import template

register = template.Library()

MISSING = "—"
MINUS = "−"


def significant(value: float, digits: int = 4) -> str:
    """`digits` significant figures without scientific notation (0.0001234, 12.35, 1,235)."""
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    if magnitude >= digits - 1:
        return f"{value:,.0f}"
    text = f"{value:,.{digits - 1 - magnitude}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def percent(fraction: float) -> str:
    """A relative change's size, two figures, for a sentence that says its direction in a word:
    0.312 -> '31 %' ('31 % cheaper', '4.9 % worse')."""
    return f"{significant(abs(fraction) * 100, 2)} %"


def percent_signed(fraction: float) -> str:
    """A relative change with its sign (a true minus): -0.04 -> '−4 %', 0.05 -> '+5 %'."""
    text = percent(fraction)
    return f"+{text}" if fraction > 0 else f"{MINUS}{text}" if fraction < 0 else text


def percent_range(low: float, high: float, *, one_sided: bool) -> str:
    """A bound as the verdict card says it: magnitudes when the verdict's word carries the sign
    (a bound on one side of zero: '24–38 %'), else signed ('−100 % to +254 %')."""
    if one_sided:
        a, b = sorted((abs(low), abs(high)))
        return f"{significant(a * 100, 2)}–{significant(b * 100, 2)} %"
    return f"{percent_signed(low)} to {percent_signed(high)}"


def _number(value) -> float | None:
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@register.filter
def qty(value, unit: str = "") -> str:
    """A quantity with its unit: {{ run.energy_kwh|qty:"kWh" }} -> '0.01234 kWh'."""
    number = _number(value)
    if number is None:
        return MISSING
    return f"{significant(number)} {unit}".strip()


@register.filter
def usd(value) -> str:
    number = _number(value)
    if number is None:
        return MISSING
    if abs(number) >= 100:
        return f"{number:,.2f} USD"
    return f"{significant(number)} USD"


@register.filter
def pct(fraction, signed: bool = True) -> str:
    """A fraction as a percentage: 0.032 -> '+3.2 %'."""
    number = _number(fraction)
    if number is None:
        return MISSING
    text = significant(number * 100, 3)
    return f"+{text} %" if signed and number > 0 else f"{text} %"


@register.filter
def duration(seconds) -> str:
    """Seconds (or a timedelta) as a duration a person reads at a glance: '45 s', '12 min 5 s',
    '3 h 20 min'."""
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    number = _number(seconds)
    if number is None:
        return MISSING
    if number < 60:
        return f"{significant(number, 3)} s"
    s = int(round(number))
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    if s < 86400 * 2:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


@register.filter
def hours_from_seconds(seconds) -> float | None:
    number = _number(seconds)
    return None if number is None else number / 3600


@register.filter
def kwh_from_joules(joules) -> float | None:
    number = _number(joules)
    return None if number is None else number / 3_600_000


@register.filter
def get(mapping, key):
    """mapping[key] in a template (dict lookups by a variable)."""
    try:
        return mapping.get(key)
    except AttributeError:
        return None


VERDICT_WORDS = {
    "cheaper": "cheaper (conclusive)",
    "costlier": "dearer (conclusive)",
    "within_threshold": "within the threshold",
    "inconclusive": "inconclusive",
    "frozen": "frozen",
    "no_data": "not compared",
    "control": "control",
    "cheaper_but_worse": "cheaper, but a worse model (no traffic)",
    "worse": "worse model (no added traffic)",
    "unpriced": "not compared: unpriced usage",
}


@register.filter
def verdict_words(verdict: str) -> str:
    """An arm's verdict (apps.attribution.verdict.VERDICTS) in words for a table cell."""
    return VERDICT_WORDS.get(verdict, verdict)
