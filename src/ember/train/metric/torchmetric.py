"""Any torchmetrics metric as an ember metric (torchmetrics is an optional extra)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ember.errors import EmberError, TrainingError
from ember.train.metric._common import dims, dtype_name
from ember.train.metric.base import MetricMetadata, MetricValue
from ember.train.metric.inputs import ClassificationInput, LossInput


class TorchMetric:
    """Wraps a `torchmetrics.Metric`: torchmetrics keeps the state, ember the loop.

    The iteration value is the metric's `forward` on the batch (one update of the
    epoch state plus the batch value, torchmetrics' own cheapest path); the epoch value
    is `compute()` over the epoch and `clear()` calls `reset()`. The metric moves to
    the device of the first batch it sees. Predictions and targets are read from the
    input's `output` (or `logits`) and `targets`: tensors, or lists of one item per
    sample as they are (a detection model's dicts of boxes, for `MeanAveragePrecision`
    with `input_type=ForwardOutput`). Whether an update waits for the
    device is up to the wrapped metric (torchmetrics' `validate_args=False` avoids
    its argument checks, which do). An exception raised by the wrapped metric becomes
    a `TrainingError` naming the metric and the shapes it was given.
    """

    unit = ""

    def __init__(
        self,
        metric: Any,
        name: str | None = None,
        input_type: type = ClassificationInput,
        higher_is_better: bool | None = None,
    ) -> None:
        if not callable(getattr(metric, "compute", None)) or not callable(
            getattr(metric, "reset", None)
        ):
            raise TrainingError(
                f"TorchMetric wraps a torchmetrics.Metric; got {type(metric).__name__}."
            )
        if input_type is LossInput:
            raise TrainingError("TorchMetric reads predictions and targets, not a LossInput.")
        self.metric = metric
        self.syncs_itself = True  # torchmetrics reduces across processes in compute()
        self.name = name if name is not None else type(metric).__name__
        self.input_type = input_type
        if higher_is_better is None:
            higher_is_better = getattr(metric, "higher_is_better", None)
        self.higher_is_better = higher_is_better
        self._device: torch.device | None = None
        self._updated = False

    def update(self, input: Any, meta: MetricMetadata) -> MetricValue:
        preds: Any = getattr(input, "output", None)
        if preds is None:
            preds = getattr(input, "logits", None)
        targets: Any = getattr(input, "targets", None)
        listed = isinstance(preds, (list, tuple)) and isinstance(targets, (list, tuple))
        if not listed and (
            not isinstance(preds, torch.Tensor) or not isinstance(targets, torch.Tensor)
        ):
            raise TrainingError(
                f"{self.name}: {type(input).__name__} has no `output` (or `logits`) and "
                "`targets` tensors (or lists, one item per sample) to pass to the "
                "torchmetrics metric."
            )
        device = _device(preds)
        if device is not None and self._device != device:
            self.metric.to(device)
            self._device = device
        try:
            value = self.metric(preds if listed else preds.detach(), targets)
        except EmberError:
            raise
        except Exception as error:
            raise TrainingError(
                f"TorchMetric {self.name!r} ({type(self.metric).__name__}) cannot read "
                f"outputs {_shape(preds)} and targets {_shape(targets)}: "
                f"{type(error).__name__}: {error}"
            ) from error
        self._updated = True
        if listed:  # a list per sample (a detection model's dicts of boxes)
            return MetricValue(value, len(preds))
        return MetricValue(value, int(preds.shape[0]) if preds.dim() else 1)

    def epoch_value(self) -> Any:
        """The wrapped metric's `compute()` over the epoch (NaN before any update)."""
        if not self._updated:
            return math.nan
        return self.metric.compute()

    def clear(self) -> None:
        self.metric.reset()
        self._updated = False


def _device(value: Any) -> torch.device | None:
    """The device of a tensor, or of the first tensor in a list of tensors or dicts."""
    if isinstance(value, torch.Tensor):
        return value.device
    for item in value:
        found = item.values() if isinstance(item, dict) else [item]
        for tensor in found:
            if isinstance(tensor, torch.Tensor):
                return tensor.device
    return None


def _shape(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{dims(value.shape)} {dtype_name(value)}"
    return f"a {type(value).__name__} of {len(value)}"
