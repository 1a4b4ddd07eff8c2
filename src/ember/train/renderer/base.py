"""The renderer protocol: how a run shows itself while it trains."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol, Sequence, runtime_checkable

from ember.printable import printable, printable_lines
from ember.train.logger.base import MetricRecord


@dataclass(frozen=True)
class RunInfo:
    """What a renderer knows when training starts."""

    artifact_dir: str
    start_epoch: int
    num_epochs: int
    model_name: str
    num_parameters: int
    devices: tuple[str, ...]
    metrics: tuple[tuple[str, str, str, bool], ...] = ()
    """Registered metrics as (split, name, unit, numeric)."""
    interrupter: Any = None
    """The run's `Interrupter`: a renderer calls `stop(message)` on it to end the run gracefully."""
    resumed: bool = False
    """The run continues from a checkpoint."""
    start_iteration: int = 0
    """Batches of `start_epoch` already done before this run (a resume mid-epoch)."""
    model_summary: str = ""
    """The model summary table and its warnings (`ModelSummary`), shown once at the
    top of the output; empty when the summary is off."""
    evaluation: str | None = None
    """The name of the evaluation this is (`Evaluator.eval`, `Learner.evaluate`), whose
    one pass over a data set renderers show as "evaluating 'name'"; None for training."""

    @property
    def activity(self) -> str:
        """What the run does, in words: "training" or "evaluating 'name'"."""
        return "training" if self.evaluation is None else f"evaluating {self.evaluation!r}"

    @property
    def noun(self) -> str:
        """What ends, in words: "training" ("training completed") or "evaluation
        'name'" ("evaluation 'test' failed")."""
        return "training" if self.evaluation is None else f"evaluation {self.evaluation!r}"


def printable_info(info: RunInfo) -> RunInfo:
    """`info` with the texts that come from outside ember (the model's class name, the
    directory, the devices, the model summary) escaped for a terminal."""
    return replace(
        info,
        artifact_dir=printable(info.artifact_dir),
        model_name=printable(info.model_name),
        devices=tuple(map(printable, info.devices)),
        model_summary=printable_lines(info.model_summary),
    )


@dataclass(frozen=True)
class Progress:
    """Where a split stands within its epoch."""

    split: str
    epoch: int
    num_epochs: int
    iteration: int
    num_iterations: int | None
    items: int
    elapsed: float
    run: str = ""
    """The run's progress in the unit of its length (`train_for`), e.g. "samples
    1.2M/5M"; empty for a length in epochs."""
    iterations_before: int = 0
    """Of `iteration`, the batches a resumed epoch had done before this session (the
    epoch's counts hold them; the rates, measured over `elapsed`, do not)."""
    items_before: int = 0
    """Of `items`, those of the batches a resumed epoch had done before this session."""
    tokens: int | None = None
    """The tokens of the split so far, when every batch of an evaluation pass told them
    (the batch's `num_tokens`, else its output's `tokens`); None otherwise."""

    @property
    def items_per_second(self) -> float:
        done = self.items - self.items_before
        return done / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def iterations_per_second(self) -> float:
        done = self.iteration - self.iterations_before
        return done / self.elapsed if self.elapsed > 0 else 0.0


@dataclass(frozen=True)
class MetricView:
    """A metric as a renderer shows it: its last iteration value and the epoch so far."""

    split: str
    name: str
    unit: str
    numeric: bool
    last: float | str | None
    epoch_value: float | None
    matrix: tuple[tuple[int, ...], ...] | None = None
    """A matrix metric's counts (rows: targets, columns: predictions) of the epoch that
    ended, in the views given to `end_split`; None otherwise."""


@runtime_checkable
class Renderer(Protocol):
    """Receives progress at render ticks (at most ~10 per second) and epoch results.

    A renderer may also define `valid_point(iteration, progress, metrics)`: a
    validation inside an epoch (`LearnerBuilder.valid_every`) ended after `iteration`
    training batches; `progress` is that validation's, `metrics` carry its values as
    epoch values. Renderers without it are not told."""

    def start(self, info: RunInfo) -> None: ...

    def update(
        self, progress: Progress, metrics: Sequence[MetricView], records: Sequence[MetricRecord]
    ) -> None:
        """A tick: current progress, every metric's state, and the new iteration values."""
        ...

    def end_split(self, progress: Progress, metrics: Sequence[MetricView]) -> None:
        """A split's epoch ended; `metrics` carry the epoch values."""
        ...

    def end(self, reason: str) -> None:
        """Training ended (completed, stopped or failed); release the terminal."""
        ...
