"""What a model's steps return: the items metrics read.

Each output is a plain dataclass holding tensors. Metrics do not read outputs
directly: they ask for an *input type* (e.g. `ClassificationInput`) and the output
converts itself through `adapt(input_type)`. A custom output supports a metric by
implementing `adapt` (see `ember.train.metric.adapt`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ember.errors import TrainingError
from ember.train import host
from ember.train.metric.accuracy import AccuracyMetric
from ember.train.metric.inputs import (
    ClassificationInput,
    ImageInput,
    LossInput,
    MultiLabelInput,
    RegressionInput,
    ScoresInput,
    SequenceInput,
    TextInput,
)
from ember.train.metric.loss import LossMetric


@dataclass
class LossFields:
    """The field every output ends with: how its `loss` was reduced. An output takes
    its own fields from a base listed after this one (`class ImageOutput(LossFields,
    _ImageFields)`): a dataclass's fields come from its bases in reverse order, so
    these follow the output's own, in its repr and its constructor alike."""

    loss_reduction: str = "mean"
    """How `loss` was reduced over the batch: "mean" (torch's default), "sum", or, for
    an output with `tokens`, "token_mean" (a mean over them: see `loss_weight`)."""


@dataclass
class TokenLossFields(LossFields):
    """The fields every output with a token count ends with."""

    tokens: int | torch.Tensor | None = None
    """The number of tokens the step processed (optional; `ThroughputMetric("tokens")`)."""

    def loss_input(self, loss: torch.Tensor, samples: int) -> LossInput:
        """What `LossMetric` reads: `loss` over `samples`, reduced as these fields say."""
        return LossInput(loss, samples, self.loss_reduction, self.tokens)


@dataclass
class _PredictedFields:
    """The own fields of the classification and regression outputs."""

    loss: torch.Tensor
    output: torch.Tensor
    targets: torch.Tensor


@dataclass
class ClassificationOutput(TokenLossFields, _PredictedFields):
    """Single-label classification: `output` holds logits or scores [B, C] (or [B] for
    binary scores) and `targets` class indices [B]."""

    def adapt(self, input_type: type) -> Any:
        if input_type is ClassificationInput:
            return ClassificationInput(self.output, self.targets)
        if input_type is ScoresInput:
            return ScoresInput(self.output, self.targets)
        if input_type is LossInput:
            return self.loss_input(self.loss, int(self.targets.shape[0]))
        return None


@dataclass
class MultiLabelClassificationOutput(TokenLossFields, _PredictedFields):
    """Multi-label classification: `output` scores [B, C], `targets` 0/1 [B, C]."""

    def adapt(self, input_type: type) -> Any:
        if input_type is MultiLabelInput:
            return MultiLabelInput(self.output, self.targets)
        if input_type is ScoresInput:
            return ScoresInput(self.output, self.targets, multilabel=True)
        if input_type is LossInput:
            return self.loss_input(self.loss, int(self.targets.shape[0]))
        return None


@dataclass
class RegressionOutput(TokenLossFields, _PredictedFields):
    """Regression: `output` predictions and `targets` of the same shape [B, ...]."""

    def adapt(self, input_type: type) -> Any:
        if input_type is RegressionInput:
            return RegressionInput(self.output, self.targets)
        if input_type is LossInput:
            return self.loss_input(self.loss, int(self.targets.shape[0]))
        return None


@dataclass
class _SequenceFields:
    """The own fields of `SequenceOutput`."""

    loss: torch.Tensor
    logits: torch.Tensor
    targets: torch.Tensor
    pad_token: int | None = None


@dataclass
class SequenceOutput(TokenLossFields, _SequenceFields):
    """Sequence prediction: `logits` [B, T, V] and `targets` token ids [B, T]; tokens
    equal to `pad_token` (if set) are excluded from metrics."""

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
            return self.loss_input(self.loss, int(self.targets.shape[0]))
        return None


@dataclass
class _TextFields:
    """The own fields of `TextOutput`."""

    predictions: Sequence[str] | torch.Tensor | Sequence[Sequence[int]]
    references: Sequence[str] | torch.Tensor | Sequence[Sequence[int]]
    decode: Callable[[list[int]], str] | None = None
    pad_token: int | None = None
    loss: torch.Tensor | None = None


@dataclass
class TextOutput(TokenLossFields, _TextFields):
    """Generated text against reference text, one pair per sample, for the text
    metrics (`CerMetric`, `WerMetric`, `BleuMetric`, `RougeMetric`).

    `predictions` and `references` are either lists of strings, or token-id tensors
    [B, T] (or lists of id lists) with `decode`, a function from a list of token ids
    to a string (a tokenizer's `decode`); ids equal to `pad_token` are dropped before
    decoding. Decoding reads the ids on the host: text metrics cost one transfer per
    batch. `loss`, when the step has one, feeds `LossMetric`.
    """

    def adapt(self, input_type: type) -> Any:
        if input_type is TextInput:
            predictions = self._texts(self.predictions, "predictions")
            references = self._texts(self.references, "references")
            if len(predictions) != len(references):
                raise TrainingError(
                    f"TextOutput holds {len(predictions)} predictions and {len(references)} "
                    "references: give one reference per prediction."
                )
            return TextInput(predictions, references)
        if input_type is LossInput and self.loss is not None:
            return self.loss_input(self.loss, len(self.references))
        return None

    def _texts(self, texts: Any, field: str) -> list[str]:
        if isinstance(texts, str):
            raise TrainingError(
                f"TextOutput.{field} is one string; give a list of strings, one per sample."
            )
        if isinstance(texts, torch.Tensor):
            if texts.dim() != 2:
                raise TrainingError(
                    f"TextOutput.{field} holds token ids of shape {list(texts.shape)}; give "
                    "them as [B, T], one row per sample."
                )
            texts = texts.tolist()
        rows = list(texts)
        if all(isinstance(row, str) for row in rows):
            return rows
        if self.decode is None:
            raise TrainingError(
                f"TextOutput.{field} holds token ids, not strings: pass decode= (a function "
                "from a list of token ids to a string, such as a tokenizer's decode)."
            )
        decoded = []
        for row in rows:
            ids = [int(i) for i in row if self.pad_token is None or int(i) != self.pad_token]
            text = self.decode(ids)
            if not isinstance(text, str):
                raise TrainingError(
                    f"TextOutput's decode returned a {type(text).__name__}; it must return "
                    "a string."
                )
            decoded.append(text)
        return decoded


@dataclass
class _ImageFields:
    """The own fields of `ImageOutput`."""

    output: torch.Tensor
    targets: torch.Tensor
    loss: torch.Tensor | None = None


@dataclass
class ImageOutput(LossFields, _ImageFields):
    """Image prediction: `output` [B, C, H, W] and `targets` [B, C, H, W] for
    reconstruction metrics (`PsnrMetric`, `SsimMetric`, `MsSsimMetric`); for
    segmentation (`DiceMetric`), `output` class scores [B, C, H, W] and `targets`
    class indices [B, H, W]. `loss`, when the step has one, feeds `LossMetric`."""

    def adapt(self, input_type: type) -> Any:
        if input_type is ImageInput:
            return ImageInput(self.output, self.targets)
        if input_type is RegressionInput:
            return RegressionInput(self.output, self.targets)
        if input_type is LossInput and self.loss is not None:
            return LossInput(self.loss, int(self.targets.shape[0]), self.loss_reduction)
        return None


def quick_reader(output_type: type, metric: Any) -> Callable[[Any], Any] | None:
    """How `metric` reads its common case straight from a step output of exactly
    `output_type`, without the input `adapt` would make: a function of the output
    that returns what the metric's `update` would return on that input, or None when
    the output is not that case (then the output is adapted and `update` called).
    None when there is no such reading. A step's metrics are read once a step, so
    the calls they take show on a small model."""
    kind = type(metric)
    if kind is LossMetric and output_type in _PREDICTED:
        quick_loss = metric.quick  # `loss_input(loss, targets.shape[0])`, reduced by mean
        return lambda item: (
            quick_loss(item.loss, item.targets.shape[0]) if item.loss_reduction == "mean" else None
        )
    if kind is AccuracyMetric and output_type is ClassificationOutput:
        quick_accuracy = metric.quick  # `ClassificationInput(output, targets)`
        return lambda item: quick_accuracy(item.output, item.targets)
    return None


_PREDICTED = (ClassificationOutput, MultiLabelClassificationOutput, RegressionOutput)


def loss_weight(item: Any) -> int | torch.Tensor | None:
    """The number of units a step's loss is the mean over, when its output says so
    (`loss_reduction="token_mean"`: its `tokens`); None for a per-sample loss. The
    learner weights each accumulated batch's gradient, and `LossMetric` each batch's
    loss, by it: the result is that of the mean over every token of the step."""
    if getattr(item, "loss_reduction", None) != "token_mean":
        return None
    tokens = getattr(item, "tokens", None)
    if tokens is None:
        raise TrainingError(
            f"{type(item).__name__} says loss_reduction='token_mean' but gives no tokens: "
            "pass tokens= (the number of tokens the loss is the mean over, e.g. the "
            "targets that are not padding: (targets != pad).sum())."
        )
    return tokens


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
        # one read of both (a run's first output only)
        value, expected = host.HostCopies().launch([loss.detach().float(), mean]).values()
    if expected > 0 and abs(value - count * expected) <= 1e-3 * count * expected:
        return (
            f"The step's loss ({value:.6g}) is {count} times the batch's mean loss: it looks "
            "summed over the batch (reduction='sum'). LossMetric reports the loss per "
            f"sample when the output says so: {type(output).__name__}(..., "
            "loss_reduction='sum')."
        )
    return None
