"""Early stopping: end training when a metric stops improving."""

from __future__ import annotations

import math
from typing import Any, Literal, Mapping, Protocol, Sequence, runtime_checkable

from ember.errors import ConfigError

History = Sequence[tuple[int, Mapping[str, Mapping[str, float]]]]
"""Completed epochs in order: (epoch, {split: {metric name: epoch value}})."""


@runtime_checkable
class EarlyStoppingStrategy(Protocol):
    def should_stop(self, history: History) -> str | None:
        """The reason to stop after the last epoch of `history`, or None to go on."""
        ...


def metric_name(metric: Any) -> str:
    return metric if isinstance(metric, str) else str(metric.name)


def check_choice(aggregate: str, direction: str, split: str) -> None:
    """Validate how a strategy reads a metric: its epoch value, which way is better, which split."""
    if aggregate != "mean":
        raise ConfigError(f"aggregate must be 'mean' (the epoch value), got {aggregate!r}.")
    if direction not in ("lowest", "highest"):
        raise ConfigError(f"direction must be 'lowest' or 'highest', got {direction!r}.")
    if split not in ("train", "valid"):
        raise ConfigError(f"split must be 'train' or 'valid', got {split!r}.")


class MetricEarlyStoppingStrategy:
    """Stop when `metric` (epoch value on `split`) has not improved for
    `no_improvement_since` epochs; never during the first `warmup_epochs` epochs."""

    def __init__(
        self,
        metric: Any,
        aggregate: Literal["mean"] = "mean",
        direction: Literal["lowest", "highest"] = "lowest",
        split: Literal["train", "valid"] = "valid",
        no_improvement_since: int = 3,
        warmup_epochs: int = 0,
    ) -> None:
        check_choice(aggregate, direction, split)
        if not isinstance(no_improvement_since, int) or no_improvement_since < 1:
            raise ConfigError(
                f"no_improvement_since must be an int >= 1, got {no_improvement_since!r}."
            )
        if not isinstance(warmup_epochs, int) or warmup_epochs < 0:
            raise ConfigError(f"warmup_epochs must be an int >= 0, got {warmup_epochs!r}.")
        self.name = metric_name(metric)
        self.direction = direction
        self.split = split
        self.patience = no_improvement_since
        self.warmup = warmup_epochs

    def should_stop(self, history: History) -> str | None:
        series = [
            (epoch, values[self.split][self.name])
            for epoch, values in history
            if self.name in values.get(self.split, {})
            and not math.isnan(values[self.split][self.name])
        ]
        if not series or history[-1][0] <= self.warmup:
            return None
        sign = 1.0 if self.direction == "lowest" else -1.0
        best_epoch, best = series[0]
        for epoch, value in series[1:]:
            if sign * value < sign * best:
                best_epoch, best = epoch, value
        last = history[-1][0]
        if last - best_epoch >= self.patience:
            return (
                f"{self.split} {self.name} has not improved for {last - best_epoch} epochs "
                f"(best {best:.6g} at epoch {best_epoch})"
            )
        return None
