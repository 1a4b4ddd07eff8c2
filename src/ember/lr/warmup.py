"""Linear warm-up in front of any scheduler, which keeps stepping during the warm-up."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from ember.errors import ConfigError
from ember.lr._common import SchedulerConfigBase, read_count, read_state
from ember.lr.base import LrScheduler

if TYPE_CHECKING:
    from ember.lr.config_union import LrSchedulerConfig


class WarmupLrSchedulerConfig(SchedulerConfigBase):
    """Config of `WarmupLrScheduler`: at step s (from 1) the rate is the wrapped scheduler's
    rate times `start_factor + (1 - start_factor) * min(s - 1, warmup_steps) / warmup_steps`."""

    type: Literal["warmup"] = "warmup"
    scheduler: LrSchedulerConfig = Field(description="The schedule to warm up into.")
    warmup_steps: int = Field(ge=1, description="Steps run below the full rate.")
    start_factor: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="Fraction of the rate at step 1.",
    )

    def init(self, total_steps: int | None = None) -> WarmupLrScheduler:
        """The scheduler; `total_steps` resolves an "auto" step count of the wrapped one
        (it is stepped from the first step, so it spans the whole run too)."""
        return WarmupLrScheduler(
            self.scheduler.init(total_steps), self.warmup_steps, self.start_factor
        )


class WarmupLrScheduler:
    """Scales the wrapped scheduler's rate by a factor rising linearly from `start_factor`
    (step 1) to 1 (step `warmup_steps + 1` on); the wrapped scheduler is stepped every step,
    so its own schedule is not delayed. With the default 0 the first step has rate 0."""

    def __init__(
        self, scheduler: LrScheduler, warmup_steps: int, start_factor: float = 0.0
    ) -> None:
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 1:
            raise ConfigError(
                f"WarmupLrScheduler: warmup_steps must be an int >= 1, got {warmup_steps!r}."
            )
        if (
            isinstance(start_factor, bool)
            or not isinstance(start_factor, (int, float))
            or not math.isfinite(start_factor)
            or not 0.0 <= start_factor <= 1.0
        ):
            raise ConfigError(
                f"WarmupLrScheduler: start_factor must be a number in [0, 1], got {start_factor!r}."
            )
        self.scheduler = scheduler
        self.warmup_steps = warmup_steps
        self.start_factor = float(start_factor)
        self.step_count = 0

    def step(self) -> float:
        self.step_count += 1
        rate = float(self.scheduler.step())
        done = self.step_count - 1
        if done >= self.warmup_steps:
            return rate
        factor = self.start_factor + (1.0 - self.start_factor) * done / self.warmup_steps
        return factor * rate

    def state_dict(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "step": self.step_count,
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        checked = read_state(state, self, "step", "scheduler")
        step = read_count(checked, self)
        self.scheduler.load_state_dict(checked["scheduler"])
        self.step_count = step


# The nested field names `LrSchedulerConfig`, which names this config: importing the union
# (at the end, once this class exists) completes it, whichever module is imported first.
import ember.lr.config_union  # noqa: E402, F401
