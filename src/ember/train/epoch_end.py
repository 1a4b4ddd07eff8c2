"""The end of a split and of an epoch: validation (at the epoch's end, or inside it
under `valid_every`), the split's values and count matrices, then the decisions of
the epoch's end (a stop, early stopping, pruning), its checkpoint and its event.
Each function works on the `Learner` whose `fit` calls it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ember.data.device import to_device
from ember.train.batches import BatchPlanner, batch_size
from ember.train.events import EndEpoch, ProcessedItem, StartSplit
from ember.train.outcome import Outcome
from ember.train.parallel import evaluation
from ember.train.length.position import Position
from ember.train.processor import MetricsProcessor
from ember.train.step import call_step
from ember.train.validation import early_stop, stop_at_point

if TYPE_CHECKING:
    from ember.train.learner import EpochValues, Learner

log = logging.getLogger("ember.train.learner")  # the run's own log, as the loop's


def valid_point(
    learner: Learner, processor: MetricsProcessor, planner: BatchPlanner | None, epoch: int
) -> bool:
    """Validate inside the epoch (`valid_every`); True when early stopping, which
    counts validation points, ends the run here."""
    assert learner.points is not None and planner is not None
    main = learner.dist is None or learner.dist.main
    learner._hook("on_validation_start", epoch)  # e.g. an EMA validating its weights
    try:
        learner.points.run(
            learner.model,
            planner,
            epoch,
            learner.iteration,
            learner.device,
            learner.dist,
            main,
            processor.renderer,
            learner._emit,
            evaluation(learner._ddp),
            learner.counters.state(),
        )
    finally:
        learner._hook("on_validation_end", epoch)
    why = stop_at_point(learner.options.early_stopping, learner.run_history)
    if why is None:
        return False
    log.info("Early stopping at epoch %d, iteration %d: %s.", epoch, learner.iteration, why)
    learner._early_stop = Outcome.stopped_early(why)
    return True


def valid_epoch(
    learner: Learner, processor: MetricsProcessor, planner: BatchPlanner, epoch: int
) -> dict[str, float]:
    """Validate (eval mode, inference mode); a graceful stop waits for its end."""
    plan = planner.epoch(epoch)
    learner.model.eval()
    start_split(learner, "valid", epoch)
    processor.start_split("valid", epoch, plan.total)
    learner._hook("on_validation_start", epoch)
    try:
        with evaluation(learner._ddp)(), learner.optim.autocast():
            for iteration, batch in enumerate(plan.batches(), start=1):
                if learner._move:
                    batch = to_device(batch, learner.device)
                item = call_step(learner.model.valid_step, batch, "valid_step", epoch, iteration)
                processor.update(item, iteration, batch_size(batch), None)
                if learner.listeners:
                    learner._emit(ProcessedItem("valid", epoch, iteration, plan.total, item, None))
        return end_split(learner, processor, "valid", epoch)
    finally:
        learner._hook("on_validation_end", epoch)
        learner.model.train()


def end_split(
    learner: Learner, processor: MetricsProcessor, split: str, epoch: int
) -> dict[str, float]:
    """The split's epoch values; rank 0 saves the epoch's count matrices (confusion
    matrices) next to the metric logs."""
    values = processor.end_split(learner.dist)
    if learner.dist is None or learner.dist.main:
        for name, counts in processor.matrices.items():
            learner.artifacts.write_matrix(split, epoch, name, counts)
    return values


def end_epoch(learner: Learner, epoch: int, values: EpochValues) -> Outcome | None:
    """Decide (a stop, early stopping), then checkpoint, then tell the listeners;
    return a reason to stop."""
    for split, split_values in values.items():
        if split_values:
            text = ", ".join(f"{name} {value!r}" for name, value in split_values.items())
            log.info("Epoch %d %s: %s", epoch, split, text)
    learner.run_history.add_epoch(epoch, values, learner.counters.state())
    if learner.train_for is not None:
        log.info("Progress after epoch %d: %s.", epoch, learner.progress_text())
    learner.optim.lr.end_epoch(values)  # an epoch-wise schedule steps before the checkpoint
    learner._hook("on_epoch_end", epoch)  # callbacks decide before the checkpoint too
    reason = None
    stop = learner.interrupter.should_stop()
    if learner.dist is not None:
        stop = learner.dist.any(stop)
    if stop:
        reason = stop_reason(learner)
    elif learner.options.early_stopping is not None:
        why = early_stop(
            learner.options.early_stopping, learner.run_history, learner.points is not None
        )
        if why is not None:
            log.info("Early stopping after epoch %d: %s.", epoch, why)
            reason = Outcome.stopped_early(why)
    if reason is None and learner.options.pruning is not None:
        reason = pruned(learner, epoch)
    if learner._final_state is not None:  # the run's length ended inside the epoch
        position = Position(
            epoch, learner.iteration, learner.items, False, counters=learner.counters
        )
        lines, states = learner._final_state
        learner.checkpoints.save(
            position, learner.model, learner.optim, learner.dist, lines, states
        )
    else:
        position = Position(
            epoch, learner.iteration, learner.items, True, counters=learner.counters
        )
        learner.checkpoints.save(position, learner.model, learner.optim, learner.dist)
    learner._emit(EndEpoch(epoch, values))
    return reason


def pruned(learner: Learner, epoch: int) -> Outcome | None:
    """Ask the pruning strategy (on rank 0, which holds the trial) whether to prune."""
    pruning, dist = learner.options.pruning, learner.dist
    why = pruning.should_prune(learner.history) if pruning and (not dist or dist.main) else None
    if dist is not None and dist.any(why is not None):
        why = why or "pruned on rank 0"
    if why is None:
        return None
    log.info("Pruned after epoch %d: %s.", epoch, why)
    return Outcome.pruned(why)


def stop_reason(learner: Learner) -> Outcome:
    message = learner.interrupter.message or "stop requested on another rank"
    if learner.options.cadence is not None and learner.options.cadence.expired:
        return Outcome.time_limit(learner.options.cadence.limit_text)
    preemption, signum = learner.options.preemption, learner.interrupter.signal
    if preemption is not None and signum is not None and signum == preemption.signal:
        return Outcome.preempted(signum, preemption.name)
    return Outcome.stopped(message, signum)


def start_split(learner: Learner, split: str, epoch: int, first: int = 1) -> None:
    """Tell the model (`on_split_start`, if it has one) and the listeners. A split
    resumed in its middle (`first` > 1) does not start afresh: the model is not told,
    and keeps the state its checkpoint restored (`get_extra_state`)."""
    hook = getattr(learner.model, "on_split_start", None)
    if callable(hook) and first == 1:
        hook(split)
    learner._emit(StartSplit(split, epoch, first))
