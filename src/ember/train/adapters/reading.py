"""How a model from another library is read: a batch goes in (keyword arguments, positional
arguments or the batch itself), and its forward's result comes out as a loss, predictions
and the batch's targets. Everything is read by duck typing (`.loss`, `.logits`, a dict of
losses), so no library is imported."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

from ember.data.device import first_dim
from ember.errors import TrainingError

TargetsSpec = str | Callable[[Any], Any] | None


def call_model(model: nn.Module, batch: Any, targets: TargetsSpec, own_loss: bool) -> Any:
    """The forward on `batch`: a dict batch as keyword arguments, a tuple or list as
    positional ones, anything else as the one argument. When ember computes the loss
    (`own_loss` is False), the targets are left out where they were found by default
    (the `labels` key, or the key `targets` names; a tuple's last element)."""
    if isinstance(batch, Mapping):
        if own_loss or callable(targets):
            return model(**batch)
        key = targets or "labels"
        return model(**{name: value for name, value in batch.items() if name != key})
    if isinstance(batch, (tuple, list)):
        if own_loss or targets is not None:
            return model(*batch)
        return model(*batch[:-1])
    return model(batch)


def find_targets(batch: Any, targets: TargetsSpec) -> Any:
    """The batch's targets, or None when they are not where `targets` says: a function
    of the batch; a key of a dict batch or an attribute of another object ("labels"
    when not given); by default, the last element of a tuple or list."""
    if callable(targets):
        return targets(batch)
    if isinstance(batch, Mapping):
        return batch.get(targets or "labels")
    if isinstance(batch, (tuple, list)):
        if targets is None:
            return batch[-1] if len(batch) > 1 else None
        return None
    return getattr(batch, targets or "labels", None)


def find_field(batch: Any, name: str) -> Any:
    """A key of a dict batch, or an attribute of any other batch (None if absent)."""
    if isinstance(batch, Mapping):
        return batch.get(name)
    return getattr(batch, name, None)


def is_loss_dict(result: Any) -> bool:
    """A dict of losses, as torchvision's detection models return in train mode: no
    `loss` key, and every value a scalar tensor."""
    return (
        isinstance(result, Mapping)
        and "loss" not in result
        and len(result) > 0
        and all(isinstance(value, Tensor) and value.dim() == 0 for value in result.values())
    )


def loss_of(result: Any) -> Tensor | None:
    """The loss a forward computed: its `loss` (a key or an attribute, as Hugging Face's
    outputs carry it), the sum of a dict of losses, or None."""
    if isinstance(result, Tensor):
        return None
    if isinstance(result, Mapping):
        loss = result.get("loss")
        if isinstance(loss, Tensor):
            return loss
        if is_loss_dict(result):
            return sum(result.values())  # type: ignore[return-value]
        return None
    loss = getattr(result, "loss", None)
    return loss if isinstance(loss, Tensor) else None


def predictions_of(result: Any) -> Any:
    """What a forward predicted: the result itself when it is a tensor; its `logits`;
    else the first tensor of an output dict besides the loss (a diffusers model's
    `sample`); a list or tuple as it is (a detection model's boxes in eval mode); None
    for a dict of losses."""
    if isinstance(result, Tensor):
        return result
    if isinstance(result, Mapping):
        if is_loss_dict(result):
            return None
        if isinstance(result.get("logits"), Tensor):
            return result["logits"]
        for name, value in result.items():
            if name != "loss" and isinstance(value, Tensor):
                return value
        return None
    logits = getattr(result, "logits", None)
    if isinstance(logits, Tensor):
        return logits
    if isinstance(result, (list, tuple)):
        return result
    return None


def count_samples(targets: Any, batch: Any) -> int:
    """The samples a batch's loss is the mean over: the targets' first dimension (or
    their number, a list of dicts), else the first dimension of the batch's first tensor,
    else the length of its first list (a list of images)."""
    if isinstance(targets, Tensor) and targets.dim() > 0:
        return int(targets.shape[0])
    if isinstance(targets, (list, tuple)):
        return len(targets)
    size = first_dim(batch)
    if size is not None:
        return size
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], (list, tuple)):
        return len(batch[0])
    return 1


def describe_result(result: Any) -> str:
    """A forward's result in a few words, for a message."""
    if isinstance(result, Tensor):
        return f"a tensor of shape {list(result.shape)}"
    if isinstance(result, Mapping):
        return f"a {type(result).__name__} with keys {list(result)}"
    return f"a {type(result).__name__}"


def no_loss(model: nn.Module, result: Any, split: str) -> TrainingError:
    """The error of a step whose forward returned no loss."""
    name = type(model).__name__
    mode = "train" if split == "train" else "eval"
    hint = (
        "Give the model its labels (a Hugging Face model computes its loss when the batch "
        "holds `labels`), or pass LossFromModel(loss=...) to compute it from the "
        "predictions and the targets."
    )
    if split != "train":
        hint += (
            " A model that returns losses only in train mode (torchvision's detection "
            "models) gets a validation loss with LossFromModel(valid_loss='train_mode')."
        )
    return TrainingError(
        f"{name}'s forward returned {describe_result(result)} in {mode} mode, with no loss "
        f"(neither a `loss` nor a dict of scalar losses). {hint}"
    )


@contextlib.contextmanager
def train_mode(model: nn.Module) -> Iterator[None]:
    """The model in train mode for one forward, without changing it: normalisation layers
    that keep running statistics stay in eval mode (they would update them), every
    module's mode is put back afterwards, and the random draws (dropout, a detection
    head's sampling) come from a fork of the generators, so training's own draws are
    the same as without this forward."""
    modes = [(module, module.training) for module in model.modules()]
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    try:
        model.train()
        for module in model.modules():
            if getattr(module, "track_running_stats", False):
                module.eval()
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        for module, mode in modes:
            module.training = mode
