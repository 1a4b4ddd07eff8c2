"""Step decay: the rate is multiplied by `gamma` every `step_size` steps."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ember.lr._common import SchedulerConfigBase, read_count, read_state


class StepLrSchedulerConfig(SchedulerConfigBase):
    """Config of `StepLrScheduler`: at step s (from 1) the rate is
    `initial_lr * gamma**((s - 1) // step_size)`."""

    type: Literal["step"] = "step"
    initial_lr: float = Field(gt=0.0, allow_inf_nan=False, description="Rate of the first steps.")
    step_size: int = Field(ge=1, description="Number of steps between two decays.")
    gamma: float = Field(
        default=0.1, gt=0.0, allow_inf_nan=False, description="Factor of each decay."
    )

    def init(self, total_steps: int | None = None) -> StepLrScheduler:
        return StepLrScheduler(self)


class StepLrScheduler:
    """Keeps the rate for `step_size` steps, then multiplies it by `gamma`, and so on."""

    def __init__(self, config: StepLrSchedulerConfig) -> None:
        self.initial_lr = config.initial_lr
        self.step_size = config.step_size
        self.gamma = config.gamma
        self.step_count = 0

    def step(self) -> float:
        self.step_count += 1
        return self.initial_lr * self.gamma ** ((self.step_count - 1) // self.step_size)

    def state_dict(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "step": self.step_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_count = read_count(read_state(state, self, "step"), self)
