"""Schedulers that run other schedulers: several stepped together, their rates combined
(`ComposedLrScheduler`), several one after another (`SequentialLrScheduler`), and a
linear warm-up in front of one (`WarmupLrScheduler`). Their configs, which nest any
scheduler config, live beside `LrSchedulerConfig` in `ember.lr.config_union`."""

from __future__ import annotations

import bisect
import math
from typing import Any, Literal, Sequence

from ember.errors import ConfigError
from ember.lr._common import read_children, read_count, read_state
from ember.lr.base import LrScheduler

SchedulerReduction = Literal["prod", "sum", "avg"]
"""How `ComposedLrScheduler` combines its schedulers' rates."""

_REDUCTIONS = ("prod", "sum", "avg")


def milestone_problem(milestones: Sequence[int], count: int | None) -> str | None:
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


class SequentialLrScheduler:
    """Runs `schedulers[0]` for steps 1..milestones[0], `schedulers[1]` for the steps up to
    milestones[1], and so on; a scheduler is only stepped while it is the active one."""

    def __init__(self, schedulers: Sequence[LrScheduler], milestones: Sequence[int]) -> None:
        if len(schedulers) == 0:
            raise ConfigError("SequentialLrScheduler needs at least one scheduler.")
        problem = milestone_problem(milestones, len(schedulers))
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
