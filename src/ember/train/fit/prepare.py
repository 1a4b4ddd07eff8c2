"""Before a fit's epochs: `prepare` checks the loaders, counts the steps, loads the
resumed state and reads and checks every record of the run, then prepares the log and
the loggers, returning the fit's parts and state; `start` logs what was prepared, joins
the processes, checks the validation step and only then changes the directory of a
resumed run (`commit`) and tells the loggers and the renderer. A resume refused by any
of these checks leaves every byte of the directory as it was."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Iterable

import torch

from ember.durable import together
from ember.errors import TrainingError
from ember.train import metric_exchange as exchange
from ember.train.checkpoint.resume import Resume
from ember.train.describe import describe_run, run_info
from ember.train.distributed import Distributed
from ember.train.events import Start
from ember.train.files.lock import RunLock
from ember.train.files.model_summary import summarize_model
from ember.train.files.run_record import (
    SavedRecords,
    check_replace,
    check_resume,
    read_records,
    record_start,
)
from ember.train.fit.evaluation import check_not_empty, check_validation
from ember.train.fit.events import FitEvents
from ember.train.fit.layouts import training_plan
from ember.train.fit.parts import FitParts, Lasting
from ember.train.fit.state import FitState
from ember.train.length.batches import BatchPlanner
from ember.train.length.position import Position
from ember.train.logger.application import FileApplicationLogger, RankLogFile
from ember.train.logger.base import MetricLogger, RunStart, start_loggers
from ember.train.logger.file import FileMetricLogger
from ember.train.oom import RankSplit
from ember.train.parallel import evaluation, parallelize
from ember.train.processor import MetricsProcessor
from ember.train.renderer.silent import SilentRenderer

log = logging.getLogger("ember.train.learner")  # the run's own log, as the loop's


def prepare(
    kit: Lasting,
    state: FitState,
    train: Iterable[Any],
    valid: Iterable[Any] | None,
    dist: Distributed | None,
    lock: RunLock | None,
) -> tuple[FitParts, list[str]]:
    """Check the loaders, count the steps, load and restore the resumed state; only
    then prepare the directory, open the log and make the loggers. Returns the fit's
    parts and the notes to log once the log is open."""
    options, model, optim = kit.options, kit.model, kit.optim
    main = dist is None or dist.main
    state.output_checked = False
    check_not_empty(train, "training", "fit(train, ...)")
    if valid is not None:
        check_not_empty(valid, "validation", "fit(train) without validation data")
    resume = kit.checkpoints.resume_point()
    records = check_records(kit, resume) if main else None
    shard = (dist.rank, dist.world) if dist is not None else None
    valid_limit = options.limit_batches[1]
    stand_ins = options.fsdp is not None  # every forward gathers from every process
    train_plan, streams, dealt = training_plan(options, resume, train, shard, kit.checkpoints)
    if kit.points is not None:  # validation points count the steps as the plan groups them
        kit.points.accumulation = train_plan.accumulation
    train_plan.check_limit("training", "train")
    train_plan.check_whole_steps("training")
    train_plan.count.needs = count_needs(kit)
    valid_plan = None
    if valid is not None:
        valid_plan = BatchPlanner(valid, 1, shard, valid_limit, stand_ins, "validation", False)
        valid_plan.check_limit("validation", "valid")
    kit.length.counters = resume.position.counters
    notes = [*optim.notes, *dealt, *count_steps(kit, state, train_plan, resume.position)]
    if dist is not None or train_plan.layout is not None:  # a shuffled loader ember deals
        saved = resume.state["learner"].get("data") if resume.state is not None else None
        train_plan.share_order(dist, saved.get("seed") if isinstance(saved, dict) else None)
        if valid_plan is not None:
            valid_plan.share_order(dist, None)
    kit.checkpoints.data = train_plan.data_state()
    kit.checkpoints.loader_state = train_plan.loader_state
    if resume.state is not None and resume.position.iteration:  # resumed inside an epoch
        where = f"epoch {resume.position.epoch}, iteration {resume.position.iteration}"
        changed = train_plan.data_changes(resume.state["learner"].get("data"), where)
        notes += [changed] if changed else []
    optim.lr.check_monitor(
        {split: [entry.name for entry in entries] for split, entries in options.metrics.items()}
    )
    wrapped = ranks = None
    if dist is not None:  # the model as the processes share it, before it is restored
        wrapped = parallelize(model, optim.optimizer, dist, options.fsdp, options.sync_batchnorm)
        if optim.micro_split is not None:  # grads_accumulation("auto")
            ranks = RankSplit(dist, model)
    notes += [*resume.notes, *kit.checkpoints.restore(resume, model, optim, dist)]
    if resume.state is not None:
        saved_rng = kit.checkpoints.saved_rng(resume, dist)
        stream = resume.stream  # the stream of the column this process now runs
        after = stream["torch"] if stream is not None else saved_rng.get("torch")
        train_plan.resume(saved_rng.get("loader"), after, resume.position)
        if stream is not None and stream.get("cuda") is not None and options.device.type == "cuda":
            torch.cuda.set_rng_state(stream["cuda"].cpu().to(torch.uint8), options.device)
    own = None  # rank-N.log: each process's own lines (devices(..., rank_logs=True))
    if dist is not None and options.rank_logs:
        own = RankLogFile(kit.artifacts.rank_log(dist.rank), dist.rank)
    app_log = FileApplicationLogger(kit.artifacts.experiment_log, rank_log=own)
    if options.application_log and main:
        app_log.check()
    if main and resume.state is None:  # a fresh run: a directory holding a run is refused or
        overwrite = options.overwrite or resume.replace  # replaced (checkpoint("auto"))
        kit.artifacts.prepare(None, overwrite)
    load_history(kit, resume, records, main, dist)
    app_log.install(main=options.application_log and main)
    if main and lock is not None and lock.takeover_message:
        notes.append(lock.takeover_message)
    complete = kit.length.finished(resume.position)  # a finished run: nothing to show
    renderer = options.renderer if main and not complete else SilentRenderer()
    loggers = make_loggers(kit, main)
    processor = MetricsProcessor(
        options.metrics, loggers, renderer, state.num_epochs, gathers=dist is not None
    )
    if kit.length.train_for is not None:
        processor.run_progress = kit.length.progress_text
    parts = FitParts(
        options=options,
        model=model,
        wrapped=wrapped,
        optim=optim,
        manual=kit.manual,
        guard=kit.guard,
        flops=kit.flops,
        processor=processor,
        checkpoints=kit.checkpoints,
        history=kit.history,
        artifacts=kit.artifacts,
        length=kit.length,
        dist=dist,
        ranks=ranks,
        points=kit.points,
        events=FitEvents(options.listeners, optim.callbacks),
        loggers=loggers,
        renderer=renderer,
        app_log=app_log,
        resume=resume,
        train=train_plan,
        valid=valid_plan,
        device=options.device,
        move=options.device.type != "cpu",
        records=records,
        streams=streams,
    )
    return parts, notes


def check_records(kit: Lasting, resume: Resume) -> SavedRecords | None:
    """Rank 0 reads every record a resumed run goes on with and checks them against its
    checkpoint, before anything is written (a fresh run of checkpoint("auto") checks
    that the directory holds no run that ended). None for a fresh run."""
    artifacts = kit.artifacts
    if resume.state is None:
        if resume.replace:
            check_replace(artifacts)
        return None
    records = read_records(artifacts)
    learner, position = resume.state["learner"], resume.position
    where = f"epoch {learner['epoch']}" + (
        f", iteration {position.iteration}" if position.iteration else ""
    )
    mark = learner.get("history_mark")
    check_resume(records, artifacts, position.epoch - 1, where, mark, "history" in learner)
    return records


def start(parts: FitParts, state: FitState, notes: list[str], valid: Iterable[Any] | None) -> None:
    """Log what was prepared, join the processes, start the renderer, check the
    validation step, then write the run's records (`commit`) and start the loggers."""
    start, dist, options = parts.resume.position, parts.dist, parts.options
    for note in notes:
        resumed = note.startswith(
            ("Resumed from", "Resumed on", "Resuming from", "checkpoint('auto')")
        )
        log.log(logging.INFO if resumed else logging.WARNING, "%s", note)
    if dist is not None:
        prepare_processes(parts, dist)
    processes = dist.world if dist is not None else 1
    hparams, directory = options.hparams, str(options.artifact_dir)
    info = run_info(options, parts.model, state.num_epochs, dist, start)
    log.info("%s", describe_run(options, parts.optim, dist, parts.length, info))
    summary = summarize_model(parts.model, options.model_summary)
    info = replace(info, model_summary=summary)
    parts.renderer.start(info)  # shown at once, before the validation check and loggers
    train_for = parts.length.train_for
    if parts.length.finished(start) and train_for is not None:
        state.epoch = start.epoch - (0 if start.iteration else 1)
        log.warning(
            "The run is already complete: its checkpoint has %s and train_for is %s, so "
            "nothing is left to train and the trained model is returned as it is. Raise "
            "train_for to train further.",
            f"{start.counters.of(train_for.unit):,} {train_for.unit}",
            train_for,
        )
    elif parts.length.finished(start):
        state.epoch = start.epoch - 1
        log.warning(
            "The run is already complete: its checkpoint is at the end of epoch %d and "
            "num_epochs is %d, so nothing is left to train and the trained model is "
            "returned as it is. Raise num_epochs to train further.",
            state.epoch,
            state.num_epochs,
        )
    elif valid is not None and options.metrics.get("valid"):
        check_validation(
            parts.model,
            valid,
            parts.processor,
            start.epoch,
            parts.device,
            parts.optim.autocast,
            evaluation(parts.wrapped),
        )
    with together():  # the run's records of its start: durable as one
        if parts.main:
            commit(parts)
        parts.history.describe_model(info.model_name, info.num_parameters)
    start_loggers(
        parts.loggers,
        RunStart(start.epoch, start.iteration, not start.fresh, processes, hparams, directory),
    )
    parts.events.emit(Start(start.epoch, state.num_epochs, directory))


def commit(parts: FitParts) -> None:
    """Every check passed: a resumed run drops the logs after its checkpoint and the
    temporaries a kill left; the hyperparameters and a new session are written. The
    history is rewritten whole at its first record (`RunHistory.describe_model`)."""
    start = parts.resume.position
    if not start.fresh:
        parts.artifacts.prepare(start.kept_epochs(), overwrite=False)
    record_start(parts.artifacts, start.epoch, parts.options.hparams, parts.records)


def count_needs(kit: Lasting) -> str | None:
    """What of the run cannot go on without the items of each training batch counted."""
    train_for = kit.length.train_for
    if train_for is not None and train_for.unit == "samples":
        return f"train_for({str(train_for)!r})"
    accumulation = kit.options.grads_accumulation
    if accumulation != 1:
        return (
            f"grads_accumulation({accumulation!r}), which weights each batch by its share "
            "of the step's items,"
        )
    return None


def count_steps(kit: Lasting, state: FitState, train: BatchPlanner, start: Position) -> list[str]:
    """The run's optimizer steps, and the schedule that waits for them ("auto");
    returns a warning about the schedule's interval, if any. A run whose length is
    not in epochs shows the epoch it should end in as its `num_epochs`."""
    lr, length = kit.optim.lr, kit.length
    state.steps_per_epoch = train.steps_per_epoch()
    state.total_steps, last_epoch = length.steps(train, state.steps_per_epoch, start)
    if length.train_for is not None:
        state.num_epochs = max(start.epoch, last_epoch or start.epoch)
        if kit.optim.callbacks is not None:
            kit.optim.callbacks.update(num_epochs=state.num_epochs)
    if lr.pending is not None and state.total_steps is None:
        why = "the training loader has no length"
        if length.train_for is not None and length.train_for.unit == "samples":
            why = (
                f"the run trains for {length.train_for}, and the training loader does not "
                "tell its samples per step (a batch_size, and a dataset or sampler length)"
            )
        raise TrainingError(
            f"The learning-rate schedule counts the run's optimizer steps ('auto'), but {why}. "
            "Give the schedule its step count instead."
        )
    lr.resolve(state.total_steps)
    warning = lr.check_interval(state.steps_per_epoch)
    return [warning] if warning else []


def load_history(
    kit: Lasting, resume: Resume, records: SavedRecords | None, main: bool, dist: Distributed | None
) -> None:
    """Rank 0 keeps the history in `history.jsonl`; a resumed run continues the saved
    one (as `records` read it) up to where it resumes, in memory: the file is rewritten
    whole at the run's first record. Every process gets rank 0's copy."""
    history = kit.history
    if main:
        history.path = kit.artifacts.history
    if resume.state is None:
        return
    if main:
        saved = records.history if records is not None else None
        if saved is not None:
            history.epochs = saved.epochs
            history.checkpoints = saved.checkpoints
            history.repairs = saved.repairs  # what `ember repair` did stays said
            history.points = saved.points
            history.counters = saved.counters
            history.point_counters = saved.point_counters
        else:  # a run from before the history file: the checkpoint carried it
            history.epochs = [(int(e), v) for e, v in resume.state["learner"].get("history", [])]
        if not kit.length.finished(resume.position) or kit.length.train_for is None:
            history.trim(resume.position.epoch, resume.position.iteration)
    if dist is not None:
        history.epochs = dist.broadcast(history.epochs)
        history.points = dist.broadcast(history.points)


def make_loggers(kit: Lasting, main: bool) -> dict[str, list[MetricLogger]]:
    """Rank 0 writes the metric files and feeds the extra loggers."""
    then = (
        "resume with checkpoint('latest')"
        if kit.checkpoints.checkpointer is not None
        else "train again (this run writes no checkpoint to resume from: add "
        "with_file_checkpointer(recorder) to be able to resume)"
    )
    return {
        split: [FileMetricLogger(kit.artifacts.split_dir(split), then), *extra] if main else []
        for split, extra in kit.options.loggers.items()
    }


def prepare_processes(parts: FitParts, dist: Distributed) -> None:
    """Several processes: check that the loaders shard exactly (evenly under
    sync_batchnorm(), with a batch for every process under FSDP), warn about metrics
    that see one process's data."""
    plans = {"training": parts.train, "validation": parts.valid}
    for name, plan in plans.items():
        if plan is None:
            continue
        plan.check_shardable(name)
        if parts.options.sync_batchnorm and plan is parts.train:  # each forward shares them
            plan.check_even(
                name,
                "sync_batchnorm()",
                "Build the loader with drop_last=True, or choose a batch size or a number of "
                "processes that gives every process as many batches.",
            )
        if plan.stand_ins:
            plan.check_stand_ins(name)
    exchange.warn_unmerged(parts.processor.states)
    dist.barrier()  # rank 0 has prepared the artifact directory
    parts.app_log.open_rank_log()
