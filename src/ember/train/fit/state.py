"""Where one fit stands (`FitState`): its one owner of the loop's counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ember.train.length.duration import Counters
from ember.train.length.position import Position
from ember.train.length.run_length import RunLength
from ember.train.outcome import Outcome


@dataclass(frozen=True)
class EndedInside:
    """The run's length ended inside an epoch: the metric log lines and the epoch's
    metric states at that step, which the epoch's checkpoint keeps."""

    lines: dict[str, int]
    states: dict[str, Any]


@dataclass
class FitState:
    """The counters of one fit, written by the loop and its stepper only.

    `epoch`, `iteration` (the batches done in the epoch) and `items` (their samples) say
    where the loop is; `num_epochs` is the run's (for a length in steps, samples or
    tokens: the epoch it should end in, raised when it runs on); `ending` says how the
    run is ending once the loop knows: an early stop (`Outcome`) decided at a
    validation point, or the run's length reached inside an epoch (`EndedInside`)."""

    num_epochs: int
    length: RunLength
    epoch: int = 0
    iteration: int = 0
    items: int = 0
    steps_per_epoch: int | None = None
    """Optimizer steps per epoch (every process, gradient accumulation counted)."""
    total_steps: int | None = None
    """Optimizer steps of the whole run."""
    skipped_steps: int = 0
    """Optimizer steps skipped for a non-finite loss (`nonfinite_loss("skip")`)."""
    output_checked: bool = False
    """The fit's first training output has been checked."""
    token_mean: bool = False
    """The steps' losses are means over tokens: each batch's gradient is weighted by them."""
    ending: Outcome | EndedInside | None = None
    ended_epoch: int = 0
    """The last epoch whose end this fit reached (its values recorded); the fit stopped
    inside `epoch` when it is not that one and batches of `epoch` were done."""

    @property
    def where(self) -> str:
        """Where the fit stands, in words: "after epoch 2", or "after epoch 3, iteration
        40" inside an epoch (as the checkpoint of that point is named)."""
        if self.iteration and self.ended_epoch != self.epoch:
            return f"after epoch {self.epoch}, iteration {self.iteration}"
        return f"after epoch {self.epoch}"

    @property
    def counters(self) -> Counters:
        """The optimizer steps, samples and tokens (every process's) of the run so far."""
        return self.length.counters

    def position(self, complete: bool) -> Position:
        """Where the loop stands now, as a checkpoint records it (`complete`: the whole
        epoch, validation included, is done)."""
        return Position(self.epoch, self.iteration, self.items, complete, counters=self.counters)
