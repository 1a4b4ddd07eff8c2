"""Small helpers shared by the metric implementations."""

from __future__ import annotations

import torch


def wide_float(device: torch.device) -> torch.dtype:
    """The float type for epoch totals: float64 where the device has it (not on MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def resolve_pad(own: int | None, given: int | None) -> int | None:
    """The metric's own padding token wins over the one the output carries."""
    return own if own is not None else given
