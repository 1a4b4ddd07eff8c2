"""Cosine annealing with warm restarts (SGDR, Loshchilov & Hutter), as Burn defines it."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from ember.lr._common import (
    SchedulerConfigBase,
    StepCount,
    read_count,
    read_state,
    resolve_steps,
)


class CosineAnnealingLrSchedulerConfig(SchedulerConfigBase):
    """Config of `CosineAnnealingLrScheduler`: half a cosine from `initial_lr` at step 1 down to
    `min_lr` at step `num_iters + 1`; the next step restarts the cycle at `initial_lr`."""

    type: Literal["cosine"] = "cosine"
    initial_lr: float = Field(
        gt=0.0, allow_inf_nan=False, description="Rate at the start of each cycle."
    )
    num_iters: StepCount = Field(
        description="Steps from initial_lr to min_lr; a cycle is num_iters + 1 steps. "
        '"auto": the run\'s optimizer steps - 1, so min_lr is the rate of the last step.'
    )
    min_lr: float = Field(
        default=0.0, ge=0.0, allow_inf_nan=False, description="Rate at the end of each cycle."
    )

    @field_validator("min_lr")
    @classmethod
    def _at_most_initial(cls, value: float, info: ValidationInfo) -> float:
        initial = info.data.get("initial_lr")
        if initial is not None and value > initial:
            raise ValueError(f"min_lr must be at most initial_lr ({initial})")
        return value

    def init(self, total_steps: int | None = None) -> CosineAnnealingLrScheduler:
        """The scheduler; `total_steps` (the run's optimizer steps) resolves "auto"."""
        return CosineAnnealingLrScheduler(
            self,
            resolve_steps(
                self.num_iters, total_steps, "CosineAnnealingLrSchedulerConfig", "num_iters"
            ),
        )


class CosineAnnealingLrScheduler:
    """Follows `min_lr + (initial_lr - min_lr) * (1 + cos(pi * i / num_iters)) / 2` for
    i = 0..num_iters, then starts again at i = 0 (a warm restart every num_iters + 1 steps).

    To anneal once over a whole run, set `num_iters` to the run's number of steps - 1."""

    def __init__(
        self, config: CosineAnnealingLrSchedulerConfig, num_iters: int | None = None
    ) -> None:
        self.initial_lr = config.initial_lr
        self.num_iters = (
            num_iters
            if num_iters is not None
            else resolve_steps(config.num_iters, None, type(config).__name__, "num_iters")
        )
        self.min_lr = config.min_lr
        self.step_count = 0

    def step(self) -> float:
        self.step_count += 1
        position = (self.step_count - 1) % (self.num_iters + 1)
        cosine = math.cos(math.pi * position / self.num_iters)
        return self.min_lr + 0.5 * (self.initial_lr - self.min_lr) * (1.0 + cosine)

    def state_dict(self) -> dict[str, Any]:
        return {"type": type(self).__name__, "step": self.step_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_count = read_count(read_state(state, self, "step"), self)
