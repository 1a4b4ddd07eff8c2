"""Schedulers run one after another, switching at given steps (e.g. warm-up, then cosine)."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any, Literal, Sequence

from pydantic import Field, ValidationInfo, field_validator

from ember.errors import ConfigError
from ember.lr._common import SchedulerConfigBase, read_children, read_count, read_state
from ember.lr.base import LrScheduler

if TYPE_CHECKING:
    from ember.lr.config_union import LrSchedulerConfig


def _milestone_problem(milestones: Sequence[int], count: int | None) -> str | None:
    """Why `milestones` cannot split a run among `count` schedulers, or None if they can."""
    if count is not None and len(milestones) != count - 1:
        return (
            f"needs one milestone fewer than schedulers: {count} scheduler(s) take "
            f"{count - 1} milestone(s), got {len(milestones)}"
        )
    previous = 0
    for milestone in milestones:
        if isinstance(milestone, bool) or not isinstance(milestone, int) or milestone <= previous:
            return f"must be integers > 0 in strictly increasing order, got {list(milestones)}"
        previous = milestone
    return None


class SequentialLrSchedulerConfig(SchedulerConfigBase):
    """Config of `SequentialLrScheduler`: scheduler i gives the rates up to global step
    `milestones[i]`; the next one then starts from its own first step."""

    type: Literal["sequential"] = "sequential"
    schedulers: list[LrSchedulerConfig] = Field(min_length=1, description="Schedulers, in order.")
    milestones: list[int] = Field(
        default_factory=list, description="Global steps at which the next scheduler takes over."
    )

    @field_validator("milestones")
    @classmethod
    def _fit_schedulers(cls, value: list[int], info: ValidationInfo) -> list[int]:
        schedulers = info.data.get("schedulers")
        problem = _milestone_problem(value, None if schedulers is None else len(schedulers))
        if problem is not None:
            raise ValueError(f"milestones {problem}")
        return value

    def init(self, total_steps: int | None = None) -> SequentialLrScheduler:
        """The scheduler; with `total_steps`, each scheduler's "auto" step count is the
        length of its segment (the last one ends with the run)."""
        starts = [0, *self.milestones]
        ends: list[int | None] = [*self.milestones, total_steps]
        schedulers = [
            config.init(None if end is None else end - start)
            for config, start, end in zip(self.schedulers, starts, ends)
        ]
        return SequentialLrScheduler(schedulers, self.milestones)


class SequentialLrScheduler:
    """Runs `schedulers[0]` for steps 1..milestones[0], `schedulers[1]` for the steps up to
    milestones[1], and so on; a scheduler is only stepped while it is the active one."""

    def __init__(self, schedulers: Sequence[LrScheduler], milestones: Sequence[int]) -> None:
        if len(schedulers) == 0:
            raise ConfigError("SequentialLrScheduler needs at least one scheduler.")
        problem = _milestone_problem(milestones, len(schedulers))
        if problem is not None:
            raise ConfigError(f"SequentialLrScheduler: milestones {problem}.")
        self.schedulers = list(schedulers)
        self.milestones = list(milestones)
        self.step_count = 0

    def step(self) -> float:
        self.step_count += 1
        active = bisect.bisect_left(self.milestones, self.step_count)
        return float(self.schedulers[active].step())

    def state_dict(self) -> dict[str, Any]:
        return {
            "type": type(self).__name__,
            "step": self.step_count,
            "schedulers": [scheduler.state_dict() for scheduler in self.schedulers],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        checked = read_state(state, self, "step", "schedulers")
        step = read_count(checked, self)
        states = read_children(checked, self, self.schedulers)
        for scheduler, child in zip(self.schedulers, states):
            scheduler.load_state_dict(child)
        self.step_count = step


# The nested field names `LrSchedulerConfig`, which names this config: importing the union
# (at the end, once this class exists) completes it, whichever module is imported first.
import ember.lr.config_union  # noqa: E402, F401
