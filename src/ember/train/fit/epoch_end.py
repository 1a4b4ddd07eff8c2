"""The end of a split and of an epoch: validation (at the epoch's end, or inside it
under `valid_every`), the split's values and count matrices, then the decisions of
the epoch's end (a stop, early stopping, pruning), its checkpoint and its event."""

from __future__ import annotations

import logging

from ember.train.events import EndEpoch, ProcessedItem, StartSplit
from ember.train.fit.evaluation import evaluating, run_pass
from ember.train.fit.parts import FitParts
from ember.train.fit.points import early_stop, stop_at_point
from ember.train.fit.state import EndedInside, FitState
from ember.train.length.stop_vote import agree_stop
from ember.train.outcome import Outcome
from ember.train.parallel import evaluation

log = logging.getLogger("ember.train.learner")  # the run's own log, as the loop's
EpochValues = dict[str, dict[str, float]]


def valid_point(parts: FitParts, state: FitState) -> bool:
    """Validate inside the epoch (`valid_every`); True when early stopping, which
    counts validation points, ends the run here."""
    points, valid, epoch, events = parts.points, parts.valid, state.epoch, parts.events
    assert points is not None and valid is not None
    events.hook("on_validation_start", epoch)  # e.g. an EMA validating its weights
    try:
        values = points.run(
            parts.model,
            valid,
            epoch,
            state.num_epochs,
            state.iteration,
            parts.device,
            parts.dist,
            parts.processor.renderer,
            events.emit,
            evaluation(parts.wrapped),
            state.counters.state(),
        )
        events.values({"valid": values})
    finally:
        events.hook("on_validation_end", epoch)
    why = stop_at_point(parts.options.early_stopping, parts.history)
    if why is None:
        return False
    log.info("Early stopping at epoch %d, iteration %d: %s.", epoch, state.iteration, why)
    state.ending = Outcome.stopped_early(why)
    return True


def valid_epoch(parts: FitParts, state: FitState) -> dict[str, float]:
    """Validate (eval mode, inference mode); a graceful stop waits for its end."""
    assert parts.valid is not None
    epoch, processor, events, model = state.epoch, parts.processor, parts.events, parts.model
    plan = parts.valid.epoch(epoch)
    model.eval()
    start_split(parts, "valid", epoch)
    processor.start_split("valid", epoch, plan.total, num_epochs=state.num_epochs)
    events.hook("on_validation_start", epoch)

    def told(iteration: int, item: object) -> None:
        events.emit(ProcessedItem("valid", epoch, iteration, plan.total, item, None))

    try:
        with evaluating(model, evaluation(parts.wrapped), parts.optim.autocast, after=True):
            each = told if events.any_listener else None
            run_pass(
                model.valid_step,  # type: ignore[arg-type]
                "valid_step",
                plan.batches(),
                processor,
                "valid",
                epoch,
                parts.device,
                each=each,
                count=plan.count,
            )
        values = end_split(parts, "valid", epoch)
        events.values({"valid": values})
        return values
    finally:
        events.hook("on_validation_end", epoch)
        model.train()


def start_split(parts: FitParts, split: str, epoch: int, first: int = 1) -> None:
    """Tell the model (`on_split_start`, if it has one) and the listeners. A split
    resumed in its middle (`first` > 1) does not start afresh: the model is not told,
    and keeps the state its checkpoint restored (`get_extra_state`)."""
    hook = getattr(parts.model, "on_split_start", None)
    if callable(hook) and first == 1:
        hook(split)
    parts.events.emit(StartSplit(split, epoch, first))


def end_split(parts: FitParts, split: str, epoch: int) -> dict[str, float]:
    """The split's epoch values; rank 0 saves the epoch's count matrices (confusion
    matrices) next to the metric logs."""
    processor = parts.processor
    values = processor.end_split(parts.dist)
    if parts.main:
        for name, counts in processor.matrices.items():
            parts.artifacts.write_matrix(split, epoch, name, counts)
    return values


def end_epoch(parts: FitParts, state: FitState, values: EpochValues) -> Outcome | None:
    """Decide (a stop, early stopping), then checkpoint, then tell the listeners;
    return a reason to stop."""
    epoch, options, dist = state.epoch, parts.options, parts.dist
    for split, split_values in values.items():
        if split_values:
            text = ", ".join(f"{name} {value!r}" for name, value in split_values.items())
            log.info("Epoch %d %s: %s", epoch, split, text)
    parts.history.add_epoch(epoch, values, state.counters.state())
    state.ended_epoch = epoch
    if parts.length.train_for is not None:
        log.info("Progress after epoch %d: %s.", epoch, parts.length.progress_text())
    parts.optim.lr.end_epoch(values)  # an epoch-wise schedule steps before the checkpoint
    parts.events.values(values)  # what on_epoch_end decides on
    parts.events.hook("on_epoch_end", epoch)  # callbacks decide before the checkpoint too
    reason = None
    stop = parts.options.interrupter.should_stop()
    if dist is not None:  # collective: every process decides alike, for the same reason
        stop, _, _ = agree_stop(dist, parts.options.interrupter, options.preemption)
    if stop:
        reason = stop_reason(parts)
    elif options.early_stopping is not None:
        why = early_stop(options.early_stopping, parts.history, parts.points is not None)
        if why is not None:
            log.info("Early stopping after epoch %d: %s.", epoch, why)
            reason = Outcome.stopped_early(why)
    if reason is None and options.pruning is not None:
        reason = pruned(parts, epoch)
    ending = state.ending
    if isinstance(ending, EndedInside):  # the run's length ended inside the epoch
        parts.checkpoints.save(
            state.position(False), parts.model, parts.optim, dist, ending.lines, ending.states
        )
    else:
        parts.checkpoints.save(state.position(True), parts.model, parts.optim, dist)
    parts.events.end_epoch(EndEpoch(epoch, values), getattr(parts.optim.lr, "scheduler", None))
    return reason


def pruned(parts: FitParts, epoch: int) -> Outcome | None:
    """Ask the pruning strategy (on rank 0, which holds the trial) whether to prune."""
    pruning, dist = parts.options.pruning, parts.dist
    why = pruning.should_prune(parts.history.entries()) if pruning and parts.main else None
    if dist is not None and dist.any(why is not None):  # collective
        why = why or "pruned on rank 0"
    if why is None:
        return None
    log.info("Pruned after epoch %d: %s.", epoch, why)
    return Outcome.pruned(why)


def stop_reason(parts: FitParts) -> Outcome:
    """How a requested stop ended the run: the time limit, a preemption signal, or a
    stop (a signal, the dashboard, code, another rank)."""
    interrupter, options = parts.options.interrupter, parts.options
    message = interrupter.message or "stop requested on another rank"
    if options.cadence is not None and options.cadence.expired:
        return Outcome.time_limit(options.cadence.limit_text)
    preemption, signum = options.preemption, interrupter.signal
    if preemption is not None and signum is not None and signum == preemption.signal:
        return Outcome.preempted(signum, preemption.name)
    return Outcome.stopped(message, signum)
