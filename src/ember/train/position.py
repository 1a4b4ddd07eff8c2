"""Where a run stands: the epoch, the batches and samples done in it, whether it is whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    def from_state(cls, state: dict[str, Any]) -> Position:
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
