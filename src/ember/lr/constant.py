"""A constant learning rate (what `build(..., lr=1e-4)` turns a float into)."""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

from ember.config import Config
from ember.errors import ConfigError


class ConstantLr:
    """Returns the same learning rate at every step."""

    def __init__(self, lr: float) -> None:
        if (
            not isinstance(lr, (int, float))
            or isinstance(lr, bool)
            or not math.isfinite(lr)
            or lr < 0
        ):
            raise ConfigError(f"The learning rate must be a finite number >= 0, got {lr!r}.")
        self.lr = float(lr)

    def step(self) -> float:
        return self.lr

    def state_dict(self) -> dict[str, Any]:
        return {"lr": self.lr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lr = float(state["lr"])


class ConstantLrConfig(Config):
    """Config of a constant learning rate."""

    lr: float = Field(gt=0.0)

    def init(self) -> ConstantLr:
        return ConstantLr(self.lr)
