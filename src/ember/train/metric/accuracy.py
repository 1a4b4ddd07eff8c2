"""Classification accuracy, in percent."""

from __future__ import annotations

from ember.train.metric._common import Probabilities, percent_correct, resolve_pad
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import ClassificationInput


class AccuracyMetric:
    """Share of samples whose highest-scoring class is the target, in percent.

    Binary scores [N] / [N, 1] count as class 1 above a probability of 0.5. They are
    probabilities unless `from_logits=True`, which applies a sigmoid first (the
    outputs of a model trained with `BCEWithLogitsLoss`); without it, binary scores
    outside [0, 1] on the first batch of an epoch raise a `TrainingError`. Scores
    [N, C] may be logits or probabilities alike: the top class is the same.

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

    def update(self, input: ClassificationInput, meta: MetricMetadata) -> MetricValue:
        output, targets = input.output, input.targets
        pad = resolve_pad(self.pad_token, input.pad_token)
        mask = None if pad is None else targets != pad
        if output.dim() == 2 and output.shape[1] == 1:
            output = output[:, 0]
        if output.dim() == 1:  # binary: scores of the positive class
            scores = self._probabilities(output, self.name, mask)
            predicted = (scores > 0.5).to(targets.dtype)
        else:
            predicted = output.argmax(dim=-1)
        return percent_correct(predicted == targets, mask)

    def clear(self) -> None:
        self._probabilities.reset()
