"""Area under the ROC curve, computed over the whole epoch."""

from __future__ import annotations

import math
from typing import Any

import torch

from ember.errors import TrainingError
from ember.train.metric._common import (
    FirstBatch,
    Probabilities,
    add_class_range,
    add_unit_range,
    check_binary,
    check_classes,
    check_same_shape,
    dims,
    wide_float,
)
from ember.train.metric.base import MetricMetadata, MetricValue, Number
from ember.train.metric.inputs import ScoresInput

_WHO = "AurocMetric ('AUROC')"
_BINARY = "binary scores [N] or [N, 1] (or two-class logits [N, 2]) and 0/1 targets [N]"
_SINGLE = "scores [N] or [N, C] and class-index targets [N]"
_MULTILABEL = "scores and 0/1 targets of one shape, [N, C]"


def rank_auroc(
    scores: torch.Tensor,
    positive: torch.Tensor,
    valid: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Macro AUROC of the columns of `scores` [N, K] against `positive` [N, K], on device.

    Uses the rank-sum (Mann-Whitney) form with tied scores given their average rank,
    which equals the trapezoidal area under the ROC curve. Rows where `valid` [N] is
    False are left out. Columns without both positives and negatives are skipped;
    the result is NaN when no column qualifies.
    """
    s, pos = scores.t(), positive.t()  # [K, N]: rank each column along its samples
    n = s.shape[-1]
    skipped: torch.Tensor | int = 0
    kept: torch.Tensor | int = n
    if valid is not None:
        s = s.masked_fill(~valid, float("-inf"))  # left-out rows take the lowest ranks
        pos = pos & valid
        kept = valid.sum()
        skipped = n - kept
    ordered, order = s.sort(dim=-1)
    ordered = ordered.contiguous()
    # 0-based first and one-past-last positions of each value's tie group: twice
    # the average 1-based rank is lo + hi + 1, an exact integer.
    lo = torch.searchsorted(ordered, ordered)
    hi = torch.searchsorted(ordered, ordered, right=True)
    n_pos = pos.sum(dim=-1)
    n_neg = kept - n_pos
    twice_rank_sum = ((lo + hi + 1) * pos.gather(-1, order)).sum(dim=-1) - 2 * skipped * n_pos
    twice_u = twice_rank_sum - n_pos * (n_pos + 1)
    area = twice_u.to(dtype) / (2 * n_pos * n_neg).to(dtype)
    defined = (n_pos > 0) & (n_neg > 0)
    return torch.where(defined, area, 0.0).sum() / defined.sum().to(dtype)


class AurocMetric:
    """Area under the ROC curve (AUROC) of the whole epoch, unitless in [0, 1].

    The mode follows the output: binary for scores [N] / [N, 1] (or two-class
    logits [N, 2], ranked by their difference), one-vs-rest macro for scores
    [N, C >= 3], and label-wise macro for multi-label outputs. The iteration value
    is the AUROC of the batch alone (NaN if it lacks a class); the epoch value is
    computed once, at epoch end, from every score of the epoch kept on the device.
    Classes (or labels) without both positive and negative samples are left out of
    the macro mean.

    Binary [N] / [N, 1] and multi-label scores are probabilities unless
    `from_logits=True`; without it, scores outside [0, 1] on the first batch of an
    epoch raise a `TrainingError`, as for the thresholded metrics. A sigmoid does not
    change the ranking, so logits are ranked as they are (which also keeps large
    logits apart, where float32 sigmoids would round to a tie at 1). Scores [N, C >= 3]
    go through a softmax with `from_logits=True`; without it, a batch already in
    [0, 1] is read as probabilities and any other batch goes through a softmax (as in
    torchmetrics).

    Shapes are checked at every update: binary scores against targets [N] (or
    [N, 1]), scores [N, C >= 3] against integer class indices [N], multi-label scores
    and targets of one shape [N, C], and the same number of columns all epoch. Values
    are checked on the first batch of every epoch: class indices within [0, C),
    binary and multi-label targets within [0, 1].
    """

    name = "AUROC"
    unit = ""
    higher_is_better = True
    input_type = ScoresInput

    _area = staticmethod(rank_auroc)
    _who = _WHO

    def __init__(self, *, from_logits: bool = False) -> None:
        self.from_logits = from_logits
        self._probabilities = Probabilities(from_logits, f"{type(self).__name__}()")
        self._checks = FirstBatch()
        self._scores: list[torch.Tensor] = []
        self._positive: list[torch.Tensor] = []
        self._valid: list[torch.Tensor | None] = []

    def update(self, input: ScoresInput, meta: MetricMetadata) -> MetricValue:
        scores, positive, valid = self._columns(input)
        if self._scores and self._scores[0].shape[1] != scores.shape[1]:
            raise TrainingError(
                f"{self._who} ranks {self._scores[0].shape[1]} score columns this epoch, but a "
                f"batch has outputs {dims(input.output.shape)} with {scores.shape[1]}: every "
                "batch needs the same number of output columns."
            )
        self._checks.verify()
        self._scores.append(scores)
        self._positive.append(positive)
        self._valid.append(valid)
        weight: Number = int(scores.shape[0]) if valid is None else valid.sum()
        return MetricValue(self._area(scores, positive, valid), weight)

    def epoch_value(self) -> torch.Tensor | float:
        """The AUROC of every sample seen since the last `clear()`."""
        if not self._scores:
            return math.nan
        scores = torch.cat(self._scores)
        positive = torch.cat(self._positive)
        valid = None
        if any(v is not None for v in self._valid):
            valid = torch.cat(
                [
                    v if v is not None else torch.ones(len(s), dtype=torch.bool, device=s.device)
                    for v, s in zip(self._valid, self._scores)
                ]
            )
        return self._area(scores, positive, valid, wide_float(scores.device))

    def clear(self) -> None:
        self._scores, self._positive, self._valid = [], [], []
        self._checks.reset()

    def epoch_state(self) -> tuple[list[Any], list[Any], list[Any]]:
        """This process's scores (exchanged when training on several processes)."""
        return (
            _moved(self._scores, "cpu"),
            _moved(self._positive, "cpu"),
            _moved(self._valid, "cpu"),
        )

    def merge_epoch_states(self, states: list[Any]) -> None:
        """Add other processes' scores, so `epoch_value` covers every sample."""
        device = self._scores[0].device if self._scores else torch.device("cpu")
        for scores, positive, valid in states:
            self._scores += _moved(scores, device)
            self._positive += _moved(positive, device)
            self._valid += _moved(valid, device)

    def _columns(
        self, input: ScoresInput
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Scores [N, K], positives [N, K] and the rows kept [N] (None: all)."""
        output, targets = input.output.detach(), input.targets
        checks = self._checks
        if input.multilabel:
            check_same_shape(self._who, _MULTILABEL, output, targets)
            self._check_range(output, None)
            add_unit_range(checks, self._who, targets, hint=_CLASSES_HINT)
            # A copy: the stored scores must outlive a reused output buffer.
            return output.to(torch.float32, copy=True), targets > 0.5, None
        if output.dim() == 1 or (output.dim() == 2 and output.shape[-1] in (1, 2)):
            targets = check_binary(self._who, _BINARY, output, targets)
        elif output.dim() == 2:
            check_classes(self._who, _SINGLE, output, targets)
        valid = None if input.pad_token is None else targets != input.pad_token
        if output.dim() == 1 or (output.dim() == 2 and output.shape[-1] == 1):
            self._check_range(output.reshape(-1), valid)
            add_unit_range(checks, self._who, targets, valid, hint=_BINARY_HINT)
            scores = output.reshape(-1, 1).to(torch.float32, copy=True)
            positive = (targets > 0.5).reshape(-1, 1)
        elif output.dim() == 2 and output.shape[-1] == 2:
            add_unit_range(checks, self._who, targets, valid, hint=_BINARY_HINT)
            # softmax(x)[1] = sigmoid(x1 - x0): the difference ranks like the probability.
            scores = (output[:, 1] - output[:, 0]).unsqueeze(-1).float()
            positive = (targets > 0.5).unsqueeze(-1)
        elif output.dim() == 2:
            add_class_range(checks, self._who, output, targets, valid)
            output = output.float()
            if self.from_logits:
                scores = output.softmax(dim=-1)
            else:
                is_probability = ((output >= 0) & (output <= 1)).all()
                scores = torch.where(is_probability, output, output.softmax(dim=-1))
            classes = torch.arange(output.shape[-1], device=targets.device)
            positive = targets.unsqueeze(-1) == classes
        else:
            raise TrainingError(
                f"{self._who} reads {_SINGLE}; got outputs {dims(output.shape)} and targets "
                f"{dims(targets.shape)}: flatten sequences (outputs.view(-1, C), "
                "targets.view(-1))."
            )
        if valid is not None:
            positive = positive & valid.unsqueeze(-1)
        return scores, positive, valid

    def _check_range(self, scores: torch.Tensor, valid: torch.Tensor | None) -> None:
        """Probabilities must lie in [0, 1] (checked on an epoch's first batch); logits
        are ranked as they are, since a sigmoid keeps their order."""
        if not self.from_logits:
            self._probabilities(scores, self.name, self._checks, valid)


_BINARY_HINT = "Targets of more classes need outputs [N, C], one column per class."
_CLASSES_HINT = "Class indices need a single-label output (ClassificationOutput)."


def _moved(tensors: list[Any], device: Any) -> list[Any]:
    """The same list with every tensor on `device` (None entries kept)."""
    return [None if t is None else t.to(device) for t in tensors]
