"""Early stopping: end training when a metric stops improving."""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

from ember.errors import ConfigError
from ember.train.history import History, Monitor, Points


@runtime_checkable
class EarlyStoppingStrategy(Protocol):
    def should_stop(self, history: History) -> str | None:
        """The reason to stop after the last epoch of `history`, or None to go on."""
        ...


@runtime_checkable
class PruningStrategy(Protocol):
    """Decides at each epoch end whether a trial of a hyperparameter search is pruned
    (`ember.integrations.optuna.OptunaPruning` asks an Optuna pruner)."""

    def should_prune(self, history: History) -> str | None:
        """Why the run is pruned after the last epoch of `history`, or None to go on."""
        ...


class MetricEarlyStoppingStrategy:
    """Stop when `metric` (epoch value on `split`) has not improved for
    `no_improvement_since` epochs; never during the first `warmup_epochs` epochs.

    In a run that validates inside its epochs (`valid_every`), a validation strategy
    counts validation points instead (`should_stop_at_point`): every validation, inside
    an epoch or at its end, is one, and the run may stop in the middle of an epoch."""

    def __init__(
        self,
        metric: Any,
        aggregate: Literal["mean"] = "mean",
        direction: Literal["lowest", "highest"] = "lowest",
        split: Literal["train", "valid"] = "valid",
        no_improvement_since: int = 3,
        warmup_epochs: int = 0,
    ) -> None:
        self.monitor = Monitor.of(metric, aggregate, direction, split)
        if not isinstance(no_improvement_since, int) or no_improvement_since < 1:
            raise ConfigError(
                f"no_improvement_since must be an int >= 1, got {no_improvement_since!r}."
            )
        if not isinstance(warmup_epochs, int) or warmup_epochs < 0:
            raise ConfigError(f"warmup_epochs must be an int >= 0, got {warmup_epochs!r}.")
        self.name = self.monitor.name
        self.direction = direction
        self.split = split
        self.patience = no_improvement_since
        self.warmup = warmup_epochs

    def should_stop(self, history: History) -> str | None:
        best = self.monitor.best(history)
        if best is None or history[-1][0] <= self.warmup:
            return None
        best_epoch, value = best
        last = history[-1][0]
        if last - best_epoch >= self.patience:
            return (
                f"{self.split} {self.name} has not improved for {last - best_epoch} epochs "
                f"(best {value:.6g} at epoch {best_epoch})"
            )
        return None

    def should_stop_at_point(self, points: Points) -> str | None:
        """The reason to stop after the last of `points` (every validation of the run,
        see `ember.train.history.Points`), or None. Patience counts points."""
        if self.split != "valid" or not points or points[-1][0] <= self.warmup:
            return None
        series = self.monitor.point_series(points)
        if not series:
            return None
        sign = 1.0 if self.direction == "lowest" else -1.0
        best = 0
        for index, (_, _, value) in enumerate(series):
            if sign * value < sign * series[best][2]:
                best = index
        since = len(series) - 1 - best
        if since < self.patience:
            return None
        epoch, iteration, value = series[best]
        where = f"epoch {epoch}" + (f", iteration {iteration}" if iteration is not None else " end")
        return (
            f"{self.split} {self.name} has not improved for {since} validations "
            f"(best {value:.6g} at {where})"
        )
