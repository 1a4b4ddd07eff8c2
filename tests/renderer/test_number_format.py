"""One way to write a number for people: 4 significant digits, wherever it is shown."""

from __future__ import annotations

import math

import pytest

from ember.train.renderer.format import format_compact, format_number, significant


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (100.0, "100.0"),  # an accuracy at 100 %, beside ...
        (98.75, "98.75"),  # ... one below it: the same digits
        (0.01, "0.01000"),  # a learning rate, beside ...
        (4.886e-4, "4.886e-4"),  # ... a smaller one
        (0.0, "0"),  # a schedule's last rate
        (-0.0, "0"),
        (0.21656713774427772, "0.2166"),
        (9999.7, "1.000e4"),  # rounding up changes the notation
        (12345.678, "1.235e4"),
        (0.001, "0.001000"),
        (-1.2345e-5, "-1.234e-5"),
        (math.nan, "nan"),
        (-math.inf, "-inf"),
    ],
)
def test_four_significant_digits(value, text):
    assert significant(value) == text
    assert format_compact(value) == text
    assert float(text) == pytest.approx(value, rel=1e-3, abs=0) or not math.isfinite(value)


def test_units_follow_the_number():
    assert format_number(98.75, "%") == "98.75 %"
    assert format_number(None, "%") == "-"
    assert format_number("text", "%") == "text"
    assert format_number(354.5, "item/s") == "354.5 item/s"
    assert max(len(format_compact(v)) for v in (0.001234, 1.234e-5, 123456.0)) <= 8
