"""The learning-rate scheduler protocol and its driver inside the loop."""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

import torch

from ember.errors import ConfigError, TrainingError


class StepsUnknown(ConfigError):
    """A scheduler config asks for the run's step count (`"auto"`) and none was given."""


@runtime_checkable
class LrScheduler(Protocol):
    """Gives the learning rate of each optimizer step, in order; its state resumes it."""

    def step(self) -> float:
        """The learning rate to use for the next optimizer step."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class LrDriver:
    """Applies a scheduler to an optimizer once per optimizer step.

    ember schedulers: the rate is written into every param group before the step.
    `torch.optim.lr_scheduler` objects: they set the rate themselves; ember steps them
    after each optimizer step, as PyTorch expects.
    """

    def __init__(
        self, scheduler: Any, optimizer: torch.optim.Optimizer, pending: Any = None
    ) -> None:
        self.scheduler = scheduler
        self.pending = pending
        """A scheduler config waiting for the run's step count (an "auto" inside)."""
        self.optimizer = optimizer
        self.is_torch = isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler)
        if self.is_torch and scheduler.optimizer is not optimizer:
            raise TrainingError(
                f"The {type(scheduler).__name__} given to build() drives another optimizer "
                "than the one the learner uses. Create the torch scheduler on the same "
                "torch optimizer you pass to build()."
            )
        self.last_lr: float = float(optimizer.param_groups[0]["lr"])

    def resolve(self, total_steps: int | None) -> None:
        """Build a pending scheduler config now that the run's optimizer steps are known."""
        if self.pending is not None:
            self.scheduler = self.pending.init(total_steps)
            self.pending = None

    def before_step(self) -> float:
        """Set and return the learning rate of the coming optimizer step."""
        if self.is_torch:
            self.last_lr = _checked(float(self.optimizer.param_groups[0]["lr"]), self.scheduler)
            return self.last_lr
        lr = _checked(float(self.scheduler.step()), self.scheduler)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.last_lr = lr
        return lr

    def after_step(self) -> None:
        if self.is_torch:
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        return {"type": type(self.scheduler).__name__, "state": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = type(self.scheduler).__name__
        found = state.get("type") if isinstance(state, dict) else None
        if found != expected:
            raise TrainingError(
                f"The checkpoint holds the state of a {found} learning-rate scheduler, but "
                f"this run uses {expected}. Resume with the scheduler the run was started with."
            )
        self.scheduler.load_state_dict(state["state"])


class ConstantLr:
    """Returns the same learning rate at every step."""

    def __init__(self, lr: float) -> None:
        if (
            not isinstance(lr, (int, float))
            or isinstance(lr, bool)
            or not math.isfinite(lr)
            or lr < 0
        ):
            raise ConfigError(f"The learning rate must be a finite number >= 0, got {lr!r}.")
        self.lr = float(lr)

    def step(self) -> float:
        return self.lr

    def state_dict(self) -> dict[str, Any]:
        return {"lr": self.lr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lr = float(state["lr"])


def _checked(lr: float, scheduler: Any) -> float:
    """A learning rate a step can use: finite and >= 0."""
    if not (math.isfinite(lr) and lr >= 0):
        raise TrainingError(
            f"{type(scheduler).__name__} gave the learning rate {lr!r} for the next step; a "
            "rate must be a finite number >= 0. Check the schedule's settings (a factor or a "
            "step that drives it below 0)."
        )
    return lr
