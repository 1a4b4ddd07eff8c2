"""The epochs of a fit (`TrainLoop`): each epoch trains every optimizer step of its
batch plan, then validates and ends (`epoch_end.py`). Read top to bottom: `run` is the
epochs, `train_split` one epoch's steps, `after_step` the decisions after each."""

from __future__ import annotations

import contextlib
import itertools
import logging
from typing import Any, Callable, Mapping

from ember.errors import TrainingError
from ember.train.events import StartEpoch
from ember.train.fit import epoch_end
from ember.train.fit.parts import FitParts
from ember.train.fit.state import EndedInside, FitState
from ember.train.fit.steady import steady_steps
from ember.train.fit.stepper import Stepper
from ember.train.length.duration import crossed
from ember.train.length.epoch_plan import EpochPlan, Step
from ember.train.length.position import Position
from ember.train.length.stop_vote import StopVote, agree_stop
from ember.train.outcome import Outcome
from ember.train.parallel import join

log = logging.getLogger("ember.train.learner")  # the run's own log, as the loop's


class TrainLoop:
    """Runs the epochs of one fit with its parts, keeping its state."""

    def __init__(self, parts: FitParts, state: FitState) -> None:
        self.parts, self.state = parts, state
        self.stepper = Stepper(parts, state)
        self.vote = StopVote()
        self.uneven = False
        """The processes end the current epoch after different numbers of batches."""
        """When several processes agree on a stop."""
        self.saved_at: tuple[int, int] | None = None
        """The epoch and iteration of the last checkpoint taken inside an epoch."""
        options, length = parts.options, parts.length
        self.quiet = (
            parts.dist is None
            and length.train_for is None
            and not length.counts_tokens
            and (parts.valid is None or parts.points is None)
            and options.cadence is None
            and options.checkpoint_every is None
        )
        """Nothing is decided after a step but a stop request (`after_step`)."""

    def run(self) -> Outcome:
        """Every epoch left; returns how the run ended."""
        parts, state, events = self.parts, self.state, self.parts.events
        start = parts.resume.position
        for epoch in itertools.count(start.epoch):
            if parts.length.finished(Position(epoch, counters=state.counters)):
                break
            if epoch > state.num_epochs:  # a length in steps, samples or tokens runs on
                state.num_epochs = epoch
                events.epochs(epoch)
            state.epoch = epoch
            events.emit(StartEpoch(epoch, state.num_epochs))
            events.hook("on_epoch_start", epoch)
            values = self.train_split(parts.train.epoch(epoch, start))
            if values is None:  # stopped mid-epoch
                self.save_mid_epoch()
                ending = state.ending
                return ending if isinstance(ending, Outcome) else epoch_end.stop_reason(parts)
            epoch_values = {"train": values}
            if parts.valid is not None:
                epoch_values["valid"] = epoch_end.valid_epoch(parts, state)
            reason = epoch_end.end_epoch(parts, state, epoch_values)
            if parts.length.ended:  # the run's length was reached: it completed, whatever else
                break
            if reason is not None:
                return reason
        return Outcome.completed()

    def train_split(self, plan: EpochPlan) -> dict[str, float] | None:
        """Train one epoch (from where a resumed run stands): for each step of the plan,
        run it, apply it, then the decisions after it. Its epoch values, or None when a
        stop ended it early."""
        parts, state, stepper = self.parts, self.state, self.stepper
        start, epoch, dist, processor = plan.start, plan.start.epoch, parts.dist, parts.processor
        parts.model.train()
        epoch_end.start_split(parts, "train", epoch, start.iteration + 1)
        processor.start_split(
            "train", epoch, plan.total, start.iteration + 1, state.num_epochs, start.items
        )
        if start.iteration:  # resumed mid-epoch: the epoch so far comes back
            if parts.main:
                self.resume_logs(start, parts.resume.log_lines)
            processor.restore_epoch_states(parts.resume.metric_states(dist), parts.device)
        state.iteration, state.items, stop = start.iteration, start.items, False
        self.vote.start_epoch()
        stepper.start_epoch(start.iteration, plan.total)
        ranks, batches = parts.ranks, plan.batches()
        steps = plan.steps(batches)
        steady = self.quiet and plan.single and stepper.plain
        # DDP keeps answering the others' reductions only where a process runs out of
        # batches before them (each forward then takes a collective of its own)
        self.uneven = plan.uneven
        joined = join(parts.wrapped) if plan.uneven else contextlib.nullcontext()
        with ranks.join() if ranks is not None else joined:  # collective at exit
            while not stop:
                if steady and stepper.run == stepper.plain_step:  # the rest in one loop
                    stop = steady_steps(parts, state, batches, stepper.apply, plan.count)
                    break
                step = next(steps, None)
                if step is None:
                    break
                stepper.apply(stepper.run(step))
                stop = self.after_step(step, plan.total)
        parts.guard.flush()
        parts.length.end_epoch(dist)  # collective: the epoch's counters on every process
        if state.iteration == start.iteration:
            raise TrainingError(
                f"The training data loader yielded no batch in epoch {epoch}. Check that its "
                "dataset is not empty and that drop_last with a batch size larger than the "
                "dataset does not drop every sample."
            )
        if parts.length.ended and state.iteration != plan.total:  # the length ends it here
            processor.flush(dist)
            state.ending = EndedInside(processor.line_counts(), processor.epoch_states())
            log.info(
                "Training reached train_for (%s) at epoch %d, iteration %d: the epoch ends here.",
                parts.length.train_for,
                epoch,
                state.iteration,
            )
        elif stop and state.iteration != plan.total:
            processor.flush(dist)  # the logs hold every finished iteration
            return None
        return epoch_end.end_split(parts, "train", epoch)

    def after_step(self, step: Step, total: int | None) -> bool:
        """The decisions after a step, in order: the run's length reached, a validation
        point, a checkpoint due, a stop requested, a background checkpoint's failure.
        True when the epoch's steps end here."""
        parts, state, dist = self.parts, self.state, self.parts.dist
        length, interrupter = parts.length, parts.options.interrupter
        if self.quiet:  # one process, no length, validation point or checkpoint cadence
            length.count(step)
            if interrupter.requested:
                return True
            if parts.checkpoints.checkpointer is not None:
                parts.checkpoints.check()  # a background write's failure
            return False
        before = length.counters
        voted = length.advance(step, dist, interrupter.should_stop)  # collective for tokens
        if length.train_for is not None and length.reached_at(step, dist):  # collective
            length.ended = True
            return True
        points = parts.points if parts.valid is not None else None
        if (
            points is not None
            and points.due(step, total, before, length.counters)
            and epoch_end.valid_point(parts, state)  # collective: the point's values
        ):
            return True  # early stopping, counting validation points
        cadence, every = parts.options.cadence, parts.options.checkpoint_every
        # the epoch's last step, alike on every process (uneven shards end apart)
        last = state.iteration == total and (dist is None or not self.uneven)
        on_vote = dist is not None and voted is None  # rank 0's clock rides on the vote
        save = False
        if cadence is not None or every is not None:  # checkpoint_every, max_time
            save = cadence is not None and cadence.after_step(
                state.epoch, step.may_vote, last, dist, interrupter, on_vote
            )  # collective only when the steps are voted on one by one (tokens)
            if every is not None and not last and (dist is None or step.may_vote):
                save = crossed(every, before, length.counters) or save
        timed = on_vote and cadence is not None and cadence.timed
        if save and not timed:
            self.save_mid_epoch(flush=True)
        if voted is not None or dist is not None:
            main = dist is None or dist.main
            flags = (lambda: cadence.clock_flags(main)) if timed else None  # type: ignore[union-attr]
            stop = self.stop_requested(step, voted, flags)  # collective at the votes
            if timed and step.may_vote and self.vote.agreed is not None:
                save = cadence.agreed(self.vote.agreed, last, interrupter) or save  # type: ignore[union-attr]
                stop = stop or cadence.expired  # type: ignore[union-attr]
            if save and timed:
                self.save_mid_epoch(flush=True)
        else:
            stop = interrupter.requested
        if stop:
            return True
        if parts.checkpoints.checkpointer is not None:
            parts.checkpoints.check()  # a background write's failure
        return False

    def stop_requested(
        self, step: Step, voted: bool | None = None, flags: Callable[[], Any] | None = None
    ) -> bool:
        """A graceful stop after this step; several processes stop at the same step,
        while every one of them still has batches. `voted`: the processes already
        agreed with the step's token count (`RunLength.advance`); a time limit reached
        since is agreed too."""
        parts, options = self.parts, self.parts.options
        interrupter, dist = options.interrupter, parts.dist
        if voted is not None:
            if voted and dist is not None:  # why, once: the same outcome on every process
                agree_stop(dist, interrupter, options.preemption)
            cadence = options.cadence
            return voted or (cadence is not None and cadence.expired)
        if dist is None:
            return interrupter.should_stop()
        cadence = options.cadence
        if cadence is not None and cadence.expired:  # agreed already (rank 0's clock)
            return True
        # at the steps every process votes at (`StopVote`), for the same reason on all
        if not step.may_vote:
            return False
        return self.vote.agree(dist, interrupter, options.preemption, flags)

    def save_mid_epoch(self, flush: bool = False) -> None:
        """Checkpoint inside the epoch, with the metric log lines and epoch states so far
        (`flush`: write the lines of the values not yet written first). On one process
        the values start to the host before the snapshot, whose one wait brings them
        too; their lines are written before the checkpoint, which counts them. A step
        checkpointed already (its cadence, then a stop after it) is not written again."""
        parts, processor, dist = self.parts, self.parts.processor, self.parts.dist
        where = (self.state.epoch, self.state.iteration)
        if where == self.saved_at:
            return
        self.saved_at = where
        before_write = None
        if flush and dist is None:
            processor.launch()
            lines = processor.line_counts(coming=True)
            before_write = processor.flush
        else:
            if flush:
                processor.flush(dist)  # every process's lines, counted on rank 0
            lines = processor.line_counts()
        states = processor.epoch_states()
        parts.checkpoints.save(
            self.state.position(False),
            parts.model,
            parts.optim,
            dist,
            lines,
            states,
            before_write,
            checks=processor.log_checks,  # each log's last line once written: a resume knows it
        )

    def resume_logs(self, start: Position, counts: Mapping[str, int] | None) -> None:
        """Resuming mid-epoch: keep the lines each training metric log had at the
        checkpoint (later lines came after it), put them back into the metric states,
        and drop that epoch's validation logs."""
        artifacts = self.parts.artifacts
        artifacts.drop_epoch("valid", start.epoch, points_through=start.iteration)
        rows = {
            entry.name: artifacts.truncate_metric_log(
                "train", start.epoch, entry.name, (counts or {}).get(entry.name, start.iteration)
            )
            for entry in self.parts.options.metrics.get("train", ())
        }
        self.parts.processor.resume(rows)
