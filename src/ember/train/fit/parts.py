"""What one fit acts with (`FitParts`): made once by `prepare`, never reassigned."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ember.train.checkpoint.policy import CheckpointPolicy
from ember.train.checkpoint.resume import Resume
from ember.train.distributed import Distributed
from ember.train.files.artifacts import Artifacts
from ember.train.files.run_record import SavedRecords
from ember.train.fit.events import FitEvents
from ember.train.fit.points import ValidationPoints
from ember.train.flops import FlopCount
from ember.train.guard import LossGuard
from ember.train.history import RunHistory
from ember.train.length.batches import BatchPlanner
from ember.train.length.run_length import RunLength
from ember.train.length.streams import ColumnStreams
from ember.train.logger.application import FileApplicationLogger
from ember.train.logger.base import MetricLogger
from ember.train.manual import ManualOptimization, StepContext
from ember.train.oom import RankSplit
from ember.train.optimization import Optimization
from ember.train.options import LearnerOptions
from ember.train.processor import MetricsProcessor


@dataclass(frozen=True)
class Lasting:
    """What a `Learner` keeps from its build to its end, across `fit` and the verbs
    after it: the options, the model and its optimization, the artifact directory, the
    history, the checkpoint policy, the loss guard, the FLOP count, the validation
    points, custom optimization's step context and the run's length."""

    options: LearnerOptions
    artifacts: Artifacts
    history: RunHistory
    checkpoints: CheckpointPolicy
    guard: LossGuard
    flops: FlopCount
    points: ValidationPoints | None
    manual: StepContext | None
    length: RunLength

    @classmethod
    def of(cls, options: LearnerOptions) -> Lasting:
        """What lasts of a run built with `options`."""
        optim, history = options.optimization, RunHistory()
        checkpoints = CheckpointPolicy(
            options.checkpointer,
            options.strategy,
            options.resume_from,
            options.on_checkpoint_error,
            history,
            options.resume_hyperparameters,
        )
        artifacts = Artifacts(options.artifact_dir)
        guard = LossGuard(
            options.nonfinite_loss, options.device, last_checkpoint=checkpoints.last_good
        )
        return cls(
            options=options,
            artifacts=artifacts,
            history=history,
            checkpoints=checkpoints,
            guard=guard,
            flops=FlopCount(
                (entry.metric for entry in options.metrics.get("train", ())),
                options.model,
                options.device,
                optim.mixed_precision,
            ),
            points=ValidationPoints(
                options.valid_every,
                options.grads_accumulation,
                options.metrics.get("valid", ()),
                artifacts,
                history,
                optim.autocast,
            )
            if options.valid_every is not None
            else None,
            manual=StepContext(optim, guard) if isinstance(optim, ManualOptimization) else None,
            length=RunLength(
                options.train_for,
                options.num_epochs,
                (options.valid_every, options.checkpoint_every),
            ),
        )

    @property
    def model(self) -> torch.nn.Module:
        return self.options.model

    @property
    def optim(self) -> Optimization:
        return self.options.optimization


@dataclass(frozen=True)
class FitParts:
    """The objects of one fit. `model` is the user's module; `wrapped` the DDP or FSDP
    module the steps run through (None on one process); `ranks` the agreement of the
    processes under `grads_accumulation("auto")`; `points` the validation inside
    epochs (`valid_every`); `manual` the context of custom optimization."""

    options: LearnerOptions
    model: torch.nn.Module
    wrapped: Any
    optim: Optimization
    manual: StepContext | None
    guard: LossGuard
    flops: FlopCount
    processor: MetricsProcessor
    checkpoints: CheckpointPolicy
    history: RunHistory
    artifacts: Artifacts
    length: RunLength
    dist: Distributed | None
    ranks: RankSplit | None
    points: ValidationPoints | None
    events: FitEvents
    loggers: dict[str, list[MetricLogger]]
    renderer: Any
    app_log: FileApplicationLogger
    resume: Resume
    train: BatchPlanner
    valid: BatchPlanner | None
    device: torch.device
    move: bool
    """Batches go to the device (a DataLoader yields them on the CPU): decided once,
    read every step."""
    records: SavedRecords | None = None
    """The run's records as a resumed fit read and checked them, before writing (rank 0)."""
    streams: ColumnStreams | None = None
    """The random streams of the layout's columns this process runs, when it runs
    several (a run resumed on fewer processes than it started on)."""

    @property
    def main(self) -> bool:
        """This process writes the run's files (rank 0, or the only process)."""
        return self.dist is None or self.dist.main
