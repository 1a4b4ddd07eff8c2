"""Where a run stands, and putting a resumed run back there (sampler, metric logs)."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ember.train.logger.file import metric_file_name

log = logging.getLogger("ember")


@dataclass(frozen=True)
class Position:
    """`iteration` batches (`items` samples) of `epoch` are done; `complete` when the
    whole epoch, validation included, is done. `fresh` marks a run not resumed."""

    epoch: int
    iteration: int = 0
    items: int = 0
    complete: bool = False
    fresh: bool = False

    def state(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "iteration": self.iteration,
            "items": self.items,
            "complete": self.complete,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], num_epochs: int) -> Position:
        """The position to start from after the checkpointed `state`."""
        epoch, complete = int(state["epoch"]), bool(state["complete"])
        start = (
            cls(epoch + 1) if complete else cls(epoch, int(state["iteration"]), int(state["items"]))
        )
        return start  # past num_epochs when the run was finished: nothing left to train

    def kept_epochs(self) -> int | None:
        """Logs of epochs up to this one are kept on resume (None: a fresh run)."""
        if self.fresh:
            return None
        return self.epoch if self.iteration else self.epoch - 1


def find_sampler(loader: Any) -> Any:
    """The epoch-aware sampler of a loader (ours, or one with `set_epoch`), if any."""
    for owner in (loader, getattr(loader, "batch_sampler", None)):
        sampler = getattr(owner, "sampler", None)
        if callable(getattr(sampler, "set_epoch", None)):
            return sampler
    return None


def set_epoch(
    loader: Any, epoch: int, skip_items: int, done: int = 0, shard: tuple[int, int] | None = None
) -> tuple[int | None, bool]:
    """Tell an epoch-aware sampler which epoch starts, how many samples to skip and
    (several processes) which shard to read. Returns the epoch's number of batches
    (`done` already seen included) and whether the sampler did the skipping."""
    skipped = False
    sampler = find_sampler(loader)
    if sampler is not None:
        sampler.set_epoch(epoch)
        if skip_items and callable(getattr(sampler, "skip", None)):
            sampler.skip(skip_items)
            skipped = True
        if shard is not None:
            sampler.shard(*shard)
    if skip_items and not skipped:
        log.warning(
            "The data loader's sampler cannot skip samples: resuming by reading and dropping "
            "the batches already seen this epoch (build loaders with DataLoaderBuilder to avoid it)."
        )
    try:
        total = len(loader)  # type: ignore[arg-type]
    except TypeError:
        return None, skipped
    return (total + done if skipped else total), skipped


def resume_logs(
    processor: Any, artifact_dir: Path, epoch: int, iteration: int, counts: dict[str, int] | None
) -> None:
    """Resuming mid-epoch: keep the lines each training metric log of `epoch` had at the
    checkpoint (`counts`, else `iteration`; later lines came after it), load them into
    the metric states, and drop that epoch's validation logs."""
    if iteration == 0:
        return
    shutil.rmtree(artifact_dir / "valid" / f"epoch-{epoch}", ignore_errors=True)
    for state in processor.states.get("train", ()):
        path = artifact_dir / "train" / f"epoch-{epoch}" / metric_file_name(state.name)
        if not path.exists():
            continue
        keep = (counts or {}).get(state.name, iteration)
        lines = path.read_text(encoding="utf-8").split("\n")[:-1][:keep]
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        rows = [(float(v), float(w)) for v, w in (line.split(",") for line in lines)]
        state.add_rows(rows)
