"""Text formatting shared by renderers."""

from __future__ import annotations

import math


def format_number(value: float | str | None, unit: str = "") -> str:
    """A compact, readable number with its unit ("91.23 %", "0.2812", "1.2e-05")."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if math.isnan(value):
        return "nan"
    magnitude = abs(value)
    if magnitude != 0 and (magnitude >= 1e5 or magnitude < 1e-3):
        text = f"{value:.3e}"
    elif magnitude >= 100:
        text = f"{value:.2f}"
    else:
        text = f"{value:.4f}"
    return f"{text} {unit}".rstrip() if unit else text


def format_duration(seconds: float) -> str:
    """`h:mm:ss` or `m:ss`."""
    if not math.isfinite(seconds) or seconds < 0:
        return "-"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_compact(value: float | str | None) -> str:
    """A number in at most 7 characters (8 when negative), without its unit: "0.5123",
    "91.23", "123.4", "12346", "1.23e-5" (for tables on narrow terminals)."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 99999.5 or magnitude < 1e-3:
        mantissa, exponent = f"{value:.2e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    if magnitude >= 999.95:
        return f"{value:.0f}"
    if magnitude >= 99.995:
        return f"{value:.1f}"
    if magnitude >= 9.99995:
        return f"{value:.2f}"
    return f"{value:.4f}"
