"""Hamming score: the share of correct labels in multi-label classification."""

from __future__ import annotations

from ember.errors import TrainingError
from ember.train.metric._common import Probabilities
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import MultiLabelInput


class HammingScoreMetric:
    """Share of (sample, label) pairs predicted right, in percent: 100 * (1 - Hamming loss).

    A label is predicted positive when its probability exceeds `threshold`; targets
    are positive above 0.5. Scores are probabilities unless `from_logits=True`, which
    applies a sigmoid first (the outputs of a model trained with `BCEWithLogitsLoss`);
    without it, scores outside [0, 1] on the first batch of an epoch raise a
    `TrainingError`. Every sample has the same number of labels, so the
    batch-size-weighted mean of batch values is the exact epoch value.
    """

    name = "Hamming Score"
    unit = "%"
    higher_is_better = True
    input_type = MultiLabelInput

    def __init__(self, threshold: float = 0.5, *, from_logits: bool = False) -> None:
        self.threshold = float(threshold)
        self.from_logits = from_logits
        self._probabilities = Probabilities(from_logits, "HammingScoreMetric()")

    def update(self, input: MultiLabelInput, meta: MetricMetadata) -> MetricValue:
        output, targets = input.output, input.targets
        if output.shape != targets.shape:
            raise TrainingError(
                f"{self.name} needs scores and targets of the same shape; got "
                f"{tuple(output.shape)} and {tuple(targets.shape)}."
            )
        predicted = self._probabilities(output, self.name) > self.threshold
        correct = predicted == (targets > 0.5)
        # An exact count on the device; the percentage is taken on the host in float64.
        cells = max(int(correct.numel()), 1)
        return MetricValue(correct.sum(), int(targets.shape[0]), scale=100.0, divisor=cells)

    def clear(self) -> None:
        self._probabilities.reset()
