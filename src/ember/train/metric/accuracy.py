"""Classification accuracy, in percent."""

from __future__ import annotations

from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import ClassificationInput


class AccuracyMetric:
    """Share of samples whose highest-scoring class is the target, in percent.

    With `pad_token`, targets equal to it are left out (sequence tasks).
    """

    name = "Accuracy"
    unit = "%"
    higher_is_better = True
    input_type = ClassificationInput

    def __init__(self, pad_token: int | None = None) -> None:
        self.pad_token = pad_token

    def update(self, input: ClassificationInput, meta: MetricMetadata) -> MetricValue:
        output, targets = input.output, input.targets
        pad = self.pad_token if self.pad_token is not None else input.pad_token
        if output.dim() == 2 and output.shape[1] == 1:
            output = output[:, 0]
        binary = output.dim() == 1  # binary: probabilities of the positive class
        predicted = (output > 0.5).to(targets.dtype) if binary else output.argmax(dim=-1)
        correct = predicted == targets
        if pad is None:
            # An exact count on the device; the percentage is taken on the host in float64.
            n = int(targets.numel())
            return MetricValue(correct.sum(), n, scale=100.0 / max(n, 1))
        mask = targets != pad
        count = mask.sum()
        value = (correct & mask).sum() * 100.0 / count.clamp(min=1)
        return MetricValue(value, count)

    def clear(self) -> None:
        pass
