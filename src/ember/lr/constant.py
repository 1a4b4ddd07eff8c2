"""A constant learning rate (what `build(..., lr=1e-4)` turns a float into)."""

from __future__ import annotations

from pydantic import Field

from ember.config import Config
from ember.lr.base import ConstantLr


class ConstantLrConfig(Config):
    """Config of a constant learning rate."""

    lr: float = Field(gt=0.0)

    def init(self, total_steps: int | None = None) -> ConstantLr:
        return ConstantLr(self.lr)
