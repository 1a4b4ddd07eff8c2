"""What a `LearnerBuilder`'s calls have set so far (each value already checked), and the
frozen `LearnerOptions` that `build` makes of it."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch

from ember.environment import from_environment
from ember.train.build.checks import (
    check_checkpointing,
    check_closures,
    check_device,
    check_device_memory,
    check_micro_auto,
    check_model,
    check_precision,
    check_processes,
    check_resume,
    check_sync_batchnorm,
)
from ember.train.build.resolve import (
    bound_optimization,
    caller_level,
    lr_monitor,
    place_model,
    retention,
    run_cadence,
    run_checkpointer,
    run_device,
)
from ember.train.distributed import world_size
from ember.train.length.interrupter import Interrupter
from ember.train.options import LearnerOptions, RegisteredMetric

if TYPE_CHECKING:
    from ember.record.protocol import Recorder
    from ember.train.checkpoint.base import Checkpointer
    from ember.train.checkpoint.strategy import CheckpointingStrategy
    from ember.train.early_stopping import EarlyStoppingStrategy, PruningStrategy
    from ember.train.events import Listener
    from ember.train.length.duration import Duration
    from ember.train.logger.base import MetricLogger
    from ember.train.optimization import Optimization
    from ember.train.parallel import FsdpOptions
    from ember.train.renderer.base import Renderer


def _per_split() -> dict[str, list[Any]]:
    return {"train": [], "valid": []}


@dataclass
class BuilderState:
    """The options of a run as the builder's calls left them; defaults where none was set."""

    artifact_dir: Path
    overwrite: bool = False
    metrics: dict[str, list[RegisteredMetric]] = field(default_factory=_per_split)
    loggers: dict[str, list[MetricLogger]] = field(default_factory=_per_split)
    renderer: Renderer | None = None
    grads_accumulation: int = 1
    micro_auto: bool = False
    global_batch: int | None = None
    memory_history: int | None = None
    sync_batchnorm: bool = False
    recorder: Recorder | None = None
    checkpointer: Checkpointer | None = None
    num_epochs: int = 1
    devices: list[torch.device] | None = None
    timeout: float = 300.0
    rank_logs: bool = False
    fsdp: FsdpOptions | None = None
    checkpoint: int | str | None = None
    interrupter: Interrupter = field(default_factory=Interrupter)
    listeners: list[Listener] = field(default_factory=list)
    callbacks: list[Any] = field(default_factory=list)
    application_log: bool = True
    summary: bool = False
    mixed_precision: str | None = None
    clip_norm: float | None = None
    clip_value: float | None = None
    nonfinite: str = "stop"
    early_stopping: EarlyStoppingStrategy | None = None
    strategy: CheckpointingStrategy | None = None
    on_checkpoint_error: str = "stop"
    compile: dict[str, Any] | None = None
    resume_hyperparameters: str = "checkpoint"
    monitor: tuple[str, str] | None = None
    hparams: dict[str, Any] | None = None
    pruning: PruningStrategy | None = None
    preemption: Any = None
    every: tuple[int | None, float | None] = (None, None)  # steps, seconds
    max_time: float | None = None
    valid_every: int | Duration | None = None
    train_for: Duration | None = None
    every_count: Duration | None = None  # checkpoint_every in samples or tokens
    limits: dict[str, int | float | None] = field(
        default_factory=lambda: {"train": None, "valid": None}
    )
    model_summary: int | None = 1
    recompute: tuple[type, ...] = ()

    def optimization(
        self, model: torch.nn.Module, optimizer: Any, lr: Any, device: torch.device
    ) -> Optimization:
        """The optimizer(s) bound to the model, their schedules, and the callbacks."""
        optimization = bound_optimization(
            model,
            optimizer,
            lr,
            device,
            monitor=lr_monitor(self.monitor, self.metrics["valid"]),
            mixed_precision=self.mixed_precision,
            clip_norm=self.clip_norm,
            clip_value=self.clip_value,
            callbacks=self.callbacks,
            num_epochs=self.num_epochs,
        )
        if self.micro_auto:
            optimization.micro_split = 1
        return optimization

    def resolve(self, model: torch.nn.Module, optimizer: Any, lr: Any) -> LearnerOptions:
        """Check the model, devices, precision, resume and checkpointing against each
        other (each failing check names its fix), place the model and make its
        optimization and checkpointer: the options `build()` hands the `Learner`."""
        state = self
        loose = check_model(model, optimizer, lr)  # layers a plain list hides: warned of
        for message in loose:
            warnings.warn(message, UserWarning, stacklevel=caller_level())
        manual = isinstance(optimizer, Mapping)
        check_precision(state.fsdp, state.mixed_precision)
        placement = from_environment()
        check_processes(manual, state.devices, placement)
        if state.micro_auto:
            check_micro_auto(manual, state.fsdp)
        device = run_device(model, state.devices, placement)
        check_device(device, state.memory_history, state.fsdp)
        check_device_memory(model, optimizer, device, state.fsdp, world_size(state.devices))
        if state.sync_batchnorm:
            check_sync_batchnorm(model, world_size(state.devices))
        place_model(model, device, state.recompute, state.compile)
        optimization = state.optimization(model, optimizer, lr, device)
        optimization.notes += loose  # and in the run's log
        check_closures(
            optimization, state.grads_accumulation, state.micro_auto, state.mixed_precision
        )
        checkpointer = run_checkpointer(state.checkpointer, state.recorder, state.artifact_dir)
        check_resume(state.checkpoint, checkpointer, state.artifact_dir, state.recorder)
        check_checkpointing(
            checkpointer, optimization, state.train_for, state.every, state.every_count, state.fsdp
        )
        return self.learner_options(model, optimization, device, checkpointer)

    def learner_options(
        self,
        model: torch.nn.Module,
        optimization: Optimization,
        device: torch.device,
        checkpointer: Checkpointer | None,
    ) -> LearnerOptions:
        """The frozen options of the run."""
        from ember.train.renderer.select import default_renderer

        return LearnerOptions(
            model=model,
            optimization=optimization,
            device=device,
            devices=tuple(self.devices) if self.devices is not None else None,
            distributed_timeout=self.timeout,
            rank_logs=self.rank_logs,
            fsdp=self.fsdp,
            artifact_dir=self.artifact_dir,
            overwrite=self.overwrite,
            num_epochs=self.num_epochs,
            metrics={split: tuple(entries) for split, entries in self.metrics.items()},
            loggers={split: tuple(loggers) for split, loggers in self.loggers.items()},
            renderer=self.renderer if self.renderer is not None else default_renderer(),
            grads_accumulation=self.grads_accumulation,
            global_batch=self.global_batch,
            checkpointer=checkpointer,
            strategy=(
                retention(self.strategy, self.metrics["valid"])
                if checkpointer is not None
                else None
            ),
            resume_from=self.checkpoint,
            on_checkpoint_error=self.on_checkpoint_error,
            interrupter=self.interrupter,
            listeners=tuple(self.listeners),
            application_log=self.application_log,
            summary=self.summary,
            early_stopping=self.early_stopping,
            nonfinite_loss=self.nonfinite,
            compile=self.compile,
            model_summary=self.model_summary,
            activation_checkpointing=self.recompute,
            resume_hyperparameters=self.resume_hyperparameters,
            hparams=self.hparams,
            pruning=self.pruning,
            preemption=self.preemption,
            cadence=run_cadence(self.every, self.max_time),
            valid_every=self.valid_every,
            train_for=self.train_for,
            checkpoint_every=self.every_count,
            limit_batches=(self.limits["train"], self.limits["valid"]),
            memory_history=self.memory_history,
            sync_batchnorm=self.sync_batchnorm,
        )
