"""Precision, recall and F-beta score, with exact epoch values.

Each update counts, per class, the true positives, the predicted positives and the
actual positives of its batch (a few tensor ops, on the batch's device). The
iteration value is the score of that batch alone; the epoch value is computed once,
in `epoch_value()`, from the counts summed over the epoch, so it equals the score of
the whole epoch's predictions (not a mean of batch scores).

Conventions follow scikit-learn with `zero_division=0`: a ratio with a zero
denominator is 0. "macro" is the mean of per-class scores and "micro" the score of
the summed counts. In multiclass mode the macro mean runs over the classes seen in
the targets or the predictions (scikit-learn's label set); in multilabel mode over
every label column. The results are fractions in [0, 1]. Targets equal to the input's pad
token (sequence outputs) are left out.

Binary scores [N] / [N, 1] and multi-label scores are probabilities unless the metric
is built with `from_logits=True`, which applies a sigmoid first (the outputs of a
model trained with `BCEWithLogitsLoss`). Without it, scores outside [0, 1] on the
first batch of an epoch raise a `TrainingError`: a threshold of 0.5 on logits would
silently mean a probability of about 0.62. Two-class outputs [N, 2] are always
logits (softmax), and multiclass predictions (the top classes) are the same for
logits and probabilities.

Inputs are checked: shapes at every update (binary scores [N] / [N, 1] or logits
[N, 2] against targets [N]; multiclass scores [N, C] against integer class indices
[N]; multi-label scores and targets of one shape [N, C]), values on the first batch
of every epoch (class indices within [0, C), binary and multi-label targets within
[0, 1]). A wrong input raises a `TrainingError` saying what the metric reads and
what it got.
"""

from __future__ import annotations

import math
from typing import Literal, TypeVar

import torch

from ember.errors import ConfigError, TrainingError
from ember.train.metric._common import (
    Probabilities,
    SummedCounts,
    add_class_range,
    add_unit_range,
    check_binary,
    check_classes,
    check_same_shape,
    dims,
    who,
)
from ember.train.metric.base import MetricMetadata, MetricValue, Number
from ember.train.metric.inputs import ClassificationInput, MultiLabelInput

Mode = Literal["binary", "multiclass", "multilabel"]
Reduction = Literal["macro", "micro"]

_MODES = ("binary", "multiclass", "multilabel")
_REDUCTIONS = ("macro", "micro")
_T = TypeVar("_T", bound="_ConfusionMetric")
_EXPECTS = {
    "binary": "scores [N] or [N, 1] (or two-class logits [N, 2]) and 0/1 targets [N]",
    "multiclass": "outputs [N, C] and class-index targets [N]",
    "multilabel": "scores and 0/1 targets of one shape, [N, C]",
}


class _ConfusionMetric(SummedCounts):
    """Shared machinery: batch confusion counts [3, C] = (true pos., predicted pos.,
    actual pos.) per class, summed over the epoch."""

    unit = ""
    higher_is_better = True
    _label = "Score"

    def __init__(
        self,
        mode: Mode = "multiclass",
        *,
        threshold: float = 0.5,
        top_k: int = 1,
        reduction: Reduction = "macro",
        name: str | None = None,
        from_logits: bool = False,
    ) -> None:
        cls = type(self).__name__
        if mode not in _MODES:
            raise ConfigError(f"{cls}: mode must be one of {_MODES}, got {mode!r}.")
        if reduction not in _REDUCTIONS:
            raise ConfigError(f"{cls}: reduction must be one of {_REDUCTIONS}, got {reduction!r}.")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ConfigError(f"{cls}: top_k must be a positive integer, got {top_k!r}.")
        if not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
            raise ConfigError(f"{cls}: threshold must be a finite number, got {threshold!r}.")
        self.mode: Mode = mode
        self.threshold = float(threshold)
        self.top_k = top_k
        self.reduction: Reduction = reduction
        self.input_type: type = MultiLabelInput if mode == "multilabel" else ClassificationInput
        self.name = name if name is not None else self._label
        self.from_logits = from_logits
        self._probabilities = Probabilities(from_logits, f"{cls}.{mode}()")
        self._who = who(f"{cls}.{mode}()", self.name)
        super().__init__()

    # -- the protocol -------------------------------------------------------------
    def update(
        self, input: ClassificationInput | MultiLabelInput, meta: MetricMetadata
    ) -> MetricValue:
        if self.mode == "multilabel":
            counts, weight = self._multilabel_counts(input)  # type: ignore[arg-type]
        elif self.mode == "multiclass":
            counts, weight = self._multiclass_counts(input)  # type: ignore[arg-type]
        else:
            counts, weight = self._binary_counts(input)  # type: ignore[arg-type]
        return self._counted(counts, weight, input.output)

    # -- scoring ------------------------------------------------------------------
    def _ratio(
        self, tp: torch.Tensor, predicted: torch.Tensor, actual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _score(self, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        counts = counts.to(dtype)
        weights = None
        if self.reduction == "micro":
            counts = counts.sum(dim=-1, keepdim=True)
        elif self.mode == "multiclass":
            # scikit-learn's label set: classes present in the targets or predictions.
            weights = ((counts[1] + counts[2]) > 0).to(dtype)
        numerator, denominator = self._ratio(counts[0], counts[1], counts[2])
        # A zero denominator implies a zero numerator, so this yields 0 there.
        score = numerator / denominator.clamp(min=torch.finfo(dtype).tiny)
        if weights is None:
            return score.mean()
        return (score * weights).sum() / weights.sum().clamp(min=1.0)

    # -- counting -----------------------------------------------------------------
    def _binary_counts(self, input: ClassificationInput) -> tuple[torch.Tensor, Number]:
        output, targets = input.output, input.targets
        if not (output.dim() == 1 or (output.dim() == 2 and output.shape[-1] in (1, 2))):
            raise TrainingError(
                f"{self._who} reads {_EXPECTS['binary']}; got outputs {dims(output.shape)} "
                f"and targets {dims(input.targets.shape)}. Use "
                f"{type(self).__name__}.multiclass() for more classes."
            )
        targets = check_binary(self._who, _EXPECTS["binary"], output, targets)
        mask = None if input.pad_token is None else targets != input.pad_token
        checks = self._checks
        if output.dim() == 2 and output.shape[-1] == 2:  # two-class logits
            predicted = output.softmax(dim=-1)[:, 1] > self.threshold
        else:
            scores = self._probabilities(output.reshape(-1), self.name, checks, mask)
            predicted = scores > self.threshold
        add_unit_range(
            checks,
            self._who,
            targets,
            mask,
            hint=f"Targets of more classes need {type(self).__name__}.multiclass().",
        )
        checks.verify()
        actual = targets > 0.5
        weight: Number = int(targets.shape[0])
        if mask is not None:
            predicted, actual, weight = predicted & mask, actual & mask, mask.sum()
        counts = torch.stack((predicted & actual, predicted, actual)).sum(dim=-1, keepdim=True)
        return counts, weight

    def _multiclass_counts(self, input: ClassificationInput) -> tuple[torch.Tensor, Number]:
        output, targets = input.output, input.targets
        if output.dim() != 2:
            raise TrainingError(
                f"{self._who} reads {_EXPECTS['multiclass']}; got outputs "
                f"{dims(output.shape)} and targets {dims(targets.shape)}. Use "
                f"{type(self).__name__}.binary() for scores [N]; flatten sequences "
                "(outputs.view(-1, C), targets.view(-1))."
            )
        check_classes(self._who, _EXPECTS["multiclass"], output, targets)
        targets = targets.long()
        classes = int(output.shape[-1])
        if self._checks.due:
            keep = None if input.pad_token is None else targets != input.pad_token
            add_class_range(self._checks, self._who, output, targets, keep)
        self._checks.verify()
        k = min(self.top_k, classes)
        if k == 1:
            predicted = output.argmax(dim=-1)
        else:
            # As torchmetrics: the prediction is the target when it is among the top k,
            # else the top-1 class.
            top = output.topk(k, dim=-1).indices
            hit = (top == targets.unsqueeze(-1)).any(dim=-1)
            predicted = torch.where(hit, targets, top[:, 0])
        correct = (predicted == targets).long()
        n = int(targets.shape[0])
        if input.pad_token is None:
            counted = torch.ones(2 * n, dtype=torch.long, device=targets.device)
            source = torch.cat((correct, counted))
            weight: Number = n
        else:
            mask = targets != input.pad_token
            targets = torch.where(mask, targets, 0)  # pad ids may lie outside [0, C)
            counted = mask.long()
            source = torch.cat((correct * counted, counted, counted))
            weight = mask.sum()
        index = torch.cat((targets, predicted + classes, targets + 2 * classes))
        counts = torch.zeros(3 * classes, dtype=torch.long, device=targets.device)
        return counts.index_add_(0, index, source).view(3, classes), weight

    def _multilabel_counts(self, input: MultiLabelInput) -> tuple[torch.Tensor, Number]:
        output, targets = input.output, input.targets
        check_same_shape(self._who, _EXPECTS["multilabel"], output, targets)
        checks = self._checks
        predicted = self._probabilities(output, self.name, checks) > self.threshold
        add_unit_range(
            checks,
            self._who,
            targets,
            hint=f"Class indices need {type(self).__name__}.multiclass().",
        )
        checks.verify()
        actual = targets > 0.5
        counts = torch.stack((predicted & actual, predicted, actual)).sum(dim=1)
        return counts, int(targets.shape[0])


class _PrecisionRecall(_ConfusionMetric):
    """The constructors precision and recall share."""

    @classmethod
    def binary(
        cls: type[_T],
        threshold: float = 0.5,
        *,
        name: str | None = None,
        from_logits: bool = False,
    ) -> _T:
        """Binary: scores [N] or [N, 1] above `threshold`, or logits [N, 2], against 0/1 targets.

        Scores [N] / [N, 1] are probabilities unless `from_logits=True`, which applies
        a sigmoid before the threshold; probabilities outside [0, 1] raise a
        `TrainingError`.
        """
        return cls("binary", threshold=threshold, name=name, from_logits=from_logits)

    @classmethod
    def multiclass(
        cls: type[_T], top_k: int = 1, reduction: Reduction = "macro", *, name: str | None = None
    ) -> _T:
        """Single-label: scores [N, C] against class indices [N]."""
        return cls("multiclass", top_k=top_k, reduction=reduction, name=name)

    @classmethod
    def multilabel(
        cls: type[_T],
        threshold: float = 0.5,
        reduction: Reduction = "macro",
        *,
        name: str | None = None,
        from_logits: bool = False,
    ) -> _T:
        """Multi-label: scores [N, C] above `threshold` against 0/1 targets [N, C].

        Scores are probabilities unless `from_logits=True`, which applies a sigmoid
        before the threshold; probabilities outside [0, 1] raise a `TrainingError`.
        """
        return cls(
            "multilabel",
            threshold=threshold,
            reduction=reduction,
            name=name,
            from_logits=from_logits,
        )


class PrecisionMetric(_PrecisionRecall):
    """Precision tp / (tp + fp): the share of predicted positives that are right.

    Binary and multi-label scores are probabilities unless `from_logits=True` (a
    sigmoid is applied first).
    """

    _label = "Precision"

    def _ratio(
        self, tp: torch.Tensor, predicted: torch.Tensor, actual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return tp, predicted


class RecallMetric(_PrecisionRecall):
    """Recall tp / (tp + fn): the share of actual positives that are found.

    Binary and multi-label scores are probabilities unless `from_logits=True` (a
    sigmoid is applied first).
    """

    _label = "Recall"

    def _ratio(
        self, tp: torch.Tensor, predicted: torch.Tensor, actual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return tp, actual


class FBetaScoreMetric(_ConfusionMetric):
    """F-beta score (1 + b²) tp / ((1 + b²) tp + b² fn + fp); beta = 1 gives F1.

    Named f"F{beta:g} Score" ("F1 Score", "F0.5 Score"). Binary and multi-label scores
    are probabilities unless `from_logits=True` (a sigmoid is applied first).
    """

    def __init__(
        self,
        beta: float = 1.0,
        mode: Mode = "multiclass",
        *,
        threshold: float = 0.5,
        top_k: int = 1,
        reduction: Reduction = "macro",
        name: str | None = None,
        from_logits: bool = False,
    ) -> None:
        if (
            isinstance(beta, bool)
            or not isinstance(beta, (int, float))
            or not math.isfinite(beta)
            or beta <= 0
        ):
            raise ConfigError(f"FBetaScoreMetric: beta must be a positive number, got {beta!r}.")
        self.beta = float(beta)
        self._label = f"F{self.beta:g} Score"
        super().__init__(
            mode,
            threshold=threshold,
            top_k=top_k,
            reduction=reduction,
            name=name,
            from_logits=from_logits,
        )

    @classmethod
    def binary(
        cls,
        beta: float = 1.0,
        threshold: float = 0.5,
        *,
        name: str | None = None,
        from_logits: bool = False,
    ) -> FBetaScoreMetric:
        """Binary: scores [N] or [N, 1] above `threshold`, or logits [N, 2], against 0/1 targets.

        Scores [N] / [N, 1] are probabilities unless `from_logits=True`, which applies
        a sigmoid before the threshold; probabilities outside [0, 1] raise a
        `TrainingError`.
        """
        return cls(beta, "binary", threshold=threshold, name=name, from_logits=from_logits)

    @classmethod
    def multiclass(
        cls,
        beta: float = 1.0,
        top_k: int = 1,
        reduction: Reduction = "macro",
        *,
        name: str | None = None,
    ) -> FBetaScoreMetric:
        """Single-label: scores [N, C] against class indices [N]."""
        return cls(beta, "multiclass", top_k=top_k, reduction=reduction, name=name)

    @classmethod
    def multilabel(
        cls,
        beta: float = 1.0,
        threshold: float = 0.5,
        reduction: Reduction = "macro",
        *,
        name: str | None = None,
        from_logits: bool = False,
    ) -> FBetaScoreMetric:
        """Multi-label: scores [N, C] above `threshold` against 0/1 targets [N, C].

        Scores are probabilities unless `from_logits=True`, which applies a sigmoid
        before the threshold; probabilities outside [0, 1] raise a `TrainingError`.
        """
        return cls(
            beta,
            "multilabel",
            threshold=threshold,
            reduction=reduction,
            name=name,
            from_logits=from_logits,
        )

    def _ratio(
        self, tp: torch.Tensor, predicted: torch.Tensor, actual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # (1 + b²) tp + b² fn + fp  ==  b² (tp + fn) + (tp + fp)
        b2 = self.beta * self.beta
        return (1.0 + b2) * tp, b2 * actual + predicted
