"""Several schedulers stepped together, their rates combined (product, sum or mean)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal, Sequence

from pydantic import Field

from ember.errors import ConfigError
from ember.lr._common import SchedulerConfigBase, read_children, read_state
from ember.lr.base import LrScheduler

if TYPE_CHECKING:
    from ember.lr.config_union import LrSchedulerConfig

SchedulerReduction = Literal["prod", "sum", "avg"]
"""How `ComposedLrScheduler` combines its schedulers' rates."""

_REDUCTIONS = ("prod", "sum", "avg")


class ComposedLrSchedulerConfig(SchedulerConfigBase):
    """Config of `ComposedLrScheduler`: every scheduler is stepped at each step and the rates
    are multiplied (`prod`, the default), added (`sum`) or averaged (`avg`)."""

    type: Literal["composed"] = "composed"
    schedulers: list[LrSchedulerConfig] = Field(min_length=1, description="Schedulers to combine.")
    reduction: SchedulerReduction = Field(
        default="prod", description="prod, sum or avg of their rates."
    )

    def init(self, total_steps: int | None = None) -> ComposedLrScheduler:
        """The scheduler; `total_steps` resolves the "auto" step counts inside."""
        return ComposedLrScheduler(
            [config.init(total_steps) for config in self.schedulers], self.reduction
        )


class ComposedLrScheduler:
    """Steps all its schedulers once per step and returns their combined rate.

    With `prod`, a schedule of factors (e.g. an `initial_lr` of 1.0) can scale another one."""

    def __init__(
        self, schedulers: Sequence[LrScheduler], reduction: SchedulerReduction = "prod"
    ) -> None:
        if len(schedulers) == 0:
            raise ConfigError("ComposedLrScheduler needs at least one scheduler to combine.")
        if reduction not in _REDUCTIONS:
            raise ConfigError(
                f"ComposedLrScheduler: reduction must be one of {', '.join(_REDUCTIONS)}, "
                f"got {reduction!r}."
            )
        self.schedulers = list(schedulers)
        self.reduction: SchedulerReduction = reduction

    def step(self) -> float:
        rates = [float(scheduler.step()) for scheduler in self.schedulers]
        if self.reduction == "prod":
            return math.prod(rates)
        total = sum(rates)
        return total / len(rates) if self.reduction == "avg" else total

    def state_dict(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "schedulers": [scheduler.state_dict() for scheduler in self.schedulers],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        states = read_children(read_state(state, self, "schedulers"), self, self.schedulers)
        for scheduler, child in zip(self.schedulers, states):
            scheduler.load_state_dict(child)


# The nested field names `LrSchedulerConfig`, which names this config: importing the union
# (at the end, once this class exists) completes it, whichever module is imported first.
import ember.lr.config_union  # noqa: E402, F401
