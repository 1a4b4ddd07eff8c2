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
