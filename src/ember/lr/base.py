"""The learning-rate scheduler protocol and its driver inside the loop."""

from __future__ import annotations

import math
from typing import Any, Iterable, Literal, Mapping, Protocol, runtime_checkable

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


Interval = Literal["step", "epoch"]


class LrDriver:
    """Applies a scheduler to an optimizer, once per optimizer step (`interval="step"`,
    the default) or once per epoch (`interval="epoch"`, as many published scripts step
    `StepLR`).

    ember schedulers: the rate is written into every param group before the step (with
    the epoch interval, the rate of the epoch, taken at its first step).
    `torch.optim.lr_scheduler` objects: they set the rate themselves; ember steps them
    after each optimizer step, or at each epoch end, as PyTorch expects.
    `ReduceLROnPlateau` always steps at epoch end, with the epoch value of `monitor`
    (split, metric name).
    """

    def __init__(
        self,
        scheduler: Any,
        optimizer: torch.optim.Optimizer,
        pending: Any = None,
        interval: Interval = "step",
        monitor: tuple[str, str] = ("valid", "Loss"),
    ) -> None:
        self.scheduler = scheduler
        self.pending = pending
        """A scheduler config waiting for the run's step count (an "auto" inside)."""
        self.optimizer = optimizer
        self.plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        self.interval: Interval = "epoch" if self.plateau else interval
        self.monitor = monitor
        self._epoch_lr: float | None = None
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
        scheduler = self.scheduler
        if type(scheduler) is ConstantLr and self.interval == "step":
            lr = self.last_lr = scheduler.lr  # checked when set
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            return lr
        if self.is_torch or type(scheduler) is OptimizerRates:  # the groups hold the rates
            self.last_lr = _checked(float(self.optimizer.param_groups[0]["lr"]), self.scheduler)
            return self.last_lr
        if self.interval == "epoch" and self._epoch_lr is not None:
            return self._epoch_lr
        if type(scheduler) is ConstantLr:
            lr = scheduler.lr
        else:
            lr = _checked(float(scheduler.step()), scheduler)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.last_lr = lr
        if self.interval == "epoch":
            self._epoch_lr = lr
        return lr

    @property
    def steps_after(self) -> bool:
        """`after_step` steps the scheduler (a torch scheduler, stepped every step)."""
        return self.is_torch and self.interval == "step"

    def after_step(self) -> None:
        if self.steps_after:
            self.scheduler.step()

    def end_epoch(self, values: Mapping[str, Mapping[str, float]]) -> None:
        """An epoch ended (`values`: its epoch values per split): step an epoch-wise
        schedule, before the epoch's checkpoint so that it holds the decision."""
        if self.interval != "epoch":
            return
        if not self.is_torch:
            self._epoch_lr = None  # the next epoch's first step takes the next rate
        elif self.plateau:
            split, name = self.monitor
            value = values.get(split, {}).get(name)
            if value is None:
                raise TrainingError(
                    f"ReduceLROnPlateau steps on the epoch value of {split} {name!r}, which "
                    "this run does not compute. Register that metric, or name another with "
                    "LearnerBuilder.lr_monitor(metric, split)."
                )
            self.scheduler.step(value)
        else:
            self.scheduler.step()

    def check_monitor(self, registered: Mapping[str, Iterable[str]]) -> None:
        """A metric-driven schedule needs its metric among the run's (`registered`:
        metric names per split): said before training."""
        if self.plateau:
            split, name = self.monitor
            if name not in set(registered.get(split, ())):
                raise TrainingError(
                    f"ReduceLROnPlateau steps on the epoch value of {split} {name!r}, which "
                    "this run does not register. Register that metric, or name another with "
                    "LearnerBuilder.lr_monitor(metric, split)."
                )

    def check_interval(self, steps_per_epoch: int | None) -> str | None:
        """A warning when a torch schedule written to be stepped once per epoch would
        decay by more than 100x within the first epoch at the step interval."""
        scheduler = self.scheduler
        if self.interval != "step" or not self.is_torch or not steps_per_epoch:
            return None
        lr = torch.optim.lr_scheduler
        factor = None
        if isinstance(scheduler, lr.StepLR):
            factor = scheduler.gamma ** (steps_per_epoch // scheduler.step_size)
        elif isinstance(scheduler, lr.ExponentialLR):
            factor = scheduler.gamma**steps_per_epoch
        elif isinstance(scheduler, lr.MultiStepLR):
            passed = sum(n for m, n in scheduler.milestones.items() if m <= steps_per_epoch)
            factor = scheduler.gamma**passed
        elif isinstance(scheduler, lr.CosineAnnealingLR) and scheduler.T_max < steps_per_epoch:
            factor = 0.0
        if factor is None or factor >= 0.01:
            return None
        name = type(scheduler).__name__
        return (
            f"{name} is stepped after every optimizer step ({steps_per_epoch} per epoch), so "
            f"the rate falls by more than 100x within the first epoch. If it is meant to be "
            f"stepped once per epoch, as scripts usually step {name}, give its interval: "
            "build(model, optimizer, (scheduler, 'epoch'))."
        )

    def state_dict(self) -> dict[str, Any]:
        state = {"type": type(self.scheduler).__name__, "state": self.scheduler.state_dict()}
        if self._epoch_lr is not None:
            state["epoch_lr"] = self._epoch_lr
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = type(self.scheduler).__name__
        found = state.get("type") if isinstance(state, dict) else None
        if found != expected:
            raise TrainingError(
                f"The checkpoint holds the state of a {found} learning-rate scheduler, but "
                f"this run uses {expected}. Resume with the scheduler the run was started with."
            )
        self.scheduler.load_state_dict(state["state"])
        self._epoch_lr = state.get("epoch_lr")
        if self._epoch_lr is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = self._epoch_lr


class OptimizerRates:
    """The rates a torch optimizer's param groups were created with, each left as it is
    (`build(model, optimizer)` without a rate, when the groups' rates differ)."""

    def step(self) -> float:
        return math.nan  # never asked: the driver leaves the rates alone

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class ConstantLr:
    """Returns the same learning rate at every step."""

    def __init__(self, lr: float) -> None:
        self.lr = _constant(lr)

    def step(self) -> float:
        return self.lr

    def state_dict(self) -> dict[str, Any]:
        return {"lr": self.lr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lr = _constant(state["lr"])


def _constant(lr: Any) -> float:
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr) or lr < 0:
        raise ConfigError(f"The learning rate must be a finite number >= 0, got {lr!r}.")
    return float(lr)


def _checked(lr: float, scheduler: Any) -> float:
    """A learning rate a step can use: finite and >= 0."""
    if not (math.isfinite(lr) and lr >= 0):
        raise TrainingError(
            f"{type(scheduler).__name__} gave the learning rate {lr!r} for the next step; a "
            "rate must be a finite number >= 0. Check the schedule's settings (a factor or a "
            "step that drives it below 0)."
        )
    return lr
