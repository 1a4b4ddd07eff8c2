"""`FileCheckpointer`: one record per part and epoch, e.g. `checkpoint/model-3.mpk.gz`.

A checkpoint is complete when its three parts exist. A new checkpoint of an epoch is
first written whole into `checkpoint/.epoch-N.next/` (the `scheduler` part, which also
holds the loop position and RNG states, last); only then do its parts replace the
epoch's (the old `scheduler` part removed first, the new one moved in last). While a
staged set is whole, it is the epoch's checkpoint, whatever has been moved out of it:
a kill at any instant leaves the previous checkpoint of the epoch (a mid-epoch one that
the next replaces, say) or the new one, never neither. The next write finishes a
replacement a kill interrupted, or drops a staged set that was cut short; reading
never writes.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from ember.durable import fsync_directory
from ember.errors import TrainingError
from ember.train.checkpoint.base import PARTS
from ember.train.checkpoint.strategy import CheckpointingStrategy, apply_retention
from ember.train.checkpoint.writer import AsyncWriter, Snapshots
from ember.train.files.artifacts import (
    checkpoint_epochs,
    checkpoint_path,
    checkpoint_shard_path,
    checkpoint_shards,
    checkpoint_staging,
    staged_checkpoints,
)
from ember.train.history import History

log = logging.getLogger(__name__)


class FileCheckpointer:
    """Saves and loads checkpoints with a recorder; writes happen in a background
    thread from a CPU snapshot, at most one pending at a time. With a `strategy`, it
    applies retention itself after each write (for hand-written loops; under the
    Learner the run's checkpoint policy does)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        recorder: Any,
        strategy: CheckpointingStrategy | None = None,
        asynchronous: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.recorder = recorder
        self.extension: str = recorder.file_extension
        self.strategy = strategy
        self._writer = AsyncWriter() if asynchronous else None
        self._snapshots = Snapshots()

    def path(self, part: str, epoch: int) -> Path:
        return checkpoint_path(self.directory, part, epoch, self.extension)

    def shard_path(self, part: str, epoch: int, rank: int) -> Path:
        """Where one process's shard of a part goes in a sharded checkpoint (FSDP)."""
        return checkpoint_shard_path(self.directory, part, epoch, rank, self.extension)

    def save_shard(self, epoch: int, rank: int, parts: dict[str, Any]) -> None:
        """Write this process's shard of each part of `epoch` now (`parts`: part name to
        state tree of tensors on the CPU). The checkpoint is complete once rank 0 has
        written its other parts, after every shard."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for part, tree in parts.items():
            self.recorder.save(tree, self.shard_path(part, epoch, rank), kind="state")

    def drop_shards(self, epoch: int) -> None:
        """Before `epoch` is written over a checkpoint written in shards (whole, or in
        shards by other processes): remove its last part, then the old shards."""
        shards = [
            shard
            for part in ("model", "optim")
            for shard in checkpoint_shards(self.directory, part, epoch, self.extension)
        ]
        if shards:
            self.path("scheduler", epoch).unlink(missing_ok=True)
            for shard in shards:
                shard.unlink(missing_ok=True)

    def load_shard(self, epoch: int, part: str, rank: int) -> Any:
        path = self.shard_path(part, epoch, rank)
        if not path.exists():
            raise TrainingError(
                f"The shard {path.name} of the checkpoint of epoch {epoch} is missing from "
                f"{self.directory}: the checkpoint is incomplete. Resume from another epoch."
            )
        return self.recorder.load(None, path)

    def save(
        self,
        epoch: int,
        model: Any,
        optimizer: Any,
        state: dict[str, Any],
        history: History = (),
        on_saved: Callable[[list[str]], None] | None = None,
        before_write: Callable[[], None] | None = None,
    ) -> None:
        """Snapshot the parts now; encode, write and apply retention in the background.

        The snapshot waits for the previous write first (its host buffers are reused),
        then for the copies of all three parts at once: one wait on an accelerator.
        `before_write` is called once the snapshot is taken, before the write starts."""
        self.wait()
        take = self._snapshots.take
        parts = [
            ("model", take("model", model.state_dict()), "module"),
            ("optim", take("optim", optimizer.state_dict()), _optimizer_kind(optimizer)),
            ("scheduler", take("scheduler", state), "state"),
        ]
        self._snapshots.wait()
        if before_write is not None:
            late = before_write()  # what is known once the counted lines are written
            if isinstance(late, dict) and late:
                part, tree, kind = parts[-1]
                parts[-1] = (part, {**tree, **late}, kind)
        history = list(history)

        def job() -> None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._settle()
            staged = checkpoint_staging(self.directory, epoch)
            staged.mkdir(exist_ok=True)
            try:
                for part, tree, kind in parts:  # the scheduler part last: the set is whole
                    self.recorder.save(tree, staged / self.path(part, epoch).name, kind=kind)
            except BaseException:
                shutil.rmtree(staged, ignore_errors=True)  # the checkpoint before it stays
                raise
            self._replace(epoch)
            if self.strategy is not None:
                apply_retention(self, self.strategy, history)
            if on_saved is not None:
                on_saved([self.path(part, epoch).name for part, _, _ in parts])

        if self._writer is None:
            job()
        else:
            self._writer.submit(job)

    @property
    def failed(self) -> bool:
        """A background write failed; `wait()` raises its error."""
        return self._writer is not None and self._writer.failed

    def wait(self) -> None:
        """Block until the pending write is on disk; raise its error if it failed."""
        if self._writer is not None:
            self._writer.wait()

    def _replace(self, epoch: int) -> None:
        """Move the whole staged set of `epoch` over its checkpoint: the old scheduler
        part goes first, the new one comes last (parts moved before a kill are skipped)."""
        staged = checkpoint_staging(self.directory, epoch)
        fsync_directory(staged)
        self.path("scheduler", epoch).unlink(missing_ok=True)
        for part in PARTS:
            source = staged / self.path(part, epoch).name
            if source.exists():
                os.replace(source, self.path(part, epoch))
        fsync_directory(self.directory)
        shutil.rmtree(staged, ignore_errors=True)

    def _settle(self) -> None:
        """Finish a replacement a kill interrupted (its staged set is whole); drop a staged
        set a kill cut short (the checkpoint it was to replace is still whole)."""
        for epoch, staged in staged_checkpoints(self.directory).items():
            if (staged / self.path("scheduler", epoch).name).exists():
                self._replace(epoch)
            else:
                shutil.rmtree(staged, ignore_errors=True)

    def _part(self, part: str, epoch: int) -> Path:
        """Where a part of `epoch` is read: from its staged set while that set is whole (a
        replacement under way, or cut short by a kill), else from the directory."""
        staged = checkpoint_staging(self.directory, epoch)
        if (staged / self.path("scheduler", epoch).name).exists():
            candidate = staged / self.path(part, epoch).name
            if candidate.exists():
                return candidate
        return self.path(part, epoch)

    def load(self, epoch: int, part: str, target: Any) -> Any:
        path = self._part(part, epoch)
        if not path.exists():
            available = self.epochs()
            listing = ", ".join(map(str, available)) if available else "none"
            raise TrainingError(
                f"No checkpoint {path.name} in {self.directory}: the epochs saved there are "
                f"{listing}. Pass one of them to checkpoint(), or start without checkpoint()."
            )
        return self.recorder.load(target, path)

    def latest(self) -> int | None:
        """The newest complete checkpoint's epoch, or None."""
        epochs = self.epochs()
        return epochs[-1] if epochs else None

    def location(self, epoch: int) -> str:
        return str(self.path("model", epoch))

    def __str__(self) -> str:
        return str(self.directory)

    def epochs(self) -> list[int]:
        """The epochs with a complete checkpoint (all three parts), oldest first."""
        found = set(checkpoint_epochs(self.directory, "scheduler", self.extension))
        found.update(staged_checkpoints(self.directory))
        return [
            epoch
            for epoch in sorted(found)
            if all(self._part(part, epoch).exists() for part in PARTS)
        ]

    def delete(self, epoch: int) -> None:
        """Remove every part of `epoch`, the scheduler part first (missing parts are fine)."""
        shutil.rmtree(checkpoint_staging(self.directory, epoch), ignore_errors=True)
        for part in ("scheduler", "model", "optim"):
            self.path(part, epoch).unlink(missing_ok=True)
            for shard in checkpoint_shards(self.directory, part, epoch, self.extension):
                shard.unlink(missing_ok=True)


def _optimizer_kind(optimizer: Any) -> str:
    """A torch optimizer's record kind; several named optimizers are a "state"."""
    return "optimizer" if isinstance(optimizer, torch.optim.Optimizer) else "state"


_RECORDERS = {
    "mpk": "DefaultRecorder() (or NamedMpkFileRecorder())",
    "mpk.gz": "CompactRecorder() (or NamedMpkGzFileRecorder())",
    "bin": "BinFileRecorder()",
    "bin.gz": "SensitiveCompactRecorder() (or BinGzFileRecorder())",
    "json": "PrettyJsonFileRecorder()",
    "json.gz": "JsonGzFileRecorder()",
    "safetensors": "SafetensorsFileRecorder()",
}


def other_checkpoint_formats(directory: str | os.PathLike[str], recorder: Any) -> str:
    """The recorders that wrote the checkpoints in `directory`, when `recorder` did not
    write them (e.g. "epochs 1, 2 as mpk.gz: CompactRecorder() ..."); "" otherwise."""
    mine = getattr(recorder, "file_extension", None)
    found = []
    for extension, name in _RECORDERS.items():
        if extension == mine:
            continue
        epochs = checkpoint_epochs(directory, "scheduler", extension)
        if epochs:
            listing = ", ".join(map(str, epochs))
            found.append(f"epochs {listing} as .{extension}: {name}")
    return "; ".join(found)
