"""What early stopping, the best-checkpoint choice and pruning watch in a run's
history: one metric of one split and which way is better (`Monitor`), and the shapes
of the history they read (`History`, `Points`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

from ember.errors import ConfigError

History = Sequence[tuple[int, Mapping[str, Mapping[str, float]]]]
"""Completed epochs in order: (epoch, {split: {metric name: epoch value}})."""

Points = Sequence[tuple[int, "int | None", Mapping[str, Mapping[str, float]]]]
"""Validation points in order: (epoch, iteration, {"valid": {metric name: value}}), the
iteration being the training batches done in the epoch, or None for the validation at
the epoch's end."""


def metric_name(metric: Any) -> str:
    """The name under which a metric (or a metric's name) appears in a history."""
    return metric if isinstance(metric, str) else str(metric.name)


@dataclass(frozen=True)
class Monitor:
    """One metric of one split, and which way is better: what early stopping, the
    best-checkpoint choice and pruning watch, and the one place that reads its value
    from an epoch's values (`value`) and compares two of them (`better`)."""

    name: str
    split: str = "valid"
    direction: str = "lowest"

    @classmethod
    def of(
        cls,
        metric: Any,
        aggregate: Literal["mean"] = "mean",
        direction: Literal["lowest", "highest"] = "lowest",
        split: Literal["train", "valid"] = "valid",
    ) -> Monitor:
        """A checked monitor: `aggregate` is the epoch value ("mean"), `direction` says
        which way is better, `split` which split's value is read."""
        if aggregate != "mean":
            raise ConfigError(f"aggregate must be 'mean' (the epoch value), got {aggregate!r}.")
        if direction not in ("lowest", "highest"):
            raise ConfigError(f"direction must be 'lowest' or 'highest', got {direction!r}.")
        if split not in ("train", "valid"):
            raise ConfigError(f"split must be 'train' or 'valid', got {split!r}.")
        return cls(metric_name(metric), split, direction)

    def value(self, values: Mapping[str, Mapping[str, float]]) -> float | None:
        """This metric's value among one epoch's (or one point's) `values`, {split:
        {metric name: value}}; None when they have none."""
        found = values.get(self.split, {}).get(self.name)
        return None if found is None else float(found)

    @property
    def sign(self) -> float:
        """1.0 when lower is better, -1.0 when higher is: `sign * value` falls as the
        value gets better."""
        return 1.0 if self.direction == "lowest" else -1.0

    def better(self, a: float, b: float) -> bool:
        """`a` is strictly better than `b`."""
        return a < b if self.direction == "lowest" else a > b

    def series(self, history: History) -> list[tuple[int, float]]:
        """(epoch, value) of every epoch that has a value that is not NaN."""
        found = ((epoch, self.value(values)) for epoch, values in history)
        return [(epoch, v) for epoch, v in found if v is not None and not math.isnan(v)]

    def point_series(self, points: Points) -> list[tuple[int, int | None, float]]:
        """(epoch, iteration, value) of every point that has a value that is not NaN."""
        found = ((epoch, iteration, self.value(values)) for epoch, iteration, values in points)
        return [(e, i, v) for e, i, v in found if v is not None and not math.isnan(v)]

    def best(self, history: History) -> tuple[int, float] | None:
        """The best epoch and its value (the earliest one on a tie), or None."""
        best: tuple[int, float] | None = None
        for epoch, value in self.series(history):
            if best is None or self.better(value, best[1]):
                best = (epoch, value)
        return best


class Watcher:
    """A strategy that watches one metric (its `monitor`): the metric's name, split and
    direction read as the strategy's own attributes."""

    monitor: Monitor

    @property
    def name(self) -> str:
        return self.monitor.name

    @property
    def split(self) -> str:
        return self.monitor.split

    @property
    def direction(self) -> str:
        return self.monitor.direction
