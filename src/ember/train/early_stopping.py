"""Early stopping: end training when a metric stops improving, is good enough, is
hopeless or is no longer a number."""

from __future__ import annotations

import math
from typing import Any, Literal, Protocol, runtime_checkable

from ember.errors import ConfigError
from ember.train.history import History, Monitor
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


class MetricEarlyStoppingStrategy:
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
        self.direction = direction
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
        if good is not None and bad is not None and not self._better(good, bad):
            raise ConfigError(
                f"stopping_threshold ({good}) must be better than divergence_threshold "
                f"({bad}) for direction={direction!r}: the run would stop whatever its value."
            )
        if not isinstance(check_finite, bool):
            raise ConfigError(f"check_finite must be True or False, got {check_finite!r}.")
        self.name = self.monitor.name
        self.split = split
        self.patience = no_improvement_since
        self.warmup = warmup_epochs
        self.min_delta = delta
        self.check_finite = check_finite

    def _better(self, a: float, b: float) -> bool:
        """`a` is strictly better than `b`."""
        return a < b if self.direction == "lowest" else a > b

    def _best(self, history: History) -> tuple[int, float] | None:
        """The first epoch whose value no later epoch beat by more than `min_delta`."""
        best: tuple[int, float] | None = None
        sign = 1.0 if self.direction == "lowest" else -1.0
        for epoch, value in self.monitor.series(history):
            if math.isinf(value):
                continue
            if best is None or sign * (best[1] - value) > self.min_delta:
                best = (epoch, value)
        return best

    def should_stop(self, history: History) -> EarlyStop | None:
        if not history:
            return None
        last, values = history[-1]
        value = values.get(self.split, {}).get(self.name)
        if value is None:  # no value this epoch (no validation ran): nothing to decide on
            return None
        value = float(value)
        where = f"{self.split} {self.name}"

        def stop(text: str, rule: EarlyStopRule, reference: float | None) -> EarlyStop:
            return EarlyStop(
                text,
                rule,
                split=self.split,
                metric=self.name,
                epoch=last,
                value=value,
                reference=reference,
            )

        if self.check_finite and not math.isfinite(value):
            return stop(f"{where} is {value} at epoch {last}", EarlyStopRule.NON_FINITE, None)
        if not math.isfinite(value):
            return None
        good = self.stopping_threshold
        if good is not None and (value == good or self._better(value, good)):
            side = "<=" if self.direction == "lowest" else ">="
            text = f"{where} reached the stopping threshold: {value:.6g} {side} {good:.6g}"
            return stop(text, EarlyStopRule.STOPPING_THRESHOLD, good)
        if last <= self.warmup:
            return None
        bad = self.divergence_threshold
        if bad is not None and self._better(bad, value):
            side = ">" if self.direction == "lowest" else "<"
            text = f"{where} diverged past the divergence threshold: {value:.6g} {side} {bad:.6g}"
            return stop(text, EarlyStopRule.DIVERGENCE_THRESHOLD, bad)
        best = self._best(history)
        if best is not None and last - best[0] >= self.patience:
            by = f" by more than {self.min_delta:g}" if self.min_delta else ""
            text = (
                f"{where} has not improved{by} for {last - best[0]} epochs "
                f"(best {best[1]:.6g} at epoch {best[0]})"
            )
            return stop(text, EarlyStopRule.NO_IMPROVEMENT, best[1])
        return None
