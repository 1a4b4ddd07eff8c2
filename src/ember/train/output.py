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
    loss_reduction: str = "mean"
    """How `loss` was reduced over the batch: "mean" (torch's default) or "sum"."""
    tokens: int | torch.Tensor | None = None
    """The number of tokens the step processed (optional; `ThroughputMetric("tokens")`)."""

    def adapt(self, input_type: type) -> Any:
        if input_type is ClassificationInput:
            return ClassificationInput(self.output, self.targets)
        if input_type is ScoresInput:
            return ScoresInput(self.output, self.targets)
        if input_type is LossInput:
            return LossInput(
                self.loss, int(self.targets.shape[0]), self.loss_reduction, self.tokens
            )
        return None


@dataclass
class MultiLabelClassificationOutput:
    """Multi-label classification: `output` scores [B, C], `targets` 0/1 [B, C]."""

    loss: torch.Tensor
    output: torch.Tensor
    targets: torch.Tensor
    loss_reduction: str = "mean"
    """How `loss` was reduced over the batch: "mean" (torch's default) or "sum"."""
    tokens: int | torch.Tensor | None = None
    """The number of tokens the step processed (optional; `ThroughputMetric("tokens")`)."""

    def adapt(self, input_type: type) -> Any:
        if input_type is MultiLabelInput:
            return MultiLabelInput(self.output, self.targets)
        if input_type is ScoresInput:
            return ScoresInput(self.output, self.targets, multilabel=True)
        if input_type is LossInput:
            return LossInput(
                self.loss, int(self.targets.shape[0]), self.loss_reduction, self.tokens
            )
        return None


@dataclass
class RegressionOutput:
    """Regression: `output` predictions and `targets` of the same shape [B, ...]."""

    loss: torch.Tensor
    output: torch.Tensor
    targets: torch.Tensor
    loss_reduction: str = "mean"
    """How `loss` was reduced over the batch: "mean" (torch's default) or "sum"."""
    tokens: int | torch.Tensor | None = None
    """The number of tokens the step processed (optional; `ThroughputMetric("tokens")`)."""

    def adapt(self, input_type: type) -> Any:
        if input_type is RegressionInput:
            return RegressionInput(self.output, self.targets)
        if input_type is LossInput:
            return LossInput(
                self.loss, int(self.targets.shape[0]), self.loss_reduction, self.tokens
            )
        return None


@dataclass
class SequenceOutput:
    """Sequence prediction: `logits` [B, T, V] and `targets` token ids [B, T]; tokens
    equal to `pad_token` (if set) are excluded from metrics."""

    loss: torch.Tensor
    logits: torch.Tensor
    targets: torch.Tensor
    pad_token: int | None = None
    loss_reduction: str = "mean"
    """How `loss` was reduced over the batch: "mean" (torch's default) or "sum"."""
    tokens: int | torch.Tensor | None = None
    """The number of tokens the step processed (optional; `ThroughputMetric("tokens")`)."""

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
            return LossInput(
                self.loss, int(self.targets.shape[0]), self.loss_reduction, self.tokens
            )
        return None


def summed_loss_hint(output: Any) -> str | None:
    """A warning when a step's loss looks summed over its batch while the output says
    it is a mean: it equals the batch size times the mean loss the output implies."""
    if getattr(output, "loss_reduction", "sum") != "mean":
        return None
    loss, targets = getattr(output, "loss", None), getattr(output, "targets", None)
    prediction = getattr(output, "output", None)
    if not all(isinstance(t, torch.Tensor) for t in (loss, targets, prediction)):
        return None
    assert isinstance(loss, torch.Tensor) and isinstance(targets, torch.Tensor)
    assert isinstance(prediction, torch.Tensor)
    count = int(targets.shape[0]) if targets.dim() else 0
    if count < 2 or loss.numel() != 1:
        return None
    with torch.no_grad():
        try:
            if isinstance(output, ClassificationOutput) and prediction.dim() == 2:
                mean = torch.nn.functional.cross_entropy(prediction.float(), targets.long())
            elif isinstance(output, RegressionOutput) and prediction.shape == targets.shape:
                mean = torch.nn.functional.mse_loss(prediction.float(), targets.float())
            else:
                return None
        except (RuntimeError, ValueError, IndexError):
            return None
        value, expected = float(loss.detach().float()), float(mean)
    if expected > 0 and abs(value - count * expected) <= 1e-3 * count * expected:
        return (
            f"The step's loss ({value:.6g}) is {count} times the batch's mean loss: it looks "
            "summed over the batch (reduction='sum'). LossMetric reports the loss per "
            f"sample when the output says so: {type(output).__name__}(..., "
            "loss_reduction='sum')."
        )
    return None
