"""Numbers as the dashboard shows them: always with their unit, never more digits than they mean."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from django import template

register = template.Library()

MISSING = "—"


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


# A difference in words: (the word below zero, the word above it, the word at zero). One sign
# convention everywhere on the dashboard and in the CSV's words: below zero is the good side
# (cheaper, less carbon, a better model), as the API's signed numbers (negative = cheaper).
WORDS = {
    "cost": ("cheaper", "dearer", "as costly"),
    "carbon": ("less", "more", "the same"),
    "quality": ("better", "worse", "as good"),
}
# Below this size a difference is said as none ("as costly"): 0.05 %, under two figures' rounding.
NO_DIFFERENCE = 0.0005


@dataclass(frozen=True)
class Difference:
    """A relative difference said in words, its interval in the same words and order.

    amount: "28 % cheaper" ("" without a value); interval: "9.6–47 % cheaper", "between 5 %
    cheaper and 3 % dearer" ("" without bounds); compact: the interval without the word where
    the amount already says it ("9.6–47 %")."""

    amount: str
    interval: str
    compact: str

    def __str__(self) -> str:
        """'28 % cheaper (9.6–47 %)': the compact form, for a cell or a CSV."""
        if self.amount and self.compact:
            return f"{self.amount} ({self.compact})"
        return self.amount or self.interval


def difference(
    value: float | None,
    low: float | None = None,
    high: float | None = None,
    *,
    words: str = "cost",
) -> Difference:
    """The one way a relative difference is said (value and bounds signed, negative = cheaper /
    less / better): '28 % cheaper' with '9.6–47 % cheaper', '12 % dearer' with '3–20 % dearer',
    'between 5 % cheaper and 3 % dearer' for an interval that spans zero. The interval lists its
    ends low to high, smaller size first on one side of zero."""
    below, above, none = WORDS[words]
    amount = ""
    if value is not None:
        amount = none if abs(value) < NO_DIFFERENCE else f"{percent(value)} {_side(value, words)}"
    if low is None or high is None:
        return Difference(amount, "", "")
    low, high = min(low, high), max(low, high)
    if low >= 0 or high <= 0:  # one side of zero: sizes, the side's word once
        word = above if low >= 0 else below
        a, b = sorted((abs(low), abs(high)))
        sizes = f"{significant(a * 100, 2)}–{significant(b * 100, 2)} %"
        if a == b:
            sizes = percent(a)
        same_side = amount.endswith(f" {word}")  # the amount said the word already
        return Difference(amount, f"{sizes} {word}", sizes if same_side else f"{sizes} {word}")
    interval = f"between {percent(low)} {below} and {percent(high)} {above}"
    return Difference(amount, interval, interval)


def _side(value: float, words: str) -> str:
    below, above, _ = WORDS[words]
    return below if value < 0 else above


def confidence(alpha) -> str:
    """The confidence an interval is held at, from the experiment's alpha: 0.05 -> '95 %'."""
    return f"{significant((1 - float(alpha)) * 100, 3)} %"


def _number(value) -> float | None:
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@register.filter
def ago(value) -> str:
    """How long ago `value` was, in words: "just now" under a minute ("0 minutes ago" read as a
    fault), else Django's timesince ("3 minutes ago"); "" for none."""
    if not value:
        return ""
    from django.utils import timezone
    from django.utils.timesince import timesince

    if (timezone.now() - value).total_seconds() < 60:
        return "just now"
    return f"{timesince(value)} ago"


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


@register.simple_tag(name="difference")
def difference_tag(value, low=None, high=None, words: str = "cost", part: str = "") -> str:
    """{% difference arm.deviation v.low v.high %} -> '28 % cheaper (9.6–47 %)'; words: cost,
    carbon or quality; part: amount, interval or compact for that part alone. Empty without a
    value."""
    value = _number(value)
    if value is None:
        return ""
    said = difference(value, _number(low), _number(high), words=words)
    return getattr(said, part) if part in ("amount", "interval", "compact") else str(said)


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
    """An arm's verdict (apps.attribution.decide.verdict.VERDICTS) in words for a table cell."""
    return VERDICT_WORDS.get(verdict, verdict)
