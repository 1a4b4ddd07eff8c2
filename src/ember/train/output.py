"""What a model's steps return: the items metrics read.

Each output is a plain dataclass holding tensors. Metrics do not read outputs
directly: they ask for an *input type* (e.g. `ClassificationInput`) and the output
converts itself through `adapt(input_type)`. A custom output supports a metric by
implementing `adapt` (see `ember.train.metric.adapt`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ember.train.metric.inputs import (
    ClassificationInput,
    LossInput,
    MultiLabelInput,
    RegressionInput,
    ScoresInput,
    SequenceInput,
)


@dataclass
class ClassificationOutput:
    """Single-label classification: `output` holds logits or scores [B, C] (or [B] for
    binary scores) and `targets` class indices [B]."""

    loss: torch.Tensor
    output: torch.Tensor
    targets: torch.Tensor

    def adapt(self, input_type: type) -> Any:
        if input_type is ClassificationInput:
            return ClassificationInput(self.output, self.targets)
        if input_type is ScoresInput:
            return ScoresInput(self.output, self.targets)
        if input_type is LossInput:
            return LossInput(self.loss, int(self.targets.shape[0]))
        return None


@dataclass
class MultiLabelClassificationOutput:
    """Multi-label classification: `output` scores [B, C], `targets` 0/1 [B, C]."""

    loss: torch.Tensor
    output: torch.Tensor
    targets: torch.Tensor

    def adapt(self, input_type: type) -> Any:
        if input_type is MultiLabelInput:
            return MultiLabelInput(self.output, self.targets)
        if input_type is ScoresInput:
            return ScoresInput(self.output, self.targets, multilabel=True)
        if input_type is LossInput:
            return LossInput(self.loss, int(self.targets.shape[0]))
        return None


@dataclass
class RegressionOutput:
    """Regression: `output` predictions and `targets` of the same shape [B, ...]."""

    loss: torch.Tensor
    output: torch.Tensor
    targets: torch.Tensor

    def adapt(self, input_type: type) -> Any:
        if input_type is RegressionInput:
            return RegressionInput(self.output, self.targets)
        if input_type is LossInput:
            return LossInput(self.loss, int(self.targets.shape[0]))
        return None


@dataclass
class SequenceOutput:
    """Sequence prediction: `logits` [B, T, V] and `targets` token ids [B, T]; tokens
    equal to `pad_token` (if set) are excluded from metrics."""

    loss: torch.Tensor
    logits: torch.Tensor
    targets: torch.Tensor
    pad_token: int | None = None

    def adapt(self, input_type: type) -> Any:
        if input_type is SequenceInput:
            return SequenceInput(self.logits, self.targets, self.pad_token)
        if input_type is ClassificationInput:
            # Token-level classification view: [B*T, V] against [B*T].
            return ClassificationInput(
                self.logits.reshape(-1, self.logits.shape[-1]),
                self.targets.reshape(-1),
                pad_token=self.pad_token,
            )
        if input_type is LossInput:
            return LossInput(self.loss, int(self.targets.shape[0]))
        return None
