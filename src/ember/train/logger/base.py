"""The metric logger protocol: where iteration values and epoch aggregates go."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class MetricRecord:
    """One iteration's value of one metric, already on the host."""

    name: str
    iteration: int
    value: float
    weight: float


@runtime_checkable
class MetricLogger(Protocol):
    """Receives metric values in bulk. `split` is "train" or "valid"."""

    def log(self, split: str, epoch: int, records: Sequence[MetricRecord]) -> None:
        """Iteration values, in order, since the previous call."""
        ...

    def end_epoch(self, split: str, epoch: int, aggregates: dict[str, float]) -> None:
        """The epoch is over for this split; `aggregates` maps metric name to epoch value."""
        ...

    def close(self) -> None:
        """Flush and release files; called once when training ends or fails."""
        ...
