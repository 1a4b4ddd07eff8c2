"""The weights of a finished (or stopped) run's checkpoint, loaded into a model by
naming the checkpoint: `load_checkpoint(directory, model, "best")`.

Everything is found from the run's files, no path built by hand: the checkpoints
are those of `checkpoint/` (any recorder's: a record says its format in its own
bytes, and nothing is unpickled), the best one is read from `history.jsonl` (the
exact epoch values), and a checkpoint written in shards by several processes (FSDP's
`sharded_checkpoints`) is joined from its files.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ember.errors import ConfigError, TrainingError
from ember.train.checkpoint.file import FileCheckpointer
from ember.train.checkpoint.shards import load_whole
from ember.train.checkpoint.strategy import MetricCheckpointingStrategy
from ember.train.files.artifacts import Artifacts, checkpoint_epochs
from ember.train.history import RunHistory

__all__ = ["load_checkpoint", "run_checkpoints"]

LAST = ("last", "latest")


class _AnyRecord:
    """Reads the records of one extension, whichever recorder wrote them (each record
    says its format in its bytes); a `FileCheckpointer` reads the run's parts with it."""

    def __init__(self, extension: str) -> None:
        self.file_extension = extension

    def load(self, target: Any, path: str | os.PathLike[str]) -> Any:
        from ember.record import load  # (lazy: `import ember.train` reads no record)

        return load(target, path)

    def save(self, item: Any, path: Any, *, kind: Any = None) -> Any:
        raise TrainingError("A run's checkpoints are read here, never written.")


def run_checkpoints(directory: str | os.PathLike[str]) -> FileCheckpointer:
    """The checkpoints of the run in `directory`, read with the format they were
    written in; a `TrainingError` when it has none (or those of several recorders)."""
    from ember.record.file_recorder import EXTENSIONS

    folder = Artifacts(directory).checkpoints
    found = {ext: checkpoint_epochs(folder, "scheduler", ext) for ext in EXTENSIONS}
    written = {ext: epochs for ext, epochs in found.items() if epochs}
    if not written:
        raise TrainingError(
            f"{directory} holds no checkpoint ({folder} has none): the run was made without "
            "a checkpointer. Train with LearnerBuilder(...).with_file_checkpointer(recorder)."
        )
    if len(written) > 1:
        kinds = "; ".join(f".{ext}: epochs {epochs}" for ext, epochs in written.items())
        raise TrainingError(
            f"{folder} holds the checkpoints of several recorders ({kinds}): keep those of "
            "one, or load one file with its recorder (recorder.load(model, path))."
        )
    (extension,) = written
    return FileCheckpointer(folder, _AnyRecord(extension), asynchronous=False)


def choose(
    directory: str | os.PathLike[str],
    checkpointer: FileCheckpointer,
    checkpoint: int | str,
    best_by: Any,
) -> tuple[int, str]:
    """The epoch `checkpoint` names among the complete checkpoints, and why, in words
    ("the best by the lowest valid Loss", "the last", "epoch 3")."""
    saved = checkpointer.epochs()
    listing = ", ".join(map(str, saved)) or "none"
    if isinstance(checkpoint, bool) or not isinstance(checkpoint, (int, str)):
        raise ConfigError(
            f"checkpoint= takes 'best', 'last' or an epoch number, got {checkpoint!r}."
        )
    if isinstance(checkpoint, int):
        if checkpoint not in saved:
            raise TrainingError(
                f"{directory} has no complete checkpoint of epoch {checkpoint}: the epochs "
                f"saved are {listing} (the checkpointing strategy keeps those)."
            )
        return checkpoint, f"epoch {checkpoint}"
    if checkpoint in LAST:
        if not saved:
            raise TrainingError(f"{directory} has no complete checkpoint.")
        return saved[-1], "the last"
    if checkpoint != "best":
        raise ConfigError(
            f"checkpoint= takes 'best', 'last' or an epoch number, got {checkpoint!r}."
        )
    strategy = best_by if callable(getattr(best_by, "best_epoch", None)) else None
    if strategy is None:
        strategy = MetricCheckpointingStrategy(best_by)
    path = Artifacts(directory).saved_history
    if path is None:
        raise TrainingError(
            f"{directory} has no history.jsonl, which holds the epoch values the best "
            "checkpoint is chosen by: pass checkpoint='last' or an epoch number."
        )
    entries = RunHistory.load(path).entries()
    kept = [(epoch, values) for epoch, values in entries if epoch in saved]
    best = strategy.best_epoch(kept)
    if best is None:
        recorded = sorted({f"{s} {m}" for _, values in entries for s in values for m in values[s]})
        raise TrainingError(
            f"No saved epoch of {directory} (epochs {listing}) has the value that {strategy} "
            f"is chosen by: the run recorded {', '.join(recorded) or 'no metric'}. Choose by "
            "one it recorded, e.g. best_by='Loss' (the lowest valid Loss) or "
            "best_by=MetricCheckpointingStrategy(AccuracyMetric(), direction='highest'); "
            "or pass checkpoint='last' or an epoch number."
        )
    return best, f"the best by {strategy}"


def load_checkpoint(
    directory: str | os.PathLike[str],
    model: torch.nn.Module,
    checkpoint: int | str = "best",
    *,
    best_by: Any = "Loss",
) -> int:
    """Load into `model` the weights of a checkpoint of the run in `directory`;
    return its epoch.

    `checkpoint`: "best" (the default), "last" or an epoch number. The best is the
    saved epoch with the best value of `best_by` in the run's history: a metric (or
    its name), the lowest validation value being the best (the default, "Loss", is the
    choice of the default checkpointing strategy), or a checkpointing strategy, whose
    `best_epoch` chooses (e.g. `MetricCheckpointingStrategy(AccuracyMetric(),
    direction="highest")`)."""
    checkpointer = run_checkpoints(directory)
    epoch, _ = choose(directory, checkpointer, checkpoint, best_by)
    load_epoch(checkpointer, epoch, model)
    return epoch


def load_epoch(checkpointer: FileCheckpointer, epoch: int, model: torch.nn.Module) -> None:
    """The weights of `epoch` into `model`: its model part, or joined from the shards
    several processes wrote."""
    learner = checkpointer.load(epoch, "scheduler", None).get("learner", {})
    if isinstance(learner, dict) and learner.get("shards") is not None:
        load_whole(checkpointer, epoch, model, None)
    else:
        checkpointer.load(epoch, "model", model)
