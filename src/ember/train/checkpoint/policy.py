"""The checkpoint policy of one run: when to save, what to resume, which epoch is best,
and what a failed write does. The loop makes one call at each point; the checkpointer
stores, the strategy chooses what to keep, and this class joins them."""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Mapping, Sequence

import torch

from ember.errors import RunRecordError, TrainingError
from ember.lr.base import ConstantLr
from ember.rng import capture_rng_state, restore_rng_state
from ember.train.checkpoint.base import Checkpointer
from ember.train.checkpoint.resume import Resume, resume_point
from ember.train.checkpoint.shards import load_whole
from ember.train.checkpoint.strategy import CheckpointingStrategy, apply_retention
from ember.train.history import RunHistory
from ember.train.length.position import Position

log = logging.getLogger(__name__)


def _takes_before_write(checkpointer: Checkpointer | None) -> bool:
    """Whether `checkpointer.save` takes `before_write` by name (`Checkpointer.save`)."""
    if checkpointer is None:
        return False
    try:
        parameters = inspect.signature(checkpointer.save).parameters
    except (TypeError, ValueError):
        return False
    return "before_write" in parameters


class CheckpointPolicy:
    """Saves at each epoch end and when a run stops mid-epoch; resumes from
    `resume_from` (an epoch, "latest", or "auto": "latest" when a checkpoint exists, else
    a fresh run); restores the best epoch on request. With no
    checkpointer, every call is a no-op (and resuming is refused by the builder)."""

    def __init__(
        self,
        checkpointer: Checkpointer | None,
        strategy: CheckpointingStrategy | None,
        resume_from: int | str | None,
        on_error: str,
        history: RunHistory,
        hyperparameters: str = "checkpoint",
    ) -> None:
        self.checkpointer = checkpointer
        self.hyperparameters = hyperparameters
        self.strategy = strategy
        self.resume_from = resume_from
        self.on_error = on_error
        self.history = history
        self.data: dict[str, Any] | None = None
        """What each checkpoint notes of the training data (`BatchPlanner.data_state`),
        for a mid-epoch resume to tell when the data changed."""
        self.loader_state: Callable[[bool], Any] | None = None
        """What each checkpoint notes of the training loader's position and random
        states, per process (`BatchPlanner.loader_state`; True: at an epoch's end)."""
        self.layout: dict[str, int | None] | None = None
        """How the run deals each step's samples (`Layout.state`, with its processes)."""
        self.streams: Callable[[], list[tuple[int, Any]]] | None = None
        """The random streams of the layout's columns this process runs (None: they are
        not kept apart)."""

    # Resuming -----------------------------------------------------------------------
    def resume_point(self) -> Resume:
        """Where the run starts: after the chosen checkpoint, or epoch 1. "latest" is the
        newest checkpoint that loads: a damaged newer one is skipped, and said so."""
        return resume_point(self.checkpointer, self.resume_from)

    def restore(self, resume: Resume, model: torch.nn.Module, optim: Any, dist: Any) -> list[str]:
        """Put the model, optimizer, schedules and random generators back as saved; return
        what a user should read in the log (the first line says where the run resumes).
        Another optimizer class than the checkpoint's is refused before anything loads;
        changed hyperparameters follow `hyperparameters` ("checkpoint": its values win,
        "new": this run's values win) and every difference is listed."""
        state = resume.state
        if state is None or self.checkpointer is None:
            return []
        learner = state["learner"]
        saved_epoch = int(learner["epoch"])
        optimizer = optim.optimizer
        saved_class = learner.get("optimizer")
        if saved_class is not None and saved_class != type(optimizer).__name__:
            raise TrainingError(
                f"The checkpoint of epoch {saved_epoch} was written by a run with "
                f"{saved_class} and this run uses {type(optimizer).__name__}: resume with "
                f"{saved_class}, or start a new run (LearnerBuilder(dir, overwrite=True))."
            )
        given = _settings(optimizer, optim.lr.scheduler)
        self._load_weights(saved_epoch, model, optimizer, dist, learner.get("shards"))
        callback_notes = optim.load_state_dict(state) or []
        saved = _settings(optimizer, optim.lr.scheduler)
        restore_rng_state(self.saved_rng(resume, dist))
        where = f"epoch {saved_epoch}" + (
            "" if resume.position.iteration == 0 else f", iteration {resume.position.iteration}"
        )
        notes = [f"Resumed from the checkpoint of {where}.", *callback_notes]
        changed = [
            f"{key} {given[key]!r} (checkpoint {saved[key]!r})"
            for key in given
            if key in saved and given[key] != saved[key]
        ]
        if changed:
            if self.hyperparameters == "new":
                _apply(optimizer, optim.lr.scheduler, given)
                notes.append(
                    "This run's hyperparameters replace the checkpoint's "
                    f"(hyperparameters='new'): {'; '.join(changed)}."
                )
            else:
                notes.append(
                    "The checkpoint's hyperparameters are kept over this run's: "
                    f"{'; '.join(changed)}. Pass checkpoint(..., hyperparameters='new') to "
                    "train on with this run's."
                )
        return notes

    def saved_rng(self, resume: Resume, dist: Any) -> dict[str, Any]:
        """This process's random states in the resumed checkpoint (with what it noted
        of the training loader, under "loader")."""
        learner = resume.state["learner"] if resume.state is not None else {}
        ranks = learner.get("rng_ranks")
        if dist is not None and ranks is not None and len(ranks) == dist.world:
            return ranks[dist.rank]  # type: ignore[no-any-return]
        return learner.get("rng", {})  # type: ignore[no-any-return]

    # Saving -------------------------------------------------------------------------
    def save(
        self,
        position: Position,
        model: torch.nn.Module,
        optim: Any,
        dist: Any,
        lines: dict[str, int] | None = None,
        metric_states: dict[str, Any] | None = None,
        before_write: Callable[[], None] | None = None,
        checks: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        """Checkpoint `position`: at an epoch end in the background, mid-epoch (a stop)
        waiting for the write. Every process takes part (random generator states).
        `before_write` (one process) is called once the snapshot is taken, before the
        write: at once when the checkpointer does not take it. `checks` gives, once the
        counted lines are written, each open metric log's last check, which the
        checkpoint notes (`log_checks`) and a resume compares."""
        if before_write is not None and not _takes_before_write(self.checkpointer):
            before_write()
            before_write = None
        if self.checkpointer is None:
            return
        rng = capture_rng_state()
        if self.loader_state is not None:
            loader = self.loader_state(position.complete)
            if loader is not None:
                rng["loader"] = loader
        learner: dict[str, Any] = {
            **position.state(),
            "rng": rng,
            "optimizer": type(optim.optimizer).__name__,
        }
        if lines is not None:
            learner["log_lines"] = lines
        if self.data is not None:
            learner["data"] = dict(self.data)
        if self.layout is not None:
            learner["layout"] = dict(self.layout)
        if self.streams is not None:  # every column's stream, from the processes that run it
            local = self.streams()
            parts = dist.all_gather(local) if dist is not None else [local]
            found = {column: stream for part in parts for column, stream in part}
            learner["columns"] = [found[column] for column in sorted(found)]
        mark = self.history.mark()
        if mark is not None:  # the history's lines now: a resume from here finds them all
            learner["history_mark"] = list(mark)
        if metric_states is not None:  # every rank's share of the epoch so far
            learner["metric_states"] = (
                dist.all_gather(metric_states) if dist is not None else [metric_states]
            )
        optimizer = optim.optimizer
        sharding = getattr(dist, "sharding", None)
        if sharding is not None:  # the ranks send their shards to rank 0, or write them
            model, optimizer, shards = sharding.states(self.checkpointer, position.epoch)
            if shards is not None:
                learner["shards"] = shards
        if dist is not None:
            learner["rng_ranks"] = dist.all_gather(rng)
            if not dist.main:
                return
        state = {**optim.state_dict(), "learner": learner}

        def noted_checks() -> dict[str, Any]:  # each log's last counted line's check
            found = checks() if checks is not None else {}
            return {"log_checks": {name: f"{c:08x}" for name, c in found.items()}} if found else {}

        if before_write is None:
            state.update(noted_checks())  # the lines are written already
        what = f"epoch {position.epoch}" + (
            "" if position.complete else f", iteration {position.iteration}"
        )
        checkpointer, strategy, history = self.checkpointer, self.strategy, self.history
        entries = history.entries()

        def saved(names: list[str]) -> None:  # in the writer's thread, after the write
            log.info("Checkpoint of %s written: %s", what, ", ".join(names))
            kept = (
                apply_retention(checkpointer, strategy, entries)
                if strategy is not None
                else checkpointer.epochs()
            )
            history.set_checkpoints(kept)

        called: list[BaseException | None] = []  # before_write ran (and what it raised)

        def before() -> dict[str, Any]:
            assert before_write is not None
            called.append(None)
            try:
                before_write()
                return noted_checks()
            except BaseException as error:
                called[0] = error  # its own failure, not a failed write
                raise

        try:
            if before_write is None:
                checkpointer.save(position.epoch, model, optimizer, state, on_saved=saved)
            else:
                save: Any = checkpointer.save
                save(position.epoch, model, optimizer, state, on_saved=saved, before_write=before)
            if not position.complete:
                checkpointer.wait()
        except Exception as error:
            if called and error is called[0]:
                raise
            if before_write is not None and not called:
                before_write()  # the snapshot failed: the lines are written all the same
            self._failed(error)

    def finish(self) -> None:
        """The end of training: the last checkpoint is on disk, or its failure is handled
        like any other (the run fails, naming the last complete checkpoint)."""
        if self.checkpointer is not None:
            try:
                self.checkpointer.wait()
            except Exception as error:
                self._failed(error)

    def check(self) -> None:
        """Surface a background write's failure (stop, or log with "warn")."""
        if self.checkpointer is not None and self.checkpointer.failed:
            try:
                self.checkpointer.wait()
            except Exception as error:
                self._failed(error)

    def wait(self) -> None:
        """Block until the last write is done (raises its error)."""
        if self.checkpointer is not None:
            self.checkpointer.wait()

    def last_good(self) -> str:
        """A sentence naming the newest complete checkpoint, for error messages."""
        if self.checkpointer is None:
            return "No checkpoint is written (no checkpointer)"
        try:
            self.checkpointer.wait()
        except Exception:
            pass
        epoch = self.checkpointer.latest()
        if epoch is None:
            return "No checkpoint was written yet"
        return (
            f"The last good checkpoint is {self.checkpointer.location(epoch)} "
            f"(resume with checkpoint({epoch}))"
        )

    def _failed(self, error: Exception) -> None:
        latest = self.checkpointer.latest() if self.checkpointer is not None else None
        last = (
            f"the last complete checkpoint is epoch {latest}"
            if latest is not None
            else "no complete checkpoint exists"
        )
        if isinstance(error, RunRecordError):  # the history, in the writer's thread
            message = f"{error} The checkpoint was written; {last}."
        else:
            message = f"Writing a checkpoint failed ({type(error).__name__}: {error}); {last}."
        if self.on_error == "warn":
            log.error("%s Training goes on (on_checkpoint_error='warn').", message)
            return
        then = (
            "resume with checkpoint('latest')"
            if latest is not None
            else "start the run again with LearnerBuilder(dir, overwrite=True)"
        )
        raise TrainingError(
            f"{message} Free disk space or fix permissions, then {then}."
        ) from error

    # The best epoch -----------------------------------------------------------------
    def check_restore_best(self, metrics: Mapping[str, Sequence[Any]] | None = None) -> None:
        """Before training: `fit(restore_best=True)` needs a checkpointer and a strategy
        that names a best epoch among this run's metrics (`metrics`: the registered
        metrics per split, each with a `name`)."""
        if self.checkpointer is None or self.strategy is None:
            raise TrainingError(
                "restore_best=True restores a saved epoch, but no checkpointer is set: add "
                "with_file_checkpointer(recorder) (its default strategy keeps the best epoch "
                "by validation loss) or a checkpointing strategy that keeps a best epoch."
            )
        if metrics is None:
            return
        probe = [(1, {split: {e.name: 0.0 for e in entries} for split, entries in metrics.items()})]
        if self.strategy.best_epoch(probe) is None:
            registered = ", ".join(
                f"{split} {entry.name}" for split, entries in metrics.items() for entry in entries
            )
            raise TrainingError(
                f"restore_best=True: the checkpointing strategy ({self.strategy}) names no best "
                f"epoch among this run's metrics ({registered or 'none'}). Keep one with "
                "with_checkpointing_strategy(MetricCheckpointingStrategy(metric)) on a "
                "registered metric (the default does so for a validation Loss)."
            )

    def restore_best(self, model: torch.nn.Module, dist: Any) -> None:
        """Load the weights of the epoch the strategy holds to be the best."""
        self.check_restore_best()
        assert self.checkpointer is not None and self.strategy is not None
        self.checkpointer.wait()
        if dist is not None:
            dist.barrier()
        best = self.strategy.best_epoch(self.history.entries())
        if best is None:
            raise TrainingError(
                f"restore_best=True: the checkpointing strategy {type(self.strategy).__name__} "
                "names no best epoch (it keeps none, or its metric has no value that is not "
                "NaN). Use MetricCheckpointingStrategy(metric) to keep the best epoch; the "
                "trained weights are in the last checkpoint."
            )
        shards = self.checkpointer.load(best, "scheduler", None)["learner"].get("shards")
        self._load_weights(best, model, None, dist, shards)
        log.info(
            "Restored the weights of epoch %d, best by the checkpointing strategy (keeps %s).",
            best,
            self.strategy,
        )

    def _load_weights(
        self, epoch: int, model: Any, optimizer: Any, dist: Any, shards: int | None = None
    ) -> None:
        """Load the model (and the optimizer, if given) of `epoch`; a sharded model has
        them read on rank 0 and sent to every rank's shards. A checkpoint written in
        `shards` by that many processes is read from their files, by any number of
        processes: each reads the rows it holds (all of them for a whole model)."""
        checkpointer = self.checkpointer
        assert checkpointer is not None
        sharding = getattr(dist, "sharding", None)
        if shards is not None:  # each process reads the rows it needs from the shards
            if sharding is not None:
                sharding.load_shards(checkpointer, epoch, with_optimizer=optimizer is not None)
            else:
                load_whole(checkpointer, epoch, model, optimizer)
            return
        if sharding is not None:
            read = lambda epoch, part: checkpointer.load(epoch, part, None)
            sharding.load(read, epoch, with_optimizer=optimizer is not None)
            return
        checkpointer.load(epoch, "model", model)
        if optimizer is not None:
            checkpointer.load(epoch, "optim", optimizer)


_NOT_SETTINGS = ("params", "initial_lr")


def _settings(optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
    """The hyperparameters a run chose: each param group's (but the parameters), and a
    constant learning rate (other schedules own the rate)."""
    settings = {
        f"group {index} {key}" if len(optimizer.param_groups) > 1 else key: value
        for index, group in enumerate(optimizer.param_groups)
        for key, value in group.items()
        if key not in _NOT_SETTINGS and not (key == "lr" and not isinstance(scheduler, ConstantLr))
    }
    if isinstance(scheduler, ConstantLr):
        settings["lr"] = scheduler.lr
    return settings


def _apply(optimizer: torch.optim.Optimizer, scheduler: Any, settings: dict[str, Any]) -> None:
    """Write `settings` (from `_settings`) back into the param groups and the schedule."""
    single = len(optimizer.param_groups) == 1
    for index, group in enumerate(optimizer.param_groups):
        for key in list(group):
            name = key if single else f"group {index} {key}"
            if name in settings and key not in _NOT_SETTINGS:
                group[key] = settings[name]
    if isinstance(scheduler, ConstantLr) and "lr" in settings:
        scheduler.lr = float(settings["lr"])
