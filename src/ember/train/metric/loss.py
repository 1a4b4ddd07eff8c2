"""The training or validation loss."""

from __future__ import annotations

from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import LossInput


class LossMetric:
    """The step's loss, weighted by its batch size in the epoch mean."""

    name = "Loss"
    unit = ""
    higher_is_better = False
    input_type = LossInput

    def update(self, input: LossInput, meta: MetricMetadata) -> MetricValue:
        return MetricValue(input.loss.detach(), input.batch_size)

    def clear(self) -> None:
        pass
