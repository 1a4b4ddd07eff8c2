"""Classification accuracy, in percent."""

from __future__ import annotations

import torch

from ember.errors import TrainingError
from ember.train.metric._common import (
    INTEGRAL,
    FirstBatch,
    Probabilities,
    add_class_range,
    add_unit_range,
    check_binary,
    check_classes,
    dims,
    percent_correct,
)
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import ClassificationInput

_CLASSES = "outputs [N, C] and class-index targets [N]"
_BINARY = "binary scores [N] or [N, 1] and 0/1 targets [N]"


class AccuracyMetric:
    """Share of samples whose highest-scoring class is the target, in percent.

    Binary scores [N] / [N, 1] count as class 1 above a probability of 0.5, against
    0/1 targets [N] (or [N, 1]). They are probabilities unless `from_logits=True`,
    which applies a sigmoid first (the outputs of a model trained with
    `BCEWithLogitsLoss`); without it, binary scores outside [0, 1] on the first batch
    of an epoch raise a `TrainingError`. Scores [N, C] may be logits or probabilities
    alike (the top class is the same), against integer class indices [N].

    Shapes are checked at every update; target values (class indices within
    [0, C), binary targets 0 or 1) on the first batch of every epoch. Both raise a
    `TrainingError` saying what the metric reads and what it got.

    With `pad_token`, targets equal to it are left out (sequence tasks).
    """

    name = "Accuracy"
    unit = "%"
    higher_is_better = True
    input_type = ClassificationInput

    def __init__(self, pad_token: int | None = None, *, from_logits: bool = False) -> None:
        self.pad_token = pad_token
        self.from_logits = from_logits
        self._probabilities = Probabilities(from_logits, "AccuracyMetric()")
        self._checks = FirstBatch()

    def quick(self, output: torch.Tensor, targets: torch.Tensor) -> MetricValue | None:
        """`update`'s common case, read from the output's fields as they are: scores
        [N, C] against class indices [N], without padding, once the epoch's first batch
        is checked. None in any other case (then `update` reads its input)."""
        if self._checks.active or self.pad_token is not None:
            return None
        shape, target_shape = output.shape, targets.shape
        if (
            len(shape) == 2
            and len(target_shape) == 1
            and shape[1] > 1
            and shape[0] == target_shape[0]
            and targets.dtype in INTEGRAL
        ):  # the count of correct predictions, made as `percent_correct` makes it
            n = shape[0]
            correct = (output.argmax(dim=-1) == targets).sum()
            return tuple.__new__(MetricValue, (correct, n, 100.0, max(n, 1)))
        return None

    def update(self, input: ClassificationInput, meta: MetricMetadata) -> MetricValue:
        output, targets = input.output, input.targets
        pad = self.pad_token if self.pad_token is not None else input.pad_token
        checks = self._checks
        predicted: torch.Tensor
        if pad is None:
            value = self.quick(output, targets)
            if value is not None:
                return value
        if output.dim() == 1 or (output.dim() == 2 and output.shape[1] == 1):
            # binary: scores of the positive class
            targets = check_binary("AccuracyMetric", _BINARY, output, targets)
            mask = None if pad is None else targets != pad
            add_unit_range(
                checks,
                "AccuracyMetric",
                targets,
                mask,
                exact=True,
                hint="Targets of more classes need outputs [N, C], one column per class.",
            )
            scores = self._probabilities(output.reshape(-1), self.name, checks, mask)
            checks.verify()
            predicted = (scores > 0.5).to(targets.dtype)
        elif output.dim() == 2:
            check_classes("AccuracyMetric", _CLASSES, output, targets)
            mask = None if pad is None else targets != pad
            add_class_range(checks, "AccuracyMetric", output, targets, mask)
            checks.verify()
            predicted = output.argmax(dim=-1)
        else:
            raise TrainingError(
                f"AccuracyMetric reads {_CLASSES} (or {_BINARY}); got outputs "
                f"{dims(output.shape)} and "
                f"targets {dims(targets.shape)}: flatten them to one row per prediction "
                "(outputs.view(-1, C), targets.view(-1)), or return a SequenceOutput."
            )
        return percent_correct(predicted == targets, mask)

    def clear(self) -> None:
        self._checks.reset()
