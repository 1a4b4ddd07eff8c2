"""Metrics of the whole epoch's confusion matrix: Matthews correlation and the matrix.

Each update counts its batch into a [C, C] matrix on the batch's device (row: the
target class, column: the predicted class, as scikit-learn's `confusion_matrix`);
the epoch keeps the sum, merged across processes. Predictions follow the other
classification metrics: binary scores [N] / [N, 1] are probabilities above
`threshold` (logits with `from_logits=True`), two-class logits [N, 2] and
multiclass outputs [N, C] predict their top class, multi-label scores [N, L] are
thresholded label by label.
"""

from __future__ import annotations

import math
from typing import Any, Literal

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
_MODES = ("binary", "multiclass", "multilabel")
_Rows = tuple[torch.Tensor, torch.Tensor, int, "torch.Tensor | None"]
"""Targets and predicted classes [M], the number of classes, the rows kept (None: all)."""
_EXPECTS = {
    "binary": "scores [N] or [N, 1] (or two-class logits [N, 2]) and 0/1 targets [N]",
    "multiclass": "outputs [N, C] and class-index targets [N]",
    "multilabel": "scores and 0/1 targets of one shape, [N, L]",
}


class _MatrixMetric(SummedCounts):
    """Shared machinery: a [C, C] count matrix per batch, summed over the epoch."""

    unit = ""
    higher_is_better: bool | None = True
    _label = ""
    _modes: tuple[str, ...] = _MODES

    def __init__(
        self,
        mode: Mode = "multiclass",
        *,
        threshold: float = 0.5,
        name: str | None = None,
        from_logits: bool = False,
    ) -> None:
        cls = type(self).__name__
        if mode not in self._modes:
            raise ConfigError(f"{cls}: mode must be one of {self._modes}, got {mode!r}.")
        if not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
            raise ConfigError(f"{cls}: threshold must be a finite number, got {threshold!r}.")
        self.mode: Mode = mode
        self.threshold = float(threshold)
        self.from_logits = from_logits
        self.input_type: type = MultiLabelInput if mode == "multilabel" else ClassificationInput
        self.name = name if name is not None else self._label
        self._probabilities = Probabilities(from_logits, f"{cls}.{mode}()")
        self._who = who(f"{cls}.{mode}()", self.name)
        super().__init__()

    @classmethod
    def binary(
        cls, threshold: float = 0.5, *, name: str | None = None, from_logits: bool = False
    ) -> Any:
        """Binary: scores [N] or [N, 1] above `threshold`, or logits [N, 2], against 0/1
        targets [N]. Scores [N] / [N, 1] are probabilities unless `from_logits=True`."""
        return cls("binary", threshold=threshold, name=name, from_logits=from_logits)

    @classmethod
    def multiclass(cls, *, name: str | None = None) -> Any:
        """Single-label: scores or logits [N, C] (top class) against class indices [N]."""
        return cls("multiclass", name=name)

    # -- the protocol -------------------------------------------------------------
    def update(
        self, input: ClassificationInput | MultiLabelInput, meta: MetricMetadata
    ) -> MetricValue:
        if self.mode == "multilabel":
            targets, predicted, classes, keep = self._multilabel(input)  # type: ignore[arg-type]
        elif self.mode == "multiclass":
            targets, predicted, classes, keep = self._multiclass(input)  # type: ignore[arg-type]
        else:
            targets, predicted, classes, keep = self._binary(input)  # type: ignore[arg-type]
        cells = classes * classes
        index = targets * classes + predicted
        if keep is not None:  # padding rows go to one extra bin, then are dropped
            index = torch.where(keep, index, cells)
        counts = torch.bincount(index, minlength=cells + 1)[:cells].view(classes, classes)
        weight: Number = int(input.targets.shape[0]) if keep is None else keep.sum()
        return self._counted(counts, weight, input.output)

    def score(self, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The value of a count matrix, computed in `dtype`."""
        raise NotImplementedError

    def _score(self, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self.score(counts, dtype)

    # -- predictions --------------------------------------------------------------
    def _binary(self, input: ClassificationInput) -> _Rows:
        output, targets = input.output, input.targets
        if not (output.dim() == 1 or (output.dim() == 2 and output.shape[-1] in (1, 2))):
            raise TrainingError(
                f"{self._who} reads {_EXPECTS['binary']}; got outputs {dims(output.shape)} "
                f"and targets {dims(targets.shape)}. Use {type(self).__name__}.multiclass() "
                "for more classes."
            )
        targets = check_binary(self._who, _EXPECTS["binary"], output, targets)
        keep = None if input.pad_token is None else targets != input.pad_token
        if output.dim() == 2 and output.shape[-1] == 2:  # two-class logits
            predicted = output.argmax(dim=-1)
        else:
            scores = self._probabilities(output.reshape(-1), self.name, self._checks, keep)
            predicted = (scores > self.threshold).long()
        add_unit_range(
            self._checks,
            self._who,
            targets,
            keep,
            exact=True,
            hint=f"Targets of more classes need {type(self).__name__}.multiclass().",
        )
        self._checks.verify()
        return targets.long(), predicted, 2, keep

    def _multiclass(self, input: ClassificationInput) -> _Rows:
        output, targets = input.output, input.targets
        if output.dim() != 2:
            raise TrainingError(
                f"{self._who} reads {_EXPECTS['multiclass']}; got outputs "
                f"{dims(output.shape)} and targets {dims(targets.shape)}. Use "
                f"{type(self).__name__}.binary() for scores [N]; flatten sequences "
                "(outputs.view(-1, C), targets.view(-1))."
            )
        check_classes(self._who, _EXPECTS["multiclass"], output, targets)
        keep = None if input.pad_token is None else targets != input.pad_token
        add_class_range(self._checks, self._who, output, targets, keep)
        self._checks.verify()
        targets = targets.long()
        if keep is not None:  # pad ids may lie outside [0, C)
            targets = torch.where(keep, targets, 0)
        return targets, output.argmax(dim=-1), int(output.shape[-1]), keep

    def _multilabel(self, input: MultiLabelInput) -> _Rows:
        output, targets = input.output, input.targets
        check_same_shape(self._who, _EXPECTS["multilabel"], output, targets)
        predicted = self._probabilities(output, self.name, self._checks) > self.threshold
        add_unit_range(
            self._checks,
            self._who,
            targets,
            exact=True,
            hint=f"Class indices need {type(self).__name__}.multiclass().",
        )
        self._checks.verify()
        # Every (sample, label) decision pooled into one binary matrix.
        return (targets > 0.5).long().reshape(-1), predicted.long().reshape(-1), 2, None


class MccMetric(_MatrixMetric):
    """Matthews correlation coefficient of the whole epoch, unitless in [-1, 1].

    Binary and multiclass values are scikit-learn's `matthews_corrcoef` (its
    multiclass form, Gorodkin's R_K, for more than two classes); multi-label MCC
    pools every (sample, label) decision into one binary confusion matrix (the MCC of
    the flattened predictions and targets). A matrix whose predictions or targets hold
    a single class scores 0. The iteration value is the MCC of the batch; the epoch
    value is the MCC of the epoch's summed count matrix. Binary and multi-label scores
    are probabilities unless `from_logits=True` (a sigmoid is applied first).
    """

    _label = "MCC"

    @classmethod
    def multilabel(
        cls, threshold: float = 0.5, *, name: str | None = None, from_logits: bool = False
    ) -> MccMetric:
        """Multi-label: scores [N, L] above `threshold` against 0/1 targets [N, L]."""
        return cls("multilabel", threshold=threshold, name=name, from_logits=from_logits)

    def score(self, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return matthews(counts, dtype)


class ConfusionMatrixMetric(_MatrixMetric):
    """The confusion matrix of the whole epoch: counts [C, C], row = target class,
    column = predicted class (scikit-learn's `confusion_matrix`); binary outputs give
    a 2 x 2 matrix (classes 0 and 1).

    Its number per iteration and epoch is the accuracy (the matrix's trace over its
    total, in percent); the matrix itself is `matrix()` (also after the epoch's end,
    until the next epoch starts) and the learner saves each epoch's matrix with the
    run (`ember summary` prints it as a table, `ember plot` draws it as a heat map).
    """

    _label = "Confusion Matrix"
    unit = "%"
    _modes = ("binary", "multiclass")

    def matrix(self) -> torch.Tensor | None:
        """The epoch's counts so far, [C, C] int64 on the host (None before any batch)."""
        return self.epoch_state()

    def score(self, counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        counts = counts.to(dtype)
        return counts.trace() * 100.0 / counts.sum().clamp(min=1.0)


def matthews(counts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The MCC of a count matrix (rows: targets, columns: predictions), as scikit-learn
    computes it; 0 where it is undefined."""
    c = counts.to(dtype)
    true, predicted = c.sum(dim=1), c.sum(dim=0)
    total, correct = c.sum(), c.trace()
    cov_tp = correct * total - (true * predicted).sum()
    cov_pp = total * total - (predicted * predicted).sum()
    cov_tt = total * total - (true * true).sum()
    denominator = cov_pp * cov_tt
    return torch.where(denominator > 0, cov_tp / denominator.clamp(min=1.0).sqrt(), 0.0)
