"""Hamming score: the share of correct labels in multi-label classification."""

from __future__ import annotations

from ember.errors import TrainingError
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import MultiLabelInput


class HammingScoreMetric:
    """Share of (sample, label) pairs predicted right, in percent: 100 * (1 - Hamming loss).

    A label is predicted positive when its score exceeds `threshold`; targets are
    positive above 0.5. Every sample has the same number of labels, so the
    batch-size-weighted mean of batch values is the exact epoch value.
    """

    name = "Hamming Score"
    unit = "%"
    higher_is_better = True
    input_type = MultiLabelInput

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = float(threshold)

    def update(self, input: MultiLabelInput, meta: MetricMetadata) -> MetricValue:
        output, targets = input.output, input.targets
        if output.shape != targets.shape:
            raise TrainingError(
                f"{self.name} needs scores and targets of the same shape; got "
                f"{tuple(output.shape)} and {tuple(targets.shape)}."
            )
        correct = (output > self.threshold) == (targets > 0.5)
        return MetricValue(correct.float().mean() * 100.0, int(targets.shape[0]))

    def clear(self) -> None:
        pass
