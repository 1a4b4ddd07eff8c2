"""`Learner.fit`: the training loop, top to bottom.

fit -> epochs -> (train split, valid split, end of epoch). A train iteration is
step -> backward -> (every n) optimizer step -> metrics and events. Metrics,
loggers, the renderer and listeners only receive what the loop hands them.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Iterable

import torch

from ember.data.device import first_dim, to_device
from ember.errors import TrainingError
from ember.lr.base import LrDriver
from ember.rng import capture_rng_state, restore_rng_state
from ember.train.checkpoint.file import FileCheckpointer
from ember.train.events import End, EndEpoch, ProcessedItem, Start
from ember.train.interrupter import Interrupter
from ember.train.logger.application import FileApplicationLogger
from ember.train.logger.file import FileMetricLogger
from ember.train.processor import MetricsProcessor
from ember.train.renderer.base import RunInfo
from ember.train.run import prepare_artifact_dir
from ember.train.step import TrainOutput

log = logging.getLogger("ember")


class Learner:
    """A configured training run; built by `LearnerBuilder.build`. Call `fit` once."""

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_driver: LrDriver,
        device: torch.device,
        artifact_dir: Path,
        overwrite: bool,
        num_epochs: int,
        metrics: dict[str, list[tuple[Any, bool]]],
        loggers: dict[str, list[Any]],
        renderer: Any,
        grads_accumulation: int,
        checkpointer: FileCheckpointer | None,
        resume_epoch: int | None,
        interrupter: Interrupter,
        listeners: list[Any],
        application_log: bool,
        summary: bool = False,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.lr = lr_driver
        self.device = device
        self.artifact_dir = artifact_dir
        self.overwrite = overwrite
        self.num_epochs = num_epochs
        self.metrics = metrics
        self.loggers = loggers
        self.renderer = renderer
        self.grads_accumulation = grads_accumulation
        self.checkpointer = checkpointer
        self.resume_epoch = resume_epoch
        self.interrupter = interrupter
        self.listeners = listeners
        self.application_log = application_log
        self.summary = summary
        self.epoch = 0
        self.iteration = 0

    # The loop ------------------------------------------------------------------
    def fit(self, train: Iterable[Any], valid: Iterable[Any] | None = None) -> torch.nn.Module:
        """Train for the configured epochs and return the trained model."""
        prepare_artifact_dir(self.artifact_dir, self.resume_epoch, self.overwrite)
        app_log = FileApplicationLogger(self.artifact_dir / "experiment.log")
        if self.application_log:
            app_log.install()
        loggers = {
            split: [FileMetricLogger(self.artifact_dir / split), *extra]
            for split, extra in self.loggers.items()
        }
        self.processor = MetricsProcessor(self.metrics, loggers, self.renderer, self.num_epochs)
        reason = "failed"
        try:
            start = self._resume() + 1
            self._log_start(start)
            if valid is not None:
                self._preflight_valid(valid)
            self.renderer.start(self._run_info(start))
            self._emit(Start(start, self.num_epochs, str(self.artifact_dir)))
            for epoch in range(start, self.num_epochs + 1):
                self.epoch = epoch
                self._train_epoch(epoch, train)
                if valid is not None and not self.interrupter.should_stop():
                    self._valid_epoch(epoch, valid)
                self._end_epoch(epoch)
                if self.interrupter.should_stop():
                    break
            reason = (
                f"stopped: {self.interrupter.message}" if self.interrupter.should_stop() else "completed"
            )
            log.info("Training %s after epoch %d.", reason, self.epoch)
            if self.summary:
                self._print_summary()
        except BaseException as error:
            where = f"epoch {self.epoch}, iteration {self.iteration}"
            if isinstance(error, KeyboardInterrupt):
                reason = "interrupted"
                log.error("Training interrupted (KeyboardInterrupt) at %s.", where)
            else:
                log.exception("Training failed at %s.", where)
            raise
        finally:
            for split_loggers in loggers.values():
                for logger in split_loggers:
                    logger.close()
            self._emit(End(self.epoch, reason))
            self.renderer.end(reason)
            app_log.uninstall()
        return self.model

    def _train_epoch(self, epoch: int, loader: Iterable[Any]) -> None:
        model, optimizer, accumulation = self.model, self.optimizer, self.grads_accumulation
        model.train()
        total = _set_epoch(loader, epoch)
        self.processor.start_split("train", epoch, total)
        lr = self.lr.last_lr
        iteration = 0
        for iteration, batch in enumerate(loader, start=1):
            self.iteration = iteration
            batch = to_device(batch, self.device)
            output = _call_step(model.train_step, batch, "train_step", epoch, iteration)
            if iteration == 1:
                self._check_output(output, batch)
            loss = output.loss
            if accumulation > 1:
                loss = loss / _group_size(iteration, accumulation, total)
            loss.backward()
            if iteration % accumulation == 0 or iteration == total:
                lr = self.lr.before_step()
                optimizer.step()
                self.lr.after_step()
                optimizer.zero_grad(set_to_none=True)
            self.processor.update(output.item, iteration, _batch_size(batch, output), lr)
            if self.listeners:
                self._emit(ProcessedItem("train", epoch, iteration, total, output.item, lr))
            if self.interrupter.should_stop():
                break
        if iteration == 0:
            raise TrainingError(f"The training data loader yielded no batch in epoch {epoch}.")
        self._aggregates = {"train": self.processor.end_split()}

    def _valid_epoch(self, epoch: int, loader: Iterable[Any]) -> None:
        model = self.model
        total = _set_epoch(loader, epoch)
        self.processor.start_split("valid", epoch, total)
        model.eval()
        try:
            with torch.inference_mode():
                for iteration, batch in enumerate(loader, start=1):
                    batch = to_device(batch, self.device)
                    item = _call_step(model.valid_step, batch, "valid_step", epoch, iteration)
                    if iteration == 1:
                        self.processor.check("valid", item)
                    self.processor.update(item, iteration, _batch_size(batch, item), None)
                    if self.listeners:
                        self._emit(ProcessedItem("valid", epoch, iteration, total, item, None))
                    if self.interrupter.should_stop():
                        break
                self._aggregates["valid"] = self.processor.end_split()
        finally:
            model.train()

    def _end_epoch(self, epoch: int) -> None:
        for split, values in self._aggregates.items():
            if values:
                text = ", ".join(f"{name} {value:.6g}" for name, value in values.items())
                log.info("Epoch %d %s: %s", epoch, split, text)
        if self.checkpointer is not None:
            paths = self.checkpointer.save(epoch, self._checkpoint_parts(epoch))
            log.info("Checkpoint of epoch %d written: %s", epoch, ", ".join(p.name for p in paths))
        self._emit(EndEpoch(epoch, self._aggregates))

    # Helpers -------------------------------------------------------------------
    def _preflight_valid(self, loader: Iterable[Any]) -> None:
        """Run one validation batch before training so that a valid_step or a validation
        metric that cannot work fails now, not after the first epoch. Random generators
        are left exactly as they were."""
        if not self.metrics.get("valid"):
            return
        rng = capture_rng_state()
        try:
            self.model.eval()
            with torch.inference_mode():
                for batch in loader:
                    batch = to_device(batch, self.device)
                    item = _call_step(self.model.valid_step, batch, "valid_step", self.epoch, 1)
                    self.processor.check("valid", item)
                    break
        finally:
            self.model.train()
            restore_rng_state(rng)

    def _check_output(self, output: Any, batch: Any) -> None:
        if not isinstance(output, TrainOutput):
            raise TrainingError(
                f"{type(self.model).__name__}.train_step returned {type(output).__name__}; it must "
                "return TrainOutput(item) (ember calls backward on item.loss)."
            )
        if output.loss.dim() != 0:
            raise TrainingError(
                f"train_step's loss has shape {tuple(output.loss.shape)}; it must be a scalar. "
                "Reduce it (e.g. loss.mean()) before returning it."
            )
        if not output.loss.requires_grad:
            raise TrainingError(
                "train_step's loss does not require grad: it was computed without autograd "
                "(under torch.no_grad()/inference_mode, or from detached tensors)."
            )
        self.processor.check("train", output.item)

    def _checkpoint_parts(self, epoch: int) -> dict[str, Any]:
        return {
            "model": self.model,
            "optim": self.optimizer,
            "scheduler": {
                "lr_scheduler": self.lr.state_dict(),
                "learner": {"epoch": epoch, "rng": capture_rng_state()},
            },
        }

    def _resume(self) -> int:
        """Load the checkpoint to resume from; return the last completed epoch."""
        epoch = self.resume_epoch
        if epoch is None or self.checkpointer is None:
            return 0
        self.checkpointer.load(epoch, "model", self.model)
        self.checkpointer.load(epoch, "optim", self.optimizer)
        state = self.checkpointer.load(epoch, "scheduler", None)
        self.lr.load_state_dict(state["lr_scheduler"])
        restore_rng_state(state["learner"]["rng"])
        log.info("Resumed from the checkpoint of epoch %d.", epoch)
        return epoch

    def _run_info(self, start: int) -> RunInfo:
        return RunInfo(
            artifact_dir=str(self.artifact_dir),
            start_epoch=start,
            num_epochs=self.num_epochs,
            model_name=type(self.model).__name__,
            num_parameters=sum(p.numel() for p in self.model.parameters()),
            devices=(str(self.device),),
            metrics=tuple(
                (split, str(metric.name), str(getattr(metric, "unit", "")), numeric)
                for split, entries in self.metrics.items()
                for metric, numeric in entries
            ),
            interrupter=self.interrupter,
        )

    def _log_start(self, start: int) -> None:
        info = self._run_info(start)
        names = {s: ", ".join(str(m.name) for m, _ in ms) or "none" for s, ms in self.metrics.items()}
        log.info(
            "Training %s (%s parameters) on %s: epochs %d to %d, optimizer %s, lr %s, "
            "gradient accumulation %d, python %s, torch %s",
            info.model_name, f"{info.num_parameters:,}", self.device, start, self.num_epochs,
            type(self.optimizer).__name__, type(self.lr.scheduler).__name__,
            self.grads_accumulation, sys.version.split()[0], torch.__version__,
        )
        log.info("Metrics: train [%s]; valid [%s]", names["train"], names["valid"])

    def _print_summary(self) -> None:
        from ember.train.summary import LearnerSummary

        table = LearnerSummary.from_dir(self.artifact_dir).table()
        print(table)
        log.info("%s", table)

    def _emit(self, event: Any) -> None:
        for listener in self.listeners:
            listener.on_event(event)


def _set_epoch(loader: Any, epoch: int) -> int | None:
    """Tell an epoch-aware sampler which epoch starts; return the number of batches."""
    for owner in (loader, getattr(loader, "batch_sampler", None)):
        sampler = getattr(owner, "sampler", None)
        if callable(getattr(sampler, "set_epoch", None)):
            sampler.set_epoch(epoch)
            break
    try:
        return len(loader)
    except TypeError:
        return None


def _group_size(iteration: int, accumulation: int, total: int | None) -> int:
    """How many batches share the optimizer step that `iteration` belongs to."""
    if total is None:
        return accumulation
    group_start = (iteration - 1) // accumulation * accumulation
    return min(accumulation, total - group_start)


def _batch_size(batch: Any, item: Any) -> int:
    size = first_dim(batch)
    if size is None:
        size = first_dim(getattr(item, "targets", None))
    return size or 0


def _call_step(step: Any, batch: Any, name: str, epoch: int, iteration: int) -> Any:
    try:
        return step(batch)
    except Exception as error:
        if hasattr(error, "add_note"):
            error.add_note(
                f"ember: raised by {name} at epoch {epoch}, iteration {iteration}; "
                f"the batch was {describe(batch)}"
            )
        raise


def describe(batch: Any, depth: int = 0) -> str:
    """A short structural description of a batch: types, shapes, dtypes, devices."""
    import dataclasses

    if isinstance(batch, torch.Tensor):
        return f"Tensor{list(batch.shape)} {str(batch.dtype).replace('torch.', '')} {batch.device}"
    if depth > 3:
        return type(batch).__name__
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        inner = ", ".join(
            f"{f.name}={describe(getattr(batch, f.name), depth + 1)}" for f in dataclasses.fields(batch)
        )
        return f"{type(batch).__name__}({inner})"
    if isinstance(batch, dict):
        inner = ", ".join(f"{k!r}: {describe(v, depth + 1)}" for k, v in list(batch.items())[:8])
        return "{" + inner + "}"
    if isinstance(batch, (list, tuple)):
        inner = ", ".join(describe(v, depth + 1) for v in list(batch)[:8])
        more = ", ..." if len(batch) > 8 else ""
        return f"{type(batch).__name__}({inner}{more})"
    return type(batch).__name__
