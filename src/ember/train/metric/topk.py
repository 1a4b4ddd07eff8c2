"""Top-k classification accuracy, in percent."""

from __future__ import annotations

from ember.errors import ConfigError, TrainingError
from ember.train.metric._common import (
    FirstBatch,
    add_class_range,
    check_classes,
    dims,
    percent_correct,
    resolve_pad,
    who,
)
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import ClassificationInput

_EXPECTS = "outputs [N, C] and class-index targets [N]"


class TopKAccuracyMetric:
    """Share of samples whose target is among the `k` highest-scoring classes, in percent.

    Reads scores [N, C] and integer class indices [N]. Counted exactly as
    `AccuracyMetric` counts (the same figure for `k=1`). Targets equal to `pad_token`
    (or the output's own pad token) are left out. With `k` at least the number of
    classes every sample counts as correct. Shapes are checked at every update, the
    range of the class indices on the first batch of every epoch.
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
        self._who = who(f"TopKAccuracyMetric({k})", self.name)
        self._checks = FirstBatch()

    def update(self, input: ClassificationInput, meta: MetricMetadata) -> MetricValue:
        output, targets = input.output, input.targets
        if output.dim() != 2:
            raise TrainingError(
                f"{self._who} reads {_EXPECTS}; got outputs {dims(output.shape)} and targets "
                f"{dims(targets.shape)}: top-k needs one score per class, in rows of C "
                "columns (flatten sequences: outputs.view(-1, C), targets.view(-1))."
            )
        check_classes(self._who, _EXPECTS, output, targets)
        pad = resolve_pad(self.pad_token, input.pad_token)
        mask = None if pad is None else targets != pad
        add_class_range(self._checks, self._who, output, targets, mask)
        self._checks.verify()
        k = min(self.k, int(output.shape[-1]))
        top = output.topk(k, dim=-1).indices
        correct = (top == targets.unsqueeze(-1)).any(dim=-1)
        return percent_correct(correct, mask)

    def clear(self) -> None:
        self._checks.reset()
