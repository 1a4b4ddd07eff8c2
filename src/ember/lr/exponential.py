"""Exponential decay: the rate is multiplied by `gamma` after every step."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ember.lr._common import SchedulerConfigBase, read_count, read_state


class ExponentialLrSchedulerConfig(SchedulerConfigBase):
    """Config of `ExponentialLrScheduler`: at step s (from 1) the rate is
    `initial_lr * gamma**(s - 1)`; a `gamma` above 1 grows the rate (e.g. for a range test)."""

    type: Literal["exponential"] = "exponential"
    initial_lr: float = Field(gt=0.0, allow_inf_nan=False, description="Rate of the first step.")
    gamma: float = Field(gt=0.0, allow_inf_nan=False, description="Factor applied after each step.")

    def init(self, total_steps: int | None = None) -> ExponentialLrScheduler:
        return ExponentialLrScheduler(self)


class ExponentialLrScheduler:
    """Starts at `initial_lr` and multiplies the rate by `gamma` at every step."""

    def __init__(self, config: ExponentialLrSchedulerConfig) -> None:
        self.initial_lr = config.initial_lr
        self.gamma = config.gamma
        self.step_count = 0

    def step(self) -> float:
        self.step_count += 1
        return self.initial_lr * self.gamma ** (self.step_count - 1)

    def state_dict(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "step": self.step_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_count = read_count(read_state(state, self, "step"), self)
