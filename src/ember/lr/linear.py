"""Linear interpolation between two rates, then the final rate for good (e.g. a warm-up)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ember.lr._common import SchedulerConfigBase, read_count, read_state


class LinearLrSchedulerConfig(SchedulerConfigBase):
    """Config of `LinearLrScheduler`: `initial_lr` at step 1, `final_lr` from step
    `num_iters + 1` on, evenly spaced rates in between; either end may be 0 or the larger."""

    type: Literal["linear"] = "linear"
    initial_lr: float = Field(ge=0.0, allow_inf_nan=False, description="Rate of the first step.")
    final_lr: float = Field(
        ge=0.0, allow_inf_nan=False, description="Rate from step num_iters + 1 on."
    )
    num_iters: int = Field(ge=1, description="Number of steps to go from initial_lr to final_lr.")

    def init(self) -> LinearLrScheduler:
        return LinearLrScheduler(self)


class LinearLrScheduler:
    """Moves the rate by a fixed amount per step from `initial_lr` to `final_lr`, then holds it."""

    def __init__(self, config: LinearLrSchedulerConfig) -> None:
        self.initial_lr = config.initial_lr
        self.final_lr = config.final_lr
        self.num_iters = config.num_iters
        self.step_count = 0

    def step(self) -> float:
        self.step_count += 1
        done = self.step_count - 1
        if done >= self.num_iters:
            return self.final_lr
        return self.initial_lr + (self.final_lr - self.initial_lr) * done / self.num_iters

    def state_dict(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "step": self.step_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_count = read_count(read_state(state, self, "step"), self)
