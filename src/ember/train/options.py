"""What `LearnerBuilder.build` hands the `Learner`: one typed, frozen set of options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from ember.train.checkpoint.base import Checkpointer
from ember.train.checkpoint.strategy import CheckpointingStrategy
from ember.train.early_stopping import EarlyStoppingStrategy, PruningStrategy
from ember.train.events import Listener
from ember.train.length.duration import Duration
from ember.train.length.interrupter import Interrupter
from ember.train.logger.base import MetricLogger
from ember.train.metric.base import RegisteredMetric
from ember.train.optimization import Optimization
from ember.train.parallel import FsdpOptions
from ember.train.renderer.base import Renderer

__all__ = ["LearnerOptions", "RegisteredMetric"]


@dataclass(frozen=True)
class LearnerOptions:
    """Every option of a run, checked by the builder."""

    model: torch.nn.Module
    optimization: Optimization
    device: torch.device
    devices: tuple[torch.device, ...] | None
    """As given to `devices(...)`; None when not given."""
    distributed_timeout: float
    rank_logs: bool
    """Each process keeps its log lines in `rank-N.log` (`devices(..., rank_logs=True)`)."""
    artifact_dir: Path
    overwrite: bool
    num_epochs: int
    metrics: Mapping[str, tuple[RegisteredMetric, ...]]
    """Per split ("train", "valid")."""
    loggers: Mapping[str, tuple[MetricLogger, ...]]
    """Extra metric loggers per split (the file logger is always added)."""
    renderer: Renderer
    grads_accumulation: int
    global_batch: int | None
    """Samples of each optimizer step over every process (None: the first launch's)."""
    checkpointer: Checkpointer | None
    strategy: CheckpointingStrategy | None
    resume_from: int | str | None
    on_checkpoint_error: str
    interrupter: Interrupter
    listeners: tuple[Listener, ...]
    application_log: bool
    summary: bool
    early_stopping: EarlyStoppingStrategy | None
    nonfinite_loss: Any
    resume_hyperparameters: str = "checkpoint"
    """On resume, whose optimizer hyperparameters win: "checkpoint" or "new"."""
    compile: Mapping[str, Any] | None = None
    """The `torch.compile` options the model was compiled with, or None."""
    hparams: Mapping[str, Any] | None = None
    """The run's hyperparameters (`LearnerBuilder.hparams`), JSON-ready; None if not given."""
    pruning: PruningStrategy | None = None
    preemption: Any = None
    cadence: Any = None
    """Mid-epoch checkpoints and the time limit (`checkpoint_every`, `max_time`), or None."""
    """The preemption signal and requeue (`LearnerBuilder.preemption`), or None."""
    """What may prune the run at an epoch end (`LearnerBuilder.pruning`), or None."""
    fsdp: FsdpOptions | None = None
    """How the model is sharded over the processes (None: DDP, or one process)."""
    valid_every: int | Duration | None = None
    """Validate inside each epoch every this many optimizer steps of the epoch, or each
    time the run passes a multiple of a duration in samples or tokens (None: at epoch
    ends only)."""
    train_for: Duration | None = None
    """The run's length in steps, samples or tokens (None: `num_epochs` epochs)."""
    checkpoint_every: Duration | None = None
    """Checkpoint each time the run passes a multiple of this many samples or tokens."""
    limit_batches: tuple[int | float | None, int | float | None] = (None, None)
    memory_history: int | None = None
    sync_batchnorm: bool = False
    """BatchNorm statistics shared by the processes (`LearnerBuilder.sync_batchnorm`)."""
    """Record CUDA allocations (this many events) for an out-of-memory post-mortem."""
    """The batches each epoch takes of the training and validation loaders: a count, a
    fraction of the loader's batches, or None for all."""
    activation_checkpointing: tuple[type, ...] = ()
    """The module classes wrapped for activation checkpointing."""
    model_summary: int | None = 1
    """The depth of the model summary written when `fit` starts; None: no summary."""
