"""Text formatting shared by everything that shows a number to a person: the renderers,
`ember plot`, `ember compare` and the learning-rate finder's chart.

One rule for every value: 4 significant digits (`significant`), in fixed point from
0.001 to below 10,000 ("0.2166", "94.00", "100.0", "1235") and in scientific notation
with a short exponent outside it ("4.886e-4", "1.235e5"), so that a column of values
reads alike whatever their size.
"""

from __future__ import annotations

import math

DIGITS = 4
"""Significant digits of every value shown."""


def significant(value: float, digits: int = DIGITS) -> str:
    """`value` to `digits` significant digits: "0" for zero, fixed point from 0.001 to
    below 10,000 ("0.01000", "98.75", "100.0"), else "4.886e-4", "-1.235e5"; "nan",
    "inf", "-inf" as such."""
    value = float(value)
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if value == 0:
        return "0"
    mantissa, exponent_text = f"{value:.{digits - 1}e}".split("e")
    exponent = int(exponent_text)  # after rounding: 9999.7 is 1.000e4
    if -3 <= exponent < 4:
        return f"{value:.{max(0, digits - 1 - exponent)}f}"
    return f"{mantissa}e{exponent}"


def format_number(value: float | str | None, unit: str = "") -> str:
    """A value as people read it: `significant` digits and its unit ("91.23 %",
    "0.2812", "1.200e-5"); "-" for None, text as it is."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    text = significant(value)
    return f"{text} {unit}" if unit else text


def format_duration(seconds: float) -> str:
    """`h:mm:ss` or `m:ss`."""
    if not math.isfinite(seconds) or seconds < 0:
        return "-"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_compact(value: float | str | None) -> str:
    """A value without its unit, in at most 8 characters (9 when negative): the
    digits of `format_number` ("0.5123", "91.23", "1.235e5", "1.230e-5")."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return significant(value)
