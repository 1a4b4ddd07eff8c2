"""The training or validation loss."""

from __future__ import annotations

import torch

from ember.errors import TrainingError
from ember.train.metric._common import dims
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import LossInput


class LossMetric:
    """The step's loss per sample, weighted by its batch size in the epoch mean (a loss
    the step summed over the batch, `loss_reduction="sum"` on the output, is divided by
    the batch size; a loss that is a mean over tokens, `loss_reduction="token_mean"`
    with `tokens=`, is weighted by its tokens: the epoch's token mean).

    Reads a scalar loss: a tensor of one element, or a number. A loss of several
    elements (from a loss function with `reduction="none"`) raises a `TrainingError`.
    """

    name = "Loss"
    unit = ""
    higher_is_better = False
    input_type = LossInput

    def quick(self, loss: object, samples: int) -> MetricValue | None:
        """`update`'s common case, read from the output's fields as they are: a scalar
        tensor, the mean over `samples`. None in any other case."""
        if type(loss) is torch.Tensor and loss.dim() == 0:  # (a MetricValue made without
            return tuple.__new__(MetricValue, (loss.detach(), samples, 1.0, 1.0))  # a call)
        return None

    def update(self, input: LossInput, meta: MetricMetadata) -> MetricValue:
        loss, reduction = input.loss, input.reduction
        if reduction == "mean":
            value = self.quick(loss, input.batch_size)
            if value is not None:
                return value
        if reduction not in ("mean", "sum", "token_mean"):
            raise TrainingError(
                "LossMetric reads a loss reduced by 'mean', 'sum' or 'token_mean'; got "
                f"{input.reduction!r}."
            )
        if input.reduction == "token_mean":  # a mean over tokens, weighted by them
            if input.tokens is None:
                raise TrainingError(
                    "LossMetric got loss_reduction='token_mean' without tokens: pass "
                    "tokens= (the number of tokens the loss is the mean over) on the output."
                )
            return MetricValue(self._scalar(loss), input.tokens)
        # A summed loss is divided by its samples on the host: the per-sample mean.
        divisor = float(max(input.batch_size, 1)) if input.reduction == "sum" else 1.0
        return MetricValue(self._scalar(loss), input.batch_size, divisor=divisor)

    def _scalar(self, loss: object) -> torch.Tensor | float:
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise TrainingError(
                    f"LossMetric reads a scalar loss, one number per step; got a loss of "
                    f"shape {dims(loss.shape)}: reduce it (loss.mean(), or a loss function "
                    "with its default reduction)."
                )
            value = loss.detach()
            return value.reshape(()) if value.dim() else value
        if isinstance(loss, (int, float)) and not isinstance(loss, bool):
            return float(loss)
        raise TrainingError(
            f"LossMetric reads a scalar loss, a tensor or a number; got a {type(loss).__name__}."
        )

    def clear(self) -> None:
        pass
