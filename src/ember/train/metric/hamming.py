"""Hamming score: the share of correct labels in multi-label classification."""

from __future__ import annotations

from ember.train.metric._common import FirstBatch, Probabilities, add_unit_range, check_same_shape
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import MultiLabelInput

_WHO = "HammingScoreMetric ('Hamming Score')"
_EXPECTS = "scores and 0/1 targets of one shape, [N, C]"
_HINT = "Class indices need a single-label metric, such as AccuracyMetric."


class HammingScoreMetric:
    """Share of (sample, label) pairs predicted right, in percent: 100 * (1 - Hamming loss).

    A label is predicted positive when its probability exceeds `threshold`; targets
    are positive above 0.5. Scores are probabilities unless `from_logits=True`, which
    applies a sigmoid first (the outputs of a model trained with `BCEWithLogitsLoss`);
    without it, scores outside [0, 1] on the first batch of an epoch raise a
    `TrainingError`, as do targets outside [0, 1]. Scores and targets must have one
    shape, [N, C] (checked at every update). Every sample has the same number of
    labels, so the batch-size-weighted mean of batch values is the exact epoch value.
    """

    name = "Hamming Score"
    unit = "%"
    higher_is_better = True
    input_type = MultiLabelInput

    def __init__(self, threshold: float = 0.5, *, from_logits: bool = False) -> None:
        self.threshold = float(threshold)
        self.from_logits = from_logits
        self._probabilities = Probabilities(from_logits, "HammingScoreMetric()")
        self._checks = FirstBatch()

    def update(self, input: MultiLabelInput, meta: MetricMetadata) -> MetricValue:
        output, targets = input.output, input.targets
        check_same_shape(_WHO, _EXPECTS, output, targets, dim=None)
        predicted = self._probabilities(output, self.name, self._checks) > self.threshold
        add_unit_range(self._checks, _WHO, targets, hint=_HINT)
        self._checks.verify()
        correct = predicted == (targets > 0.5)
        # An exact count on the device; the percentage is taken on the host in float64.
        cells = max(int(correct.numel()), 1)
        return MetricValue(correct.sum(), int(targets.shape[0]), scale=100.0, divisor=cells)

    def clear(self) -> None:
        self._checks.reset()
