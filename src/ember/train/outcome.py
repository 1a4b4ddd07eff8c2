"""How a run ended: `Learner.outcome`, one text with the reason behind it.

`Outcome` is a `str` (the text `experiment.log`, `history.jsonl`, the summary and the
renderers show: "completed", "stopped: <why>", "stopped early: <why>", "failed",
"failed: non-finite loss ...", "interrupted") that also carries a `StopReason` and, for
early stopping, the `EarlyStop` decision: which rule fired and on which values. Code
that compared or parsed the text keeps working.
"""

from __future__ import annotations

import enum
import math
from typing import Any, TypeVar

_T = TypeVar("_T", bound="_Text")


class StopReason(str, enum.Enum):
    """Why a run ended."""

    COMPLETED = "completed"
    """Every epoch ran."""
    EARLY_STOPPED = "early_stopped"
    """The early stopping strategy ended it (`Outcome.early_stop` says which rule)."""
    PRUNED = "pruned"
    """The pruning strategy of a hyperparameter search ended it (`LearnerBuilder.pruning`)."""
    STOPPED = "stopped"
    """A graceful stop asked from code or the dashboard (`Interrupter.stop`)."""
    SIGNAL = "signal"
    """A graceful stop asked by a signal (SIGTERM, a first Ctrl-C)."""
    PREEMPTED = "preempted"
    """The preemption signal (`LearnerBuilder.preemption`) stopped it with a checkpoint:
    requeue the job; it resumes with `checkpoint("auto")`."""
    TIME_LIMIT = "time_limit"
    """`LearnerBuilder.max_time` stopped it with a checkpoint: run it again to go on."""
    INTERRUPTED = "interrupted"
    """A second Ctrl-C: `fit` raised `KeyboardInterrupt`."""
    NONFINITE_LOSS = "nonfinite_loss"
    """A NaN or infinite loss stopped it (`nonfinite_loss("stop")`): `fit` raised."""
    FAILED = "failed"
    """Another error: `fit` raised it."""


class EarlyStopRule(str, enum.Enum):
    """Which rule of an early stopping strategy fired."""

    NO_IMPROVEMENT = "no_improvement"
    STOPPING_THRESHOLD = "stopping_threshold"
    DIVERGENCE_THRESHOLD = "divergence_threshold"
    NON_FINITE = "non_finite"
    CUSTOM = "custom"
    """A strategy of your own that returned plain text."""


class _Text(str):
    """A text (what is shown, compared and parsed) that carries its details as
    attributes."""

    def __new__(cls: type[_T], text: str, **details: Any) -> _T:
        made = super().__new__(cls, text)
        for name, value in details.items():
            setattr(made, name, value)
        return made


class EarlyStop(_Text):
    """An early stopping decision: its text (what `should_stop` returns) with the rule
    that fired, the monitored metric (`split_name`, `metric`), the epoch and value that
    decided, and the threshold or best value it was compared with."""

    rule: EarlyStopRule
    split_name: str | None
    """The monitored split ("train", "valid"); `split` stays the str method."""
    metric: str | None
    epoch: int | None
    iteration: int | None
    """The training batches done in `epoch` for a validation inside it; None at its end."""
    value: float | None
    reference: float | None

    _KEYS = {
        "split": "split_name",
        "metric": "metric",
        "epoch": "epoch",
        "iteration": "iteration",
        "value": "value",
        "reference": "reference",
    }
    """The details, as `history.jsonl` names them (key -> attribute)."""

    def __new__(
        cls,
        text: str,
        rule: EarlyStopRule,
        *,
        split: str | None = None,
        metric: str | None = None,
        epoch: int | None = None,
        iteration: int | None = None,
        value: float | None = None,
        reference: float | None = None,
    ) -> EarlyStop:
        return super().__new__(
            cls,
            text,
            rule=EarlyStopRule(rule),
            split_name=split,
            metric=metric,
            epoch=epoch,
            iteration=iteration,
            value=value,
            reference=reference,
        )

    def to_json(self) -> dict[str, Any]:
        """The rule and the details that are known, for `history.jsonl` (a value that
        is not finite as its repr: "nan", "inf")."""
        data: dict[str, Any] = {"rule": self.rule.value}
        for key, attribute in self._KEYS.items():
            value = getattr(self, attribute)
            if value is not None:
                finite = not isinstance(value, float) or math.isfinite(value)
                data[key] = value if finite else repr(value)
        return data

    @classmethod
    def of(cls, decision: str) -> EarlyStop:
        """`decision` as an `EarlyStop` (plain text from a custom strategy: rule CUSTOM)."""
        return decision if isinstance(decision, EarlyStop) else cls(decision, EarlyStopRule.CUSTOM)


class Outcome(_Text):
    """How a run ended: the text, with `reason` (a `StopReason`), `early_stop` (the
    decision, when early stopping ended it) and `signal` (its number, for SIGNAL)."""

    reason: StopReason
    early_stop: EarlyStop | None
    signal: int | None

    def __new__(
        cls,
        text: str,
        reason: StopReason,
        *,
        early_stop: EarlyStop | None = None,
        signal: int | None = None,
    ) -> Outcome:
        return super().__new__(
            cls, text, reason=StopReason(reason), early_stop=early_stop, signal=signal
        )

    @classmethod
    def completed(cls) -> Outcome:
        return cls("completed", StopReason.COMPLETED)

    @classmethod
    def stopped_early(cls, decision: str) -> Outcome:
        early = EarlyStop.of(decision)
        return cls(f"stopped early: {early}", StopReason.EARLY_STOPPED, early_stop=early)

    @classmethod
    def pruned(cls, why: str) -> Outcome:
        return cls(f"pruned: {why}", StopReason.PRUNED)

    @classmethod
    def stopped(cls, message: str, signal: int | None) -> Outcome:
        reason = StopReason.STOPPED if signal is None else StopReason.SIGNAL
        return cls(f"stopped: {message}", reason, signal=None if signal is None else int(signal))

    @classmethod
    def preempted(cls, signal: int, name: str) -> Outcome:
        return cls(f"preempted: {name}", StopReason.PREEMPTED, signal=int(signal))

    @classmethod
    def time_limit(cls, message: str) -> Outcome:
        return cls(f"stopped: {message}", StopReason.TIME_LIMIT)

    @classmethod
    def failed(cls, error: BaseException, non_finite_loss: bool = False) -> Outcome:
        """How a run that raised `error` ended (`non_finite_loss`: the error is the
        loss guard's `NonFiniteLoss`)."""
        if isinstance(error, KeyboardInterrupt):
            return cls("interrupted", StopReason.INTERRUPTED)
        if non_finite_loss:
            first = str(error).split(". ", 1)[0].rstrip(".")  # "The loss is NaN at ..."
            return cls(f"failed: {first[:1].lower()}{first[1:]}", StopReason.NONFINITE_LOSS)
        return cls("failed", StopReason.FAILED)

    @property
    def exit_code(self) -> int:
        """0 for a run that completed, stopped early, was pruned or stopped on request; 128 +
        the signal number after a signal or a preemption (143 for SIGTERM, 138 for
        SIGUSR1: "preempted, requeue me"); 75 (EX_TEMPFAIL: "run me again") after the time
        limit; 130 after a second Ctrl-C; 1 for a failure."""
        if self.reason is StopReason.INTERRUPTED:
            return 130
        if self.reason is StopReason.TIME_LIMIT:
            return 75
        preempted = (StopReason.SIGNAL, StopReason.PREEMPTED)
        if self.reason in preempted and self.signal is not None:
            return 128 + self.signal
        if self.reason in (StopReason.FAILED, StopReason.NONFINITE_LOSS):
            return 1
        return 0

    def to_json(self) -> dict[str, Any]:
        """The reason, for `history.jsonl` (`stop_reason`)."""
        data: dict[str, Any] = {"reason": self.reason.value}
        if self.signal is not None:
            data["signal"] = self.signal
        if self.early_stop is not None:
            data.update(self.early_stop.to_json())
        return data
