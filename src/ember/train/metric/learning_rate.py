"""The optimizer's learning rate, as a metric."""

from __future__ import annotations

import math
from typing import Any

from ember.train.metric.base import MetricMetadata, MetricValue


class LearningRateMetric:
    """The learning rate of each iteration (`meta.lr`; NaN when the loop has none,
    e.g. in validation). It reads no output, so it works with any step output."""

    name = "Learning Rate"
    unit = ""
    higher_is_better = None
    input_type = object  # every output "is" an object: `adapt` passes it through

    def update(self, input: Any, meta: MetricMetadata) -> MetricValue:
        return MetricValue(math.nan if meta.lr is None else float(meta.lr), 1)

    def clear(self) -> None:
        pass
