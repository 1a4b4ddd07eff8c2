"""Early stopping: end training when a metric stops improving, is good enough, is
hopeless or is no longer a number."""

from __future__ import annotations

import math
from typing import Any, Literal, Protocol, Sequence, runtime_checkable

from ember.errors import ConfigError
from ember.train.history import History, Monitor, Points, Watcher
from ember.train.outcome import EarlyStop, EarlyStopRule


@runtime_checkable
class EarlyStoppingStrategy(Protocol):
    def should_stop(self, history: History) -> str | None:
        """The reason to stop after the last epoch of `history`, or None to go on (an
        `EarlyStop` to say which rule fired; plain text counts as a custom rule)."""
        ...


@runtime_checkable
class PruningStrategy(Protocol):
    """Decides at each epoch end whether a trial of a hyperparameter search is pruned
    (`ember.integrations.optuna.OptunaPruning` asks an Optuna pruner)."""

    def should_prune(self, history: History) -> str | None:
        """Why the run is pruned after the last epoch of `history`, or None to go on."""
        ...


def _threshold(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(f"{name} must be a number or None, got {value!r}.")
    return float(value)


class MetricEarlyStoppingStrategy(Watcher):
    """Watch the epoch value of `metric` on `split` and stop, after the first epoch
    where one of these rules holds (checked in this order):

    - `check_finite` (default True): the value is NaN or infinite;
    - `stopping_threshold`: the value is at or beyond it in the better direction (at or
      below it for "lowest"): good enough;
    - `divergence_threshold`: the value is beyond it in the worse direction (above it
      for "lowest"): hopeless;
    - it has not improved by more than `min_delta` for `no_improvement_since` epochs.

    The last two rules wait for the first `warmup_epochs` epochs; the first two do not.
    `should_stop` returns an `EarlyStop`: the reason in words, with the rule and values.

    In a run that validates inside its epochs (`valid_every`), a validation strategy
    counts validation points instead (`should_stop_at_point`): every validation, inside
    an epoch or at its end, is one, the rules apply to each, and the run may stop in
    the middle of an epoch.
    """

    def __init__(
        self,
        metric: Any,
        aggregate: Literal["mean"] = "mean",
        direction: Literal["lowest", "highest"] = "lowest",
        split: Literal["train", "valid"] = "valid",
        no_improvement_since: int = 3,
        warmup_epochs: int = 0,
        *,
        min_delta: float = 0.0,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_finite: bool = True,
    ) -> None:
        self.monitor = Monitor.of(metric, aggregate, direction, split)
        if not isinstance(no_improvement_since, int) or no_improvement_since < 1:
            raise ConfigError(
                f"no_improvement_since must be an int >= 1, got {no_improvement_since!r}."
            )
        if not isinstance(warmup_epochs, int) or warmup_epochs < 0:
            raise ConfigError(f"warmup_epochs must be an int >= 0, got {warmup_epochs!r}.")
        delta = _threshold("min_delta", min_delta)
        if delta is None or not math.isfinite(delta) or delta < 0:
            raise ConfigError(f"min_delta must be a finite number >= 0, got {min_delta!r}.")
        self.stopping_threshold = _threshold("stopping_threshold", stopping_threshold)
        self.divergence_threshold = _threshold("divergence_threshold", divergence_threshold)
        good, bad = self.stopping_threshold, self.divergence_threshold
        if good is not None and bad is not None and not self.monitor.better(good, bad):
            raise ConfigError(
                f"stopping_threshold ({good}) must be better than divergence_threshold "
                f"({bad}) for direction={direction!r}: the run would stop whatever its value."
            )
        if not isinstance(check_finite, bool):
            raise ConfigError(f"check_finite must be True or False, got {check_finite!r}.")
        self.patience = no_improvement_since
        self.warmup = warmup_epochs
        self.min_delta = delta
        self.check_finite = check_finite

    def should_stop(self, history: History) -> EarlyStop | None:
        if not history:
            return None
        last, values = history[-1]
        series = [(epoch, None, value) for epoch, value in self.monitor.series(history)]
        return self._decide(last, None, values, series, "epochs")

    def should_stop_at_point(self, points: Points) -> EarlyStop | None:
        """The reason to stop after the last of `points` (every validation of the run,
        see `ember.train.history.Points`), or None. Patience counts points."""
        if self.split != "valid" or not points:
            return None
        epoch, iteration, values = points[-1]
        series = self.monitor.point_series(points)
        return self._decide(epoch, iteration, values, series, "validations")

    def _decide(
        self,
        epoch: int,
        iteration: int | None,
        values: Any,
        series: Sequence[tuple[int, int | None, float]],
        unit: str,
    ) -> EarlyStop | None:
        """The rules on the last value (`values`, of `epoch` and, for a point inside an
        epoch, `iteration`), with `series` every earlier non-NaN value in order."""
        value = self.monitor.value(values)
        if value is None:  # no value this time (no validation ran): nothing to decide on
            return None
        where = f"{self.split} {self.name}"
        at = f"epoch {epoch}" if iteration is None else f"epoch {epoch}, iteration {iteration}"

        def stop(text: str, rule: EarlyStopRule, reference: float | None) -> EarlyStop:
            return EarlyStop(
                text,
                rule,
                split=self.split,
                metric=self.name,
                epoch=epoch,
                iteration=iteration,
                value=value,
                reference=reference,
            )

        if self.check_finite and not math.isfinite(value):
            return stop(f"{where} is {value} at {at}", EarlyStopRule.NON_FINITE, None)
        if not math.isfinite(value):
            return None
        good = self.stopping_threshold
        if good is not None and (value == good or self.monitor.better(value, good)):
            side = "<=" if self.direction == "lowest" else ">="
            text = f"{where} reached the stopping threshold: {value:.6g} {side} {good:.6g}"
            return stop(text, EarlyStopRule.STOPPING_THRESHOLD, good)
        if epoch <= self.warmup:
            return None
        bad = self.divergence_threshold
        if bad is not None and self.monitor.better(bad, value):
            side = ">" if self.direction == "lowest" else "<"
            text = f"{where} diverged past the divergence threshold: {value:.6g} {side} {bad:.6g}"
            return stop(text, EarlyStopRule.DIVERGENCE_THRESHOLD, bad)
        # The best: the first value that no later one beat by more than min_delta.
        sign = self.monitor.sign
        best: int | None = None
        for index, (_, _, candidate) in enumerate(series):
            if math.isinf(candidate):
                continue
            if best is None or sign * (series[best][2] - candidate) > self.min_delta:
                best = index
        if best is None:
            return None
        best_epoch, best_iteration, best_value = series[best]
        # epochs count by their numbers, validation points one by one
        since = epoch - best_epoch if unit == "epochs" else len(series) - 1 - best
        if since < self.patience:
            return None
        if unit == "epochs":
            place = f"epoch {best_epoch}"
        else:
            place = f"epoch {best_epoch}" + (
                f", iteration {best_iteration}" if best_iteration is not None else " end"
            )
        by = f" by more than {self.min_delta:g}" if self.min_delta else ""
        text = f"{where} has not improved{by} for {since} {unit} (best {best_value:.6g} at {place})"
        return stop(text, EarlyStopRule.NO_IMPROVEMENT, best_value)
