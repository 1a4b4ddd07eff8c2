"""Classification accuracy, in percent."""

from __future__ import annotations

import torch

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
        if output.dim() == 1:  # binary scores
            predicted = (output > 0.5).to(targets.dtype)
        else:
            predicted = output.argmax(dim=-1)
        correct = predicted == targets
        if pad is None:
            n = int(targets.numel())
            # Counts are exact integers; float64 keeps e.g. 21/32 at exactly 65.625 %.
            return MetricValue(correct.sum().to(torch.float64) * (100.0 / max(n, 1)), n)
        mask = targets != pad
        count = mask.sum()
        value = (correct & mask).sum().to(torch.float64) * 100.0 / count.clamp(min=1).to(torch.float64)
        return MetricValue(value, count)

    def clear(self) -> None:
        pass
