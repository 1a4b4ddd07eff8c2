"""After a fit's epochs: `failure` logs how a run ended on an exception; `close`
releases everything, never letting an error there hide the one that ended the run."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from ember.durable import together
from ember.train.distributed import Distributed
from ember.train.events import End
from ember.train.files.run_record import end_session
from ember.train.fit.parts import FitParts
from ember.train.fit.state import FitState
from ember.train.guard import NonFiniteLoss
from ember.train.memory import memory_post_mortem, note_out_of_memory
from ember.train.outcome import Outcome, StopReason

log = logging.getLogger("ember.train.learner")  # the run's own log, as the loop's


def failure(state: FitState, dist: Distributed | None, error: BaseException) -> Outcome:
    """Log how the run ended on an exception; "interrupted" or "failed[: why]"."""
    where = f"epoch {state.epoch}, iteration {state.iteration}"
    outcome = Outcome.failed(error, isinstance(error, NonFiniteLoss))
    if isinstance(error, KeyboardInterrupt):
        log.error("Training interrupted (KeyboardInterrupt) at %s.", where)
        return outcome
    elsewhere = dist.caused_elsewhere(error) if dist is not None else None
    if elsewhere is None and dist is not None and dist.lost_touch(error):
        # a rank vanished without a record (killed): find out which before saying so
        dist.failures(wait=5.0 if dist.children else 0.0)
        elsewhere = dist.caused_elsewhere(error)
    if elsewhere is not None:  # another rank failed: its record says why
        log.error("Training stopped at %s. %s", where, elsewhere)
    else:
        log.exception("Training failed at %s.", where)
    return outcome


def after_training(
    parts: FitParts, state: FitState, reason: Outcome, restore_best: bool
) -> dict[str, Any] | None:
    """The training ended: log how, requeue a preempted job, restore the best weights,
    print the summary; return the whole state of a sharded model, gathered on rank 0
    before the group closes (None when the model is not sharded)."""
    options, dist = parts.options, parts.dist
    log.info("Training %s %s.", reason, state.where)
    if options.preemption is not None:  # requeue a preempted SLURM job
        again = (StopReason.PREEMPTED, StopReason.TIME_LIMIT)
        unfinished = isinstance(reason, Outcome) and reason.reason in again
        options.preemption.after(unfinished, parts.main)
    skipped = state.skipped_steps + (parts.manual.skipped if parts.manual else 0)
    if skipped:
        log.info(
            "Skipped %d optimizer step%s with a non-finite loss (nonfinite_loss('skip')).",
            skipped,
            "" if skipped == 1 else "s",
        )
    if restore_best:
        parts.checkpoints.restore_best(parts.model, dist)
    whole = None
    if dist is not None and dist.sharding is not None:
        whole = dist.sharding.gathered_model()
    if options.summary and parts.main:
        print_summary(parts, reason)
    return whole


def out_of_memory(error: BaseException, parts: FitParts, state: FitState, recorded: bool) -> None:
    """An out-of-memory error ends the run: say where in the step, and with the
    allocation history (`memory_history()`), write the post-mortem."""
    split = parts.optim.micro_split
    note_out_of_memory(error, state.epoch, state.iteration, split)
    if recorded:
        rank = parts.dist.rank if parts.dist is not None else 0
        memory_post_mortem(error, parts.artifacts.memory_snapshot(rank))


def print_summary(parts: FitParts, outcome: Outcome) -> None:
    """The run's summary table, printed and logged (`LearnerBuilder.summary`)."""
    from ember.train.summary import LearnerSummary

    summary = LearnerSummary.from_dir(parts.options.artifact_dir)
    table = replace(summary, outcome=outcome).table()  # history.jsonl has it at the end
    print(table)
    log.info("%s", table)


def close(parts: FitParts, state: FitState, reason: str) -> None:
    """Release everything; an error here is logged, never allowed to hide the
    error that ended the run."""
    steps: list[tuple[str, Any]] = [
        ("the last checkpoint could not be written", parts.checkpoints.wait)
    ]
    for split_loggers in parts.loggers.values():
        for logger in split_loggers:
            steps.append((f"closing {type(logger).__name__} failed", logger.close))
    steps.append(
        ("a listener failed at the end", lambda: parts.events.emit(End(state.epoch, reason)))
    )
    steps.append(("the renderer failed at the end", lambda: parts.renderer.end(reason)))
    steps.append(("the run history could not be written", lambda: finish_history(parts, reason)))
    for what, step in steps:
        try:
            step()
        except Exception as error:
            log.error("%s: %s", what, error)


def finish_history(parts: FitParts, reason: str) -> None:
    """The outcome, in the history and the session, of a fit that wrote its records (one
    refused before leaves the directory as it was)."""
    if parts.history.path is not None and parts.history.written:
        with together():  # the run's records of its end: durable as one
            parts.history.finish(reason)
            end_session(parts.artifacts, reason)
