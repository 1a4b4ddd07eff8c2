"""Where a run stands: the epoch, the batches and samples done in it, whether it is whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ember.train.length.duration import Counters


@dataclass(frozen=True)
class Position:
    """`iteration` batches (`items` samples) of `epoch` are done; `complete` when the
    whole epoch, validation included, is done. `fresh` marks a run not resumed.
    `counters`: the optimizer steps, samples and tokens of the run so far."""

    epoch: int
    iteration: int = 0
    items: int = 0
    complete: bool = False
    fresh: bool = False
    counters: Counters = field(default_factory=Counters)

    def state(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "iteration": self.iteration,
            "items": self.items,
            "complete": self.complete,
            "counters": self.counters.state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Position:
        """The position to start from after the checkpointed `state`."""
        epoch, complete = int(state["epoch"]), bool(state["complete"])
        counters = Counters.from_state(state.get("counters"))
        start = (
            cls(epoch + 1, counters=counters)
            if complete
            else cls(epoch, int(state["iteration"]), int(state["items"]), counters=counters)
        )
        return start  # past num_epochs when the run was finished: nothing left to train

    def kept_epochs(self) -> int | None:
        """Logs of epochs up to this one are kept on resume (None: a fresh run)."""
        if self.fresh:
            return None
        return self.epoch if self.iteration else self.epoch - 1
