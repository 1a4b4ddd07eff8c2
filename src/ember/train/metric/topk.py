"""Top-k classification accuracy, in percent."""

from __future__ import annotations

from ember.errors import ConfigError, TrainingError
from ember.train.metric._common import percent_correct, resolve_pad
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import ClassificationInput


class TopKAccuracyMetric:
    """Share of samples whose target is among the `k` highest-scoring classes, in percent.

    Counted exactly as `AccuracyMetric` counts (the same figure for `k=1`). Targets
    equal to `pad_token` (or the output's own pad token) are left out. With `k` at
    least the number of classes every sample counts as correct.
    """

    unit = "%"
    higher_is_better = True
    input_type = ClassificationInput

    def __init__(self, k: int, pad_token: int | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"TopKAccuracyMetric: k must be a positive integer, got {k!r}.")
        self.k = k
        self.pad_token = pad_token
        self.name = f"Top-{k} Accuracy"

    def update(self, input: ClassificationInput, meta: MetricMetadata) -> MetricValue:
        output, targets = input.output, input.targets
        if output.dim() != 2:
            raise TrainingError(
                f"{self.name} needs scores of shape [N, C]; got shape {tuple(output.shape)}."
            )
        k = min(self.k, int(output.shape[-1]))
        top = output.topk(k, dim=-1).indices
        correct = (top == targets.unsqueeze(-1)).any(dim=-1)
        pad = resolve_pad(self.pad_token, input.pad_token)
        return percent_correct(correct, None if pad is None else targets != pad)

    def clear(self) -> None:
        pass
