"""The Noam schedule of "Attention Is All You Need": linear warm-up, then 1/sqrt(step) decay."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ember.lr._common import SchedulerConfigBase, read_count, read_state


class NoamLrSchedulerConfig(SchedulerConfigBase):
    """Config of `NoamLrScheduler`: at step s (from 1) the rate is
    `init_lr * model_size**-0.5 * min(s**-0.5, s * warmup_steps**-1.5)`."""

    type: Literal["noam"] = "noam"
    init_lr: float = Field(gt=0.0, allow_inf_nan=False, description="Scale of the whole schedule.")
    warmup_steps: int = Field(
        default=4000, ge=1, description="Steps of the linear rise; the peak is at this step."
    )
    model_size: int = Field(
        default=512, ge=1, description="Model (embedding) width; scales the rate by its -1/2 power."
    )

    def init(self, total_steps: int | None = None) -> NoamLrScheduler:
        return NoamLrScheduler(self)


class NoamLrScheduler:
    """Rises linearly for `warmup_steps` steps, then decays as 1/sqrt(step)."""

    def __init__(self, config: NoamLrSchedulerConfig) -> None:
        self.init_lr = config.init_lr
        self.warmup_steps = config.warmup_steps
        self.model_size = config.model_size
        self.step_count = 0

    def step(self) -> float:
        self.step_count += 1
        s = float(self.step_count)
        return (
            self.init_lr
            * self.model_size**-0.5
            * min(s**-0.5, s * float(self.warmup_steps) ** -1.5)
        )

    def state_dict(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "step": self.step_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_count = read_count(read_state(state, self, "step"), self)
