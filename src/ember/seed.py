"""`ember.seed`: one call seeds every random number generator a run uses."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed(value: int) -> None:
    """Seed Python's `random`, NumPy's global generator and torch (CPU and all CUDA devices)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        from ember.errors import ConfigError

        raise ConfigError(f"ember.seed() takes a non-negative int, got {value!r}.")
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)
