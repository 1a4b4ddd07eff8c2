"""Before and after a fit's epochs: preparing, starting, failing and closing a run.

`prepare` checks the loaders, counts the steps, loads and restores the resumed state,
and only then prepares the artifact directory, the log and the loggers; `start` logs
what was prepared, joins the processes, tells the loggers and the renderer and checks
the validation step; `failure` logs how a run ended on an exception; `close` releases
everything, never letting an error there hide the one that ended the run. Each works
on the `Learner` whose `fit` calls it; the epochs themselves are in `learner.py`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterable

from ember.errors import TrainingError
from ember.train import metric_exchange as exchange
from ember.train.batches import BatchPlanner
from ember.train.checkpoint.policy import Resume
from ember.train.describe import describe_run, run_info
from ember.train.distributed import Distributed
from ember.train.events import End, Start
from ember.train.guard import NonFiniteLoss
from ember.train.history import RunHistory
from ember.train.logger.application import FileApplicationLogger
from ember.train.logger.base import MetricLogger, RunStart, start_loggers
from ember.train.logger.file import FileMetricLogger
from ember.train.files.model_summary import summarize_model
from ember.train.oom import RankSplit
from ember.train.outcome import Outcome
from ember.train.parallel import evaluation, parallelize
from ember.train.length.position import Position
from ember.train.preflight import check_not_empty, check_validation
from ember.train.processor import MetricsProcessor
from ember.train.renderer.silent import SilentRenderer
from ember.train.files.run_record import end_session, record_start

if TYPE_CHECKING:
    from ember.train.learner import Learner

log = logging.getLogger("ember.train.learner")  # the run's own log, as the loop's


@dataclass
class FitRun:
    """What `prepare` readies for one `fit`."""

    main: bool
    resume: Resume
    train: BatchPlanner
    valid: BatchPlanner | None
    notes: list[str]
    loggers: dict[str, list[MetricLogger]]
    renderer: Any
    app_log: FileApplicationLogger


def prepare(learner: Learner, train: Iterable[Any], valid: Iterable[Any] | None) -> FitRun:
    """Check the loaders, count the steps, load and restore the resumed state; only
    then prepare the directory, open the log and make the loggers."""
    dist = learner.dist
    main = dist is None or dist.main
    learner._output_checked = False
    check_not_empty(train, "training", "fit(train, ...)")
    if valid is not None:
        check_not_empty(valid, "validation", "fit(train) without validation data")
    resume = learner.checkpoints.resume_point()
    shard = (dist.rank, dist.world) if dist is not None else None
    train_limit, valid_limit = learner.options.limit_batches
    train_plan = BatchPlanner(train, learner.grads_accumulation, shard, train_limit)
    train_plan.check_limit("training", "train")
    valid_plan = None
    if valid is not None:
        valid_plan = BatchPlanner(valid, 1, shard, valid_limit)
        valid_plan.check_limit("validation", "valid")
    learner.length.counters = resume.position.counters
    notes = count_steps(learner, train_plan, resume.position)
    learner.optim.lr.check_monitor(
        {split: [entry.name for entry in entries] for split, entries in learner.metrics.items()}
    )
    if dist is not None:  # the model as the processes share it, before it is restored
        learner._ddp = parallelize(learner.model, learner.optimizer, dist, learner.options.fsdp)
        if learner.optim.micro_split is not None:  # grads_accumulation("auto")
            learner._ranks = RankSplit(dist, learner.model)
    notes += [
        *resume.notes,
        *learner.checkpoints.restore(resume, learner.model, learner.optim, dist),
    ]
    if main:
        overwrite = learner.options.overwrite or resume.replace  # checkpoint("auto")
        learner.artifacts.prepare(resume.position.kept_epochs(), overwrite)
    load_history(learner, resume, main)
    app_log = FileApplicationLogger(learner.artifacts.experiment_log)
    if learner.options.application_log and main:
        app_log.install()
    if main and learner._run_lock is not None and learner._run_lock.takeover_message:
        notes.append(learner._run_lock.takeover_message)
    complete = learner.length.finished(resume.position)  # a finished run: nothing to show
    renderer = learner.renderer if main and not complete else SilentRenderer()
    loggers = make_loggers(learner, main)
    return FitRun(main, resume, train_plan, valid_plan, notes, loggers, renderer, app_log)


def start(learner: Learner, run: FitRun, valid: Iterable[Any] | None) -> MetricsProcessor:
    """Log what was prepared, join the processes, tell the loggers and the renderer,
    check the validation step; return the run's metrics processor."""
    start, dist = run.resume.position, learner.dist
    for note in run.notes:
        resumed = note.startswith(("Resumed from", "Resuming from", "checkpoint('auto')"))
        log.log(logging.INFO if resumed else logging.WARNING, "%s", note)
    processor = MetricsProcessor(
        learner.metrics, run.loggers, run.renderer, learner.num_epochs, gathers=dist is not None
    )
    if learner.train_for is not None:
        processor.run_progress = learner.progress_text
    if dist is not None:
        prepare_processes(learner, dist, processor, run.train, run.valid)
    processes = dist.world if dist is not None else 1
    hparams, directory = learner.options.hparams, str(learner.artifact_dir)
    start_loggers(
        run.loggers,
        RunStart(start.epoch, start.iteration, not start.fresh, processes, hparams, directory),
    )
    info = run_info(learner, start)
    log.info("%s", describe_run(learner, info))
    summary = summarize_model(learner.model, learner.options.model_summary)
    info = replace(info, model_summary=summary)
    if run.main:
        record_start(learner.artifacts, start.epoch, not start.fresh, hparams)
    learner.run_history.describe_model(info.model_name, info.num_parameters)
    if learner.length.finished(start) and learner.train_for is not None:
        learner.epoch = start.epoch - (0 if start.iteration else 1)
        log.warning(
            "The run is already complete: its checkpoint has %s and train_for is %s, so "
            "nothing is left to train and the trained model is returned as it is. Raise "
            "train_for to train further.",
            f"{start.counters.of(learner.train_for.unit):,} {learner.train_for.unit}",
            learner.train_for,
        )
    elif learner.length.finished(start):
        learner.epoch = start.epoch - 1
        log.warning(
            "The run is already complete: its checkpoint is at the end of epoch %d and "
            "num_epochs is %d, so nothing is left to train and the trained model is "
            "returned as it is. Raise num_epochs to train further.",
            learner.epoch,
            learner.num_epochs,
        )
    elif valid is not None and learner.metrics.get("valid"):
        check_validation(
            learner.model,
            valid,
            processor,
            start.epoch,
            learner.device,
            learner.optim.autocast,
            evaluation(learner._ddp),
        )
    run.renderer.start(info)
    learner._emit(Start(start.epoch, learner.num_epochs, str(learner.artifact_dir)))
    return processor


def failure(learner: Learner, error: BaseException) -> Outcome:
    """Log how the run ended on an exception; "interrupted" or "failed[: why]"."""
    where = f"epoch {learner.epoch}, iteration {learner.iteration}"
    outcome = Outcome.failed(error, isinstance(error, NonFiniteLoss))
    if isinstance(error, KeyboardInterrupt):
        log.error("Training interrupted (KeyboardInterrupt) at %s.", where)
        return outcome
    elsewhere = learner.dist.caused_elsewhere(error) if learner.dist is not None else None
    if elsewhere is not None:  # another rank failed: its record says why
        log.error("Training stopped at %s. %s", where, elsewhere)
    else:
        log.exception("Training failed at %s.", where)
    return outcome


def count_steps(learner: Learner, train: BatchPlanner, start: Position) -> list[str]:
    """The run's optimizer steps, and the schedule that waits for them ("auto");
    returns a warning about the schedule's interval, if any. A run whose length is
    not in epochs shows the epoch it should end in as its `num_epochs`."""
    learner.steps_per_epoch = train.steps_per_epoch()
    learner.total_steps, last_epoch = learner.length.steps(train, learner.steps_per_epoch, start)
    if learner.train_for is not None:
        learner.num_epochs = max(start.epoch, last_epoch or start.epoch)
        if learner.points is not None:
            learner.points.num_epochs = learner.num_epochs
    if learner.optim.lr.pending is not None and learner.total_steps is None:
        why = "the training loader has no length"
        if learner.train_for is not None and learner.train_for.unit == "samples":
            why = (
                f"the run trains for {learner.train_for}, and the training loader does not "
                "tell its samples per step (a batch_size, and a dataset or sampler length)"
            )
        raise TrainingError(
            f"The learning-rate schedule counts the run's optimizer steps ('auto'), but {why}. "
            "Give the schedule its step count instead."
        )
    learner.optim.lr.resolve(learner.total_steps)
    warning = learner.optim.lr.check_interval(learner.steps_per_epoch)
    return [warning] if warning else []


def load_history(learner: Learner, resume: Resume, main: bool) -> None:
    """Rank 0 keeps the history in `history.jsonl`; a resumed run continues the
    saved one up to where it resumes (every process gets rank 0's copy)."""
    history = learner.run_history
    if main:
        history.path = learner.artifacts.history
    if resume.state is None:
        return
    if main:
        found = learner.artifacts.saved_history if history.path is not None else None
        if found is not None:
            saved = RunHistory.load(found)
            history.epochs = saved.epochs
            history.checkpoints = saved.checkpoints
            history.points = saved.points
            history.counters = saved.counters
            history.point_counters = saved.point_counters
        else:  # a run from before the history file: the checkpoint carried it
            history.epochs = [(int(e), v) for e, v in resume.state["learner"].get("history", [])]
        if not learner.length.finished(resume.position) or learner.train_for is None:
            history.keep_before(resume.position.epoch, resume.position.iteration)
    if learner.dist is not None:
        history.epochs = learner.dist.broadcast(history.epochs)
        history.points = learner.dist.broadcast(history.points)


def make_loggers(learner: Learner, main: bool) -> dict[str, list[MetricLogger]]:
    """Rank 0 writes the metric files and feeds the extra loggers."""
    return {
        split: [FileMetricLogger(learner.artifacts.split_dir(split)), *extra] if main else []
        for split, extra in learner.options.loggers.items()
    }


def prepare_processes(
    learner: Learner,
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
    exchange.warn_unmerged(processor.states)
    if learner.options.fsdp is not None:
        train.check_even("training")
        if valid is not None:
            valid.check_even("validation")
    dist.barrier()  # rank 0 has prepared the artifact directory


def print_summary(learner: Learner) -> None:
    from ember.train.summary import LearnerSummary

    summary = LearnerSummary.from_dir(learner.artifact_dir)
    table = replace(summary, outcome=learner.outcome).table()  # history.jsonl has it at the end
    print(table)
    log.info("%s", table)


def close(
    learner: Learner, loggers: dict[str, list[MetricLogger]], renderer: Any, reason: str
) -> None:
    """Release everything; an error here is logged, never allowed to hide the
    error that ended the run."""
    steps: list[tuple[str, Any]] = [
        ("the last checkpoint could not be written", learner.checkpoints.wait)
    ]
    for split_loggers in loggers.values():
        for logger in split_loggers:
            steps.append((f"closing {type(logger).__name__} failed", logger.close))
    steps.append(
        ("a listener failed at the end", lambda: learner._emit(End(learner.epoch, reason)))
    )
    steps.append(("the renderer failed at the end", lambda: renderer.end(reason)))
    steps.append(("the run history could not be written", lambda: finish_history(learner, reason)))
    for what, step in steps:
        try:
            step()
        except Exception as error:
            log.error("%s: %s", what, error)


def finish_history(learner: Learner, reason: str) -> None:
    if learner.run_history.path is not None:
        learner.run_history.finish(reason)
        end_session(learner.artifacts, reason)
