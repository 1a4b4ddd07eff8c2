"""`Learner`: a configured run, and `Learner.fit`, the training loop from the top.

fit = the run lock + the process group + `fit/prepare.py` (the fit's parts and state)
+ `fit/loop.py` (the epochs: each train epoch takes every optimizer step of the
epoch's batch plan with `fit/stepper.py`, then validates and ends in
`fit/epoch_end.py`) + `fit/finish.py` (close). The learner keeps what lasts across
its verbs (`Lasting`) and the fit's state (`FitState`), which it shows through
read-only properties; after `fit`: `evaluate`, `predict`, `lr_find`, `smoke_test`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Iterable

import torch

from ember.errors import TrainingError
from ember.train.distributed import Distributed, setup, world_size
from ember.train.evaluator import learner_evaluator
from ember.train.files.lock import RunLock
from ember.train.fit.finish import after_training, close, failure, out_of_memory
from ember.train.fit.loop import TrainLoop
from ember.train.fit.notices import ConsoleNotices
from ember.train.fit.parts import Lasting
from ember.train.fit.prepare import prepare, start
from ember.train.fit.state import FitState
from ember.train.heap import frozen_heap
from ember.train.length.batches import BatchPlanner
from ember.train.length.duration import Counters, Duration
from ember.train.length.position import Position
from ember.train.length.signals import signal_handlers
from ember.train.lr_finder import LrFinderResult, lr_find
from ember.train.memory import start_memory_history, stop_memory_history
from ember.train.options import LearnerOptions
from ember.train.outcome import Outcome
from ember.train.parallel.dealt import hold, release
from ember.train.smoke import SmokeReport, smoke_test
from ember.train.step import check_steps

if TYPE_CHECKING:
    from ember.train.memory_estimate import MemoryEstimate

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
        self.metrics = options.metrics
        self.renderer = options.renderer
        self.interrupter = options.interrupter
        self.kit = Lasting.of(options)
        """What lasts across `fit` and the verbs after it."""
        self.guard = self.kit.guard
        self._state = FitState(options.num_epochs, self.kit.length)
        self._outcome: Outcome | None = None
        self._whole: dict[str, Any] | None = None
        self._group: Distributed | None = None
        """The processes an FSDP fit kept together after it (`hold`)."""
        self._fitted = False

    # What a fit shows -------------------------------------------------------------
    @property
    def outcome(self) -> Outcome | None:
        """After `fit`: "completed", "stopped: <why>", "stopped early: <why>" or "pruned:
        <why>" (`LearnerBuilder.pruning`); "failed" ("failed: the loss is NaN ...") or
        "interrupted" (a second Ctrl-C) when `fit` raised. An `Outcome`: the text, with
        its `reason` (a `StopReason`) and, after early stopping, `early_stop` (the rule
        that fired and its values)."""
        return self._outcome

    @property
    def exit_code(self) -> int:
        """The status a training script should exit with after `fit`: 0 when the run
        completed, stopped early or was stopped by a request (the dashboard, code);
        128 + the signal number when a signal stopped it (143 for SIGTERM, 130 for
        Ctrl-C), so a job scheduler sees a preemption; 1 when it failed."""
        return 1 if self._outcome is None else self._outcome.exit_code

    @property
    def epoch(self) -> int:
        """The epoch the run is in (after `fit`: its last)."""
        return self._state.epoch

    @property
    def iteration(self) -> int:
        """The batches done in the current epoch."""
        return self._state.iteration

    @property
    def num_epochs(self) -> int:
        """The run's epochs (for a length in steps, samples or tokens: the epoch it
        should end in, set when `fit` starts)."""
        return self._state.num_epochs

    @property
    def steps_per_epoch(self) -> int | None:
        """Optimizer steps per epoch (every process, gradient accumulation counted), set
        when `fit` starts; `steps(train)` tells it before."""
        return self._state.steps_per_epoch

    @property
    def total_steps(self) -> int | None:
        """Optimizer steps of the whole run (`steps_per_epoch * num_epochs`)."""
        return self._state.total_steps

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped for a non-finite loss in this run (`nonfinite_loss("skip")`)."""
        return self._state.skipped_steps

    @property
    def train_for(self) -> Duration | None:
        """The run's length in steps, samples or tokens (None: `num_epochs` epochs)."""
        return self.kit.length.train_for

    @property
    def counters(self) -> Counters:
        """The optimizer steps, samples and tokens (every process's) of the run so far."""
        return self.kit.length.counters

    @property
    def history(self) -> list[tuple[int, EpochValues]]:
        """Every completed epoch as `(epoch, {split: {metric: epoch value}})`."""
        return self.kit.history.entries()

    def progress_text(self) -> str:
        """The run's progress in the unit of its length, e.g. "samples 1.2M/5M" (empty
        for a length in epochs)."""
        return self.kit.length.progress_text()

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
        planner = BatchPlanner(train, self.options.grads_accumulation, shard, limit)
        per_epoch = planner.steps_per_epoch()
        return per_epoch, self.kit.length.steps(planner, per_epoch, Position(1, fresh=True))[0]

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
        kit = self.kit
        if valid is not None:
            check_steps(self.model, ("valid_step",))
        elif kit.points is not None:
            raise TrainingError(
                f"valid_every({kit.points.every}) validates inside each epoch on the validation "
                "data, but fit() got none: pass it as fit(train, valid), or leave valid_every out."
            )
        if restore_best:
            kit.checkpoints.check_restore_best(self.metrics)
        release()  # the group an earlier FSDP fit kept for its evaluations
        dist = setup(self.devices, self.options.distributed_timeout)
        lock = RunLock(kit.artifacts.lock) if dist is None or dist.main else None
        failed = True
        try:
            if lock is not None:
                kit.artifacts.check_writable()
                lock.acquire()
            with frozen_heap(self.device):  # no full pass of the collector over torch
                model = self._run(train, valid, restore_best, dist, lock)
            failed = False
            return model
        except BaseException as error:
            waits = isinstance(error, Exception) and dist is not None and bool(dist.children)
            report = dist.failures(wait=5.0 if waits else 0.0) if dist is not None else ""
            if report:
                assert dist is not None
                stopped = TrainingError(f"Training stopped because another rank failed. {report}")
                dist.tell_on_sigterm(stopped)
                raise stopped from error
            raise
        finally:
            if lock is not None:
                lock.release()
            if dist is not None and (failed or self.options.fsdp is None):
                dist.close(failed)
            elif dist is not None:  # the model stays sharded over it: evaluate and predict
                hold(dist)
                self._group = dist

    def _run(
        self,
        train: Iterable[Any],
        valid: Iterable[Any] | None,
        restore_best: bool,
        dist: Distributed | None,
        lock: RunLock | None,
    ) -> torch.nn.Module:
        """Prepare (nothing on disk changes before the resumed state loads), start,
        train every epoch, end; the loggers, the renderer and the log always close."""
        state, options = self._state, self.options
        parts, notes = prepare(self.kit, state, train, valid, dist, lock)
        notices = ConsoleNotices(parts.renderer).install() if parts.main else None
        reason: Outcome | str = "failed"
        recording = options.memory_history
        if recording is not None:
            start_memory_history(recording)
        with signal_handlers(options.interrupter, options.preemption) as signals:
            try:
                if options.cadence is not None:
                    options.cadence.start()  # max_time counts from here
                start(parts, state, notes, valid)
                if notices is not None:
                    notices.ready()
                parts.events.hook("on_fit_start", parts.resume.position.epoch)
                reason = TrainLoop(parts, state).run()
                signals.closing()  # the training ended: a Ctrl-C no longer cuts the run short
                parts.events.hook("on_fit_end", state.epoch)
                parts.checkpoints.finish()  # the last checkpoint is on disk, or the run failed
                self._outcome = reason
                self._whole = after_training(parts, state, reason, restore_best)
            except BaseException as error:
                if isinstance(error, torch.OutOfMemoryError):
                    out_of_memory(error, parts, state, recording is not None)
                reason = self._outcome = failure(state, dist, error)
                raise
            finally:
                signals.closing()
                if recording is not None:
                    stop_memory_history()
                if notices is not None:
                    notices.ready()  # before the renderer's last line
                close(parts, state, reason)
                if notices is not None:
                    notices.uninstall()
                parts.app_log.uninstall()
        return self.model

    def memory_estimate(
        self, batch: Any, *, split: int | None = None, device: Any = None
    ) -> MemoryEstimate:
        """The peak memory of one training step on `batch`, by category, from the step
        run on fake tensors (nothing allocated; `split`: micro-batches per batch; on the
        run's device, or `device`); a `MemoryEstimateError` names why a step cannot run
        so (data-dependent shapes, custom kernels). See `memory_estimate.fits`."""
        from ember.train.memory_estimate.fits import learner_estimate

        return learner_estimate(self.options, batch, split, device)

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
        none); returns `{metric: value}` over the whole set. After an FSDP fit, every
        process calls it: each evaluates its share of the batches with the sharded
        model, and every process gets the values."""
        return learner_evaluator(self.options, self._group).eval(name, loader)

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
        return smoke_test(self.options, type(self), train, valid, batches=batches, echo=echo)

    def predict(self, loader: Iterable[Any]) -> Any:
        """The model's outputs over `loader`, on the CPU, concatenated along the first
        dimension, as `Evaluator.predict` returns them. After an FSDP fit, every process
        calls it and gets every output, in the loader's order."""
        return learner_evaluator(self.options, self._group).predict(loader)
