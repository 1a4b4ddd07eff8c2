"""Which saved epochs to keep, and which one is the best: checkpointing strategies."""

from __future__ import annotations

import logging
from typing import Any, Literal, Protocol, Sequence, runtime_checkable

from ember.errors import ConfigError
from ember.train.checkpoint.base import Checkpointer
from ember.train.history import History, Monitor, Watcher

log = logging.getLogger(__name__)


@runtime_checkable
class CheckpointingStrategy(Protocol):
    def keep(self, saved: Sequence[int], history: History) -> set[int]:
        """Of the `saved` epochs, the ones this strategy wants kept."""
        ...

    def best_epoch(self, history: History) -> int | None:
        """The epoch this strategy holds to be the best (for `fit(restore_best=True)`),
        or None when it keeps no best epoch or no epoch has a value yet."""
        ...


class KeepLastNCheckpoints:
    """Keep the `n` most recent epochs."""

    def __init__(self, n: int) -> None:
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"KeepLastNCheckpoints needs n >= 1, got {n!r}.")
        self.n = n

    def keep(self, saved: Sequence[int], history: History) -> set[int]:
        return set(sorted(saved)[-self.n :])

    def __str__(self) -> str:
        return f"the last {self.n}"

    def best_epoch(self, history: History) -> int | None:
        return None  # recency is not a quality


class MetricCheckpointingStrategy(Watcher):
    """Keep the epoch with the best epoch value of `metric` on `split`."""

    def __init__(
        self,
        metric: Any,
        aggregate: Literal["mean"] = "mean",
        direction: Literal["lowest", "highest"] = "lowest",
        split: Literal["train", "valid"] = "valid",
    ) -> None:
        self.monitor = Monitor.of(metric, aggregate, direction, split)

    def best_epoch(self, history: History) -> int | None:
        best = self.monitor.best(history)
        return None if best is None else best[0]

    def keep(self, saved: Sequence[int], history: History) -> set[int]:
        best = self.best_epoch([(e, v) for e, v in history if e in set(saved)])
        return set() if best is None else {best}

    def __str__(self) -> str:
        return f"the best {self.split} {self.name} ({self.direction})"


class ComposedCheckpointingStrategy:
    """Keep an epoch while any strategy wants it: an epoch is deleted only when every
    strategy agrees to delete it. The best epoch is the first part's that names one."""

    def __init__(self, *strategies: CheckpointingStrategy) -> None:
        if not strategies:
            raise ConfigError("ComposedCheckpointingStrategy needs at least one strategy.")
        self.strategies = strategies

    def keep(self, saved: Sequence[int], history: History) -> set[int]:
        kept: set[int] = set()
        for strategy in self.strategies:
            kept |= strategy.keep(saved, history)
        return kept

    def __str__(self) -> str:
        return " and ".join(str(strategy) for strategy in self.strategies)

    def best_epoch(self, history: History) -> int | None:
        for strategy in self.strategies:
            best = strategy.best_epoch(history)
            if best is not None:
                return best
        return None


def apply_retention(
    checkpointer: Checkpointer, strategy: CheckpointingStrategy, history: History
) -> list[int]:
    """Delete the saved epochs `strategy` does not keep; return the epochs left."""
    saved = checkpointer.epochs()
    keep = strategy.keep(saved, history)
    for epoch in saved:
        if epoch not in keep:
            checkpointer.delete(epoch)
            log.info("Checkpoint of epoch %d deleted (retention).", epoch)
    return [epoch for epoch in saved if epoch in keep]
