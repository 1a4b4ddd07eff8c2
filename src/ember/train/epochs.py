"""The epochs of a fit: each epoch trains (`train_epoch`: every optimizer step of the
epoch's batch plan, then what a step may end in: a stop, a validation point, a
checkpoint), validates and ends (`epoch_end.py`). Each function works on the `Learner`
whose `fit` calls it."""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Mapping

from ember.errors import TrainingError
from ember.train import epoch_end, stepping
from ember.train.batches import BatchPlanner, EpochPlan, Step
from ember.train.checkpoint.policy import Resume
from ember.train.length.duration import crossed
from ember.train.events import StartEpoch
from ember.train.outcome import Outcome
from ember.train.parallel import join
from ember.train.length.position import Position
from ember.train.processor import MetricsProcessor

if TYPE_CHECKING:
    from ember.train.learner import Learner

log = logging.getLogger("ember.train.learner")  # the run's own log, as the loop's


def run_epochs(
    learner: Learner,
    processor: MetricsProcessor,
    train: BatchPlanner,
    valid: BatchPlanner | None,
    resume: Resume,
) -> Outcome:
    """Every epoch left; returns how the run ended."""
    first = resume.position.epoch
    for epoch in itertools.count(first):
        if learner.length.finished(Position(epoch, counters=learner.counters)):
            break
        if epoch > learner.num_epochs:  # a length in steps, samples or tokens runs on
            learner.num_epochs = processor.num_epochs = epoch
            if learner.points is not None:
                learner.points.num_epochs = epoch
        learner.epoch = epoch
        learner._emit(StartEpoch(epoch, learner.num_epochs))
        learner._hook("on_epoch_start", epoch)
        plan = train.epoch(epoch, resume.position)
        values = train_epoch(learner, processor, plan, resume, valid)
        if values is None:  # stopped mid-epoch
            save_mid_epoch(learner, processor, epoch)
            return learner._early_stop or epoch_end.stop_reason(learner)
        epoch_values = {"train": values}
        if valid is not None:
            epoch_values["valid"] = epoch_end.valid_epoch(learner, processor, valid, epoch)
        reason = epoch_end.end_epoch(learner, epoch, epoch_values)
        if learner.length.ended:  # the run's length was reached: it completed, whatever else
            break
        if reason is not None:
            return reason
    return Outcome.completed()


def train_epoch(
    learner: Learner,
    processor: MetricsProcessor,
    plan: EpochPlan,
    resume: Resume,
    valid: BatchPlanner | None = None,
) -> dict[str, float] | None:
    """Train one epoch (from where a resumed run stands); its epoch values, or
    None when a stop ended it early."""
    start, epoch, dist = plan.start, plan.start.epoch, learner.dist
    learner.model.train()
    epoch_end.start_split(learner, "train", epoch, start.iteration + 1)
    processor.start_split("train", epoch, plan.total, start.iteration + 1)
    if start.iteration:  # resumed mid-epoch: the epoch so far comes back
        if dist is None or dist.main:
            resume_logs(learner, processor, start, resume.log_lines)
        processor.restore_epoch_states(resume.metric_states(dist), learner.device)
    learner.iteration, learner.items, stop = start.iteration, start.items, False
    check = 0 if learner._output_checked else start.iteration + 1  # once a fit
    length, optim, interrupter = learner.length, learner.optim, learner.interrupter
    cadence, every = learner.options.cadence, learner.options.checkpoint_every  # mid-epoch saves
    points = learner.points if valid is not None else None
    steps_itself = dist is None or learner.guard.policy != "skip"  # no agreement on a skip
    plain = stepping.plain(learner, plan)  # then each step once the fit's first is done
    fast = plain and learner.flops.done and not learner._token_mean and check <= start.iteration
    with learner._ranks.join() if learner._ranks is not None else join(learner._ddp):
        for step in plan:
            if fast:
                finite = stepping.run_plain_step(learner, processor, step, epoch)
            else:
                if optim.micro_split is None:
                    finite = stepping.run_step(learner, processor, step, epoch, plan.total, check)
                else:
                    finite = stepping.train_step(learner, processor, step, epoch, plan.total, check)
                fast = (
                    plain and learner.flops.done and not learner._token_mean and step.first >= check
                )
            if finite and steps_itself:
                optim.step()
            else:
                stepping.step_optimizer(learner, finite, epoch)
            before = length.counters
            voted = length.advance(step, dist, interrupter.should_stop)
            if length.train_for is not None and length.reached_at(step, dist):
                length.ended = stop = True
                break
            if (
                points is not None
                and points.due(step, plan.total, before, length.counters)
                and epoch_end.valid_point(learner, processor, valid, epoch)
            ):
                stop = True  # early stopping, counting validation points
                break
            if cadence is not None or every is not None:  # checkpoint_every, max_time
                last = learner.iteration == plan.total
                save = cadence is not None and cadence.after_step(
                    epoch, step.may_vote, last, dist, interrupter
                )
                if every is not None and not last and (dist is None or step.may_vote):
                    save = crossed(every, before, length.counters) or save
                if save:
                    save_mid_epoch(learner, processor, epoch, flush=True)
            if voted is not None or dist is not None:
                stop = stop_requested(learner, step, voted)
            else:
                stop = interrupter.requested
            if stop:
                break
            if learner.checkpoints.checkpointer is not None:
                learner.checkpoints.check()  # a background write's failure
    learner.guard.flush()
    learner.length.end_epoch(dist)
    if learner.iteration == start.iteration:
        raise TrainingError(
            f"The training data loader yielded no batch in epoch {epoch}. Check that its "
            "dataset is not empty and that drop_last with a batch size larger than the "
            "dataset does not drop every sample."
        )
    if learner.length.ended and learner.iteration != plan.total:  # the run's length ends it here
        processor.flush(dist)
        learner._final_state = (processor.line_counts(), processor.epoch_states())
        log.info(
            "Training reached train_for (%s) at epoch %d, iteration %d: the epoch ends here.",
            learner.train_for,
            epoch,
            learner.iteration,
        )
    elif stop and learner.iteration != plan.total:
        processor.flush(dist)  # the logs hold every finished iteration
        return None
    return epoch_end.end_split(learner, processor, "train", epoch)


def save_mid_epoch(
    learner: Learner, processor: MetricsProcessor, epoch: int, flush: bool = False
) -> None:
    """Checkpoint inside `epoch`, with the metric log lines and epoch states so far
    (`flush`: write the lines of the values not yet written first). On one process
    the values start to the host before the snapshot, whose one wait brings them
    too; their lines are written before the checkpoint, which counts them."""
    position = Position(epoch, learner.iteration, learner.items, False, counters=learner.counters)
    before_write = None
    if flush and learner.dist is None:
        processor.launch()
        lines = processor.line_counts(coming=True)
        before_write = processor.flush
    else:
        if flush:
            processor.flush(learner.dist)  # every process's lines, counted on rank 0
        lines = processor.line_counts()
    states = processor.epoch_states()
    learner.checkpoints.save(
        position, learner.model, learner.optim, learner.dist, lines, states, before_write
    )


def stop_requested(learner: Learner, step: Step, voted: bool | None = None) -> bool:
    """A graceful stop after this step; several processes stop at the same step,
    while every one of them still has batches. `voted`: the processes already
    agreed with the step's token count (`RunLength.advance`); a time limit reached since
    is agreed too."""
    if voted is not None:
        cadence = learner.options.cadence
        return voted or (cadence is not None and cadence.expired)
    stop = learner.interrupter.should_stop()
    if learner.dist is not None:
        stop = learner.dist.any(stop) if step.may_vote else False
    return stop


def resume_logs(
    learner: Learner, processor: MetricsProcessor, start: Position, counts: Mapping[str, int] | None
) -> None:
    """Resuming mid-epoch: keep the lines each training metric log had at the
    checkpoint (later lines came after it), put them back into the metric states,
    and drop that epoch's validation logs."""
    learner.artifacts.drop_epoch("valid", start.epoch, points_through=start.iteration)
    rows = {
        entry.name: learner.artifacts.truncate_metric_log(
            "train", start.epoch, entry.name, (counts or {}).get(entry.name, start.iteration)
        )
        for entry in learner.metrics.get("train", ())
    }
    processor.resume(rows)
