"""The smoke test: `learner.smoke_test(train, valid, batches=2)`.

It runs the learner's whole loop for one short epoch (`batches` training and
validation batches) in a temporary artifact directory: `train_step`, `valid_step`,
every metric, the metric files, `history.jsonl`, a checkpoint written with the run's
recorder and loaded back through `checkpoint("latest")`, and the validation inside
the epoch when the run has `valid_every`. The model's weights and buffers, its
gradients and mode, the optimizer, the learning-rate schedule, the gradient scaler and
every random generator are put back as they were, and the run's own artifact
directory, loggers, listeners, renderer and pruning strategy are never touched.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ember.errors import ConfigError, TrainingError
from ember.rng import capture_rng_state, restore_rng_state
from ember.train.checkpoint.file import FileCheckpointer
from ember.train.checkpoint.strategy import KeepLastNCheckpoints
from ember.train.events import ProcessedItem, ValidPoint
from ember.train.files.artifacts import SPLITS, Artifacts
from ember.train.files.metric_files import read_metric_log
from ember.train.history import RunHistory
from ember.train.length.interrupter import Interrupter
from ember.train.options import LearnerOptions
from ember.train.renderer.silent import SilentRenderer


class SmokeTestError(TrainingError):
    """The smoke test found a part of the run that fails; the message names it."""


@dataclass
class SmokeReport:
    """What the smoke test ran, in a few lines (`str(report)`)."""

    batches: dict[str, int] = field(default_factory=dict)
    """Batches that went through each split's step."""
    values: dict[str, dict[str, float]] = field(default_factory=dict)
    """The short epoch's values per split."""
    lines: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(["smoke test passed:", *(f"  {line}" for line in self.lines)])


class _Counter:
    """Counts the batches of each split and the validation points (a listener)."""

    def __init__(self) -> None:
        self.batches: dict[str, int] = {}
        self.points = 0

    def on_event(self, event: Any) -> None:
        if isinstance(event, ProcessedItem):
            self.batches[event.split] = self.batches.get(event.split, 0) + 1
        elif isinstance(event, ValidPoint):
            self.points += 1


class _Saved:
    """Everything a short run changes in the learner's objects, copied before it."""

    def __init__(self, model: torch.nn.Module, optim: Any) -> None:
        self.model = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.grads = [
            None if p.grad is None else p.grad.detach().clone() for p in model.parameters()
        ]
        self.training = model.training
        self.optimizer = copy.deepcopy(optim.optimizer.state_dict())
        lr = optim.lr
        self.lr_fields = (lr.scheduler, lr.pending, lr.last_lr, lr._epoch_lr)
        self.schedule = (
            copy.deepcopy(lr.scheduler.state_dict()) if lr.scheduler is not None else None
        )
        self.scaler = copy.deepcopy(optim.scaler.state_dict()) if optim.scaler is not None else None
        self.rng = capture_rng_state()
        self.micro_split = optim.micro_split  # grads_accumulation("auto")'s split

    def restore(self, model: torch.nn.Module, optim: Any) -> None:
        model.load_state_dict(self.model)
        for parameter, grad in zip(model.parameters(), self.grads):
            parameter.grad = grad
        model.train(self.training)
        optim.optimizer.load_state_dict(self.optimizer)
        lr = optim.lr
        lr.scheduler, lr.pending, lr.last_lr, lr._epoch_lr = self.lr_fields
        if self.schedule is not None:
            lr.scheduler.load_state_dict(self.schedule)
        if self.scaler is not None:
            optim.scaler.load_state_dict(self.scaler)
        restore_rng_state(self.rng)
        optim.micro_split = self.micro_split


def smoke_test(
    options: LearnerOptions,
    learner_class: Callable[[LearnerOptions], Any],
    train: Iterable[Any],
    valid: Iterable[Any] | None = None,
    *,
    batches: int = 2,
    echo: bool = True,
) -> SmokeReport:
    """Run `batches` batches of each split through the whole loop of a learner of
    `options` (made by `learner_class`) in a temporary directory, load its checkpoint
    back, put everything back; return (and with `echo`, print) what ran. A failing
    part raises `SmokeTestError` naming it."""
    if not isinstance(batches, int) or isinstance(batches, bool) or batches < 1:
        raise ConfigError(f"smoke_test(batches=...) must be an int >= 1, got {batches!r}.")
    model, optim = options.model, options.optimization
    saved = _Saved(model, optim)
    report = SmokeReport()
    try:
        with tempfile.TemporaryDirectory(prefix="ember-smoke-") as directory:
            _run(learner_class, options, Path(directory), train, valid, batches, report)
    finally:
        saved.restore(model, optim)
    report.lines.append(
        "model, gradients, optimizer, learning-rate schedule, scaler and random generators "
        "restored; the run's artifact directory untouched"
    )
    if echo:
        print(report)
    return report


def _run(
    learner_class: Any,
    options: LearnerOptions,
    root: Path,
    train: Iterable[Any],
    valid: Iterable[Any] | None,
    batches: int,
    report: SmokeReport,
) -> None:
    counter = _Counter()
    checkpointer = options.checkpointer
    recorder = checkpointer.recorder if isinstance(checkpointer, FileCheckpointer) else None
    if recorder is None:
        from ember.record import DefaultRecorder

        recorder = DefaultRecorder()
    artifacts = Artifacts(root / "run")

    def short(resume: bool) -> LearnerOptions:
        return dataclasses.replace(
            options,
            artifact_dir=artifacts.root,
            overwrite=False,
            devices=None,
            fsdp=None,  # one process: nothing to shard
            num_epochs=1,
            train_for=None,  # one short epoch, whatever the run's length
            checkpoint_every=None,
            renderer=SilentRenderer(),
            loggers={split: () for split in options.loggers},
            listeners=(counter,),
            interrupter=Interrupter(),
            checkpointer=FileCheckpointer(artifacts.checkpoints, recorder),
            strategy=options.strategy or KeepLastNCheckpoints(1),
            resume_from="latest" if resume else None,
            summary=False,
            pruning=None,  # a trial must not hear of the smoke test
            valid_every=1 if options.valid_every is not None and valid is not None else None,
            limit_batches=(batches, batches),
        )

    first = learner_class(short(resume=False))
    _guarded(lambda: first.fit(train, valid), "the short epoch")
    trained = {k: v.detach().clone() for k, v in first.model.state_dict().items()}
    report.batches = dict(counter.batches)
    report.values = {split: dict(values) for split, values in first.history[-1][1].items()}
    steps = first.steps_per_epoch
    report.lines.append(
        f"train_step: {counter.batches.get('train', 0)} batches, "
        f"{steps if steps is not None else '?'} optimizer step(s)"
    )
    if valid is not None:
        report.lines.append(f"valid_step: {counter.batches.get('valid', 0)} batches")
    if counter.points:
        report.lines.append(f"validation inside the epoch (valid_every): {counter.points} point(s)")
    for split in SPLITS:
        values = report.values.get(split)
        if values:
            shown = ", ".join(f"{name} {value:.6g}" for name, value in values.items())
            report.lines.append(f"{split} metrics: {shown}")
    files = [
        f"{split}/epoch-{epoch}/{stem}.log ({len(read_metric_log(path))} lines)"
        for split in SPLITS
        for epoch, stem, path in artifacts.metric_logs(split)
    ]
    if files:
        report.lines.append("metric files: " + ", ".join(files))
    RunHistory.load(artifacts.history)
    report.lines.append("history.jsonl and experiment.log written")

    counter.batches.clear()
    second = learner_class(short(resume=True))
    _guarded(lambda: second.fit(train, valid), "loading the checkpoint back")
    loaded = second.model.state_dict()
    equal = all(torch.equal(trained[name], loaded[name]) for name in trained)
    names = ", ".join(sorted(path.name for path in artifacts.checkpoints.iterdir()))
    report.lines.append(
        f"checkpoint written ({names}) and loaded back with checkpoint('latest'): weights "
        + ("equal to the trained ones" if equal else "as stored at the recorder's precision")
    )


def _guarded(run: Any, part: str) -> None:
    """Run one part; an error becomes a `SmokeTestError` naming the part that failed."""
    try:
        run()
    except Exception as error:
        raise SmokeTestError(
            f"Smoke test failed in {_failing_part(error, part)}: {type(error).__name__}: {error}"
        ) from error


def _failing_part(error: BaseException, part: str) -> str:
    """The part of the run an error came from: the step its note names, else the
    deepest ember package its traceback went through, else `part`."""
    notes = " ".join(getattr(error, "__notes__", []))
    for step in ("train_step", "valid_step"):
        if f"raised by {step}" in notes:
            return step
    if type(error).__name__ == "NonFiniteLoss":
        return "train_step (the loss is not finite)"
    text = str(error)
    if text.startswith("Writing a checkpoint failed"):
        return "the checkpoint write"
    if " metric " in text and "fails on the first" in text:
        return "a metric"
    where = part
    packages = (
        ("/ember/train/metric/", "a metric"),
        ("/ember/train/logger/", "the metric files"),
        ("/ember/train/checkpoint/", "the checkpoint"),
        ("/ember/record/", "the checkpoint"),
    )
    trace = error.__traceback__
    while trace is not None:
        file = trace.tb_frame.f_code.co_filename.replace("\\", "/")
        for package, name in packages:
            if package in file:
                where = name
        trace = trace.tb_next
    if where == "the checkpoint":
        return "the checkpoint " + ("write" if part == "the short epoch" else "load")
    return where
