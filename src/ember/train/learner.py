"""`Learner.fit`: the training loop, top to bottom.

fit -> epochs -> (train epoch, valid epoch, end of epoch). A train epoch takes each
optimizer step from the epoch's batch plan (`batches.py`), runs its batches (step,
backward, metrics), steps the optimizer and decides whether to stop. Checkpoints
(`checkpoint/policy.py`), the artifact directory (`artifacts.py`) and the epoch
history (`history.py`) have owners of their own; metrics, loggers, the renderer and
listeners only receive what the loop hands them.
"""

from __future__ import annotations

import itertools
import logging
import math
import sys
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

import torch

from ember.data.device import to_device
from ember.errors import TrainingError
from ember.train.artifacts import Artifacts
from ember.train.batches import BatchPlanner, EpochPlan, Step, batch_size, steps_to_reach
from ember.train.checkpoint.policy import CheckpointPolicy, Resume
from ember.train.describe import describe_run, run_info
from ember.train.distributed import Distributed, setup, world_size
from ember.train.duration import Counters, Duration, crossed, short_count
from ember.train.evaluator import Evaluator
from ember.train.events import End, EndEpoch, ProcessedItem, Start, StartEpoch, StartSplit
from ember.train.flops import FlopCount
from ember.train.guard import LossGuard, NonFiniteLoss
from ember.train.history import RunHistory
from ember.train.interrupter import Interrupter
from ember.train.lock import RunLock
from ember.train.logger.application import FileApplicationLogger
from ember.train.logger.base import MetricLogger, RunStart, start_loggers
from ember.train.logger.file import FileMetricLogger
from ember.train.lr_finder import LrFinderResult, lr_find
from ember.train.manual import ManualOptimization, StepContext
from ember.train.model_summary import summarize_model
from ember.train.oom import (
    RankSplit,
    memory_post_mortem,
    run_split,
    run_split_ranks,
    start_memory_history,
    stop_memory_history,
)
from ember.train.options import LearnerOptions
from ember.train.outcome import Outcome, StopReason
from ember.train.output import loss_weight, summed_loss_hint
from ember.train.parallel import evaluation, join, no_sync, parallelize
from ember.train.position import Position
from ember.train.preflight import check_not_empty, check_validation
from ember.train.processor import MetricsProcessor
from ember.train.renderer.silent import SilentRenderer
from ember.train.run_record import end_session, record_start
from ember.train.signals import signal_handlers
from ember.train.smoke import SmokeReport, smoke_test
from ember.train.step import call_step, check_steps, check_train_output
from ember.train.validation import ValidationPoints, early_stop, stop_at_point

log = logging.getLogger(__name__)
EpochValues = dict[str, dict[str, float]]


@dataclass
class _Run:
    """What `_prepare` readies for one `fit`."""

    main: bool
    resume: Resume
    train: BatchPlanner
    valid: BatchPlanner | None
    notes: list[str]
    loggers: dict[str, list[MetricLogger]]
    renderer: Any
    app_log: FileApplicationLogger


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
        self.train_for: Duration | None = options.train_for
        """The run's length in steps, samples or tokens (None: `num_epochs` epochs)."""
        self.counters = Counters()
        """The optimizer steps, samples and tokens (every process's) of the run so far."""
        self._counts_tokens = any(
            isinstance(d, Duration) and d.unit == "tokens"
            for d in (options.train_for, options.valid_every, options.checkpoint_every)
        )
        self._uses_counts = self._counts_tokens or any(
            isinstance(d, Duration)
            for d in (options.train_for, options.valid_every, options.checkpoint_every)
        )
        """A length or cadence counts steps, samples or tokens over the run."""
        self._step_tokens: int | torch.Tensor = 0
        """Tokens of the step running (counted only when a duration is in tokens)."""
        self._tokens_pending: int | torch.Tensor = 0
        """Tokens of this process not yet summed over the processes."""
        self._ended = False
        """The run's length (`train_for`) was reached."""
        self._final_state: tuple[Any, Any] | None = None
        """Metric log lines and states of an epoch the run's length ended inside."""
        self.skipped_steps = 0
        """Optimizer steps skipped for a non-finite loss in this run (`nonfinite_loss("skip")`)."""
        self._token_mean = False
        self._output_checked = False
        """The steps' losses are means over tokens: each batch's gradient is weighted by them."""
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
        return per_epoch, self._run_steps(planner, per_epoch, Position(1, fresh=True))[0]

    def _run_steps(
        self, planner: BatchPlanner, per_epoch: int | None, start: Position
    ) -> tuple[int | None, int | None]:
        """`(total_steps, last_epoch)` of the run from `start`: its optimizer steps, and
        the epoch it ends in (None where the loader does not tell them). A run resumed
        with another batch size counts the steps left from an epoch's start."""
        length, done = self.train_for, start.counters
        if length is None:
            return (None if per_epoch is None else per_epoch * self.num_epochs), self.num_epochs
        before = start.epoch - 1
        if length.unit == "steps":
            left = max(0, length.value - done.steps)
            epochs = None if not per_epoch else before + max(1, math.ceil(left / per_epoch))
            return length.value, epochs
        if length.unit == "samples":
            per_step = planner.step_samples()
            reach = (
                None if per_step is None else steps_to_reach(length.value - done.samples, per_step)
            )
            if reach is not None:
                return done.steps + reach[0], before + max(1, reach[1])
        return None, None

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
                raise TrainingError(
                    f"Training stopped because another rank failed. {report}"
                ) from error
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
        run = self._prepare(train, valid)
        reason: Outcome | str = "failed"
        recording = self.options.memory_history
        if recording is not None:
            start_memory_history(recording)
        try:
            with signal_handlers(self.interrupter, self.options.preemption):
                if self.options.cadence is not None:
                    self.options.cadence.start()  # max_time counts from here
                processor = self._start(run, valid)
                self._hook("on_fit_start", run.resume.position.epoch)
                reason = self._epochs(processor, run.train, run.valid, run.resume)
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
                self._print_summary()
        except BaseException as error:
            if recording is not None and isinstance(error, torch.OutOfMemoryError):
                rank = self.dist.rank if self.dist is not None else 0
                memory_post_mortem(error, self.artifacts.memory_snapshot(rank))
            reason = self.outcome = self._failure(error)
            raise
        finally:
            if recording is not None:
                stop_memory_history()
            self._close(run.loggers, run.renderer, reason)
            run.app_log.uninstall()
        return self.model

    def _prepare(self, train: Iterable[Any], valid: Iterable[Any] | None) -> _Run:
        """Check the loaders, count the steps, load and restore the resumed state; only
        then prepare the directory, open the log and make the loggers."""
        dist = self.dist
        main = dist is None or dist.main
        self._output_checked = False
        check_not_empty(train, "training", "fit(train, ...)")
        if valid is not None:
            check_not_empty(valid, "validation", "fit(train) without validation data")
        resume = self.checkpoints.resume_point()
        shard = (dist.rank, dist.world) if dist is not None else None
        train_limit, valid_limit = self.options.limit_batches
        train_plan = BatchPlanner(train, self.grads_accumulation, shard, train_limit)
        train_plan.check_limit("training", "train")
        valid_plan = None
        if valid is not None:
            valid_plan = BatchPlanner(valid, 1, shard, valid_limit)
            valid_plan.check_limit("validation", "valid")
        self.counters = resume.position.counters
        notes = self._count_steps(train_plan, resume.position)
        self.optim.lr.check_monitor(
            {split: [entry.name for entry in entries] for split, entries in self.metrics.items()}
        )
        if dist is not None:  # the model as the processes share it, before it is restored
            self._ddp = parallelize(self.model, self.optimizer, dist, self.options.fsdp)
            if self.optim.micro_split is not None:  # grads_accumulation("auto")
                self._ranks = RankSplit(dist, self.model)
        notes += [*resume.notes, *self.checkpoints.restore(resume, self.model, self.optim, dist)]
        if main:
            overwrite = self.options.overwrite or resume.replace  # checkpoint("auto")
            self.artifacts.prepare(resume.position.kept_epochs(), overwrite)
        self._load_history(resume, main)
        app_log = FileApplicationLogger(self.artifacts.experiment_log)
        if self.options.application_log and main:
            app_log.install()
        if main and self._run_lock is not None and self._run_lock.takeover_message:
            notes.append(self._run_lock.takeover_message)
        complete = self._finished(resume.position)  # a finished run: nothing to show
        renderer = self.renderer if main and not complete else SilentRenderer()
        loggers = self._loggers(main)
        return _Run(main, resume, train_plan, valid_plan, notes, loggers, renderer, app_log)

    def _start(self, run: _Run, valid: Iterable[Any] | None) -> MetricsProcessor:
        """Log what was prepared, join the processes, tell the loggers and the renderer,
        check the validation step; return the run's metrics processor."""
        start, dist = run.resume.position, self.dist
        for note in run.notes:
            resumed = note.startswith(("Resumed from", "Resuming from", "checkpoint('auto')"))
            log.log(logging.INFO if resumed else logging.WARNING, "%s", note)
        processor = MetricsProcessor(
            self.metrics, run.loggers, run.renderer, self.num_epochs, gathers=dist is not None
        )
        if self.train_for is not None:
            processor.run_progress = self.progress_text
        if dist is not None:
            self._prepare_processes(dist, processor, run.train, run.valid)
        processes = dist.world if dist is not None else 1
        hparams, directory = self.options.hparams, str(self.artifact_dir)
        start_loggers(
            run.loggers,
            RunStart(start.epoch, start.iteration, not start.fresh, processes, hparams, directory),
        )
        info = run_info(self, start)
        log.info("%s", describe_run(self, info))
        summary = summarize_model(self.model, self.options.model_summary)
        info = replace(info, model_summary=summary)
        if run.main:
            record_start(self.artifacts, start.epoch, not start.fresh, hparams)
        self.run_history.describe_model(info.model_name, info.num_parameters)
        if self._finished(start) and self.train_for is not None:
            self.epoch = start.epoch - (0 if start.iteration else 1)
            log.warning(
                "The run is already complete: its checkpoint has %s and train_for is %s, so "
                "nothing is left to train and the trained model is returned as it is. Raise "
                "train_for to train further.",
                f"{start.counters.of(self.train_for.unit):,} {self.train_for.unit}",
                self.train_for,
            )
        elif self._finished(start):
            self.epoch = start.epoch - 1
            log.warning(
                "The run is already complete: its checkpoint is at the end of epoch %d and "
                "num_epochs is %d, so nothing is left to train and the trained model is "
                "returned as it is. Raise num_epochs to train further.",
                self.epoch,
                self.num_epochs,
            )
        elif valid is not None and self.metrics.get("valid"):
            check_validation(
                self.model,
                valid,
                processor,
                start.epoch,
                self.device,
                self.optim.autocast,
                evaluation(self._ddp),
            )
        run.renderer.start(info)
        self._emit(Start(start.epoch, self.num_epochs, str(self.artifact_dir)))
        return processor

    def _failure(self, error: BaseException) -> Outcome:
        """Log how the run ended on an exception; "interrupted" or "failed[: why]"."""
        where = f"epoch {self.epoch}, iteration {self.iteration}"
        outcome = Outcome.failed(error, isinstance(error, NonFiniteLoss))
        if isinstance(error, KeyboardInterrupt):
            log.error("Training interrupted (KeyboardInterrupt) at %s.", where)
            return outcome
        elsewhere = self.dist.caused_elsewhere(error) if self.dist is not None else None
        if elsewhere is not None:  # another rank failed: its record says why
            log.error("Training stopped at %s. %s", where, elsewhere)
        else:
            log.exception("Training failed at %s.", where)
        return outcome

    def _finished(self, start: Position) -> bool:
        """A run resumed at `start` has nothing left to train."""
        if self.train_for is None:
            return start.epoch > self.num_epochs
        return start.counters.reached(self.train_for)

    def _count_steps(self, train: BatchPlanner, start: Position) -> list[str]:
        """The run's optimizer steps, and the schedule that waits for them ("auto");
        returns a warning about the schedule's interval, if any. A run whose length is
        not in epochs shows the epoch it should end in as its `num_epochs`."""
        self.steps_per_epoch = train.steps_per_epoch()
        self.total_steps, last_epoch = self._run_steps(train, self.steps_per_epoch, start)
        if self.train_for is not None:
            self.num_epochs = max(start.epoch, last_epoch or start.epoch)
            if self.points is not None:
                self.points.num_epochs = self.num_epochs
        if self.optim.lr.pending is not None and self.total_steps is None:
            why = "the training loader has no length"
            if self.train_for is not None and self.train_for.unit == "samples":
                why = (
                    f"the run trains for {self.train_for}, and the training loader does not "
                    "tell its samples per step (a batch_size, and a dataset or sampler length)"
                )
            raise TrainingError(
                f"The learning-rate schedule counts the run's optimizer steps ('auto'), but {why}. "
                "Give the schedule its step count instead."
            )
        self.optim.lr.resolve(self.total_steps)
        warning = self.optim.lr.check_interval(self.steps_per_epoch)
        return [warning] if warning else []

    # The loop --------------------------------------------------------------------
    def _epochs(
        self,
        processor: MetricsProcessor,
        train: BatchPlanner,
        valid: BatchPlanner | None,
        resume: Resume,
    ) -> Outcome:
        """Every epoch left; returns how the run ended."""
        first = resume.position.epoch
        for epoch in itertools.count(first):
            if self._finished(Position(epoch, counters=self.counters)):
                break
            if epoch > self.num_epochs:  # a length in steps, samples or tokens runs on
                self.num_epochs = processor.num_epochs = epoch
                if self.points is not None:
                    self.points.num_epochs = epoch
            self.epoch = epoch
            self._emit(StartEpoch(epoch, self.num_epochs))
            self._hook("on_epoch_start", epoch)
            plan = train.epoch(epoch, resume.position)
            values = self._train_epoch(processor, plan, resume, valid)
            if values is None:  # stopped mid-epoch
                self._save_mid_epoch(processor, epoch)
                return self._early_stop or self._stop_reason()
            epoch_values = {"train": values}
            if valid is not None:
                epoch_values["valid"] = self._valid_epoch(processor, valid, epoch)
            reason = self._end_epoch(epoch, epoch_values)
            if self._ended:  # the run's length was reached: it completed, whatever else
                break
            if reason is not None:
                return reason
        return Outcome.completed()

    def _train_epoch(
        self,
        processor: MetricsProcessor,
        plan: EpochPlan,
        resume: Resume,
        valid: BatchPlanner | None = None,
    ) -> dict[str, float] | None:
        """Train one epoch (from where a resumed run stands); its epoch values, or
        None when a stop ended it early."""
        start, epoch, dist = plan.start, plan.start.epoch, self.dist
        self.model.train()
        self._start_split("train", epoch, start.iteration + 1)
        processor.start_split("train", epoch, plan.total, start.iteration + 1)
        if start.iteration:  # resumed mid-epoch: the epoch so far comes back
            if dist is None or dist.main:
                self._resume_logs(processor, start, resume.log_lines)
            processor.restore_epoch_states(resume.metric_states(dist), self.device)
        self.iteration, self.items, stop = start.iteration, start.items, False
        check = 0 if self._output_checked else start.iteration + 1  # once a fit
        with self._ranks.join() if self._ranks is not None else join(self._ddp):
            for step in plan:
                finite = self._train_step(processor, step, epoch, plan.total, check)
                self._step_optimizer(finite, epoch)
                before = self.counters
                voted = self._advance(step)
                if self._length_reached(step):
                    self._ended = stop = True
                    break
                if self._point_due(step, plan.total, valid, before) and self._valid_point(
                    processor, valid, epoch
                ):
                    stop = True  # early stopping, counting validation points
                    break
                cadence = self.options.cadence  # checkpoint_every, max_time
                last = self.iteration == plan.total
                save = bool(cadence) and cadence.after_step(
                    epoch, step.may_vote, last, dist, self.interrupter
                )
                every = self.options.checkpoint_every
                if every is not None and not last and (dist is None or step.may_vote):
                    save = crossed(every, before, self.counters) or save
                if save:
                    processor.flush(dist)
                    self._save_mid_epoch(processor, epoch)
                stop = self._stop_requested(step, voted)
                if stop:
                    break
                self.checkpoints.check()
        self.guard.flush()
        if dist is not None and self._uses_counts:
            self._sync_counters(dist)
        if self.train_for is not None and self.counters.reached(self.train_for):
            self._ended = True
        if self.iteration == start.iteration:
            raise TrainingError(
                f"The training data loader yielded no batch in epoch {epoch}. Check that its "
                "dataset is not empty and that drop_last with a batch size larger than the "
                "dataset does not drop every sample."
            )
        if self._ended and self.iteration != plan.total:  # the run's length ends it here
            processor.flush(dist)
            self._final_state = (processor.line_counts(), processor.epoch_states())
            log.info(
                "Training reached train_for (%s) at epoch %d, iteration %d: the epoch ends here.",
                self.train_for,
                epoch,
                self.iteration,
            )
        elif stop and self.iteration != plan.total:
            processor.flush(dist)  # the logs hold every finished iteration
            return None
        return self._end_split(processor, "train", epoch)

    def _save_mid_epoch(self, processor: MetricsProcessor, epoch: int) -> None:
        """Checkpoint inside `epoch`, with the metric log lines and epoch states so far."""
        position = Position(epoch, self.iteration, self.items, False, counters=self.counters)
        lines, states = processor.line_counts(), processor.epoch_states()
        self.checkpoints.save(position, self.model, self.optim, self.dist, lines, states)

    def _train_step(
        self, processor: MetricsProcessor, step: Step, epoch: int, total: int | None, check: int
    ) -> bool:
        """`_run_step`, or under `grads_accumulation("auto")` the step run again in
        micro-batches after an out-of-memory error (`train/oom.py`)."""
        if self.optim.micro_split is None:
            return self._run_step(processor, step, epoch, total, check)
        iteration, items, counting = self.iteration, self.items, not self.flops.done
        ranks, mark = self._ranks, processor.hold()

        def attempt(split: Step) -> bool:
            self.iteration, self.items = iteration, items  # a failed attempt counts nothing
            processor.undo(mark)  # nor do its metric values
            if counting:  # the FLOPs are counted on a batch that fits
                self.flops.done = False
            return self._run_step(processor, split, epoch, total, check, ranks)

        try:
            if ranks is not None:  # several processes: they agree on every attempt
                return run_split_ranks(self.optim, step, attempt, ranks)
            return run_split(self.optim, step, attempt)
        finally:
            processor.release()

    def _run_step(
        self,
        processor: MetricsProcessor,
        step: Step,
        epoch: int,
        total: int | None,
        check: int,
        ranks: RankSplit | None = None,
    ) -> bool:
        """Forward and backward every batch of one optimizer step; False when a loss
        was not finite. The batch numbered `check` has its output checked. The callbacks'
        `on_before_optimizer_step` comes before the metrics of the step's last batch
        (they may read it: `GradNormMetric`), the step after them (a non-finite loss the
        metrics find stops the run before its step is applied). With `ranks`
        (grads_accumulation("auto") on several processes) the model runs without DDP and
        the processes agree after the last batch (`RankSplit.settle`)."""
        optim, guard, ddp, manual = self.optim, self.guard, self._ddp, self._manual
        if ranks is not None:
            ddp = None  # gradients stay local until every process fitted
        forward = ddp if ddp is not None else self.model.train_step
        hooks = self.callbacks
        lr = optim.begin_group()
        last, finite = len(step.batches) - 1, True
        tokens: Any = 0  # the group's tokens, when its losses are means over tokens
        origins = step.origins
        self._step_tokens = 0
        for index, batch in enumerate(step.batches):
            iteration = step.first + (index if origins is None else origins[index])
            self.iteration = iteration
            self.items += step.items[index]
            told = getattr(batch, "num_tokens", None) if self._counts_tokens else None
            if self._move:
                batch = to_device(batch, self.device)
            if hooks is not None:
                hooks.ctx.epoch, hooks.ctx.iteration = epoch, iteration
            with no_sync(ddp, index < last), self.flops.count():
                if manual is not None:  # custom optimization: the step runs backward itself
                    manual.begin(epoch, iteration, index == 0, index == last, step.shares[index])
                    with optim.autocast():
                        output = call_step(self._manual_step, batch, "train_step", epoch, iteration)
                    ok = manual.ok
                    if iteration == check:
                        self._check_output(processor, output, epoch, manual=True)
                        self._check_metrics(processor, output, epoch)
                else:
                    with optim.autocast():
                        output = call_step(forward, batch, "train_step", epoch, iteration)
                    if iteration == check:
                        self._check_output(processor, output, epoch)
                    ok = guard.check(output.loss, epoch, iteration)
                    finite = ok and finite
                    if hooks is not None:
                        hooks.ctx.output = output
                    share: Any = step.shares[index]
                    if self._token_mean:
                        share = token_weight(output.item, iteration)
                        tokens = tokens + share
                    optim.backward(output.loss, share)
                    if iteration == check:
                        self._check_metrics(processor, output, epoch)
            if index == last and ranks is not None:
                verdict = ranks.settle(finite, tokens if self._token_mean else 0)
                if self._token_mean:
                    optim.rescale(verdict.tokens, world=ranks.dist.world)
            elif index == last and self._token_mean:
                optim.rescale(tokens, self.dist)  # by the group's tokens on every process
            if index == last and finite:
                optim.prepare()
            if self._counts_tokens:
                self._step_tokens = self._step_tokens + batch_tokens(told, output, iteration)
            if ok:  # a skipped non-finite batch stays out of the epoch's metrics
                processor.update(output.item, iteration, step.sizes[index], lr)
            if self.listeners:
                self._emit(ProcessedItem("train", epoch, iteration, total, output.item, lr))
        return finite

    def _manual_step(self, batch: Any) -> Any:
        return self.model.train_step(batch, self._manual)  # type: ignore[operator]

    def _check_output(
        self, processor: MetricsProcessor, output: Any, epoch: int, manual: bool = False
    ) -> None:
        """The first training output of the fit, before its backward: its type, its
        loss, how its loss is weighted."""
        self._output_checked = True
        check_train_output(self.model, output, manual)
        self._token_mean = loss_weight(output.item) is not None
        if self._token_mean and manual and self.options.grads_accumulation > 1:
            raise TrainingError(
                "loss_reduction='token_mean' weights each accumulated batch by its tokens "
                "when ember runs backward; a step that runs its own (ctx.backward) under "
                "grads_accumulation cannot be weighted by them. Accumulate without "
                "'token_mean' (each batch weighs its samples), or do not accumulate."
            )
        guard = self.guard
        if not manual and guard.policy == "stop":  # the loss metric's values stand guard
            guard.covered = processor.watch_loss(output.item, output.loss, guard.nonfinite)

    def _check_metrics(self, processor: MetricsProcessor, output: Any, epoch: int) -> None:
        """The first training output of the fit, once its backward freed the graph (its
        activations no longer take memory) and before the first optimizer step: what
        the metrics read, and whether the loss looks summed."""
        processor.check("train", output.item, epoch)
        hint = summed_loss_hint(output.item)
        if hint is not None:
            log.warning("%s", hint)

    def _step_optimizer(self, finite: bool, epoch: int) -> None:
        """Step, or skip the step of a group with a non-finite loss. Under "skip" with
        several processes they agree first (one all-reduce of a flag): a NaN on any rank
        skips the step on every rank, so the replicas stay equal."""
        elsewhere = False
        if self.dist is not None and self.guard.policy == "skip":
            if self._ranks is not None and self._ranks.verdict is not None:
                agreed = self._ranks.verdict.finite  # the attempt's agreement said it
            else:
                agreed = not self.dist.any(not finite)
            elsewhere, finite = finite and not agreed, agreed
        if finite:
            self.optim.step()
            return
        self.optim.skip()
        self.skipped_steps += 1
        where = " on another process" if elsewhere else ""
        message = (
            f"Skipped the optimizer step at epoch {epoch}, iteration {self.iteration}: "
            f"non-finite loss{where} (nonfinite_loss('skip'))."
        )
        log.warning("%s", message)
        print(f"ember: {message}", file=sys.stderr)

    def _stop_requested(self, step: Step, voted: bool | None = None) -> bool:
        """A graceful stop after this step; several processes stop at the same step,
        while every one of them still has batches. `voted`: the processes already
        agreed with the step's token count (`_advance`); a time limit reached since
        is agreed too."""
        if voted is not None:
            cadence = self.options.cadence
            return voted or (cadence is not None and cadence.expired)
        stop = self.interrupter.should_stop()
        if self.dist is not None:
            stop = self.dist.any(stop) if step.may_vote else False
        return stop

    def _advance(self, step: Step) -> bool | None:
        """Count the step done: one optimizer step, its samples (every process's, which
        the batch plan knows) and, when a duration is in tokens, its tokens: read on the
        host once per step, and under several processes summed over them in the one
        all-reduce that also takes the stop vote (returned; None when not voted here)."""
        done = self.counters
        tokens, voted = done.tokens, None
        if self._counts_tokens:
            self._tokens_pending = self._tokens_pending + self._step_tokens
            if self.dist is None:
                tokens += int(self._tokens_pending)
                self._tokens_pending = 0
            elif step.may_vote:
                total, voted = self.dist.sum_and_any(
                    self._tokens_pending, self.interrupter.should_stop()
                )
                tokens += total
                self._tokens_pending = 0
        self.counters = Counters(done.steps + 1, done.samples + sum(step.items), tokens)
        return voted

    def _sync_counters(self, dist: Distributed) -> None:
        """At an epoch's end, the processes agree on the counters: the last steps of an
        uneven epoch, which some processes did not have, counted once, and the tokens
        not yet summed."""
        rows = dist.all_gather(
            (self.counters.steps, self.counters.samples, int(self._tokens_pending))
        )
        self._tokens_pending = 0
        self.counters = Counters(
            max(row[0] for row in rows),
            max(row[1] for row in rows),
            self.counters.tokens + sum(row[2] for row in rows),
        )

    def _length_reached(self, step: Step) -> bool:
        """The run's length (`train_for`) is reached after this step (decided where
        every process has the step, so they end together)."""
        if self.train_for is None or (self.dist is not None and not step.may_vote):
            return False
        return self.counters.reached(self.train_for)

    def progress_text(self) -> str:
        """The run's progress in the unit of its length, e.g. "samples 1.2M/5M" (empty
        for a length in epochs)."""
        if self.train_for is None:
            return ""
        unit, target = self.train_for.unit, self.train_for.value
        return f"{unit} {short_count(self.counters.of(unit))}/{short_count(target)}"

    def _point_due(
        self, step: Step, total: int | None, valid: BatchPlanner | None, before: Counters
    ) -> bool:
        if valid is None or self.points is None:
            return False
        return self.points.due(step, total, before, self.counters)

    def _valid_point(
        self, processor: MetricsProcessor, planner: BatchPlanner | None, epoch: int
    ) -> bool:
        """Validate inside the epoch (`valid_every`); True when early stopping, which
        counts validation points, ends the run here."""
        assert self.points is not None and planner is not None
        main = self.dist is None or self.dist.main
        self._hook("on_validation_start", epoch)  # e.g. an EMA validating its weights
        try:
            self.points.run(
                self.model,
                planner,
                epoch,
                self.iteration,
                self.device,
                self.dist,
                main,
                processor.renderer,
                self._emit,
                evaluation(self._ddp),
                self.counters.state(),
            )
        finally:
            self._hook("on_validation_end", epoch)
        why = stop_at_point(self.options.early_stopping, self.run_history)
        if why is None:
            return False
        log.info("Early stopping at epoch %d, iteration %d: %s.", epoch, self.iteration, why)
        self._early_stop = Outcome.stopped_early(why)
        return True

    def _valid_epoch(
        self, processor: MetricsProcessor, planner: BatchPlanner, epoch: int
    ) -> dict[str, float]:
        """Validate (eval mode, inference mode); a graceful stop waits for its end."""
        plan = planner.epoch(epoch)
        self.model.eval()
        self._start_split("valid", epoch)
        processor.start_split("valid", epoch, plan.total)
        self._hook("on_validation_start", epoch)
        try:
            with evaluation(self._ddp)(), self.optim.autocast():
                for iteration, batch in enumerate(plan.batches(), start=1):
                    if self._move:
                        batch = to_device(batch, self.device)
                    item = call_step(self.model.valid_step, batch, "valid_step", epoch, iteration)
                    processor.update(item, iteration, batch_size(batch), None)
                    if self.listeners:
                        self._emit(ProcessedItem("valid", epoch, iteration, plan.total, item, None))
            return self._end_split(processor, "valid", epoch)
        finally:
            self._hook("on_validation_end", epoch)
            self.model.train()

    def _end_split(self, processor: MetricsProcessor, split: str, epoch: int) -> dict[str, float]:
        """The split's epoch values; rank 0 saves the epoch's count matrices (confusion
        matrices) next to the metric logs."""
        values = processor.end_split(self.dist)
        if self.dist is None or self.dist.main:
            for name, counts in processor.matrices.items():
                self.artifacts.write_matrix(split, epoch, name, counts)
        return values

    def _end_epoch(self, epoch: int, values: EpochValues) -> Outcome | None:
        """Decide (a stop, early stopping), then checkpoint, then tell the listeners;
        return a reason to stop."""
        for split, split_values in values.items():
            if split_values:
                text = ", ".join(f"{name} {value!r}" for name, value in split_values.items())
                log.info("Epoch %d %s: %s", epoch, split, text)
        self.run_history.add_epoch(epoch, values, self.counters.state())
        if self.train_for is not None:
            log.info("Progress after epoch %d: %s.", epoch, self.progress_text())
        self.optim.lr.end_epoch(values)  # an epoch-wise schedule steps before the checkpoint
        self._hook("on_epoch_end", epoch)  # callbacks decide before the checkpoint too
        reason = None
        stop = self.interrupter.should_stop()
        if self.dist is not None:
            stop = self.dist.any(stop)
        if stop:
            reason = self._stop_reason()
        elif self.options.early_stopping is not None:
            why = early_stop(self.options.early_stopping, self.run_history, self.points is not None)
            if why is not None:
                log.info("Early stopping after epoch %d: %s.", epoch, why)
                reason = Outcome.stopped_early(why)
        if reason is None and self.options.pruning is not None:
            reason = self._pruned(epoch)
        if self._final_state is not None:  # the run's length ended inside the epoch
            position = Position(epoch, self.iteration, self.items, False, counters=self.counters)
            lines, states = self._final_state
            self.checkpoints.save(position, self.model, self.optim, self.dist, lines, states)
        else:
            position = Position(epoch, self.iteration, self.items, True, counters=self.counters)
            self.checkpoints.save(position, self.model, self.optim, self.dist)
        self._emit(EndEpoch(epoch, values))
        return reason

    def _pruned(self, epoch: int) -> Outcome | None:
        """Ask the pruning strategy (on rank 0, which holds the trial) whether to prune."""
        pruning, dist = self.options.pruning, self.dist
        why = pruning.should_prune(self.history) if pruning and (not dist or dist.main) else None
        if dist is not None and dist.any(why is not None):
            why = why or "pruned on rank 0"
        if why is None:
            return None
        log.info("Pruned after epoch %d: %s.", epoch, why)
        return Outcome.pruned(why)

    def _start_split(self, split: str, epoch: int, first: int = 1) -> None:
        """Tell the model (`on_split_start`, if it has one) and the listeners. A split
        resumed in its middle (`first` > 1) does not start afresh: the model is not told,
        and keeps the state its checkpoint restored (`get_extra_state`)."""
        hook = getattr(self.model, "on_split_start", None)
        if callable(hook) and first == 1:
            hook(split)
        self._emit(StartSplit(split, epoch, first))

    def _stop_reason(self) -> Outcome:
        message = self.interrupter.message or "stop requested on another rank"
        if self.options.cadence is not None and self.options.cadence.expired:
            return Outcome.time_limit(self.options.cadence.limit_text)
        preemption, signum = self.options.preemption, self.interrupter.signal
        if preemption is not None and signum is not None and signum == preemption.signal:
            return Outcome.preempted(signum, preemption.name)
        return Outcome.stopped(message, signum)

    # Setting up ------------------------------------------------------------------
    def _load_history(self, resume: Resume, main: bool) -> None:
        """Rank 0 keeps the history in `history.jsonl`; a resumed run continues the
        saved one up to where it resumes (every process gets rank 0's copy)."""
        history = self.run_history
        if main:
            history.path = self.artifacts.history
        if resume.state is None:
            return
        if main:
            found = self.artifacts.saved_history if history.path is not None else None
            if found is not None:
                saved = RunHistory.load(found)
                history.epochs = saved.epochs
                history.checkpoints = saved.checkpoints
                history.points = saved.points
                history.counters = saved.counters
                history.point_counters = saved.point_counters
            else:  # a run from before the history file: the checkpoint carried it
                history.epochs = [
                    (int(e), v) for e, v in resume.state["learner"].get("history", [])
                ]
            if not self._finished(resume.position) or self.train_for is None:
                history.keep_before(resume.position.epoch, resume.position.iteration)
        if self.dist is not None:
            history.epochs = self.dist.broadcast(history.epochs)
            history.points = self.dist.broadcast(history.points)

    def _loggers(self, main: bool) -> dict[str, list[MetricLogger]]:
        """Rank 0 writes the metric files and feeds the extra loggers."""
        return {
            split: [FileMetricLogger(self.artifacts.split_dir(split)), *extra] if main else []
            for split, extra in self.options.loggers.items()
        }

    def _prepare_processes(
        self,
        dist: Distributed,
        processor: MetricsProcessor,
        train: BatchPlanner,
        valid: BatchPlanner | None,
    ) -> None:
        """Several processes: check that the loaders shard exactly (and evenly under
        FSDP), warn about metrics that see one process's data."""
        train.check_shardable("training")
        if valid is not None:
            valid.check_shardable("validation")
        processor.warn_unmerged_metrics()
        if self.options.fsdp is not None:
            train.check_even("training")
            if valid is not None:
                valid.check_even("validation")
        dist.barrier()  # rank 0 has prepared the artifact directory

    def _resume_logs(
        self, processor: MetricsProcessor, start: Position, counts: Mapping[str, int] | None
    ) -> None:
        """Resuming mid-epoch: keep the lines each training metric log had at the
        checkpoint (later lines came after it), put them back into the metric states,
        and drop that epoch's validation logs."""
        self.artifacts.drop_epoch("valid", start.epoch, points_through=start.iteration)
        rows = {
            entry.name: self.artifacts.truncate_metric_log(
                "train", start.epoch, entry.name, (counts or {}).get(entry.name, start.iteration)
            )
            for entry in self.metrics.get("train", ())
        }
        processor.resume(rows)

    # Ending ----------------------------------------------------------------------
    def _print_summary(self) -> None:
        from ember.train.summary import LearnerSummary

        summary = LearnerSummary.from_dir(self.artifact_dir)
        table = replace(summary, outcome=self.outcome).table()  # history.jsonl has it at the end
        print(table)
        log.info("%s", table)

    def _close(self, loggers: dict[str, list[MetricLogger]], renderer: Any, reason: str) -> None:
        """Release everything; an error here is logged, never allowed to hide the
        error that ended the run."""
        steps: list[tuple[str, Any]] = [
            ("the last checkpoint could not be written", self.checkpoints.wait)
        ]
        for split_loggers in loggers.values():
            for logger in split_loggers:
                steps.append((f"closing {type(logger).__name__} failed", logger.close))
        steps.append(("a listener failed at the end", lambda: self._emit(End(self.epoch, reason))))
        steps.append(("the renderer failed at the end", lambda: renderer.end(reason)))
        steps.append(("the run history could not be written", lambda: self._finish(reason)))
        for what, step in steps:
            try:
                step()
            except Exception as error:
                log.error("%s: %s", what, error)

    def _finish(self, reason: str) -> None:
        if self.run_history.path is not None:
            self.run_history.finish(reason)
            end_session(self.artifacts, reason)

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

    def _evaluator(self) -> Evaluator:
        """An evaluator of the model with the learner's settings. It has an interrupter
        of its own: a stop that ended `fit` (and sets `exit_code`) does not stop it."""
        metrics = self.metrics.get("valid") or self.metrics.get("train") or ()
        if self.options.fsdp is not None:
            raise TrainingError(
                "evaluate() and predict() need the whole model, and under FSDP each process "
                "held a shard of it until fit() ended. Load the trained weights into a plain "
                "model (model.load_state_dict(learner.model_state_dict()) on rank 0, or the "
                "last checkpoint with recorder.load(model, path)) and use an Evaluator."
            )
        return Evaluator(
            self.model,
            self.device,
            self.artifact_dir,
            metrics,
            self.renderer,
            summary=self.options.summary,
            interrupter=Interrupter(),
            autocast=self.optim.autocast,
        )

    def evaluate(self, name: str, loader: Iterable[Any]) -> dict[str, float]:
        """Evaluate the model (after `fit`: the trained one) on `loader` as
        `Evaluator.eval` does, on the learner's device, into its artifact directory
        (`test/<name>/`), with its validation metrics (the training ones when it has
        none); return `{metric: value}` over the whole set."""
        return self._evaluator().eval(name, loader)

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
        return self._evaluator().predict(loader)


def batch_tokens(told: Any, output: Any, iteration: int) -> int | torch.Tensor:
    """The tokens of a training batch, for a duration in tokens: the batch's
    `num_tokens` (an int), else its output's `tokens` (an int or a tensor)."""
    if isinstance(told, int) and not isinstance(told, bool):
        return told
    tokens = getattr(getattr(output, "item", output), "tokens", None)
    if tokens is None:
        raise TrainingError(
            f"A duration in tokens counts each batch's tokens, and the batch of iteration "
            f"{iteration} tells none: give the batch a num_tokens attribute (an int), or the "
            "training output tokens= (an int or a tensor)."
        )
    return tokens


def token_weight(item: Any, iteration: int) -> int | torch.Tensor:
    """The tokens of a batch of a run whose losses are means over tokens."""
    weight = loss_weight(item)
    if weight is None:
        raise TrainingError(
            f"The training output of iteration {iteration} has no loss_reduction='token_mean' "
            "while the run's first had it: give every batch's output "
            "loss_reduction='token_mean' and tokens=."
        )
    return weight
