"""`Learner.fit`: the training loop, top to bottom.

fit -> epochs -> (train split, valid split, end of epoch). A train iteration is
step -> backward -> (every n batches) optimizer step -> metrics and events. Metrics,
loggers, the renderer, the checkpointer and listeners only receive what the loop
hands them.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

from ember.data.device import first_dim, to_device
from ember.errors import TrainingError
from ember.rng import capture_rng_state, restore_rng_state
from ember.train.checkpoint.file import FileCheckpointer
from ember.train.describe import describe, describe_run, run_info
from ember.train.distributed import BatchPlan, Distributed, SilentRenderer, setup, wrap
from ember.train.events import End, EndEpoch, ProcessedItem, Start
from ember.train.guard import LossGuard
from ember.train.interrupter import Interrupter
from ember.train.logger.application import FileApplicationLogger
from ember.train.logger.file import FileMetricLogger
from ember.train.optimization import Optimization
from ember.train.position import Position, find_sampler, resume_logs, set_epoch
from ember.train.processor import MetricsProcessor
from ember.train.run import RunLock, prepare_artifact_dir, remove_stale_temporaries
from ember.train.signals import signal_handlers
from ember.train.step import TrainOutput

log = logging.getLogger("ember")


class Learner:
    """A configured training run, built by `LearnerBuilder.build`. Call `fit` once."""

    def __init__(self, **options: Any) -> None:
        self.model: torch.nn.Module = options["model"]
        self.optim: Optimization = options["optimization"]
        self.optimizer = self.optim.optimizer
        self.device: torch.device = options["device"]
        self.devices: list[torch.device] | None = options["devices"]
        self.distributed_timeout: float = options["distributed_timeout"]
        self.dist: Distributed | None = None
        self._ddp: Any = None
        self.artifact_dir: Path = options["artifact_dir"]
        self.overwrite: bool = options["overwrite"]
        self.num_epochs: int = options["num_epochs"]
        self.metrics: dict[str, list[tuple[Any, bool]]] = options["metrics"]
        self.loggers: dict[str, list[Any]] = options["loggers"]
        self.renderer: Any = options["renderer"]
        self.grads_accumulation: int = options["grads_accumulation"]
        self.checkpointer: FileCheckpointer | None = options["checkpointer"]
        self.resume_from: int | str | None = options["resume_from"]
        self.interrupter: Interrupter = options["interrupter"]
        self.listeners: list[Any] = options["listeners"]
        self.application_log: bool = options["application_log"]
        self.summary: bool = options["summary"]
        self.early_stopping: Any = options["early_stopping"]
        self.guard = LossGuard(
            options["nonfinite_loss"], self.device, last_checkpoint=self._last_checkpoint
        )
        self.on_checkpoint_error: str = options["on_checkpoint_error"]
        self.history: list[tuple[int, dict[str, dict[str, float]]]] = []
        self.epoch = 0
        self.iteration = 0
        self.items = 0
        self._resume_lines: dict[str, int] | None = None
        self._move = self.device.type != "cpu"  # batches from a DataLoader are on the CPU
        self.outcome: str | None = None
        """After `fit`: "completed", "stopped: <why>" or "stopped early: <why>"."""

    # The loop ------------------------------------------------------------------
    def fit(
        self,
        train: Iterable[Any],
        valid: Iterable[Any] | None = None,
        *,
        restore_best: bool = False,
    ) -> torch.nn.Module:
        """Train for the configured epochs and return the trained model (with
        `restore_best=True`, the weights of the best epoch kept by the checkpointing
        strategy's metric)."""
        self.dist = setup(self.devices, self.distributed_timeout)
        main = self.dist is None or self.dist.main
        lock = RunLock(self.artifact_dir) if main else None
        failed = True
        try:
            if lock is not None:
                prepare_artifact_dir(self.artifact_dir, None, overwrite=True, check_only=True)
                lock.acquire()
            model = self._fit_locked(train, valid, restore_best)
            failed = False
            return model
        except BaseException as error:
            waits = (
                isinstance(error, Exception) and self.dist is not None and bool(self.dist.children)
            )
            report = self.dist.failures(wait=5.0 if waits else 0.0) if self.dist is not None else ""
            if report:
                raise TrainingError(
                    f"Training stopped because another rank failed. {report}"
                ) from error
            raise
        finally:
            if lock is not None:
                lock.release()
            if self.dist is not None:
                self.dist.close(failed)

    def _fit_locked(
        self, train: Iterable[Any], valid: Iterable[Any] | None, restore_best: bool
    ) -> torch.nn.Module:
        dist = self.dist
        main = dist is None or dist.main
        position = self._resume_position()
        if main:
            prepare_artifact_dir(self.artifact_dir, position.kept_epochs(), self.overwrite)
            if self.checkpointer is not None:
                remove_stale_temporaries(self.checkpointer.directory)
        app_log = FileApplicationLogger(self.artifact_dir / "experiment.log")
        if self.application_log and main:
            app_log.install()
        loggers = {
            split: [FileMetricLogger(self.artifact_dir / split), *extra] if main else []
            for split, extra in self.loggers.items()
        }
        if not main:
            self.renderer = SilentRenderer()
        self.processor = MetricsProcessor(self.metrics, loggers, self.renderer, self.num_epochs)
        if dist is not None:
            self._ddp = self._prepare_distributed(train, valid)
            dist.barrier()  # rank 0 has prepared the artifact directory
        reason = "failed"
        try:
            with signal_handlers(self.interrupter):
                self._restore(position)
                info = run_info(self, position.epoch)
                log.info("%s", describe_run(self, info))
                if position.epoch > self.num_epochs:
                    log.warning(
                        "The checkpoint is at the end of epoch %d and num_epochs is %d: nothing is "
                        "left to train, the trained model is returned as it is. Raise num_epochs "
                        "to train further.",
                        position.epoch - 1,
                        self.num_epochs,
                    )
                elif valid is not None:
                    self._preflight_valid(valid)
                self.renderer.start(info)
                self._emit(Start(position.epoch, self.num_epochs, str(self.artifact_dir)))
                reason = self._epochs(train, valid, position)
            self.outcome = reason
            log.info("Training %s after epoch %d.", reason, self.epoch)
            if restore_best:
                self._restore_best()
            if self.summary and (self.dist is None or self.dist.main):
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
            self._close(loggers, reason)
            app_log.uninstall()
        return self.model

    def _epochs(self, train: Iterable[Any], valid: Iterable[Any] | None, start: Position) -> str:
        for epoch in range(start.epoch, self.num_epochs + 1):
            self.epoch = epoch
            skip = start if epoch == start.epoch else Position(epoch)
            if not self._train_epoch(epoch, train, skip):
                self._save_checkpoint(
                    Position(epoch, self.iteration, self.items, False), self.processor.line_counts()
                )
                return f"stopped: {self.interrupter.message or 'stop requested on another rank'}"
            if valid is not None:
                self._valid_epoch(epoch, valid)
            reason = self._end_epoch(epoch)
            if reason is not None:
                return reason
        return "completed"

    def _train_epoch(self, epoch: int, loader: Iterable[Any], start: Position) -> bool:
        """Train one epoch (from `start` when resuming mid-epoch); False if stopped."""
        model, optim, guard, checkpointer, dist = (
            self.model,
            self.optim,
            self.guard,
            self.checkpointer,
            self.dist,
        )
        model.train()
        shard = (dist.rank, dist.world) if dist is not None else None
        total, skipped = set_epoch(loader, epoch, start.items, start.iteration, shard)
        plan = _plan(loader) if dist is not None else None
        self.processor.start_split("train", epoch, total, start.iteration + 1)
        if dist is None or dist.main:
            resume_logs(
                self.processor, self.artifact_dir, epoch, start.iteration, self._resume_lines
            )
        step = self._ddp if self._ddp is not None else model.train_step
        world = dist.world if dist is not None else 1
        iteration, self.items, stop = start.iteration, start.items, False
        with _join(self._ddp):
            for group in _groups(
                loader, self.grads_accumulation, 0 if skipped else start.iteration
            ):
                lr = optim.begin_group()
                sizes = [_batch_size(batch) for batch in group]
                first = iteration - start.iteration  # this run's index of the group's first batch
                group_items = (
                    sum(sizes) or len(group)
                    if plan is None
                    else plan.global_items(first, len(group))
                )
                finite = True
                for index, (batch, size) in enumerate(zip(group, sizes)):
                    iteration += 1
                    self.iteration = iteration
                    self.items += size if plan is None else plan.global_items(first + index)
                    if self._move:
                        batch = to_device(batch, self.device)
                    with _no_sync(self._ddp, index < len(group) - 1):
                        with optim.autocast():
                            output = _call_step(step, batch, "train_step", epoch, iteration)
                        if iteration == start.iteration + 1:
                            self._check_output(output)
                        finite = guard.check(output.loss, epoch, iteration) and finite
                        optim.backward(output.loss, (size or 1) * world / group_items)
                    self.processor.update(output.item, iteration, size, lr)
                    if self.listeners:
                        self._emit(ProcessedItem("train", epoch, iteration, total, output.item, lr))
                if finite:
                    optim.step()
                else:
                    optim.skip()
                    log.warning(
                        "Skipped the optimizer step at epoch %d, iteration %d: non-finite loss.",
                        epoch,
                        iteration,
                    )
                stop = self.interrupter.should_stop()
                if (
                    plan is not None and dist is not None
                ):  # all ranks stop at one step, while all have batches
                    stop = (
                        dist.any(stop)
                        if first + self.grads_accumulation <= plan.min_batches
                        else False
                    )
                if stop:
                    break
                if checkpointer is not None and checkpointer.failed:
                    self._save_checkpoint_failed_in_background()
        guard.flush()
        if iteration == start.iteration:
            raise TrainingError(f"The training data loader yielded no batch in epoch {epoch}.")
        if stop and iteration != total:
            self.processor.sync(dist)  # the logs hold every finished iteration
            return False
        self._aggregates = {"train": self.processor.end_split(dist)}
        return True

    def _valid_epoch(self, epoch: int, loader: Iterable[Any]) -> None:
        """Validate (eval mode, inference mode); a graceful stop waits for its end."""
        model, dist = self.model, self.dist
        total, _ = set_epoch(
            loader, epoch, 0, 0, (dist.rank, dist.world) if dist is not None else None
        )
        self.processor.start_split("valid", epoch, total)
        model.eval()
        try:
            with torch.inference_mode(), self.optim.autocast():
                for iteration, batch in enumerate(loader, start=1):
                    if self._move:
                        batch = to_device(batch, self.device)
                    item = _call_step(model.valid_step, batch, "valid_step", epoch, iteration)
                    self.processor.update(item, iteration, _batch_size(batch), None)
                    if self.listeners:
                        self._emit(ProcessedItem("valid", epoch, iteration, total, item, None))
                self._aggregates["valid"] = self.processor.end_split(dist)
        finally:
            model.train()

    def _end_epoch(self, epoch: int) -> str | None:
        """Log the epoch, checkpoint it, ask early stopping; return a reason to stop."""
        for split, values in self._aggregates.items():
            if values:
                text = ", ".join(f"{name} {value:.6g}" for name, value in values.items())
                log.info("Epoch %d %s: %s", epoch, split, text)
        self.history.append((epoch, self._aggregates))
        self._save_checkpoint(Position(epoch, self.iteration, self.items, True))
        self._emit(EndEpoch(epoch, self._aggregates))
        stop = self.interrupter.should_stop()
        if self.dist is not None:
            stop = self.dist.any(stop)
        if stop:
            return f"stopped: {self.interrupter.message or 'stop requested on another rank'}"
        if self.early_stopping is not None:
            reason = self.early_stopping.should_stop(self.history)
            if reason is not None:
                log.info("Early stopping after epoch %d: %s.", epoch, reason)
                return f"stopped early: {reason}"
        return None

    # Checkpoints ---------------------------------------------------------------
    def _save_checkpoint(self, position: Position, lines: dict[str, int] | None = None) -> None:
        if self.checkpointer is None:
            return
        rng = capture_rng_state()
        learner: dict[str, Any] = {**position.state(), "rng": rng, "history": self.history}
        if lines is not None:
            learner["log_lines"] = lines
        if self.dist is not None:
            learner["rng_ranks"] = self.dist.all_gather(rng)
            if not self.dist.main:
                return
        state = {**self.optim.state_dict(), "learner": learner}
        what = f"epoch {position.epoch}" + (
            "" if position.complete else f", iteration {position.iteration}"
        )

        def saved(paths: list[Path]) -> None:
            log.info("Checkpoint of %s written: %s", what, ", ".join(p.name for p in paths))

        try:
            self.checkpointer.save(
                position.epoch, self.model, self.optimizer, state, self.history, saved
            )
            if not position.complete:
                self.checkpointer.wait()
        except Exception as error:
            self._checkpoint_failed(error)

    def _save_checkpoint_failed_in_background(self) -> None:
        try:
            self.checkpointer.wait()  # type: ignore[union-attr]
        except Exception as error:
            self._checkpoint_failed(error)

    def _last_checkpoint(self) -> str:
        if self.checkpointer is None:
            return "No checkpoint is written (no file checkpointer)"
        try:
            self.checkpointer.wait()
        except Exception:
            pass
        epochs = self.checkpointer.epochs()
        if not epochs:
            return "No checkpoint was written yet"
        path = self.checkpointer.path("model", epochs[-1])
        return f"The last good checkpoint is {path} (resume with checkpoint({epochs[-1]}))"

    def _checkpoint_failed(self, error: Exception) -> None:
        kept = self.checkpointer.epochs() if self.checkpointer else []
        last = (
            f"the last complete checkpoint is epoch {kept[-1]}"
            if kept
            else "no complete checkpoint exists"
        )
        message = f"Writing a checkpoint failed ({type(error).__name__}: {error}); {last}."
        if self.on_checkpoint_error == "warn":
            log.error("%s Training goes on (on_checkpoint_error='warn').", message)
            return
        raise TrainingError(
            message + " Free disk space or fix permissions, then resume with checkpoint('latest')."
        ) from error

    def _resume_position(self) -> Position:
        if self.resume_from is None or self.checkpointer is None:
            return Position(1, fresh=True)
        epochs = self.checkpointer.epochs()
        epoch = epochs[-1] if self.resume_from == "latest" and epochs else self.resume_from
        state = self.checkpointer.load(int(epoch), "scheduler", None)
        self._resume_state = state
        return Position.from_state(state["learner"], self.num_epochs)

    def _restore(self, position: Position) -> None:
        state = getattr(self, "_resume_state", None)
        if state is None or self.checkpointer is None:
            return
        saved_epoch = int(state["learner"]["epoch"])
        self.checkpointer.load(saved_epoch, "model", self.model)
        self.checkpointer.load(saved_epoch, "optim", self.optimizer)
        self.optim.load_state_dict(state)
        ranks = state["learner"].get("rng_ranks")
        if self.dist is not None and ranks is not None and len(ranks) == self.dist.world:
            restore_rng_state(ranks[self.dist.rank])
        else:
            restore_rng_state(state["learner"]["rng"])
        self._resume_lines = state["learner"].get("log_lines")
        self.history = [(int(e), a) for e, a in state["learner"].get("history", [])]
        where = f"epoch {saved_epoch}" + (
            "" if position.iteration == 0 else f", iteration {position.iteration}"
        )
        log.info("Resumed from the checkpoint of %s.", where)

    def _restore_best(self) -> None:
        strategy = _find_metric_strategy(getattr(self.checkpointer, "strategy", None))
        if strategy is None or self.checkpointer is None:
            raise TrainingError(
                "restore_best=True needs a file checkpointer with a MetricCheckpointingStrategy "
                "(the default strategy keeps the best epoch by validation loss)."
            )
        self.checkpointer.wait()
        if self.dist is not None:
            self.dist.barrier()
        best = strategy.best_epoch(self.history)
        if best is not None:
            self.checkpointer.load(best, "model", self.model)
            log.info(
                "Restored the weights of epoch %d, best %s %s.", best, strategy.split, strategy.name
            )

    # Helpers -------------------------------------------------------------------
    def _prepare_distributed(self, train: Iterable[Any], valid: Iterable[Any] | None) -> Any:
        """Check that the loaders can be sharded exactly; wrap the model in DDP."""
        for name, loader in (("training", train), ("validation", valid)):
            if loader is None:
                continue
            sampler = find_sampler(loader)
            if sampler is None or not callable(getattr(sampler, "shard", None)):
                raise TrainingError(
                    f"Training on several processes needs the {name} data loader to be built "
                    "with ember.data.DataLoaderBuilder: its sampler gives each process its "
                    "exact share of every epoch (no sample dropped or counted twice)."
                )
        for split, entries in self.metrics.items():
            for metric, _ in entries:
                whole_epoch = callable(getattr(metric, "epoch_value", None))
                mergeable = callable(getattr(metric, "merge_epoch_states", None))
                if whole_epoch and not mergeable and not getattr(metric, "syncs_itself", False):
                    log.warning(
                        "%s (%s) computes its epoch value from the whole epoch: under several "
                        "processes it covers rank 0's share of the data only.",
                        metric.name,
                        split,
                    )
        return wrap(self.model, self.dist)  # type: ignore[arg-type]

    def _preflight_valid(self, loader: Iterable[Any]) -> None:
        """Run one validation batch before training, so that a valid_step or a validation
        metric that cannot work fails now, not after an epoch. RNGs are left untouched."""
        if not self.metrics.get("valid"):
            return
        rng = capture_rng_state()
        try:
            self.model.eval()
            with torch.inference_mode(), self.optim.autocast():
                for batch in loader:
                    item = _call_step(
                        self.model.valid_step, to_device(batch, self.device), "valid_step", 0, 1
                    )
                    self.processor.check("valid", item)
                    break
        finally:
            self.model.train()
            restore_rng_state(rng)

    def _check_output(self, output: Any) -> None:
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

    def _print_summary(self) -> None:
        from ember.train.summary import LearnerSummary

        table = LearnerSummary.from_dir(self.artifact_dir).table()
        print(table)
        log.info("%s", table)

    def _close(self, loggers: dict[str, list[Any]], reason: str) -> None:
        """Release everything; an error here is logged, never allowed to hide the
        error that ended the run."""
        steps: list[tuple[str, Any]] = []
        if self.checkpointer is not None:
            steps.append(("the last checkpoint could not be written", self.checkpointer.wait))
        for split_loggers in loggers.values():
            for logger in split_loggers:
                steps.append((f"closing {type(logger).__name__} failed", logger.close))
        steps.append(("a listener failed at the end", lambda: self._emit(End(self.epoch, reason))))
        steps.append(("the renderer failed at the end", lambda: self.renderer.end(reason)))
        for what, step in steps:
            try:
                step()
            except Exception as error:
                log.error("%s: %s", what, error)

    def _emit(self, event: Any) -> None:
        for listener in self.listeners:
            listener.on_event(event)


def _groups(loader: Iterable[Any], size: int, drop: int) -> Iterator[list[Any]]:
    """Batches in groups of `size` (one optimizer step each; the last may be shorter),
    after dropping `drop` batches (a resumed run whose sampler cannot skip)."""
    batches = iter(loader)
    for _ in itertools.islice(batches, drop):
        pass
    while True:
        group = list(itertools.islice(batches, size))
        if not group:
            return
        yield group


def _plan(loader: Any) -> BatchPlan:
    sampler = find_sampler(loader)
    return BatchPlan(sampler.shard_lengths(), int(loader.batch_size), bool(loader.drop_last))


def _join(ddp: Any) -> Any:
    """DDP's Join context: ranks with fewer batches keep answering the others' reductions."""
    if ddp is None:
        return contextlib.nullcontext()
    from torch.distributed.algorithms.join import Join

    return Join([ddp])


_NULL = contextlib.nullcontext()


def _no_sync(ddp: Any, accumulate: bool) -> Any:
    """Skip DDP's gradient reduction on all but the last batch of a group."""
    return ddp.no_sync() if ddp is not None and accumulate else _NULL


def _find_metric_strategy(strategy: Any) -> Any:
    from ember.train.checkpoint.strategy import (
        ComposedCheckpointingStrategy,
        MetricCheckpointingStrategy,
    )

    if isinstance(strategy, MetricCheckpointingStrategy):
        return strategy
    if isinstance(strategy, ComposedCheckpointingStrategy):
        for inner in strategy.strategies:
            found = _find_metric_strategy(inner)
            if found is not None:
                return found
    return None


def _batch_size(batch: Any) -> int:
    return first_dim(batch) or 0


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
