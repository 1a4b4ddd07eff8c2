"""Events the loop emits; listeners (`on_event`) hook in without touching the loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Start:
    """Training starts (or resumes) at `epoch`."""

    epoch: int
    num_epochs: int
    artifact_dir: str


@dataclass(frozen=True)
class StartEpoch:
    """An epoch starts (its train split first)."""

    epoch: int
    num_epochs: int


@dataclass(frozen=True)
class StartSplit:
    """A split of `epoch` starts ("train" or "valid"), before its first batch: where a
    model that carries state across batches (a recurrent hidden state) resets it. The
    model's own `on_split_start(split)`, if it defines one, is called at the same time,
    except when a run resumes in the middle of the split (`first_iteration` > 1)."""

    split: str
    epoch: int
    first_iteration: int = 1


@dataclass(frozen=True)
class ProcessedItem:
    """One batch went through a step (`split` is "train" or "valid")."""

    split: str
    epoch: int
    iteration: int
    num_iterations: int | None
    item: Any
    lr: float | None


@dataclass(frozen=True)
class EndEpoch:
    """Both splits of `epoch` are done; `aggregates[split][metric]` are the epoch values."""

    epoch: int
    aggregates: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class ValidPoint:
    """A validation inside `epoch` (`valid_every`) ended, after `iteration` training
    batches of the epoch; `values[metric]` are its values over the validation data."""

    epoch: int
    iteration: int
    values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class End:
    """Training ended after `epoch`; `reason` says why ("completed", "stopped: ...", "failed")."""

    epoch: int
    reason: str


Event = Start | StartEpoch | StartSplit | ProcessedItem | ValidPoint | EndEpoch | End


@runtime_checkable
class Listener(Protocol):
    """Anything with `on_event(event)`; registered with `LearnerBuilder.listener(...)`."""

    def on_event(self, event: Event) -> None: ...
