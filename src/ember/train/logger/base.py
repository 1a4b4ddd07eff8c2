"""The metric logger protocol: where iteration values and epoch aggregates go."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple, Protocol, Sequence, runtime_checkable


class MetricRecord(NamedTuple):
    """One iteration's value of one metric, already on the host. (A named tuple: one is
    made per metric and iteration.)"""

    name: str
    iteration: int
    value: float
    weight: float


@runtime_checkable
class MetricLogger(Protocol):
    """Receives metric values in bulk. `split` is "train" or "valid".

    A logger may also define `start_run(run: RunStart)`, which the learner calls once
    before the first `log`: it says where the run starts (a resumed run continues
    after its checkpoint) and how many processes send values. Loggers without it
    keep working; they just are not told.
    """

    def log(self, split: str, epoch: int, records: Sequence[MetricRecord]) -> None:
        """Iteration values, in order, since the previous call."""
        ...

    def end_epoch(self, split: str, epoch: int, aggregates: dict[str, float]) -> None:
        """The epoch is over for this split; `aggregates` maps metric name to epoch value."""
        ...

    def close(self) -> None:
        """Flush and release files; called once when training ends or fails."""
        ...


@dataclass(frozen=True)
class RunStart:
    """Where a run starts, as told to a logger's optional `start_run` method.

    `epoch` is the first epoch this run trains. When `resumed`, the run continues
    from a checkpoint: `iteration` training iterations of `epoch` were done (and
    logged) before it, while that epoch's validation is redone from its start. What a
    logger holds beyond that point came after the checkpoint and is logged again by
    this run, so a logger that keeps its output drops it (see `keeps`). `processes`
    is the number of processes that train: under several, each iteration's value of a
    metric arrives once per process, every copy with the same iteration number.
    `hparams` are the run's hyperparameters (`LearnerBuilder.hparams`, as JSON-ready
    values; None when none were given) and `artifact_dir` the run's artifact
    directory, where a logger may keep what it needs to continue a resumed run.
    """

    epoch: int = 1
    iteration: int = 0
    resumed: bool = False
    processes: int = 1
    hparams: Mapping[str, Any] | None = field(default=None, compare=False)
    artifact_dir: str | None = None

    def keeps(self, split: str, epoch: int, iteration: int | None = None) -> bool:
        """Whether a value logged before this run stays: an iteration value of
        `split` (or an epoch value, with `iteration` None) of `epoch`."""
        if not self.resumed or epoch < self.epoch:
            return True
        if epoch > self.epoch or iteration is None or split != "train":
            return False
        return iteration <= self.iteration

    def kept_epochs(self) -> int:
        """On resume, the last epoch all of whose values stay."""
        return self.epoch if self.iteration else self.epoch - 1


def start_loggers(loggers: Mapping[str, Sequence[Any]], run: RunStart) -> None:
    """Call `start_run(run)` on each logger that defines it, once per instance (one
    logger may serve both splits)."""
    seen: set[int] = set()
    for split_loggers in loggers.values():
        for logger in split_loggers:
            start = getattr(logger, "start_run", None)
            if id(logger) in seen or not callable(start):
                continue
            seen.add(id(logger))
            start(run)
