"""The check of a split's metrics on its first batch, and the single number a metric
value must be: a metric that cannot work fails before the first optimizer step, with a
message naming the metric, the split and what it got."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from ember.data.device import describe
from ember.errors import EmberError, TrainingError
from ember.train import host
from ember.train.metric.adapt import adapt
from ember.train.metric.base import MetricMetadata
from ember.train.metric.state import MetricState


def check_first_batch(
    states: Sequence[MetricState], split: str, item: Any, epoch: int, num_epochs: int
) -> None:
    """Every metric of `states` reads `item` and updates once (then forgets it)."""
    meta = MetricMetadata(split, epoch, num_epochs, 1, None, None)
    for state in states:
        adapted = adapt(item, state.input_type, state.name)
        try:
            with torch.no_grad(), host.at_once():
                value = state.metric.update(adapted, meta)
        except EmberError as error:  # its own message says what is wrong and the fix
            raise TrainingError(
                f"The {split} metric {state.name!r} fails on the first {split} batch: {error}"
            ) from error
        except Exception as error:
            raise TrainingError(
                f"The {split} metric {state.name!r} fails on the first {split} batch: "
                f"{type(error).__name__}: {error}. It received {describe(adapted)}; it "
                f"reads a {state.input_type.__name__}. Check the shapes the step returns "
                "(e.g. class indices, not one-hot targets, for accuracy)."
            ) from error
        state.metric.clear()
        for number in (value.value, value.weight):
            if isinstance(number, Tensor) and number.numel() != 1:
                single_number(number, state.name)  # raises the message naming the metric


def single_number(value: Tensor, name: str) -> float:
    """A host tensor's single number; an error naming the metric for any other shape."""
    try:
        return value.item()
    except RuntimeError:
        raise TrainingError(
            f"The metric {name!r} returned a tensor of shape {tuple(value.shape)}; a metric's "
            "value and weight must be single numbers (a 0-d tensor, a float or an int)."
        ) from None
