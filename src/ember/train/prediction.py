"""Prediction: a model run over a data set, its outputs concatenated.

`predict` sends each batch to the model's `predict_step` when it has one, else to
`forward`; `concat_outputs` joins the batch outputs into one.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, ContextManager, Iterable

import torch

from ember.data.device import to_device
from ember.errors import TrainingError


def predict(
    model: torch.nn.Module,
    loader: Iterable[Any],
    device: torch.device,
    autocast: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
) -> Any:
    """`Evaluator.predict` for any model and device (in eval mode, inference mode)."""
    step = prediction_step(model)
    outputs: list[Any] = []
    training = model.training
    model.eval()
    try:
        hook = getattr(model, "on_split_start", None)
        if callable(hook):  # a model carrying state across batches starts afresh
            hook("predict")
        with torch.inference_mode(), autocast():
            for batch in loader:
                if device.type != "cpu":
                    batch = to_device(batch, device)
                output = step(batch)
                outputs.append(to_device(output, torch.device("cpu"), non_blocking=False))
    finally:
        model.train(training)
    return concat_outputs(outputs)


def prediction_step(model: torch.nn.Module) -> Callable[[Any], Any]:
    """What `predict` runs on each batch: the model's `predict_step`, or else its
    `forward` on the batch's first tensor."""
    own = getattr(model, "predict_step", None)
    if callable(own):
        return own  # type: ignore[no-any-return]
    return lambda batch: model(_first_tensor(batch))


def concat_outputs(outputs: list[Any]) -> Any:
    """Batch outputs as one: tensors concatenated along the first dimension; dataclasses,
    named tuples, tuples, lists and dicts of tensors concatenated field by field (the
    same structure back; None fields stay None); anything else (or tensors without a
    first dimension) as the list of the outputs."""
    if not outputs:
        return []
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if first.dim() > 0 and all(
            isinstance(o, torch.Tensor) and o.dim() == first.dim() for o in outputs
        ):
            return torch.cat(outputs)
        return outputs
    if first is None and all(o is None for o in outputs):
        return None
    if not all(type(o) is type(first) for o in outputs):
        return outputs
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        changes = {
            field.name: concat_outputs([getattr(o, field.name) for o in outputs])
            for field in dataclasses.fields(first)
            if field.init
        }
        return dataclasses.replace(first, **changes)
    if isinstance(first, (tuple, list)) and len({len(o) for o in outputs}) == 1:
        parts = [concat_outputs([o[i] for o in outputs]) for i in range(len(first))]
        if hasattr(first, "_fields"):
            return type(first)(*parts)
        return tuple(parts) if isinstance(first, tuple) else parts
    if isinstance(first, dict) and all(o.keys() == first.keys() for o in outputs):
        return {key: concat_outputs([o[key] for o in outputs]) for key in first}
    return outputs


def _first_tensor(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch
    found = _find_tensor(batch)
    if found is None:
        raise TrainingError(
            f"predict() found no tensor in a batch of type {type(batch).__name__} to pass to "
            "forward: give the model a predict_step(self, batch) method."
        )
    return found


def _find_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        children: Iterable[Any] = (getattr(value, f.name) for f in dataclasses.fields(value))
    elif isinstance(value, (tuple, list)):
        children = value
    elif isinstance(value, dict):
        children = value.values()
    else:
        return None
    for child in children:
        found = _find_tensor(child)
        if found is not None:
            return found
    return None
