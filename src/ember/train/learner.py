"""`Learner`: a configured run, and `Learner.fit`, the training loop from the top.

fit -> prepare and start (`lifecycle.py`) -> the epochs (`epochs.py`: each train
epoch takes every optimizer step of the epoch's batch plan, `batches.py`, and runs
it, `stepping.py`) -> validation and the epoch's end (`epoch_end.py`) -> close. The
learner holds the run's state; checkpoints (`checkpoint/policy.py`), the artifact
directory (`artifacts.py`) and the epoch history (`history.py`) have owners of their
own; metrics, loggers, the renderer and listeners only receive what the loop hands
them. After `fit`: `evaluate`, `predict`, `lr_find`, `smoke_test`.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import torch

from ember.errors import TrainingError
from ember.train import epochs, lifecycle
from ember.train.files.artifacts import Artifacts
from ember.train.batches import BatchPlanner
from ember.train.checkpoint.policy import CheckpointPolicy
from ember.train.distributed import Distributed, setup, world_size
from ember.train.length.duration import Counters, Duration
from ember.train.evaluator import learner_evaluator
from ember.train.flops import FlopCount
from ember.train.guard import LossGuard
from ember.train.history import RunHistory
from ember.train.files.lock import RunLock
from ember.train.lr_finder import LrFinderResult, lr_find
from ember.train.manual import ManualOptimization, StepContext
from ember.train.memory import memory_post_mortem, start_memory_history, stop_memory_history
from ember.train.oom import RankSplit
from ember.train.build.options import LearnerOptions
from ember.train.outcome import Outcome, StopReason
from ember.train.length.position import Position
from ember.train.length.run_length import RunLength
from ember.train.length.signals import signal_handlers
from ember.train.smoke import SmokeReport, smoke_test
from ember.train.step import check_steps
from ember.train.validation import ValidationPoints

log = logging.getLogger(__name__)
EpochValues = dict[str, dict[str, float]]


class Learner:
    """A configured training run, built by `LearnerBuilder.build`. Call `fit` once."""

    def __init__(self, options: LearnerOptions) -> None:
        self.options = options
        self.model = options.model
        self.optim = options.optimization
        self.optimizer = self.optim.optimizer
        self.callbacks = self.optim.callbacks
        """The run's callbacks (`LearnerBuilder.callback`), None when there are none."""
        self.device = options.device
        self.devices = list(options.devices) if options.devices is not None else None
        self.artifact_dir = options.artifact_dir
        self.artifacts = Artifacts(options.artifact_dir)
        self.num_epochs = options.num_epochs
        self.metrics = options.metrics
        self.renderer = options.renderer
        self.grads_accumulation = options.grads_accumulation
        self.interrupter = options.interrupter
        self.listeners = options.listeners
        self.run_history = RunHistory()
        self.checkpoints = CheckpointPolicy(
            options.checkpointer,
            options.strategy,
            options.resume_from,
            options.on_checkpoint_error,
            self.run_history,
            options.resume_hyperparameters,
        )
        self.guard = LossGuard(
            options.nonfinite_loss, self.device, last_checkpoint=self.checkpoints.last_good
        )
        self.flops = FlopCount(
            (entry.metric for entry in self.metrics.get("train", ())),
            self.model,
            self.device,
            self.optim.mixed_precision,
        )
        """The FLOPs of one training sample, counted on the first batch for the metrics
        that need them (`ThroughputMetric("mfu")`)."""
        self.points = (
            ValidationPoints(
                options.valid_every,
                options.grads_accumulation,
                options.metrics.get("valid", ()),
                options.num_epochs,
                self.artifacts,
                self.run_history,
                self.optim.autocast,
            )
            if options.valid_every is not None
            else None
        )
        self._early_stop: Outcome | None = None
        self.dist: Distributed | None = None
        self._ddp: Any = None
        self._ranks: RankSplit | None = None
        """grads_accumulation("auto") on several processes: their agreement."""
        self._whole: dict[str, Any] | None = None
        self._move = self.device.type != "cpu"  # batches from a DataLoader are on the CPU
        self._manual: StepContext | None = None
        if isinstance(self.optim, ManualOptimization):
            self._manual = StepContext(self.optim, self.guard)
        self.epoch = 0
        self.iteration = 0
        self.items = 0
        self.length = RunLength(
            options.train_for,
            options.num_epochs,
            (options.valid_every, options.checkpoint_every),
        )
        """The run's length (`train_for`, else `num_epochs` epochs) and its counters."""
        self._final_state: tuple[Any, Any] | None = None
        """Metric log lines and states of an epoch the run's length ended inside."""
        self.skipped_steps = 0
        """Optimizer steps skipped for a non-finite loss in this run (`nonfinite_loss("skip")`)."""
        self._token_mean = False
        """The steps' losses are means over tokens: each batch's gradient is weighted by them."""
        self._output_checked = False
        self._fitted = False
        self._run_lock: RunLock | None = None
        self.steps_per_epoch: int | None = None
        """Optimizer steps per epoch (every process, gradient accumulation counted), set
        when `fit` starts; `steps(train)` tells it before."""
        self.total_steps: int | None = None
        """Optimizer steps of the whole run (`steps_per_epoch * num_epochs`)."""
        self.outcome: Outcome | None = None
        """After `fit`: "completed", "stopped: <why>", "stopped early: <why>" or "pruned:
        <why>" (`LearnerBuilder.pruning`); "failed" ("failed: the loss is NaN ...") or
        "interrupted" (a second Ctrl-C) when `fit` raised. An `Outcome`: the text, with
        its `reason` (a `StopReason`) and, after early stopping, `early_stop` (the rule
        that fired and its values)."""

    @property
    def exit_code(self) -> int:
        """The status a training script should exit with after `fit`: 0 when the run
        completed, stopped early or was stopped by a request (the dashboard, code);
        128 + the signal number when a signal stopped it (143 for SIGTERM, 130 for
        Ctrl-C), so a job scheduler sees a preemption; 1 when it failed."""
        return 1 if self.outcome is None else self.outcome.exit_code

    def steps(self, train: Iterable[Any]) -> tuple[int | None, int | None]:
        """`(steps_per_epoch, total_steps)` that `fit(train, ...)` will take: optimizer
        steps per epoch on the process with the most batches (under several processes
        each takes its share of the batches) and over the whole run, under the batch
        limit (`limit_batches`); for a run whose length (`train_for`) is in steps, those,
        and in samples, the steps that reach them. What an "auto" step count of a
        scheduler config is resolved from. None when the loader has no length (and no
        count limits it), or, for the run's steps, when its length is in tokens."""
        world = world_size(self.devices)
        shard = (0, world) if world > 1 else None
        limit = self.options.limit_batches[0]
        planner = BatchPlanner(train, self.grads_accumulation, shard, limit)
        per_epoch = planner.steps_per_epoch()
        return per_epoch, self.length.steps(planner, per_epoch, Position(1, fresh=True))[0]

    @property
    def train_for(self) -> Duration | None:
        """The run's length in steps, samples or tokens (None: `num_epochs` epochs)."""
        return self.length.train_for

    @property
    def counters(self) -> Counters:
        """The optimizer steps, samples and tokens (every process's) of the run so far."""
        return self.length.counters

    def progress_text(self) -> str:
        """The run's progress in the unit of its length, e.g. "samples 1.2M/5M" (empty
        for a length in epochs)."""
        return self.length.progress_text()

    @property
    def history(self) -> list[tuple[int, EpochValues]]:
        """Every completed epoch as `(epoch, {split: {metric: epoch value}})`."""
        return self.run_history.entries()

    # The run ---------------------------------------------------------------------
    def fit(
        self,
        train: Iterable[Any],
        valid: Iterable[Any] | None = None,
        *,
        restore_best: bool = False,
    ) -> torch.nn.Module:
        """Train for the configured epochs and return the trained model (with
        `restore_best=True`, the weights of the epoch the checkpointing strategy holds
        to be the best)."""
        if self._fitted:
            raise TrainingError(
                "fit() was already called on this Learner: a Learner runs once. Build a new "
                "one with the same builder (add checkpoint('latest') to continue this run)."
            )
        self._fitted = True
        if valid is not None:
            check_steps(self.model, ("valid_step",))
        elif self.points is not None:
            raise TrainingError(
                f"valid_every({self.points.every}) validates inside each epoch on the validation "
                "data, but fit() got none: pass it as fit(train, valid), or leave valid_every out."
            )
        if restore_best:
            self.checkpoints.check_restore_best(self.metrics)
        self.dist = setup(self.devices, self.options.distributed_timeout)
        main = self.dist is None or self.dist.main
        lock = RunLock(self.artifacts.lock) if main else None
        self._run_lock = lock
        failed = True
        try:
            if lock is not None:
                self.artifacts.check_writable()
                lock.acquire()
            model = self._run(train, valid, restore_best)
            failed = False
            return model
        except BaseException as error:
            waits = (
                isinstance(error, Exception) and self.dist is not None and bool(self.dist.children)
            )
            report = self.dist.failures(wait=5.0 if waits else 0.0) if self.dist is not None else ""
            if report:
                assert self.dist is not None
                stopped = TrainingError(f"Training stopped because another rank failed. {report}")
                self.dist.tell_on_sigterm(stopped)
                raise stopped from error
            raise
        finally:
            if lock is not None:
                lock.release()
            if self.dist is not None:
                self.dist.close(failed)

    def _run(
        self, train: Iterable[Any], valid: Iterable[Any] | None, restore_best: bool
    ) -> torch.nn.Module:
        """Prepare (nothing on disk changes before the resumed state loads), start,
        train every epoch, end; the loggers, the renderer and the log always close."""
        run = lifecycle.prepare(self, train, valid)
        reason: Outcome | str = "failed"
        recording = self.options.memory_history
        if recording is not None:
            start_memory_history(recording)
        try:
            with signal_handlers(self.interrupter, self.options.preemption):
                if self.options.cadence is not None:
                    self.options.cadence.start()  # max_time counts from here
                processor = lifecycle.start(self, run, valid)
                self._hook("on_fit_start", run.resume.position.epoch)
                reason = epochs.run_epochs(self, processor, run.train, run.valid, run.resume)
                self._hook("on_fit_end", self.epoch)
                self.checkpoints.finish()  # the last checkpoint is on disk, or the run failed
            self.outcome = reason
            log.info("Training %s after epoch %d.", reason, self.epoch)
            if self.options.preemption is not None:  # requeue a preempted SLURM job
                again = (StopReason.PREEMPTED, StopReason.TIME_LIMIT)
                unfinished = isinstance(reason, Outcome) and reason.reason in again
                self.options.preemption.after(unfinished, run.main)
            skipped = self.skipped_steps + (self._manual.skipped if self._manual else 0)
            if skipped:
                log.info(
                    "Skipped %d optimizer step%s with a non-finite loss (nonfinite_loss('skip')).",
                    skipped,
                    "" if skipped == 1 else "s",
                )
            if restore_best:
                self.checkpoints.restore_best(self.model, self.dist)
            if self.dist is not None and self.dist.sharding is not None:
                self._whole = self.dist.sharding.gathered_model()  # before the group closes
            if self.options.summary and run.main:
                lifecycle.print_summary(self)
        except BaseException as error:
            if recording is not None and isinstance(error, torch.OutOfMemoryError):
                rank = self.dist.rank if self.dist is not None else 0
                memory_post_mortem(error, self.artifacts.memory_snapshot(rank))
            reason = self.outcome = lifecycle.failure(self, error)
            raise
        finally:
            if recording is not None:
                stop_memory_history()
            lifecycle.close(self, run.loggers, run.renderer, reason)
            run.app_log.uninstall()
        return self.model

    # What the epochs call (`epochs.py`, `epoch_end.py`, `stepping.py`) -------------
    def _hook(self, name: str, epoch: int) -> None:
        """Call a callback hook of the run's epochs and splits (none without callbacks)."""
        if self.callbacks is not None and self.callbacks.has(name):
            self.callbacks.ctx.epoch = epoch
            self.callbacks.call(name)

    def _emit(self, event: Any) -> None:
        for listener in self.listeners:
            listener.on_event(event)

    # After the run ---------------------------------------------------------------
    def model_state_dict(self) -> dict[str, Any]:
        """The trained model's whole state. Under FSDP, where each process holds a
        shard, `fit` gathers it on rank 0 (on the CPU) before it ends, and the other
        ranks get {}; otherwise it is the model's own `state_dict()`."""
        if self._whole is not None:
            return self._whole
        return self.model.state_dict()

    def evaluate(self, name: str, loader: Iterable[Any]) -> dict[str, float]:
        """Evaluate the model (after `fit`: the trained one) on `loader` as
        `Evaluator.eval` does, on the learner's device, into its artifact directory
        (`test/<name>/`), with its validation metrics (the training ones when it has
        none); return `{metric: value}` over the whole set."""
        return learner_evaluator(self).eval(name, loader)

    def lr_find(self, train: Iterable[Any], **options: Any) -> LrFinderResult:
        """The learning-rate range test on `train` (see `ember.train.lr_finder.lr_find` for
        `start`, `end`, `steps`, `mode`, `smoothing` and `diverge`): the rates, the
        losses and a `suggestion`; everything it changes is put back afterwards, and its
        curve is written to `lr-find.json` for `ember plot`."""
        return lr_find(self, train, **options)

    def smoke_test(
        self,
        train: Iterable[Any],
        valid: Iterable[Any] | None = None,
        *,
        batches: int = 2,
        echo: bool = True,
    ) -> SmokeReport:
        """Run `batches` batches of each split through the whole loop (steps, metrics,
        files, a checkpoint written and loaded back) in a temporary directory, leaving
        this learner, its model, optimizer and schedule as they were; return (and print)
        what ran, or raise `SmokeTestError` naming the part that fails."""
        return smoke_test(self, train, valid, batches=batches, echo=echo)

    def predict(self, loader: Iterable[Any]) -> Any:
        """The model's outputs over `loader`, on the CPU, concatenated along the first
        dimension, as `Evaluator.predict` returns them."""
        return learner_evaluator(self).predict(loader)
