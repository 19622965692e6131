"""Numbers on screen carry their unit and only the digits that mean something."""

import pytest

from apps.dashboard.templatetags.dashboard_format import (
    confidence,
    difference,
    duration,
    pct,
    qty,
    significant,
    usd,
)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0, "0"),
        (0.000123456, "0.0001235"),
        (0.5, "0.5"),
        (12.3456, "12.35"),
        (1234.5, "1,234"),
        (1_234_567, "1,234,567"),
        (-0.02, "-0.02"),
    ],
)
def test_significant(value, text):
    assert significant(value) == text


def test_units_are_always_there_and_missing_values_say_so():
    assert usd(0.012345) == "0.01235 USD"
    assert usd(1234.567) == "1,234.57 USD"
    assert qty(3.2, "kWh") == "3.2 kWh"
    assert pct(0.0321) == "+3.21 %" and pct(-0.01) == "-1 %" and pct(0) == "0 %"
    assert (
        duration(42) == "42 s" and duration(3725) == "1 h 2 min" and duration(200_000) == "2 d 7 h"
    )
    for f in (usd, qty, pct, duration):
        assert f(None) == "—"
    assert usd(float("nan")) == "—"


@pytest.mark.parametrize(
    ("args", "words", "text", "interval"),
    [
        # cheaper: the interval's sizes in the amount's word, smaller first
        ((-0.283, -0.47, -0.0958), "cost", "28 % cheaper (9.6–47 %)", "9.6–47 % cheaper"),
        ((0.12, 0.03, 0.20), "cost", "12 % dearer (3–20 %)", "3–20 % dearer"),
        # across zero: both ends in words, low to high, never a sign
        (
            (-0.01, -0.05, 0.03),
            "cost",
            "1 % cheaper (between 5 % cheaper and 3 % dearer)",
            "between 5 % cheaper and 3 % dearer",
        ),
        ((-0.28, None, None), "cost", "28 % cheaper", ""),  # no interval
        ((0.0001, -0.02, 0.03), "cost", "as costly (between 2 % cheaper and 3 % dearer)", None),
        ((0.049, 0.041, 0.057), "quality", "4.9 % worse (4.1–5.7 %)", "4.1–5.7 % worse"),
        ((-0.32, -0.37, -0.28), "carbon", "32 % less (28–37 %)", "28–37 % less"),
    ],
)
def test_a_difference_reads_one_way_everywhere(args, words, text, interval):
    """Issue 44: the card said "9.6–47 %", the table "-28.3 % [-47 %, -9.58 %]", the carbon line
    "-36.6 % to -27.8 %": one function now says each, in words."""
    said = difference(*args, words=words)
    assert str(said) == text
    if interval is not None:
        assert said.interval == interval
    assert "-" not in str(said) and "−" not in str(said) and "[" not in str(said)


def test_an_interval_on_the_other_side_keeps_its_word_and_the_level_is_the_experiments():
    assert str(difference(0.25, -0.3, -0.1)) == "25 % dearer (10–30 % cheaper)"
    assert difference(None, -0.3, -0.1).interval == "10–30 % cheaper"
    assert confidence(0.05) == "95 %" and confidence("0.01") == "99 %"


def test_ago_says_just_now_under_a_minute_never_zero_minutes():
    from datetime import timedelta

    from django.utils import timezone

    from apps.dashboard.templatetags.dashboard_format import ago

    now = timezone.now()
    assert ago(now - timedelta(seconds=20)) == "just now"
    assert ago(now - timedelta(minutes=3, seconds=5)) == "3\xa0minutes ago"
    assert ago(None) == ""
