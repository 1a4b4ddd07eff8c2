"""What `LearnerBuilder.build` makes of the options: the device and the model on it, the
optimizer(s) bound to the model with their learning-rate schedules, the checkpointer and
which checkpoints it keeps, and the mid-epoch cadence."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from ember.errors import ConfigError
from ember.lr.base import ConstantLr, LrDriver, OptimizerRates, StepsUnknown
from ember.train.callbacks.base import Callbacks, Context
from ember.train.checkpoint.file import FileCheckpointer
from ember.train.checkpoint.strategy import (
    CheckpointingStrategy,
    ComposedCheckpointingStrategy,
    KeepLastNCheckpoints,
    MetricCheckpointingStrategy,
)
from ember.train.distributed import process_device
from ember.train.files.artifacts import Artifacts
from ember.train.manual import ManualOptimization
from ember.train.optimization import Optimization

if TYPE_CHECKING:
    from ember.record.protocol import Recorder
    from ember.train.checkpoint.base import Checkpointer
    from ember.train.options import RegisteredMetric


# The device and the model -------------------------------------------------------
def run_device(
    model: torch.nn.Module, devices: Sequence[torch.device] | None, placement: Any
) -> torch.device:
    """The device this process trains on: the model's, unless devices or a launcher say."""
    if devices is None and placement is None:
        return model_device(model)
    return process_device(devices, placement[2] if placement else 0)


def model_device(model: torch.nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    return torch.device("cpu")


def place_model(
    model: torch.nn.Module,
    device: torch.device,
    recompute: tuple[type, ...],
    compile_options: dict[str, Any] | None,
) -> None:
    """Activation checkpointing applied, the model moved to `device`, then compiled."""
    if recompute:
        from ember.train.activation_checkpointing import apply

        apply(model, recompute)
    model.to(device)
    if compile_options is not None:
        model.compile(**compile_options)


# Optimization -------------------------------------------------------------------
def bound_optimization(
    model: torch.nn.Module,
    optimizer: Any,
    lr: Any,
    device: torch.device,
    *,
    monitor: tuple[str, str],
    mixed_precision: str | None,
    clip_norm: float | None,
    clip_value: float | None,
    callbacks: list[Any],
    num_epochs: int,
) -> Optimization:
    """The optimizer(s) bound to the model, their schedules, and the callbacks."""
    named = dict(optimizer) if isinstance(optimizer, Mapping) else {"optimizer": optimizer}
    optimizers, drivers, notes = {}, {}, []
    for name, given in named.items():
        rate = lr[name] if isinstance(lr, Mapping) else lr
        rate, interval = lr_interval(rate)
        if rate is None:
            rate = own_rates(given, model)
        elif isinstance(given, torch.optim.Optimizer):
            notes += replaced_rates(given, rate, name if isinstance(optimizer, Mapping) else None)
        scheduler, pending = lr_scheduler(rate)
        bound = bind_optimizer(given, model, initial_lr(scheduler))
        optimizers[name] = bound
        drivers[name] = LrDriver(scheduler, bound, pending, interval, monitor)
    if len(optimizers) > 1:
        check_disjoint(optimizers)
    hooks = None
    if callbacks:
        hooks = Callbacks(callbacks, Context(model, optimizers, num_epochs))
    options: tuple[Any, ...] = (device, mixed_precision, clip_norm, clip_value, hooks)
    if isinstance(optimizer, Mapping):
        optimization: Optimization = ManualOptimization(model, optimizers, drivers, *options)
    else:
        optimization = Optimization(model, optimizers["optimizer"], drivers["optimizer"], *options)
    optimization.notes += notes
    return optimization


def own_rates(optimizer: Any, model: torch.nn.Module) -> Any:
    """`build()` without a rate: a torch optimizer trains at the rates of its param
    groups, constant (one float when they agree, so a resume compares it; else each
    group's own). An ember optimizer config holds no rate: refused, naming the fix."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        if not callable(getattr(optimizer, "init", None)) and not callable(
            getattr(optimizer, "bind", None)
        ):
            bind_optimizer(optimizer, model, 0.0)  # not an optimizer at all: its own error
        raise ConfigError(
            f"build() got an ember optimizer config ({type(optimizer).__name__}) and no "
            "learning rate: a config holds none. Give one, e.g. build(model, AdamConfig(), "
            "1e-3), or an ember scheduler; or pass a torch optimizer created with its rate, "
            "e.g. torch.optim.Adam(model.parameters(), lr=1e-3), and leave lr out."
        )
    rates = {float(group["lr"]) for group in optimizer.param_groups}
    return rates.pop() if len(rates) == 1 else OptimizerRates()


def replaced_rates(optimizer: torch.optim.Optimizer, lr: Any, name: str | None) -> list[str]:
    """A float rate given beside a torch optimizer created with another: the given one
    wins, said now (a Python warning at `build`) and returned, for the run's log."""
    if not isinstance(lr, (int, float)) or isinstance(lr, bool):
        return []  # a scheduler owns the rate by design
    own = [float(group["lr"]) for group in optimizer.param_groups]
    if all(rate == float(lr) for rate in own):
        return []
    which = (
        f"the optimizer {name!r} ({type(optimizer).__name__})"
        if name
        else (f"the {type(optimizer).__name__}")
    )
    created = f"lr={own[0]!r}" if len(set(own)) == 1 else f"the rates {own!r} of its param groups"
    message = (
        f"build() got lr={lr!r}, and {which} was created with {created}: the given "
        f"{lr!r} wins, every step of every param group trains at {lr!r}. To keep the "
        "optimizer's own rate, leave lr out: build(model, optimizer)."
    )
    warnings.warn(message, UserWarning, stacklevel=caller_level())
    return [message]


def caller_level() -> int:
    """The `stacklevel` of a warning that points at the first frame outside ember (the
    user's `build` call)."""
    frame: Any = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("ember."):
        frame, level = frame.f_back, level + 1
    return level


def lr_monitor(
    monitor: tuple[str, str] | None, valid_metrics: Sequence[RegisteredMetric]
) -> tuple[str, str]:
    """The epoch value a metric-driven schedule steps on."""
    if monitor is not None:
        return monitor
    if any(entry.name == "Loss" for entry in valid_metrics):
        return ("valid", "Loss")
    return ("train", "Loss")


def lr_interval(lr: Any) -> tuple[Any, Any]:
    """`(scheduler, "step" | "epoch")`, or a scheduler alone (stepped per optimizer step)."""
    if isinstance(lr, tuple):
        if len(lr) != 2 or lr[1] not in ("step", "epoch"):
            raise ConfigError(
                f"build() got the tuple {lr!r} as learning rate: give (scheduler, 'step') or "
                "(scheduler, 'epoch'), the interval at which the scheduler is stepped."
            )
        return lr[0], lr[1]
    return lr, "step"


def lr_scheduler(lr: Any) -> tuple[Any, Any]:
    """The scheduler for `lr`, or (None, config) for a config that needs the run's
    step count ("auto"), which the learner counts when `fit` starts."""
    if isinstance(lr, (int, float)) and not isinstance(lr, bool):
        return ConstantLr(float(lr)), None
    if isinstance(lr, torch.optim.lr_scheduler.LRScheduler):
        return lr, None
    if all(callable(getattr(lr, name, None)) for name in ("step", "state_dict", "load_state_dict")):
        return lr, None
    if callable(getattr(lr, "init", None)):
        try:
            built = lr.init()
        except StepsUnknown:
            return None, lr
        return lr_scheduler(built)
    raise ConfigError(
        f"build() got {lr!r} as learning rate: pass a float (constant rate), an ember "
        "scheduler (ember.lr) or a torch.optim.lr_scheduler object."
    )


def initial_lr(scheduler: Any) -> float:
    if isinstance(scheduler, ConstantLr):
        return scheduler.lr
    return 0.0 if not isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler) else math.nan


def bind_optimizer(optimizer: Any, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    if isinstance(optimizer, torch.optim.Optimizer):
        owned = {id(p) for p in model.parameters()}
        foreign = [
            p for group in optimizer.param_groups for p in group["params"] if id(p) not in owned
        ]
        if foreign:
            raise ConfigError(
                f"The optimizer updates {len(foreign)} tensor(s) that are not parameters of "
                f"{type(model).__name__}: it was created for another model (or a copy). Create it "
                "from this model's parameters, e.g. torch.optim.Adam(model.parameters()), or pass "
                "an ember optimizer config (ember.optim.AdamConfig()) and let ember bind it."
            )
        return optimizer
    factory = optimizer.init() if callable(getattr(optimizer, "init", None)) else optimizer
    if callable(getattr(factory, "bind", None)):
        trainable = [p for p in model.parameters() if p.requires_grad]
        if not trainable:
            raise ConfigError(f"{type(model).__name__} has no trainable parameters.")
        return factory.bind(trainable, lr if math.isfinite(lr) else 0.0)
    raise ConfigError(
        f"build() got {type(optimizer).__name__} as optimizer: pass a torch.optim.Optimizer "
        "over the model's parameters or an ember optimizer config such as AdamConfig()."
    )


def check_disjoint(optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
    """Two optimizers must not update the same tensor."""
    owner: dict[int, str] = {}
    for name, optimizer in optimizers.items():
        for group in optimizer.param_groups:
            for param in group["params"]:
                other = owner.setdefault(id(param), name)
                if other != name:
                    raise ConfigError(
                        f"The optimizers {other!r} and {name!r} both update a tensor of shape "
                        f"{tuple(param.shape)}: each parameter belongs to one optimizer. "
                        "Create each one on its part of the model (e.g. "
                        "model.generator.parameters())."
                    )


# Checkpoints --------------------------------------------------------------------
def run_checkpointer(
    given: Checkpointer | None, recorder: Recorder | None, artifact_dir: Path
) -> Checkpointer | None:
    """The run's checkpointer: the one given, or the file checkpointer of `recorder`."""
    if recorder is not None:
        return FileCheckpointer(Artifacts(artifact_dir).checkpoints, recorder)
    return given


def retention(
    strategy: CheckpointingStrategy | None, valid_metrics: Sequence[RegisteredMetric]
) -> CheckpointingStrategy:
    """Which checkpoints to keep: the strategy given, or the last 2 epochs and the best
    by valid loss."""
    if strategy is not None:
        return strategy
    keep_last = KeepLastNCheckpoints(2)
    if any(entry.name == "Loss" for entry in valid_metrics):
        return ComposedCheckpointingStrategy(keep_last, MetricCheckpointingStrategy("Loss"))
    return keep_last


def run_cadence(every: tuple[int | None, float | None], max_time: float | None) -> Any:
    """This run's mid-epoch checkpoints and time limit (a `Cadence`), or None."""
    if every == (None, None) and max_time is None:
        return None
    from ember.train.length.cadence import Cadence

    return Cadence(*every, limit=max_time)
