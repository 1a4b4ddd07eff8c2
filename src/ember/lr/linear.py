"""Linear interpolation between two rates, then the final rate for good (e.g. a warm-up)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ember.lr._common import (
    SchedulerConfigBase,
    StepCount,
    read_count,
    read_state,
    resolve_steps,
)


class LinearLrSchedulerConfig(SchedulerConfigBase):
    """Config of `LinearLrScheduler`: `initial_lr` at step 1, `final_lr` from step
    `num_iters + 1` on, evenly spaced rates in between; either end may be 0 or the larger."""

    type: Literal["linear"] = "linear"
    initial_lr: float = Field(ge=0.0, allow_inf_nan=False, description="Rate of the first step.")
    final_lr: float = Field(
        ge=0.0, allow_inf_nan=False, description="Rate from step num_iters + 1 on."
    )
    num_iters: StepCount = Field(
        description="Number of steps to go from initial_lr to final_lr. "
        '"auto": the run\'s optimizer steps - 1, so final_lr is the rate of the last step.'
    )

    def init(self, total_steps: int | None = None) -> LinearLrScheduler:
        """The scheduler; `total_steps` (the run's optimizer steps) resolves "auto"."""
        return LinearLrScheduler(
            self, resolve_steps(self.num_iters, total_steps, "LinearLrSchedulerConfig", "num_iters")
        )


class LinearLrScheduler:
    """Moves the rate by a fixed amount per step from `initial_lr` to `final_lr`, then holds it."""

    def __init__(self, config: LinearLrSchedulerConfig, num_iters: int | None = None) -> None:
        self.initial_lr = config.initial_lr
        self.final_lr = config.final_lr
        self.num_iters = (
            num_iters
            if num_iters is not None
            else resolve_steps(config.num_iters, None, type(config).__name__, "num_iters")
        )
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
