"""Numbers on screen carry their unit and only the digits that mean something."""

import pytest

from apps.dashboard.templatetags.dashboard_format import duration, pct, qty, significant, usd


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
