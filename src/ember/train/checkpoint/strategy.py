"""Which saved epochs to keep: retention strategies for the file checkpointer."""

from __future__ import annotations

import math
from typing import Any, Literal, Protocol, Sequence, runtime_checkable

from ember.errors import ConfigError
from ember.train.early_stopping import History, check_choice, metric_name


@runtime_checkable
class CheckpointingStrategy(Protocol):
    def keep(self, saved: Sequence[int], history: History) -> set[int]:
        """Of the `saved` epochs, the ones this strategy wants kept."""
        ...


class KeepLastNCheckpoints:
    """Keep the `n` most recent epochs."""

    def __init__(self, n: int) -> None:
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"KeepLastNCheckpoints needs n >= 1, got {n!r}.")
        self.n = n

    def keep(self, saved: Sequence[int], history: History) -> set[int]:
        return set(sorted(saved)[-self.n :])


class MetricCheckpointingStrategy:
    """Keep the epoch with the best epoch value of `metric` on `split`."""

    def __init__(
        self,
        metric: Any,
        aggregate: Literal["mean"] = "mean",
        direction: Literal["lowest", "highest"] = "lowest",
        split: Literal["train", "valid"] = "valid",
    ) -> None:
        check_choice(aggregate, direction, split)
        self.name = metric_name(metric)
        self.direction = direction
        self.split = split

    def best_epoch(self, history: History) -> int | None:
        sign = 1.0 if self.direction == "lowest" else -1.0
        best: tuple[float, int] | None = None
        for epoch, values in history:
            value = values.get(self.split, {}).get(self.name)
            if value is None or math.isnan(value):
                continue
            if best is None or sign * value < best[0]:
                best = (sign * value, epoch)
        return None if best is None else best[1]

    def keep(self, saved: Sequence[int], history: History) -> set[int]:
        best = self.best_epoch([(e, v) for e, v in history if e in set(saved)])
        return set() if best is None else {best}


class ComposedCheckpointingStrategy:
    """Keep an epoch while any strategy wants it: an epoch is deleted only when every
    strategy agrees to delete it."""

    def __init__(self, *strategies: CheckpointingStrategy) -> None:
        if not strategies:
            raise ConfigError("ComposedCheckpointingStrategy needs at least one strategy.")
        self.strategies = strategies

    def keep(self, saved: Sequence[int], history: History) -> set[int]:
        kept: set[int] = set()
        for strategy in self.strategies:
            kept |= strategy.keep(saved, history)
        return kept
